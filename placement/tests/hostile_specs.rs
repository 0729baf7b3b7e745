//! One bad object harms only itself. Arbitrary specs (generated selectors built from hostile
//! fragments and random text, quantities of any size and sign, plus the cases found on
//! `main`: 55 nested parentheses, `1e400` capacities, `. all(` comprehensions, growing
//! `replace` chains) go through both roads to the solver: the one `fleetctl` takes (parse
//! with the CRD schema, `validate_set`, snapshot, solve) and the one the controller takes
//! (typed objects straight from the API server, no schema check, snapshot, solve). The
//! property: nothing panics or overflows the stack, the poison deployment is refused
//! (`invalid` naming its selector, or simply unplaced with a reason), and a healthy
//! deployment in the same snapshot is still placed in full. Rendering is not needed: it
//! writes selectors as text and never evaluates them.

use flotilla_apis::FleetObject;
use flotilla_apis::document::parse_stream;
use flotilla_apis::validate::validate_set;
use flotilla_placement::{FleetSnapshot, Plan, SolveOptions, solve};
use proptest::prelude::*;
use serde_json::{Value, json};

const HEALTHY: &str = r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0"#;

fn class(name: &str, memory: &str) -> Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": name},
        "spec": {"device": {"driver": "gpu.nvidia.com",
            "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}, "cc": {"version": "9.0.0"}},
            "capacity": {"memory": memory}},
        "devicesPerNode": 8, "provisioning": {"aws": {"instanceTypes": ["p5.48xlarge"]}},
        "pricePerNodeHour": {"onDemand": "98.32"}}})
}

fn cluster() -> Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": "eu-fra-1"},
        "spec": {"provider": {"aws": {"eksCluster": "fra", "region": "eu-central-1"}}, "region": "eu-central-1",
            "zones": ["eu-central-1a"], "jurisdiction": "EU", "country": "DE",
            "credentials": {"secretRef": {"namespace": "flotilla-system", "name": "k"}},
            "endpoint": "https://fra.example.com",
            "pools": [
                {"name": "good", "class": "good", "minNodes": 0, "maxNodes": 4, "nodes": 2, "capacityTypes": ["on-demand"]},
                {"name": "poison", "class": "poison", "minNodes": 0, "maxNodes": 4, "nodes": 2, "capacityTypes": ["on-demand"]}]}})
}

fn deployment(name: &str, selector: &str) -> Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"model": {"name": name, "source": "hf://org/model@main"}, "replicas": 2,
            "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
            "devices": {"alternatives": [{"selectors": [selector]}]}}})
}

/// The fleet: a healthy class and deployment next to a poison class and deployment.
fn fleet(poison_memory: &str, poison_selector: &str) -> Vec<Value> {
    vec![
        class("good", "80Gi"),
        class("poison", poison_memory),
        cluster(),
        deployment("healthy", &format!("device.attributes[\"gpu.nvidia.com\"].productName != '' && {HEALTHY}")),
        deployment("poison", poison_selector),
    ]
}

fn typed(v: &Value) -> Option<FleetObject> {
    Some(match v["kind"].as_str()? {
        "InferenceClass" => FleetObject::Class(serde_json::from_value(v.clone()).ok()?),
        "InferenceCluster" => FleetObject::Cluster(serde_json::from_value(v.clone()).ok()?),
        "ModelDeployment" => FleetObject::Deployment(serde_json::from_value(v.clone()).ok()?),
        _ => return None,
    })
}

fn check_plan(plan: &Plan, road: &str) -> Result<(), TestCaseError> {
    let healthy = plan.get("ml", "healthy");
    prop_assert!(
        healthy.is_some_and(|h| h.unplaced == 0 && h.invalid.is_none()),
        "{road}: healthy not placed: {healthy:?}"
    );
    if let Some(p) = plan.get("ml", "poison")
        && let Some(invalid) = &p.invalid
    {
        prop_assert!(invalid.field.starts_with("spec.devices.alternatives[0].selectors[0]"));
        prop_assert!(p.assignments.is_empty() && !invalid.message.is_empty());
    }
    Ok(())
}

