//! What a compiled selector may do, read from its syntax tree before it ever runs: every
//! identifier is `device`, a variable a comprehension bound, or the namespace of a library
//! function (`sets.contains`); `quantity("…")` literals are in range; and the estimated
//! evaluation cost stays within Kubernetes' budget. The estimate follows cel-go's model: one
//! unit per node, strings and lists cost a tenth of a unit per byte or element they touch,
//! and a comprehension costs its body once per element of its range. Sizes are bounded the
//! way DRA bounds a device (at most 32 attributes or capacities, strings of at most 64 bytes),
//! literal lists by their length, and a growing string by what each step can add
//! (`s.replace("a", "aaaaaaaaaa")` can make `s` ten times longer), so an expression that
//! could run long or grow memory is refused with its cost instead of being run.

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};

/// Kubernetes' per-expression CEL cost budget (DRA device selectors use the same).
pub const MAX_COST: u64 = 1_000_000;

/// Library functions called through a namespace, as kube-cel registers them with the
/// features Flotilla enables (`lists`, `sets`, `math`, `strings`).
pub const NAMESPACED_FUNCTIONS: [&str; 22] = [
    "lists.range",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    "strings.quote",
    "math.abs",
    "math.bitAnd",
    "math.bitNot",
    "math.bitOr",
    "math.bitShiftLeft",
    "math.bitShiftRight",
    "math.bitXor",
    "math.ceil",
    "math.floor",
    "math.greatest",
    "math.isFinite",
    "math.isInf",
    "math.isNaN",
    "math.least",
    "math.round",
    "math.sign",
    "math.sqrt",
];

/// A length nothing bounds (a list built from a runtime number).
const UNBOUNDED: u64 = 1 << 32;
/// Entries of a device map and bytes of a device string, as DRA bounds them.
const DEVICE_BOUND: u64 = 64;

/// What the analysis found wrong.
#[derive(Debug, PartialEq, Eq)]
pub enum Finding {
    /// An identifier that is not `device` nor bound by a comprehension.
    UnknownVariable(String),
    /// A `quantity("…")` literal Kubernetes could not hold.
    BadQuantity(String),
}

/// The estimate of a selector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// Estimated cost, in cel-go units.
    pub cost: u64,
    /// Deepest nesting of comprehensions.
    pub comprehension_depth: usize,
}

/// A value's estimated cost so far, its length (bytes or entries) and its entries' length.
#[derive(Clone, Copy, Debug)]
struct Est {
    cost: u64,
    len: u64,
    elem: u64,
}

impl Est {
    fn scalar(cost: u64) -> Self {
        Self { cost, len: 1, elem: 0 }
    }
}

struct Walker {
    scope: Vec<(String, Est)>,
    depth: usize,
    max_depth: usize,
}

/// Checks identifiers and quantity literals and estimates the cost of `expr`.
pub fn analyze(expr: &IdedExpr) -> Result<Estimate, Finding> {
    let mut w = Walker { scope: Vec::new(), depth: 0, max_depth: 0 };
    let est = w.walk(expr)?;
    Ok(Estimate { cost: est.cost, comprehension_depth: w.max_depth })
}

