//! The checks of a ModelDeployment against the set (`validate_set`): its alternatives (known
//! classes, selectors, minimums that add up), its cache, its placement (capacity types,
//! jurisdictions, regions, label selector, claim template), whether a pod fits a node of the
//! classes it may use, its routing and its roles.

use std::collections::BTreeMap;

use super::selectors::{SelectorChecker, check_label_selector, check_selects_some};
use super::{Kind, Set, Sink, has_duplicates};
use crate::ModelDeploymentSpec;
use crate::deployment::PlacementPolicy;

/// Every check of one ModelDeployment (the sink's current object) in namespace `ns`, in the
/// order its problems are reported.
pub(super) fn check_deployment<'e>(
    sink: &mut Sink<'_>,
    s: &'e ModelDeploymentSpec,
    ns: &str,
    set: &Set<'_>,
    selectors: &mut SelectorChecker<'e>,
) {
    check_alternatives(sink, s, set, selectors);
    check_cache_ref(sink, s, ns, set);
    if has_duplicates(&s.placement.capacity_types) {
        sink.error("spec.placement.capacityTypes", "lists a capacity type twice");
    }
    check_jurisdictions(sink, &s.placement, set);
    check_fit_deployment(sink, s, &set.per_node);
    if let Some(sel) = &s.placement.cluster_selector {
        check_label_selector(sink, "spec.placement.clusterSelector", sel);
        check_selects_some(sink, "spec.placement.clusterSelector", sel, &set.cluster_labels);
    }
    if let Some(t) = &s.placement.capacity_claim_template
        && has_duplicates(&t.capacity_types)
    {
        sink.error("spec.placement.capacityClaimTemplate.capacityTypes", "lists a capacity type twice");
    }
    check_regions(sink, &s.placement);
    check_routing_and_roles(sink, s);
    check_adapters(sink, s, ns, set);
}

/// A warning when the adapter's ModelCache selects, by its own `spec.targets.clusterSelector`,
/// clusters the adapter may not be served in: its files are copied there all the same.
fn check_adapter_cache_targets(
    sink: &mut Sink<'_>,
    a: &crate::deployment::Adapter,
    base: &crate::common::Sovereignty,
    cache: (&str, &str),
    field: &str,
    set: &Set<'_>,
) {
    let Some(sel) = set.cache_selectors.get(&cache) else { return };
    let outside: Vec<&str> = set
        .cluster_labels
        .iter()
        .filter(|(name, labels)| {
            crate::selector::selector_matches(sel, labels).is_ok()
                && set.places.get(name).is_some_and(|(j, r)| a.outside_policy(base, j, r, labels).is_some())
        })
        .map(|(name, _)| *name)
        .collect();
    if !outside.is_empty() {
        sink.warn(
            format!("{field}.cacheRef"),
            format!(
                "ModelCache {}/{}'s spec.targets.clusterSelector selects {}, where adapter `{}` may not be served: its files are staged there all the same; narrow the cache's selector, or target the cache by spec.targets.deployments only (it then stages only where the adapter may be served)",
                cache.0,
                cache.1,
                outside.join(", "),
                a.name
            ),
        );
    }
}

