//! CEL device selectors in the DRA dialect. A selector is compiled once; a device shape (an
//! `InferenceClass` device) is turned into a CEL value once, by executing a map literal that
//! calls `quantity()` and `semver()`, so selectors see real quantities and versions:
//! `device.driver`, `device.attributes["gpu.nvidia.com"].productName`,
//! `device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0`.
//! A missing attribute is an evaluation error, as in Kubernetes; callers treat it as no match.
//! Every selector is bounded before and while it runs: its nesting is read from its tokens
//! before the parser sees it ([`lexical`]), its cost is estimated from its tree ([`cost`]),
//! and parsing and evaluation run behind [`guard`] (a stack of known size, caught panics,
//! checked `quantity()`/`replace()`/`lists.range()`).

mod cost;
mod guard;
mod lexical;

use std::fmt::Write as _;

use kube_cel::cel::{Context, ExecutionError, Program, Value};

pub use cost::{MAX_COST, NAMESPACED_FUNCTIONS};
pub(crate) use guard::evaluating;
pub use guard::{MAX_LIST_LEN, MAX_STRING_BYTES};
pub use lexical::MAX_NESTING;

use crate::common::{DeviceAttribute, DeviceSpec};

/// Longest selector accepted, as in DRA (10 KiB).
pub const MAX_SELECTOR_LEN: usize = 10 * 1024;
/// Deepest nesting of comprehensions (`all`, `exists`, `map`, `filter`) accepted, read from
/// the syntax tree. Device selectors need no more; the cost estimate bounds the rest.
pub const MAX_COMPREHENSION_DEPTH: usize = 2;

/// Why a selector cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// Longer than [`MAX_SELECTOR_LEN`].
    #[error("selector is {len} bytes long; the limit is {MAX_SELECTOR_LEN}: split it or simplify it")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Does not parse.
    #[error("selector does not compile at line {line}, column {column}: {message} (in `{expression}`)")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's words.
        message: String,
        /// The selector.
        expression: String,
    },
    /// Uses a variable other than `device`.
    #[error("selector uses unknown variable `{name}`; device selectors see only `device` (in `{expression}`)")]
    UnknownVariable {
        /// The variable.
        name: String,
        /// The selector.
        expression: String,
    },
    /// Nests deeper than [`MAX_NESTING`] (read from its tokens, before parsing).
    #[error(
        "selector nests {depth} levels deep at line {line}, column {column}; at most {MAX_NESTING} are allowed (brackets and chained operators): simplify it"
    )]
    TooDeep {
        /// Estimated depth where the limit was passed.
        depth: usize,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
    },
    /// Nests comprehensions deeper than [`MAX_COMPREHENSION_DEPTH`].
    #[error(
        "selector nests {depth} comprehensions; at most {MAX_COMPREHENSION_DEPTH} are allowed to bound its cost (in `{expression}`)"
    )]
    TooManyComprehensions {
        /// Nesting depth found.
        depth: usize,
        /// The selector.
        expression: String,
    },
    /// Its estimated cost passes [`MAX_COST`].
    #[error(
        "selector has an estimated cost of {cost}; the limit is {MAX_COST}, as in Kubernetes: iterate over fewer or smaller lists (in `{expression}`)"
    )]
    TooCostly {
        /// The estimate.
        cost: u64,
        /// The selector.
        expression: String,
    },
    /// A quantity Kubernetes could not hold (in a device capacity or a `quantity()` literal).
    #[error("{field}: {message}")]
    Quantity {
        /// Where: `spec.device.capacity.memory`, or the selector.
        field: String,
        /// Why.
        message: String,
    },
    /// A device outside DRA's bounds (entries per device, string length).
    #[error("{field}: {message}")]
    DeviceBounds {
        /// Where.
        field: String,
        /// Why.
        message: String,
    },
    /// The CEL library panicked on it (a bug there; reported, not fatal).
    #[error("the CEL library failed on this selector ({message}); simplify it (in `{expression}`)")]
    Panicked {
        /// The panic's message.
        message: String,
        /// The selector.
        expression: String,
    },
    /// Evaluated to something other than a bool.
    #[error("selector must return bool but returned {got} (in `{expression}`)")]
    NonBool {
        /// The value's type.
        got: String,
        /// The selector.
        expression: String,
    },
    /// Failed while evaluating (for instance a missing attribute).
    #[error("selector failed to evaluate: {message} (in `{expression}`)")]
    Evaluation {
        /// What went wrong.
        message: String,
        /// The selector.
        expression: String,
        /// Whether the failure was a missing map key (attribute or capacity not published).
        missing_key: bool,
    },
}