/// Both roads; every step must return (a panic or a stack overflow fails the test run).
fn both_roads(poison_memory: &str, poison_selector: &str) -> Result<(), TestCaseError> {
    let docs = fleet(poison_memory, poison_selector);
    // fleetctl: JSON is YAML; the schema check and validate_set run first.
    let text = docs.iter().map(Value::to_string).collect::<Vec<_>>().join("\n---\n");
    let parsed = parse_stream("fleet.yaml", &text);
    let _problems = validate_set(&parsed.objects, &parsed.refused);
    let snapshot = FleetSnapshot::from_objects(parsed.objects.iter().map(|o| &o.value));
    let plan = solve(&snapshot, &SolveOptions::default());
    if parsed.objects.iter().filter(|o| o.value.name() == "healthy" || o.value.name() == "good").count() == 2 {
        check_plan(&plan, "fleetctl")?;
    }
    // The controller: typed objects as the API server stores them, no schema check.
    let objects: Vec<FleetObject> = docs.iter().filter_map(typed).collect();
    let plan = solve(&FleetSnapshot::from_objects(objects.iter()), &SolveOptions::default());
    check_plan(&plan, "controller")
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("(".to_string()),
        Just(")".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just("device".to_string()),
        Just(".attributes[\"gpu.nvidia.com\"]".to_string()),
        Just(".capacity[\"gpu.nvidia.com\"].memory".to_string()),
        Just(".productName".to_string()),
        Just(". all(x, ".to_string()),
        Just(".exists(y,".to_string()),
        Just(".compareTo(quantity(\"1e50\"))".to_string()),
        Just("quantity(\"80Gi\")".to_string()),
        Just(".replace('a', 'aaaaaaaaaa')".to_string()),
        Just("lists.range(1000000000)".to_string()),
        Just("sets.contains([1], [1])".to_string()),
        Just("math.bitShiftLeft(1, 200)".to_string()),
        Just(" == ".to_string()),
        Just(" && ".to_string()),
        Just(" + ".to_string()),
        Just(" ? ".to_string()),
        Just(" : ".to_string()),
        Just("'x'".to_string()),
        Just("1".to_string()),
        Just(",".to_string()),
        Just("\n".to_string()),
        Just("//".to_string()),
        "[a-z\"'(){}\\[\\].,!?<>=+*/%-]{1,4}",
    ]
}

fn selector() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(fragment(), 1..80).prop_map(|f| f.concat()),
        1 => "\\PC{0,120}",
        1 => (1usize..120).prop_map(|n| format!("{}true{}", "(".repeat(n), ")".repeat(n))),
        1 => (1usize..120).prop_map(|n| format!("device.driver{} != ''", ".replace('a', 'aaaaaaaaaa')".repeat(n % 20))),
        1 => (1usize..100).prop_map(|n| format!("1{} > 0", " + 1".repeat(n))),
    ]
}

fn quantity() -> impl Strategy<Value = String> {
    prop_oneof![
        "-?[0-9]{1,40}(\\.[0-9]{0,40})?(e-?[0-9]{1,4}|Ki|Mi|Gi|Ti|Ei|E|n|m|k)?",
        Just("1e400".to_string()),
        Just("-1Gi".to_string()),
        Just("-0".to_string()),
        Just("8Ei".to_string()),
        Just("80Gi".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_poison_deployment_or_class_harms_only_itself(memory in quantity(), sel in selector()) {
        both_roads(&memory, &sel)?;
        // The poison selector on the healthy class too: only the poison deployment is touched.
        both_roads("80Gi", &sel)?;
    }
}

#[test]
fn the_cases_found_on_main_harm_only_themselves() {
    let list = format!("[{}]", (0..100).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    let cases = [
        ("80Gi", format!("{}true{}", "(".repeat(55), ")".repeat(55))),
        ("1e400", HEALTHY.to_string()),
        ("1e50", HEALTHY.to_string()),
        ("123456789012345678901234567890123", HEALTHY.to_string()),
        ("-1Gi", HEALTHY.to_string()),
        ("-0", HEALTHY.to_string()),
        ("80Gi", format!("{list}. all(a, {list}. all(b, {list}. all(c, a + b + c >= 0)))")),
        ("80Gi", format!("device.driver{} != ''", ".replace('a','aaaaaaaaaa')".repeat(12))),
        ("80Gi", "sets.contains([1, 2], [1]) && math.greatest(1, 2) == 2".to_string()),
    ];
    for (memory, sel) in &cases {
        if let Err(e) = both_roads(memory, sel) {
            panic!("memory {memory}, selector {sel:.60}: {e}");
        }
    }
}

#[test]
fn the_poison_deployment_gets_an_invalid_spec_naming_its_selector() {
    let docs = fleet("80Gi", &format!("{}true{}", "(".repeat(55), ")".repeat(55)));
    let objects: Vec<FleetObject> = docs.iter().filter_map(typed).collect();
    let plan = solve(&FleetSnapshot::from_objects(objects.iter()), &SolveOptions::default());
    let poison = plan.get("ml", "poison").expect("poison is in the plan");
    let invalid = poison.invalid.as_ref().expect("poison is invalid");
    assert_eq!(invalid.field, "spec.devices.alternatives[0].selectors[0]");
    assert!(invalid.message.contains("levels deep at line 1"), "{}", invalid.message);
    assert_eq!((poison.unplaced, poison.assignments.len()), (2, 0));
    let healthy = plan.get("ml", "healthy").expect("healthy is in the plan");
    assert_eq!((healthy.unplaced, healthy.invalid.is_none()), (0, true));
}
