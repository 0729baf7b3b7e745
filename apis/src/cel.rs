//! CEL device selectors in the DRA dialect. A selector is compiled once; a device shape (an
//! `InferenceClass` device) is turned into a CEL value once, by executing a map literal that
//! calls `quantity()` and `semver()`, so selectors see real quantities and versions:
//! `device.driver`, `device.attributes["gpu.nvidia.com"].productName`,
//! `device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0`.
//! A missing attribute is an evaluation error, as in Kubernetes; callers treat it as no match.

use std::fmt::Write as _;

use kube_cel::KubeCelExt;
use kube_cel::cel::{Context, ExecutionError, Program, Value};

use crate::common::{DeviceAttribute, DeviceSpec};

/// Longest selector accepted, as in DRA (10 KiB).
pub const MAX_SELECTOR_LEN: usize = 10 * 1024;
/// Deepest nesting of comprehensions (`all`, `exists`, `map`, `filter`) accepted. Device maps
/// are small, so this bounds evaluation cost the way Kubernetes' cost budget does.
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
    /// Nests comprehensions deeper than [`MAX_COMPREHENSION_DEPTH`].
    #[error(
        "selector nests {depth} comprehensions; at most {MAX_COMPREHENSION_DEPTH} are allowed to bound its cost (in `{expression}`)"
    )]
    TooCostly {
        /// Nesting depth found.
        depth: usize,
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
    /// An engine with the standard and Kubernetes CEL functions.
    pub fn new() -> Self {
        Self { base: Context::default().with_all() }
    }

    /// Compiles a selector, checking length, syntax, variables and nesting.
    pub fn compile(&self, expression: &str) -> Result<Selector, SelectorError> {
        if expression.len() > MAX_SELECTOR_LEN {
            return Err(SelectorError::TooLong { len: expression.len() });
        }
        let program = Program::compile(expression).map_err(|errs| {
            let first = errs.errors.first();
            SelectorError::Syntax {
                line: first.map_or(1, |e| e.pos.0.max(1) as usize),
                column: first.map_or(1, |e| e.pos.1.max(0) as usize + 1),
                message: first.map_or_else(|| "syntax error".to_string(), |e| e.msg.clone()),
                expression: expression.to_string(),
            }
        })?;
        let depth = comprehension_depth(expression);
        if depth > MAX_COMPREHENSION_DEPTH {
            return Err(SelectorError::TooCostly { depth, expression: expression.to_string() });
        }
        let bound = comprehension_variables(expression);
        if let Some(name) =
            program.references().variables().into_iter().find(|v| *v != "device" && !bound.iter().any(|b| b == v))
        {
            return Err(SelectorError::UnknownVariable { name: name.to_string(), expression: expression.to_string() });
        }
        Ok(Selector { expression: expression.to_string(), program })
    }

    /// Builds the CEL value of a device shape, with real quantities and versions.
    pub fn device(&self, device: &DeviceSpec) -> Result<Value, SelectorError> {
        let literal = device_literal(device);
        let program = self.compile_internal(&literal)?;
        program.execute(&self.base).map_err(|e| SelectorError::Evaluation {
            message: e.to_string(),
            expression: literal.clone(),
            missing_key: false,
        })
    }

    fn compile_internal(&self, literal: &str) -> Result<Program, SelectorError> {
        Program::compile(literal).map_err(|e| SelectorError::Syntax {
            line: 1,
            column: 1,
            message: e.to_string(),
            expression: literal.to_string(),
        })
    }

    /// Evaluates a selector against a device value.
    pub fn matches(&self, selector: &Selector, device: &Value) -> Result<bool, SelectorError> {
        let mut ctx = self.base.new_inner_scope();
        ctx.add_variable_from_value("device", device.clone());
        match selector.program.execute(&ctx) {
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

/// Names bound by comprehension macros (`x` in `list.all(x, x > 0)`).
fn comprehension_variables(expression: &str) -> Vec<String> {
    static RE: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(r"\.(?:all|exists|exists_one|existsOne|map|filter)\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,").ok()
    });
    re.as_ref()
        .map(|re| re.captures_iter(expression).filter_map(|c| c.get(1)).map(|m| m.as_str().to_string()).collect())
        .unwrap_or_default()
}

/// Nesting depth of comprehension macros, counted on the text outside string literals.
fn comprehension_depth(expression: &str) -> usize {
    const MACROS: [&str; 6] = [".all(", ".exists(", ".exists_one(", ".map(", ".filter(", ".existsOne("];
    let bytes = expression.as_bytes();
    let mut stack: Vec<bool> = Vec::new(); // one entry per open paren: is it a comprehension?
    let (mut depth, mut max) = (0usize, 0usize);
    let mut i = 0;
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let b = bytes[i];
        if let Some(q) = quote {
            if b == b'\\' {
                i += 2;
                continue;
            }
            if b == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        match b {
            b'"' | b'\'' => quote = Some(b),
            b'(' => {
                let is_macro = MACROS.iter().any(|m| expression[..=i].ends_with(m));
                if is_macro {
                    depth += 1;
                    max = max.max(depth);
                }
                stack.push(is_macro);
            }
            b')' if stack.pop() == Some(true) => {
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        i += 1;
    }
    max
}

/// A CEL value (a compiled device), in the `cel` version kube-cel was built with.
pub use kube_cel::cel::Value as CelValue;

#[cfg(test)]
mod tests;
