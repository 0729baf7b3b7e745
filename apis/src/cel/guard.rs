//! The boundary around the third-party CEL parser and evaluator. Each call runs on a stack
//! of known size (grown with `stacker` when the caller's, a 2 MiB Tokio worker's for
//! instance, has less left), so the nesting [`super::lexical`] lets through always fits; a
//! panic inside it is caught and becomes that selector's error. At run time the functions
//! that can make values grow or overflow are replaced by checked versions that refuse
//! before calling kube-cel's own: `quantity()` range-checks its argument (a quantity from a
//! device attribute never reaches kube-cel's arithmetic out of range), `replace()` refuses a
//! result longer than [`MAX_STRING_BYTES`], and `lists.range()` a list longer than
//! [`MAX_LIST_LEN`].

use std::any::Any;
use std::sync::Arc;

use kube_cel::KubeCelExt;
use kube_cel::cel::extractors::{Arguments, This};
use kube_cel::cel::{Context, FunctionContext, Program, ResolveResult, Value};

/// Longest string a selector may build at run time.
pub const MAX_STRING_BYTES: usize = 64 * 1024;
/// Longest list `lists.range` may build at run time.
pub const MAX_LIST_LEN: i64 = 100_000;
/// Stack for parsing and analysing a selector: enough for [`super::lexical::MAX_NESTING`]
/// levels of the generated parser in a debug build (about 170 KiB per bracket there).
const COMPILE_STACK: usize = 16 * 1024 * 1024;
/// Stack for evaluating one (about 40 KiB per level in a debug build, so 32 levels need
/// under 2 MiB): a fresh one only when less than [`EVAL_RED_ZONE`] is left, so the common
/// case on a main thread costs no allocation.
const EVAL_STACK: usize = 8 * 1024 * 1024;
/// Stack an evaluation must find left to run where it is.
const EVAL_RED_ZONE: usize = 4 * 1024 * 1024;

/// Runs `f` (a parse) on a stack of [`COMPILE_STACK`] bytes; a panic becomes `Err(message)`.
pub fn compiling<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    on_stack(COMPILE_STACK, COMPILE_STACK, f)
}

/// Runs `f` (an evaluation) with at least [`EVAL_RED_ZONE`] bytes of stack; a panic becomes `Err(message)`.
pub fn evaluating<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    on_stack(EVAL_RED_ZONE, EVAL_STACK, f)
}

fn on_stack<T>(red_zone: usize, size: usize, f: impl FnOnce() -> T) -> Result<T, String> {
    stacker::maybe_grow(red_zone, size, || std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)))
        .map_err(|payload| panic_message(payload.as_ref()))
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Kubernetes' CEL libraries with the growing functions replaced by checked ones.
pub fn context() -> Context<'static> {
    let mut ctx = Context::default().with_all();
    ctx.add_function("quantity", checked_quantity);
    ctx.add_function("replace", checked_replace);
    ctx.add_function("lists.range", checked_range);
    ctx
}

/// kube-cel's own functions, called by the checked ones once their arguments are safe.
struct Raw {
    ctx: Context<'static>,
    quantity: Option<Program>,
    replace: Option<Program>,
    replace_n: Option<Program>,
    range: Option<Program>,
}

thread_local! {
    static RAW: Raw = Raw {
        ctx: Context::default().with_all(),
        quantity: Program::compile("quantity(a)").ok(),
        replace: Program::compile("t.replace(a, b)").ok(),
        replace_n: Program::compile("t.replace(a, b, n)").ok(),
        range: Program::compile("lists.range(n)").ok(),
    };
}

fn delegate(ftx: &FunctionContext, pick: fn(&Raw) -> &Option<Program>, vars: Vec<(&str, Value)>) -> ResolveResult {
    RAW.with(|raw| {
        let Some(program) = pick(raw) else { return Err(ftx.error("internal: the library call did not compile")) };
        let mut ctx = raw.ctx.new_inner_scope();
        for (name, value) in vars {
            ctx.add_variable_from_value(name, value);
        }
        program.execute(&ctx)
    })
}

