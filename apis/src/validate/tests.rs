//! Unit tests of `validate_set`'s own steps, and the helpers the kinds' tests share: small
//! documents, parsed, and the problems one step reports on them.

use super::*;

pub(super) const CLASS: &str = r#"
apiVersion: flotilla.dev/v1alpha1
kind: InferenceClass
metadata: {name: h100}
spec:
  device:
    driver: gpu.nvidia.com
    attributes: {architecture: {string: Hopper}}
    capacity: {memory: 80Gi}
  devicesPerNode: 8
  pricePerNodeHour: {onDemand: "98.32"}
"#;

pub(super) const CLUSTER: &str = r#"
apiVersion: flotilla.dev/v1alpha1
kind: InferenceCluster
metadata: {name: eu-fra-1}
spec:
  provider: {aws: {eksCluster: inference-fra-1, region: eu-central-1}}
  region: eu-central-1
  jurisdiction: EU
  credentials: {secretRef: {namespace: flotilla-system, name: eu-fra-1-kubeconfig}}
  endpoint: https://inference.eu-fra-1.example.com
  pools:
  - {name: h100, class: h100, minNodes: 0, maxNodes: 4, nodes: 2, capacityTypes: [on-demand]}
"#;

/// One Standalone replica on the H100 class.
pub(super) const ONE_H100: &str =
    "  replicas: 1\n  topology: {type: Standalone, devicesPerReplica: 1}\n  devices: {alternatives: [{class: h100}]}";