/// Each adapter has its own name (not the model's, an alias, or another adapter's), a verified
/// cache of the set, and a policy within the deployment's.
fn check_adapters(sink: &mut Sink<'_>, s: &ModelDeploymentSpec, ns: &str, set: &Set<'_>) {
    let base = s.placement.sovereignty.clone().unwrap_or_default();
    for (i, a) in s.adapters.iter().enumerate() {
        let field = format!("spec.adapters[{i}]");
        if a.name == s.model.name || s.model.aliases.contains(&a.name) {
            sink.error(
                format!("{field}.name"),
                format!("`{}` is the model's name or an alias: give the adapter a name of its own", a.name),
            );
        }
        if s.adapters[..i].iter().any(|b| b.name == a.name) {
            sink.error(format!("{field}.name"), format!("adapter `{}` is listed twice", a.name));
        }
        let cache = (ns, a.cache_ref.as_str());
        if set.unverified_caches.contains(&cache) {
            sink.error(
                format!("{field}.cacheRef"),
                format!(
                    "ModelCache {ns}/{} gives no spec.digest: adapters are loaded only from verified files; add the digest",
                    a.cache_ref
                ),
            );
        } else if !set.caches.contains(&cache) && !set.refused_named(Kind::ModelCache, Some(ns), &a.cache_ref) {
            sink.error(
                format!("{field}.cacheRef"),
                format!("no ModelCache {ns}/{} in this set: add it or fix cacheRef", a.cache_ref),
            );
        }
        if let Some((path, message)) = a.wider_than(&base) {
            sink.error(format!("{field}.{path}"), message);
        } else {
            check_adapter_cache_targets(sink, a, &base, cache, &field, set);
        }
        if let Some(sel) = &a.cluster_selector {
            check_label_selector(sink, &format!("{field}.clusterSelector"), sel);
            check_selects_some(sink, &format!("{field}.clusterSelector"), sel, &set.cluster_labels);
        }
    }
}

/// Each alternative's class is known and its selectors can run; the minimums add up to at
/// most `replicas`.
fn check_alternatives<'e>(
    sink: &mut Sink<'_>,
    s: &'e ModelDeploymentSpec,
    set: &Set<'_>,
    selectors: &mut SelectorChecker<'e>,
) {
    let mut min_sum: i64 = 0;
    for (i, alt) in s.devices.alternatives.iter().enumerate() {
        let field = format!("spec.devices.alternatives[{i}]");
        if let Some(class) = &alt.class
            && !set.known_class(class)
        {
            sink.error(format!("{field}.class"), set.unknown_class(class));
        }
        min_sum += i64::from(alt.min_replicas.unwrap_or(0));
        selectors.check(sink, &field, alt.class.as_deref(), &alt.selectors);
    }
    if min_sum > i64::from(s.replicas) {
        sink.error(
            "spec.devices.alternatives",
            format!(
                "minReplicas add up to {min_sum}, more than spec.replicas {}: lower them or raise replicas",
                s.replicas
            ),
        );
    }
}

/// The ModelCache `cacheRef` names is in the set (or was refused).
fn check_cache_ref(sink: &mut Sink<'_>, s: &ModelDeploymentSpec, ns: &str, set: &Set<'_>) {
    if let Some(cache) = &s.model.cache_ref
        && !set.caches.contains(&(ns, cache.as_str()))
        && !set.refused_named(Kind::ModelCache, Some(ns), cache)
    {
        sink.error("spec.model.cacheRef", format!("no ModelCache {ns}/{cache} in this set: add it or remove cacheRef"));
    }
}

/// A warning for each allowed jurisdiction no InferenceCluster of the set is in (a set
/// without clusters says nothing).
fn check_jurisdictions(sink: &mut Sink<'_>, p: &PlacementPolicy, set: &Set<'_>) {
    let Some(sov) = &p.sovereignty else { return };
    for (i, j) in sov.allowed_jurisdictions.iter().enumerate() {
        if !set.jurisdictions.is_empty() && !set.jurisdictions.contains(j.as_str()) {
            sink.warn(
                format!("spec.placement.sovereignty.allowedJurisdictions[{i}]"),
                format!("no InferenceCluster in this set is in jurisdiction {}", j.as_str()),
            );
        }
    }
}

/// A warning for each region both allowed and denied.
fn check_regions(sink: &mut Sink<'_>, p: &PlacementPolicy) {
    let Some(sov) = &p.sovereignty else { return };
    for r in sov.allowed_regions.iter().filter(|r| sov.denied_regions.contains(r)) {
        sink.warn("spec.placement.sovereignty.deniedRegions", format!("{r} is both allowed and denied; denied wins"));
    }
}