impl Walker {
    fn walk(&mut self, e: &IdedExpr) -> Result<Est, Finding> {
        Ok(match &e.expr {
            Expr::Unspecified => Est::scalar(1),
            Expr::Literal(LiteralValue::String(s)) => Est { cost: 1, len: s.inner().len() as u64, elem: 0 },
            Expr::Literal(LiteralValue::Bytes(b)) => Est { cost: 1, len: b.inner().len() as u64, elem: 0 },
            Expr::Literal(_) => Est::scalar(1),
            Expr::Ident(name) => match self.scope.iter().rev().find(|(n, _)| n == name) {
                Some((_, est)) => Est { cost: 1, ..*est },
                None if name == "device" => Est { cost: 1, len: DEVICE_BOUND, elem: DEVICE_BOUND },
                None => return Err(Finding::UnknownVariable(name.clone())),
            },
            Expr::Select(s) => {
                let operand = self.walk(&s.operand)?;
                Est { cost: operand.cost.saturating_add(1), len: operand.elem.max(1), elem: operand.elem }
            }
            Expr::List(l) => self.collection(l.elements.iter())?,
            Expr::Map(m) => self.collection(m.entries.iter().flat_map(|entry| match &entry.expr {
                EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                EntryExpr::StructField(f) => vec![&f.value],
            }))?,
            Expr::Struct(s) => self.collection(s.entries.iter().map(|entry| match &entry.expr {
                EntryExpr::StructField(f) => &f.value,
                EntryExpr::MapEntry(me) => &me.value,
            }))?,
            Expr::Comprehension(c) => {
                self.depth += 1;
                self.max_depth = self.max_depth.max(self.depth);
                let range = self.walk(&c.iter_range)?;
                let init = self.walk(&c.accu_init)?;
                let n = range.len;
                let item = Est { cost: 0, len: range.elem.max(1), elem: range.elem };
                let accu = Est { cost: 0, len: n.saturating_add(init.len), elem: range.elem.max(DEVICE_BOUND) };
                let bound = self.scope.len();
                self.scope.push((c.iter_var.clone(), item));
                if let Some(v) = &c.iter_var2 {
                    self.scope.push((v.clone(), item));
                }
                self.scope.push((c.accu_var.clone(), accu));
                let cond = self.walk(&c.loop_cond)?;
                let step = self.walk(&c.loop_step)?;
                let result = self.walk(&c.result)?;
                self.scope.truncate(bound);
                self.depth -= 1;
                let per_item = cond.cost.saturating_add(step.cost).saturating_add(1);
                Est {
                    cost: range
                        .cost
                        .saturating_add(init.cost)
                        .saturating_add(n.saturating_mul(per_item))
                        .saturating_add(result.cost),
                    len: result.len,
                    elem: result.elem,
                }
            }
            Expr::Call(call) => self.call(&call.func_name, call.target.as_deref(), &call.args)?,
        })
    }

    fn collection<'a>(&mut self, items: impl Iterator<Item = &'a IdedExpr>) -> Result<Est, Finding> {
        let mut out = Est { cost: 1, len: 0, elem: 0 };
        for item in items {
            let est = self.walk(item)?;
            out.cost = out.cost.saturating_add(est.cost);
            out.len = out.len.saturating_add(1);
            out.elem = out.elem.max(est.len);
        }
        Ok(out)
    }

    fn call(&mut self, name: &str, target: Option<&IdedExpr>, args: &[IdedExpr]) -> Result<Est, Finding> {
        // `sets.contains(a, b)` parses as a call of `contains` on the identifier `sets`.
        let namespaced = match target.map(|t| &t.expr) {
            Some(Expr::Ident(ns)) => NAMESPACED_FUNCTIONS.contains(&format!("{ns}.{name}").as_str()),
            _ => false,
        };
        let target = if namespaced { None } else { target.map(|t| self.walk(t)).transpose()? };
        let mut parts = Vec::with_capacity(args.len());
        for a in args {
            parts.push(self.walk(a)?);
        }
        if name == "quantity"
            && let Some(IdedExpr { expr: Expr::Literal(LiteralValue::String(s)), .. }) = args.first()
        {
            crate::quantity::check(s.inner()).map_err(Finding::BadQuantity)?;
        }
        let inputs = target.iter().chain(parts.iter());
        let base = inputs.clone().fold(1u64, |c, e| c.saturating_add(e.cost));
        let arg = |i: usize| parts.get(i).copied().unwrap_or(Est::scalar(0));
        let (len, elem, touched) = match (name, target) {
            ("_&&_" | "_||_" | "!_" | "-_", _) => (1, 0, 0),
            ("_?_:_", _) => (arg(1).len.max(arg(2).len), arg(1).elem.max(arg(2).elem), 0),
            ("_[_]", _) => (arg(0).elem.max(1), arg(0).elem, 0),
            ("_+_", _) => {
                let (a, b) = (arg(0), arg(1));
                (a.len.saturating_add(b.len), a.elem.max(b.elem), a.len.saturating_add(b.len))
            }
            ("@in", _) => (1, 0, arg(1).len),
            ("_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_", _) => (1, 0, arg(0).len.max(arg(1).len)),
            ("size" | "has", _) => (1, 0, 0),
            ("range", _) if namespaced => {
                let n = match args.first().map(|a| &a.expr) {
                    Some(Expr::Literal(LiteralValue::Int(n))) => u64::try_from(*n.inner()).unwrap_or(0),
                    _ => UNBOUNDED,
                };
                (n, 1, n)
            }
            ("replace", Some(t)) => {
                let grown = t.len.saturating_mul(arg(1).len.saturating_add(1)).max(t.len);
                (grown, 0, grown)
            }
            ("matches", Some(t)) => (1, 0, t.len.saturating_mul(arg(0).len.max(1))),
            ("matches", None) => (1, 0, arg(0).len.saturating_mul(arg(1).len.max(1))),
            _ => {
                // What the call reads; `join` and `flatten` read every element of every entry.
                let flattens = matches!(name, "join" | "flatten");
                let magnitude = inputs.fold(0u64, |m, e| {
                    m.saturating_add(if flattens { e.len.saturating_mul(e.elem.max(1)) } else { e.len })
                });
                let elem = target.iter().chain(parts.iter()).map(|e| e.elem).max().unwrap_or(0);
                (magnitude.max(1), elem, magnitude)
            }
        };
        Ok(Est { cost: base.saturating_add(touched.div_ceil(10)), len, elem })
    }
}