/// A compiled selector.
#[derive(Debug)]
pub struct Selector {
    expression: String,
    program: Program,
}

impl Selector {
    /// The selector's source text.
    pub fn expression(&self) -> &str {
        &self.expression
    }
}

/// Compiles selectors and device values against one context holding Kubernetes' CEL libraries.
pub struct SelectorEngine {
    base: Context<'static>,
}

impl std::fmt::Debug for SelectorEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SelectorEngine")
    }
}

impl Default for SelectorEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl SelectorEngine {
    /// An engine with the standard and Kubernetes CEL functions (the growing ones checked).
    pub fn new() -> Self {
        Self { base: guard::context() }
    }

    /// Compiles a selector, checking length, nesting (before parsing), syntax, variables,
    /// quantity literals and estimated cost.
    pub fn compile(&self, expression: &str) -> Result<Selector, SelectorError> {
        if expression.len() > MAX_SELECTOR_LEN {
            return Err(SelectorError::TooLong { len: expression.len() });
        }
        lexical::check_nesting(expression).map_err(|(depth, line, column)| SelectorError::TooDeep {
            depth,
            line,
            column,
        })?;
        let panicked = |message| SelectorError::Panicked { message, expression: expression.to_string() };
        let (program, estimate) = guard::compiling(|| {
            let program = Program::compile(expression)?;
            let estimate = cost::analyze(program.expression());
            Ok::<_, kube_cel::cel::ParseErrors>((program, estimate))
        })
        .map_err(panicked)?
        .map_err(|errs| {
            let first = errs.errors.first();
            SelectorError::Syntax {
                line: first.map_or(1, |e| e.pos.0.max(1) as usize),
                column: first.map_or(1, |e| e.pos.1.max(0) as usize + 1),
                message: first.map_or_else(|| "syntax error".to_string(), |e| e.msg.clone()),
                expression: expression.to_string(),
            }
        })?;
        let estimate = estimate.map_err(|finding| match finding {
            cost::Finding::UnknownVariable(name) => {
                SelectorError::UnknownVariable { name, expression: expression.to_string() }
            }
            cost::Finding::BadQuantity(message) => {
                SelectorError::Quantity { field: format!("quantity() in `{expression}`"), message }
            }
        })?;
        if estimate.comprehension_depth > MAX_COMPREHENSION_DEPTH {
            return Err(SelectorError::TooManyComprehensions {
                depth: estimate.comprehension_depth,
                expression: expression.to_string(),
            });
        }
        if estimate.cost > MAX_COST {
            return Err(SelectorError::TooCostly { cost: estimate.cost, expression: expression.to_string() });
        }
        Ok(Selector { expression: expression.to_string(), program })
    }

    /// Builds the CEL value of a device shape, with real quantities and versions. Capacities
    /// are range-checked and DRA's bounds enforced first, naming the field.
    pub fn device(&self, device: &DeviceSpec) -> Result<Value, SelectorError> {
        check_device(device)?;
        let literal = device_literal(device);
        let program = self.compile_internal(&literal)?;
        let panicked = |message| SelectorError::Panicked { message, expression: literal.clone() };
        guard::evaluating(|| program.execute(&self.base)).map_err(panicked)?.map_err(|e| SelectorError::Evaluation {
            message: e.to_string(),
            expression: literal.clone(),
            missing_key: false,
        })
    }

    fn compile_internal(&self, literal: &str) -> Result<Program, SelectorError> {
        let panicked = |message| SelectorError::Panicked { message, expression: literal.to_string() };
        guard::compiling(|| Program::compile(literal)).map_err(panicked)?.map_err(|e| SelectorError::Syntax {
            line: 1,
            column: 1,
            message: e.to_string(),
            expression: literal.to_string(),
        })
    }