fn checked_quantity(ftx: &FunctionContext, text: Arc<String>) -> ResolveResult {
    crate::quantity::check(&text).map_err(|m| ftx.error(m))?;
    delegate(ftx, |r| &r.quantity, vec![("a", Value::String(text))])
}

fn checked_replace(
    ftx: &FunctionContext,
    This(target): This<Arc<String>>,
    Arguments(args): Arguments,
) -> ResolveResult {
    let (Some(Value::String(from)), Some(Value::String(to))) = (args.first(), args.get(1)) else {
        return Err(ftx.error("replace takes two strings (and an optional count)"));
    };
    let count = match args.get(2) {
        Some(Value::Int(n)) if *n >= 0 => *n as usize,
        _ => usize::MAX,
    };
    let occurrences = if from.is_empty() { target.chars().count() + 1 } else { target.matches(from.as_str()).count() };
    let grown = to.len().saturating_sub(from.len()).saturating_mul(occurrences.min(count));
    if target.len().saturating_add(grown) > MAX_STRING_BYTES {
        return Err(ftx.error(format!(
            "replace would build a string of more than {MAX_STRING_BYTES} bytes; selectors are bounded"
        )));
    }
    let mut vars = vec![("t", Value::String(target)), ("a", args[0].clone()), ("b", args[1].clone())];
    match args.get(2) {
        Some(n) => {
            vars.push(("n", n.clone()));
            delegate(ftx, |r| &r.replace_n, vars)
        }
        None => delegate(ftx, |r| &r.replace, vars),
    }
}

fn checked_range(ftx: &FunctionContext, n: i64) -> ResolveResult {
    if n > MAX_LIST_LEN {
        return Err(
            ftx.error(format!("lists.range({n}) is longer than {MAX_LIST_LEN} elements; selectors are bounded"))
        );
    }
    delegate(ftx, |r| &r.range, vec![("n", Value::Int(n))])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(e: &str) -> ResolveResult {
        let ctx = context();
        match Program::compile(e) {
            Ok(p) => p.execute(&ctx),
            Err(err) => Err(kube_cel::cel::ExecutionError::function_error("compile", err)),
        }
    }

    #[test]
    fn checked_functions_refuse_what_would_overflow_or_grow() {
        assert!(
            run("quantity('1e50').compareTo(quantity('1n')) > 0")
                .is_err_and(|e| e.to_string().contains("out of range"))
        );
        let grow = format!("'{}'.replace('a', 'aaaaaaaaaa') != ''", "a".repeat(8000));
        assert!(run(&grow).is_err_and(|e| e.to_string().contains("more than 65536 bytes")));
        assert!(run("lists.range(100000000).size() > 0").is_err_and(|e| e.to_string().contains("longer than")));
    }

    #[test]
    fn checked_functions_still_do_their_job() {
        assert_eq!(run("quantity('80Gi').compareTo(quantity('40Gi')) > 0").ok(), Some(Value::Bool(true)));
        assert_eq!(run("'abca'.replace('a', 'x')").ok(), Some(Value::String(Arc::new("xbcx".into()))));
        assert_eq!(run("'abca'.replace('a', 'x', 1)").ok(), Some(Value::String(Arc::new("xbca".into()))));
        assert_eq!(run("lists.range(3).size()").ok(), Some(Value::Int(3)));
    }

    /// kube-cel's own quantity, unchecked, overflows on values Kubernetes cannot hold: the
    /// panic (debug builds check arithmetic) is caught at the boundary and named.
    #[cfg(debug_assertions)]
    #[test]
    fn a_real_panic_inside_kube_cel_is_caught() {
        let raw = Context::default().with_all();
        let program = Program::compile("quantity('1e50').compareTo(quantity('1n')) > 0").expect("compiles");
        let caught = evaluating(|| program.execute(&raw).is_ok());
        assert!(caught.is_err_and(|m| m.contains("overflow")), "kube-cel's overflow was not caught");
    }

    #[test]
    fn a_panic_is_caught_and_named() {
        let caught = evaluating(|| -> u32 { panic!("boom") });
        assert_eq!(caught, Err("boom".to_string()));
        assert_eq!(compiling(|| 7), Ok(7));
    }
}