#[cfg(test)]
mod tests {
    use kube_cel::cel::Program;

    use super::*;

    fn estimate(e: &str) -> Result<Estimate, Finding> {
        match Program::compile(e) {
            Ok(p) => analyze(p.expression()),
            Err(err) => Err(Finding::UnknownVariable(format!("does not parse: {err}"))),
        }
    }

    fn cost(e: &str) -> u64 {
        estimate(e).map_or(u64::MAX, |x| x.cost)
    }

    #[test]
    fn documented_selectors_are_cheap() {
        assert!(cost(r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0"#) < 100);
        assert!(cost(r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100")"#) < 100);
        assert!(cost("[1, 2, 3].all(x, x > 0)") < 100);
    }

    #[test]
    fn nested_comprehensions_over_literal_lists_multiply() {
        let list = format!("[{}]", (0..100).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
        let two = format!("{list}.all(a, {list}.all(b, a + b >= 0))");
        let three = format!("{list}.all(a, {list}.all(b, {list}.all(c, a + b + c >= 0)))");
        assert!(cost(&two) < MAX_COST, "{}", cost(&two));
        assert!(cost(&three) > MAX_COST, "{}", cost(&three));
        // Whitespace does not change the tree.
        assert_eq!(cost(&three.replace(".all(", ". all(")), cost(&three));
    }

    #[test]
    fn growing_strings_and_unbounded_ranges_cost_what_they_could_grow_to() {
        let chain = format!("device.driver{} != ''", ".replace('a', 'aaaaaaaaaa')".repeat(8));
        assert!(cost(&chain) > MAX_COST, "{}", cost(&chain));
        assert!(cost("device.driver.replace('a', 'b') != ''") < 100);
        assert!(cost("lists.range(10).all(i, i >= 0)") < 200);
        assert!(cost("lists.range(device.attributes['d'].n).all(i, i >= 0)") > MAX_COST);
    }

    #[test]
    fn identifiers_are_device_bound_variables_or_namespaces() {
        assert_eq!(estimate("node.name == 'x'"), Err(Finding::UnknownVariable("node".into())));
        assert!(estimate("[1].all(x, x > 0) && device.driver != ''").is_ok());
        assert_eq!(estimate("[1].all(x, x > 0) && x > 0"), Err(Finding::UnknownVariable("x".into())));
        for ok in ["sets.contains([1, 2], [1])", "math.greatest(1, 2) == 2", "lists.range(3).size() == 3"] {
            assert!(estimate(ok).is_ok(), "{ok}");
        }
        assert_eq!(estimate("nosuch.contains([1], [1])"), Err(Finding::UnknownVariable("nosuch".into())));
    }

    #[test]
    fn quantity_literals_are_range_checked() {
        assert!(
            matches!(estimate("quantity('1e400').isInteger()"), Err(Finding::BadQuantity(m)) if m.contains("out of range"))
        );
        assert!(estimate("quantity('80Gi').isInteger()").is_ok());
    }

    #[test]
    fn comprehension_depth_is_read_from_the_tree() {
        let e = "[1].all(x, [1]. all(y, [1].\nexists(z, z > 0)))";
        assert_eq!(estimate(e).map(|x| x.comprehension_depth), Ok(3));
    }
}