    /// Evaluates a selector against a device value.
    pub fn matches(&self, selector: &Selector, device: &Value) -> Result<bool, SelectorError> {
        let run = || {
            let mut ctx = self.base.new_inner_scope();
            ctx.add_variable_from_value("device", device.clone());
            selector.program.execute(&ctx)
        };
        let panicked = |message| SelectorError::Panicked { message, expression: selector.expression.clone() };
        match guard::evaluating(run).map_err(panicked)? {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(SelectorError::NonBool {
                got: match other {
                    Value::Opaque(_) => {
                        "a quantity or version; compare it, e.g. `.compareTo(quantity(\"80Gi\")) >= 0`".to_string()
                    }
                    v => format!("{:?}", v.type_of()).to_lowercase(),
                },
                expression: selector.expression.clone(),
            }),
            Err(e) => Err(SelectorError::Evaluation {
                missing_key: matches!(e, ExecutionError::NoSuchKey(_)),
                message: e.to_string(),
                expression: selector.expression.clone(),
            }),
        }
    }
}

/// DRA's bounds on a device and Kubernetes' on its quantities, checked before the device is
/// described to CEL (the API server does not range-check quantities in custom resources).
pub fn check_device(device: &DeviceSpec) -> Result<(), SelectorError> {
    const MAX_ENTRIES: usize = 32;
    const MAX_STRING: usize = 64;
    for (field, n) in [("attributes", device.attributes.len()), ("capacity", device.capacity.len())] {
        if n > MAX_ENTRIES {
            return Err(SelectorError::DeviceBounds {
                field: format!("spec.device.{field}"),
                message: format!("has {n} entries; a DRA device has at most {MAX_ENTRIES}"),
            });
        }
    }
    for (name, attr) in &device.attributes {
        if let Some(s) = attr.string.as_ref().filter(|s| s.chars().count() > MAX_STRING) {
            return Err(SelectorError::DeviceBounds {
                field: format!("spec.device.attributes.{name}.string"),
                message: format!("is {} characters long; DRA allows at most {MAX_STRING}", s.chars().count()),
            });
        }
    }
    for (name, q) in &device.capacity {
        crate::quantity::check_non_negative(&q.0)
            .map_err(|message| SelectorError::Quantity { field: format!("spec.device.capacity.{name}"), message })?;
    }
    Ok(())
}

/// Splits `domain/name` into its parts; unqualified names belong to the driver's domain.
fn qualify<'a>(driver: &'a str, name: &'a str) -> (&'a str, &'a str) {
    match name.rsplit_once('/') {
        Some((domain, short)) => (domain, short),
        None => (driver, name),
    }
}

/// A CEL string literal for `s`.
pub fn cel_string(s: &str) -> String {
    // JSON string escaping is valid CEL string-literal escaping.
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

/// The CEL map literal that evaluates to a device value.
fn device_literal(device: &DeviceSpec) -> String {
    use std::collections::BTreeMap;
    let mut attrs: BTreeMap<&str, Vec<(&str, String)>> = BTreeMap::new();
    for (name, attr) in &device.attributes {
        let (domain, short) = qualify(&device.driver, name);
        attrs.entry(domain).or_default().push((short, attribute_literal(attr)));
    }
    let mut caps: BTreeMap<&str, Vec<(&str, String)>> = BTreeMap::new();
    for (name, q) in &device.capacity {
        let (domain, short) = qualify(&device.driver, name);
        caps.entry(domain).or_default().push((short, format!("quantity({})", cel_string(&q.0))));
    }
    let nested = |m: &BTreeMap<&str, Vec<(&str, String)>>| {
        let mut out = String::from("{");
        for (i, (domain, entries)) in m.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let _ = write!(out, "{}: {{", cel_string(domain));
            for (j, (k, v)) in entries.iter().enumerate() {
                if j > 0 {
                    out.push_str(", ");
                }
                let _ = write!(out, "{}: {v}", cel_string(k));
            }
            out.push('}');
        }
        out.push('}');
        out
    };
    format!(
        "{{\"driver\": {}, \"attributes\": {}, \"capacity\": {}}}",
        cel_string(&device.driver),
        nested(&attrs),
        nested(&caps)
    )
}

/// The CEL literal of a device attribute (`semver("9.0.0")` for versions).
pub fn attribute_literal(attr: &DeviceAttribute) -> String {
    if let Some(s) = &attr.string {
        cel_string(s)
    } else if let Some(i) = attr.int {
        i.to_string()
    } else if let Some(b) = attr.bool {
        b.to_string()
    } else if let Some(v) = &attr.version {
        format!("semver({})", cel_string(v))
    } else {
        "null".to_string()
    }
}

/// A CEL value (a compiled device), in the `cel` version kube-cel was built with.
pub use kube_cel::cel::Value as CelValue;

#[cfg(test)]
mod tests;
