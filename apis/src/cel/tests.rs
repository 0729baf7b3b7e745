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
    let nested = "[1,2].all(x, [1,2].all(y, [1,2].all(z, z > 0)))";
    assert!(matches!(engine.compile(nested), Err(SelectorError::TooCostly { depth: 3, .. })));
    assert!(engine.compile("[1,2].all(x, [1,2].all(y, y > 0))").is_ok());
    // Parentheses inside strings do not count.
    assert_eq!(comprehension_depth("device.driver == '.all(.all(.all('"), 0);
}