/// A ModelDeployment `name` in namespace `ml` with `spec` (YAML flow mappings) after its model,
/// engine and a one-device topology.
pub(super) fn deployment(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: flotilla.dev/v1alpha1\nkind: ModelDeployment\nmetadata: {{name: {name}, namespace: ml}}\nspec:\n  model: {{name: {name}, source: \"hf://org/m\"}}\n  engine: {{image: \"vllm/vllm-openai:v0.11.0\"}}\n{spec}\n"
    )
}

/// The objects of YAML documents, each of which passes its own checks.
pub(super) fn parse(docs: &[&str]) -> Vec<Located<FleetObject>> {
    let p = crate::document::parse_stream("t.yaml", &docs.join("\n---\n"));
    assert!(p.problems.iter().all(|p| p.severity != Severity::Error), "{:#?}", p.problems);
    p.objects
}

/// The problems `check` reports with `obj` as the current object: (severity, field, message).
pub(super) fn reported<'a>(
    obj: &'a Located<FleetObject>,
    check: impl FnOnce(&mut Sink<'a>),
) -> Vec<(Severity, String, String)> {
    let mut sink = Sink { problems: Vec::new(), current: Some(obj) };
    check(&mut sink);
    sink.problems.into_iter().map(|p| (p.severity, p.field, p.message)).collect()
}

/// The fields of `problems`.
pub(super) fn fields(problems: &[(Severity, String, String)]) -> Vec<&str> {
    problems.iter().map(|p| p.1.as_str()).collect()
}

#[test]
fn an_adapter_name_is_no_other_deployments_model_alias_or_adapter() {
    let with = |name: &str, adapters: &str| {
        deployment(name, &format!("{ONE_H100}\n  adapters: {adapters}"))
            .replace("source: \"hf://org/m\"}", "source: \"hf://org/m\", aliases: [alias-b]}")
    };
    let objects = parse(&[
        CLASS,
        CLUSTER,
        &with("a", "[{name: b, cacheRef: c}, {name: own, cacheRef: c}, {name: shared, cacheRef: c}]"),
        &with("b", "[{name: shared, cacheRef: c}]"),
    ]);
    let mut sink = Sink { problems: Vec::new(), current: None };
    check_adapter_names(&mut sink, &objects);
    // (field, the deployment it clashes with): a's `b` and `shared`, then b's `shared`; a's `own` is fine.
    let got: Vec<(&str, bool)> =
        sink.problems.iter().map(|p| (p.field.as_str(), p.message.contains("ModelDeployment ml/b"))).collect();
    assert_eq!(
        got,
        vec![("spec.adapters[0].name", true), ("spec.adapters[2].name", true), ("spec.adapters[0].name", false)],
        "{:#?}",
        sink.problems
    );
}

#[test]
fn a_second_object_of_the_same_kind_and_name_is_a_duplicate() {
    let objects = parse(&[CLASS, CLASS, CLUSTER, &deployment("a", ONE_H100)]);
    let mut sink = Sink { problems: Vec::new(), current: None };
    check_duplicate_names(&mut sink, &objects);
    assert_eq!(sink.problems.len(), 1, "{:#?}", sink.problems);
    let p = &sink.problems[0];
    assert_eq!((p.field.as_str(), p.object.as_deref()), ("metadata.name", Some("InferenceClass h100")));
    assert!(p.message.starts_with("duplicate name: already defined at t.yaml"), "{}", p.message);
}

#[test]
fn classes_are_described_once_and_one_without_a_price_is_warned_about() {
    let free = CLASS.replace("name: h100}", "name: free}").replace("pricePerNodeHour: {onDemand: \"98.32\"}", "");
    let bad = CLASS.replace("name: h100}", "name: bad}").replace("80Gi", "-1Gi");
    let objects = parse(&[CLASS, &free, &bad, CLUSTER]);
    let engine = SelectorEngine::new();
    let mut sink = Sink { problems: Vec::new(), current: None };
    let classes = describe_classes(&mut sink, &objects, &engine);
    assert_eq!(classes.keys().copied().collect::<Vec<_>>(), vec!["bad", "free", "h100"]);
    assert!(classes["h100"].is_some() && classes["free"].is_some());
    assert!(classes["bad"].is_none(), "a device CEL cannot describe");
    let said: Vec<(Severity, &str)> = sink.problems.iter().map(|p| (p.severity, p.field.as_str())).collect();
    assert!(said.contains(&(Severity::Warning, "spec.pricePerNodeHour")), "{said:?}");
    assert!(said.iter().any(|(s, f)| *s == Severity::Error && f.starts_with("spec.device")), "{said:?}");
}

#[test]
fn the_set_indexes_what_references_look_up() {
    let cache = "apiVersion: flotilla.dev/v1alpha1\nkind: ModelCache\nmetadata: {name: w, namespace: ml}\nspec:\n  source: hf://org/m\n  size: 16G\n  targets: {deployments: [a]}";
    let objects = parse(&[CLASS, CLUSTER, &deployment("a", ONE_H100), cache]);
    let engine = SelectorEngine::new();
    let classes = describe_classes(&mut Sink { problems: Vec::new(), current: None }, &objects, &engine);
    let refused = [(Kind::InferenceClass, None, "gone".to_string()), (Kind::ModelCache, None, "c".to_string())];
    let set = Set::of(&objects, &refused, &classes);
    assert_eq!(set.per_node.get("h100"), Some(&8));
    assert!(set.jurisdictions.contains("EU"));
    assert_eq!(set.cluster_labels.len(), 1);
    assert_eq!(set.cluster_labels[0].0, "eu-fra-1");
    assert!(set.deployments.contains(&("ml", "a")) && set.caches.contains(&("ml", "w")));
    assert!(set.known_class("h100") && set.known_class("gone"), "a refused class is known");
    assert!(!set.known_class("a100"));
    assert!(set.unknown_class("a100").contains("defined here: [h100]"), "{}", set.unknown_class("a100"));
    // A refused document without a namespace counts as `default`'s.
    assert!(set.refused_named(Kind::ModelCache, Some("default"), "c"));
    assert!(!set.refused_named(Kind::ModelCache, Some("ml"), "c"));
    assert!(set.refused_named(Kind::ModelCache, None, "c"));
}

#[test]
fn deployments_sharing_a_model_name_without_weights_are_warned_about() {
    let model = |name: &str, weight: &str| {
        deployment(name, &format!("{ONE_H100}{weight}"))
            .replace(&format!("model: {{name: {name},"), "model: {name: shared,")
    };
    let weighted = "\n  routing: {weight: 50}";
    let objects = parse(&[&model("a", ""), &model("b", weighted), &model("c", "")]);
    let mut sink = Sink { problems: Vec::new(), current: None };
    check_shared_model_names(&mut sink, &objects);
    let warned: Vec<Option<&str>> = sink.problems.iter().map(|p| p.object.as_deref()).collect();
    assert_eq!(warned, vec![Some("ModelDeployment ml/a"), Some("ModelDeployment ml/c")], "only those without a weight");
    assert!(
        sink.problems[0].message.contains("served by ModelDeployment ml/a, ModelDeployment ml/b, ModelDeployment ml/c")
    );
    // All weighted: nothing to say.
    let objects = parse(&[&model("a", weighted), &model("b", weighted)]);
    let mut sink = Sink { problems: Vec::new(), current: None };
    check_shared_model_names(&mut sink, &objects);
    assert!(sink.problems.is_empty());
}

#[test]
fn a_long_list_of_names_is_cut_and_counted() {
    let names: Vec<String> = (0..8).map(|i| format!("d{i}")).collect();
    assert_eq!(first_of(&names[..5], 5), "d0, d1, d2, d3, d4");
    assert_eq!(first_of(&names, 5), "d0, d1, d2, d3, d4 and 3 more");
}

#[test]
fn a_capacity_type_listed_twice_is_a_duplicate() {
    use CapacityType::*;
    assert!(!has_duplicates(&[Reserved, OnDemand, Spot]));
    assert!(has_duplicates(&[Spot, OnDemand, Spot]));
    assert!(!has_duplicates(&[]));
}
