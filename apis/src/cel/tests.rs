use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;

fn h100() -> DeviceSpec {
    let mut attributes = BTreeMap::new();
    attributes.insert(
        "productName".to_string(),
        DeviceAttribute { string: Some("NVIDIA H100 80GB HBM3".into()), ..Default::default() },
    );
    attributes.insert(
        "computeCapability".to_string(),
        DeviceAttribute { version: Some("9.0.0".into()), ..Default::default() },
    );
    attributes.insert("nvlink".to_string(), DeviceAttribute { bool: Some(true), ..Default::default() });
    attributes.insert("example.com/rack".to_string(), DeviceAttribute { int: Some(7), ..Default::default() });
    let mut capacity = BTreeMap::new();
    capacity.insert("memory".to_string(), Quantity("80Gi".into()));
    DeviceSpec { driver: "gpu.nvidia.com".into(), attributes, capacity }
}

fn eval(expr: &str, device: &DeviceSpec) -> Result<bool, SelectorError> {
    let engine = SelectorEngine::new();
    let sel = engine.compile(expr)?;
    let dev = engine.device(device)?;
    engine.matches(&sel, &dev)
}

#[test]
fn quantity_comparison_matches_and_its_twin_does_not() {
    let e = r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0"#;
    assert_eq!(eval(e, &h100()), Ok(true));
    let e = r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("141Gi")) >= 0"#;
    assert_eq!(eval(e, &h100()), Ok(false));
}