/// A model does not fall back to itself; each role appears once.
fn check_routing_and_roles(sink: &mut Sink<'_>, s: &ModelDeploymentSpec) {
    if let Some(routing) = &s.routing
        && let Some(i) = routing.fallback_models.iter().position(|m| *m == s.model.name)
    {
        sink.error(format!("spec.routing.fallbackModels[{i}]"), "a model cannot fall back to itself");
    }
    let roles: Vec<_> = s.topology.roles.iter().map(|r| r.name).collect();
    if roles.iter().enumerate().any(|(i, r)| roles[..i].contains(r)) {
        sink.error("spec.topology.roles", "each role (prefill, decode) may appear once");
    }
}

/// The most devices per node among the classes some alternative may use (a named class, or any
/// class when the alternative names none); `None` when no such class is in the set.
pub(super) fn largest_node<'a>(
    classes: impl Iterator<Item = Option<&'a str>>,
    per_node: &BTreeMap<&str, u32>,
) -> Option<u32> {
    classes
        .flat_map(|c| match c {
            Some(name) => per_node.get(name).copied().into_iter().collect::<Vec<_>>(),
            None => per_node.values().copied().collect(),
        })
        .max()
}

/// A pod of the topology needs more devices on one node than any class it may use offers.
fn check_fit_deployment(sink: &mut Sink<'_>, s: &ModelDeploymentSpec, per_node: &BTreeMap<&str, u32>) {
    use crate::deployment::TopologyType;
    let Some(max) = largest_node(s.devices.alternatives.iter().map(|a| a.class.as_deref()), per_node) else { return };
    let t = &s.topology;
    let mut pods: Vec<(String, u32)> = Vec::new();
    match t.type_ {
        TopologyType::Disaggregated => {
            for (i, r) in t.roles.iter().enumerate() {
                pods.push((format!("spec.topology.roles[{i}].devicesPerPod"), r.devices_per_pod));
            }
        }
        _ => pods.push(("spec.topology.devicesPerReplica".to_string(), t.devices_per_replica)),
    }
    for (field, n) in pods {
        if n > max {
            sink.error(
                field,
                format!("{n} devices on one node, but the classes this deployment may use have at most {max} devices per node: use MultiNode or a larger class"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{CLASS, CLUSTER, deployment, fields, parse, reported};
    use super::*;
    use crate::cel::SelectorEngine;
    use crate::document::FleetObject;

    /// The problems `check` reports on the deployment `doc` in a set with the H100 class and the
    /// EU cluster.
    fn on_deployment(
        doc: &str,
        check: impl for<'a> FnOnce(&mut Sink<'a>, &'a ModelDeploymentSpec, &Set<'a>, &mut SelectorChecker<'a>),
    ) -> Vec<String> {
        let objects = parse(&[CLASS, CLUSTER, doc]);
        let engine = SelectorEngine::new();
        let classes = super::super::describe_classes(&mut Sink { problems: vec![], current: None }, &objects, &engine);
        let set = Set::of(&objects, &[], &classes);
        let mut selectors = SelectorChecker::new(&engine, &classes);
        let FleetObject::Deployment(md) = &objects[2].value else { panic!("not a deployment") };
        let problems = reported(&objects[2], |sink| check(sink, &md.spec, &set, &mut selectors));
        fields(&problems).into_iter().map(String::from).collect()
    }

    const ONE: &str = "  replicas: 1\n  topology: {type: Standalone, devicesPerReplica: 1}";

    #[test]
    fn every_check_of_a_deployment_runs_in_order() {
        let spec = format!(
            "{ONE}\n  devices: {{alternatives: [{{class: a100}}]}}\n  placement: {{capacityTypes: [spot, spot], sovereignty: {{allowedJurisdictions: [US]}}}}"
        );
        assert_eq!(
            on_deployment(&deployment("a", &spec), |sink, s, set, selectors| check_deployment(
                sink, s, "ml", set, selectors
            )),
            vec![
                "spec.devices.alternatives[0].class",
                "spec.placement.capacityTypes",
                "spec.placement.sovereignty.allowedJurisdictions[0]"
            ]
        );
    }

    #[test]
    fn alternatives_name_known_classes_and_their_minimums_add_up() {
        let check = check_alternatives;
        let ok = format!("{ONE}\n  devices: {{alternatives: [{{class: h100, minReplicas: 1}}]}}");
        assert!(on_deployment(&deployment("a", &ok), check).is_empty());
        let bad = format!(
            "{ONE}\n  devices: {{alternatives: [{{class: a100, minReplicas: 1}}, {{selectors: ['device.driver == \"gpu.nvidia.com\"'], minReplicas: 1}}]}}"
        );
        assert_eq!(
            on_deployment(&deployment("a", &bad), check),
            vec!["spec.devices.alternatives[0].class", "spec.devices.alternatives"]
        );
    }

    #[test]
    fn a_cache_reference_names_a_cache_of_the_set() {
        let spec = format!("{ONE}\n  devices: {{alternatives: [{{class: h100}}]}}");
        let check = |sink: &mut Sink<'_>, s: &ModelDeploymentSpec, set: &Set<'_>, _: &mut SelectorChecker<'_>| {
            check_cache_ref(sink, s, "ml", set)
        };
        assert!(on_deployment(&deployment("a", &spec), check).is_empty());
        let cached =
            deployment("a", &spec).replace("source: \"hf://org/m\"}", "source: \"hf://org/m\", cacheRef: weights}");
        assert_eq!(on_deployment(&cached, check), vec!["spec.model.cacheRef"]);
    }

    #[test]
    fn adapters_have_own_names_verified_caches_and_only_narrow_the_deployment() {
        let cache = |name: &str, digest: bool| {
            let d = if digest { format!("\n  digest: sha256:{}", "a".repeat(64)) } else { String::new() };
            format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: ModelCache\nmetadata: {{name: {name}, namespace: ml}}\nspec:\n  source: hf://org/{name}\n  size: 1G\n  targets: {{deployments: [a]}}{d}"
            )
        };
        let problems = |adapters: &str| {
            let spec = format!(
                "{ONE}\n  devices: {{alternatives: [{{class: h100}}]}}\n  placement: {{sovereignty: {{allowedJurisdictions: [EU, US]}}}}\n  adapters: {adapters}"
            );
            let objects = parse(&[CLASS, CLUSTER, &cache("fr", true), &cache("raw", false), &deployment("a", &spec)]);
            let set = Set::of(&objects, &[], &BTreeMap::new());
            let FleetObject::Deployment(md) = &objects[4].value else { panic!("not a deployment") };
            let got = reported(&objects[4], |sink| check_adapters(sink, &md.spec, "ml", &set));
            fields(&got).into_iter().map(String::from).collect::<Vec<_>>()
        };
        assert!(problems("[{name: support-fr, cacheRef: fr, sovereignty: {allowedJurisdictions: [EU]}}]").is_empty());
        assert_eq!(
            problems(
                "[{name: a, cacheRef: fr}, {name: x, cacheRef: raw}, {name: x, cacheRef: gone}, {name: y, cacheRef: fr, sovereignty: {allowedJurisdictions: [EU, APAC]}}, {name: z, cacheRef: fr, clusterSelector: {matchLabels: {tier: none}}}]"
            ),
            vec![
                "spec.adapters[0].name",
                "spec.adapters[1].cacheRef",
                "spec.adapters[2].name",
                "spec.adapters[2].cacheRef",
                "spec.adapters[3].sovereignty.allowedJurisdictions",
                "spec.adapters[4].clusterSelector",
            ]
        );
    }

    #[test]
    fn an_adapter_cache_selecting_clusters_outside_the_adapters_policy_is_warned_of() {
        let us = CLUSTER.replace("eu-fra-1", "us-iad-1").replace("eu-central-1", "us-east-1").replace("EU", "US");
        let cache = format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: ModelCache\nmetadata: {{name: wide, namespace: ml}}\nspec:\n  source: hf://org/wide\n  size: 1G\n  digest: sha256:{}\n  targets: {{clusterSelector: {{}}}}",
            "b".repeat(64)
        );
        let spec = format!(
            "{ONE}\n  devices: {{alternatives: [{{class: h100}}]}}\n  placement: {{sovereignty: {{allowedJurisdictions: [EU, US]}}}}\n  adapters: [{{name: fr, cacheRef: wide, sovereignty: {{allowedJurisdictions: [EU]}}}}, {{name: all, cacheRef: wide}}]"
        );
        let objects = parse(&[CLASS, CLUSTER, &us, &cache, &deployment("a", &spec)]);
        let set = Set::of(&objects, &[], &BTreeMap::new());
        let FleetObject::Deployment(md) = &objects[4].value else { panic!("not a deployment") };
        let got = reported(&objects[4], |sink| check_adapters(sink, &md.spec, "ml", &set));
        assert_eq!(fields(&got), vec!["spec.adapters[0].cacheRef"], "{got:#?}");
        assert!(got[0].2.contains("selects us-iad-1, where adapter `fr` may not be served"), "{}", got[0].2);
        assert!(!got[0].2.contains("eu-fra-1"));
    }

    #[test]
    fn sovereignty_names_jurisdictions_of_the_set_and_no_region_both_allowed_and_denied() {
        let spec = |sov: &str| {
            format!("{ONE}\n  devices: {{alternatives: [{{class: h100}}]}}\n  placement: {{sovereignty: {sov}}}")
        };
        let check = |sink: &mut Sink<'_>, s: &ModelDeploymentSpec, set: &Set<'_>, _: &mut SelectorChecker<'_>| {
            check_jurisdictions(sink, &s.placement, set);
            check_regions(sink, &s.placement);
        };
        assert!(on_deployment(&deployment("a", &spec("{allowedJurisdictions: [EU]}")), check).is_empty());
        let both = spec("{allowedJurisdictions: [EU, US], allowedRegions: [eu-west-1], deniedRegions: [eu-west-1]}");
        assert_eq!(
            on_deployment(&deployment("a", &both), check),
            vec!["spec.placement.sovereignty.allowedJurisdictions[1]", "spec.placement.sovereignty.deniedRegions"]
        );
    }

    #[test]
    fn a_model_does_not_fall_back_to_itself_and_roles_appear_once() {
        let check = |sink: &mut Sink<'_>, s: &ModelDeploymentSpec, _: &Set<'_>, _: &mut SelectorChecker<'_>| {
            check_routing_and_roles(sink, s)
        };
        let roles = "  replicas: 1\n  topology: {type: Disaggregated, devicesPerReplica: 2, roles: [{name: prefill, pods: 1, devicesPerPod: 1}, {name: prefill, pods: 1, devicesPerPod: 1}]}";
        let spec = format!(
            "{roles}\n  devices: {{alternatives: [{{class: h100}}]}}\n  routing: {{fallbackModels: [other, a]}}"
        );
        assert_eq!(
            on_deployment(&deployment("a", &spec), check),
            vec!["spec.routing.fallbackModels[1]", "spec.topology.roles"]
        );
    }

    #[test]
    fn a_pod_fits_a_node_of_the_largest_class_it_may_use() {
        let tp = |n: u32| {
            format!(
                "  replicas: 1\n  topology: {{type: TensorParallel, devicesPerReplica: {n}}}\n  devices: {{alternatives: [{{class: h100}}]}}"
            )
        };
        let check = |sink: &mut Sink<'_>, s: &ModelDeploymentSpec, set: &Set<'_>, _: &mut SelectorChecker<'_>| {
            check_fit_deployment(sink, s, &set.per_node)
        };
        assert!(on_deployment(&deployment("a", &tp(8)), check).is_empty());
        assert_eq!(on_deployment(&deployment("a", &tp(16)), check), vec!["spec.topology.devicesPerReplica"]);
        let per_node = BTreeMap::from([("h100", 8), ("l4", 4)]);
        assert_eq!(largest_node([Some("l4")].into_iter(), &per_node), Some(4));
        assert_eq!(largest_node([Some("l4"), None].into_iter(), &per_node), Some(8), "no class: any");
        assert_eq!(largest_node([Some("a100")].into_iter(), &per_node), None);
    }
}