#[test]
fn attributes_strings_versions_bools_and_qualified_domains() {
    let d = h100();
    assert_eq!(eval(r#"device.driver == "gpu.nvidia.com""#, &d), Ok(true));
    assert_eq!(eval(r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100")"#, &d), Ok(true));
    assert_eq!(eval(r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA A100")"#, &d), Ok(false));
    assert_eq!(
        eval(r#"device.attributes["gpu.nvidia.com"].computeCapability.isGreaterThan(semver("8.9.0"))"#, &d),
        Ok(true)
    );
    assert_eq!(
        eval(r#"device.attributes["gpu.nvidia.com"].computeCapability.isGreaterThan(semver("9.1.0"))"#, &d),
        Ok(false)
    );
    assert_eq!(eval(r#"device.attributes["gpu.nvidia.com"].nvlink"#, &d), Ok(true));
    assert_eq!(eval(r#"device.attributes["example.com"].rack == 7"#, &d), Ok(true));
}

#[test]
fn missing_attribute_is_an_evaluation_error_flagged_as_missing_key() {
    match eval(r#"device.attributes["gpu.nvidia.com"].nosuch == "x""#, &h100()) {
        Err(SelectorError::Evaluation { missing_key, .. }) => assert!(missing_key),
        other => panic!("expected a missing-key evaluation error, got {other:?}"),
    }
}

#[test]
fn non_bool_result_is_refused() {
    match eval(r#"device.capacity["gpu.nvidia.com"].memory"#, &h100()) {
        Err(SelectorError::NonBool { .. }) => {}
        other => panic!("expected NonBool, got {other:?}"),
    }
    assert!(matches!(eval("1 + 2", &h100()), Err(SelectorError::NonBool { .. })));
}

#[test]
fn syntax_error_reports_position() {
    let engine = SelectorEngine::new();
    match engine.compile("device.driver == ") {
        Err(SelectorError::Syntax { line, column, .. }) => {
            assert_eq!(line, 1);
            assert!(column > 1, "column {column} should point into the expression");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn only_device_is_a_variable() {
    let engine = SelectorEngine::new();
    assert!(matches!(engine.compile("node.name == 'x'"), Err(SelectorError::UnknownVariable { .. })));
    assert!(engine.compile("device.driver == 'x'").is_ok());
}

#[test]
fn length_and_nesting_limits() {
    let engine = SelectorEngine::new();
    let long = format!("device.driver == '{}'", "a".repeat(MAX_SELECTOR_LEN));
    assert!(matches!(engine.compile(&long), Err(SelectorError::TooLong { .. })));
    let nested = "[1,2].all(x, [1,2].all(y, [1,2]. all(z, z > 0)))";
    assert!(matches!(engine.compile(nested), Err(SelectorError::TooManyComprehensions { depth: 3, .. })));
    assert!(engine.compile("[1,2].all(x, [1,2].all(y, y > 0))").is_ok());
    // Parentheses inside strings do not count.
    assert!(engine.compile("device.driver == '.all(.all(.all('").is_ok());
}

#[test]
fn deep_nesting_is_refused_before_parsing_even_on_a_small_stack() {
    // A Tokio worker's 2 MiB stack died at ~16 levels before the pre-parse check.
    let deep = format!("{}true{}", "(".repeat(55), ")".repeat(55));
    let got = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || SelectorEngine::new().compile(&deep).err())
        .map(|h| h.join().ok().flatten());
    match got {
        Ok(Some(SelectorError::TooDeep { depth, line, column })) => {
            assert_eq!((depth, line), (MAX_NESTING + 1, 1));
            assert!(column > 1);
        }
        other => panic!("expected TooDeep, got {other:?}"),
    }
}

#[test]
fn allowed_nesting_compiles_and_runs_on_a_small_stack() {
    // Just inside the limit: parsing it needs far more than 2 MiB in a debug build.
    let e = format!("{}device.driver == 'gpu.nvidia.com'{}", "(".repeat(MAX_NESTING - 4), ")".repeat(MAX_NESTING - 4));
    let ok =
        std::thread::Builder::new().stack_size(2 * 1024 * 1024).spawn(move || eval(&e, &h100())).map(|h| h.join().ok());
    assert_eq!(ok.ok().flatten(), Some(Ok(true)));
}

#[test]
fn costly_selectors_are_refused_with_their_cost() {
    let engine = SelectorEngine::new();
    let list = format!("[{}]", (0..100).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    let e = format!("{list}.all(a, {list}.all(b, a + b >= 0)) && {list}.all(a, {list}.exists(b, a == b))");
    assert!(engine.compile(&e).is_ok(), "two levels of 100 cost about 20,000 each");
    let chain = format!("device.driver{} != ''", ".replace('a', 'aaaaaaaaaa')".repeat(8));
    match engine.compile(&chain) {
        Err(SelectorError::TooCostly { cost, .. }) => assert!(cost > MAX_COST),
        other => panic!("expected TooCostly, got {other:?}"),
    }
}

#[test]
fn namespaced_library_functions_work() {
    let d = h100();
    assert_eq!(eval("sets.contains([1, 2, 3], [1, 2])", &d), Ok(true));
    assert_eq!(eval("math.greatest(1, 5, 3) == 5", &d), Ok(true));
    assert_eq!(eval("lists.range(4).size() == 4", &d), Ok(true));
    assert_eq!(eval("strings.quote('a') != ''", &d), Ok(true));
}

#[test]
fn capacities_kubernetes_cannot_hold_are_refused_naming_the_field() {
    for (q, why) in [("1e400", "out of range"), ("1e50", "out of range"), ("-1Gi", "negative"), ("-0", "negative")] {
        let mut d = h100();
        d.capacity.insert("memory".into(), Quantity(q.into()));
        match SelectorEngine::new().device(&d) {
            Err(SelectorError::Quantity { field, message }) => {
                assert_eq!(field, "spec.device.capacity.memory");
                assert!(message.contains(why), "{q}: {message}");
            }
            other => panic!("{q}: expected a quantity error, got {other:?}"),
        }
    }
    // The documented selector against a literal Kubernetes cannot hold is refused too.
    let e = r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("1e50")) >= 0"#;
    assert!(matches!(SelectorEngine::new().compile(e), Err(SelectorError::Quantity { .. })));
}

#[test]
fn a_quantity_built_at_run_time_is_range_checked_too() {
    let mut d = h100();
    d.attributes.insert("huge".into(), DeviceAttribute { string: Some("1e50".into()), ..Default::default() });
    let e = r#"quantity(device.attributes["gpu.nvidia.com"].huge).compareTo(quantity("1n")) > 0"#;
    match eval(e, &d) {
        Err(SelectorError::Evaluation { message, .. }) => assert!(message.contains("out of range"), "{message}"),
        other => panic!("expected an evaluation error, got {other:?}"),
    }
}
