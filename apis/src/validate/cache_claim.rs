//! The checks of a ModelCache and of a CapacityClaim against the set (`validate_set`): a
//! cache's target selector, size and deployments; a claim's pod sets, reservations, capacity
//! types and device classes.

use super::deployment::largest_node;
use super::selectors::{SelectorChecker, check_label_selector, check_selects_some};
use super::{Kind, Set, Sink, has_duplicates};
use crate::cache::ModelCacheSpec;
use crate::claim::CapacityClaimSpec;
use crate::common::CapacityType;

/// Every check of one ModelCache (the sink's current object) in namespace `ns`.
pub(super) fn check_cache(sink: &mut Sink<'_>, spec: &ModelCacheSpec, ns: &str, set: &Set<'_>) {
    if let Some(sel) = &spec.targets.cluster_selector {
        check_label_selector(sink, "spec.targets.clusterSelector", sel);
        check_selects_some(sink, "spec.targets.clusterSelector", sel, &set.cluster_labels);
    }
    let size = spec.size.0.trim();
    if size.starts_with('-')
        || size.trim_start_matches(['0', '.', '+']).chars().next().is_none_or(|ch| !ch.is_ascii_digit())
    {
        sink.error("spec.size", format!("{size:?} must be a positive quantity such as 140Gi"));
    }
    for (i, d) in spec.targets.deployments.iter().enumerate() {
        if !set.deployments.contains(&(ns, d.as_str())) && !set.refused_named(Kind::ModelDeployment, Some(ns), d) {
            sink.error(format!("spec.targets.deployments[{i}]"), format!("no ModelDeployment {ns}/{d} in this set"));
        }
    }
}

/// Every check of one CapacityClaim (the sink's current object).
pub(super) fn check_claim<'e>(
    sink: &mut Sink<'_>,
    spec: &'e CapacityClaimSpec,
    set: &Set<'_>,
    selectors: &mut SelectorChecker<'e>,
) {
    check_pod_sets(sink, spec, set);
    if !spec.capacity.reservation_ids.is_empty() && !spec.capacity.capacity_types.contains(&CapacityType::Reserved) {
        sink.warn("spec.capacity.reservationIds", "reservations are named but capacityTypes does not include reserved");
    }
    if has_duplicates(&spec.capacity.capacity_types) {
        sink.error("spec.capacity.capacityTypes", "lists a capacity type twice");
    }
    for (i, dc) in spec.capacity.device_classes.iter().enumerate() {
        let field = format!("spec.capacity.deviceClasses[{i}]");
        if let Some(class) = &dc.class
            && !set.known_class(class)
        {
            sink.error(format!("{field}.class"), set.unknown_class(class));
        }
        selectors.check(sink, &field, dc.class.as_deref(), &dc.selectors);
    }
}

/// Pod set names are unique, and each pod fits a node of the classes the claim may use.
fn check_pod_sets(sink: &mut Sink<'_>, spec: &CapacityClaimSpec, set: &Set<'_>) {
    let mut names = std::collections::BTreeSet::new();
    for (i, p) in spec.pod_sets.iter().enumerate() {
        if !names.insert(p.name.as_str()) {
            sink.error(format!("spec.podSets[{i}].name"), format!("duplicate pod set name {:?}", p.name));
        }
    }
    let classes = spec.capacity.device_classes.iter().map(|dc| dc.class.as_deref());
    let Some(max) = largest_node(classes, &set.per_node) else { return };
    for (i, p) in spec.pod_sets.iter().enumerate() {
        if p.devices_per_pod.max(0) as u32 > max {
            sink.error(
                format!("spec.podSets[{i}].devicesPerPod"),
                format!(
                    "{} devices on one node, but the usable classes have at most {max} devices per node",
                    p.devices_per_pod
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{CLASS, CLUSTER, ONE_H100, deployment, fields, parse, reported};
    use super::*;
    use crate::cel::SelectorEngine;
    use crate::document::FleetObject;

    /// The problems the check of its kind reports on the last document of `docs`, in a set
    /// with the H100 class, the EU cluster and deployment `ml/a`.
    fn on_last(doc: &str) -> Vec<String> {
        let d = deployment("a", ONE_H100);
        let objects = parse(&[CLASS, CLUSTER, &d, doc]);
        let engine = SelectorEngine::new();
        let classes = super::super::describe_classes(&mut Sink { problems: vec![], current: None }, &objects, &engine);
        let set = Set::of(&objects, &[], &classes);
        let mut selectors = SelectorChecker::new(&engine, &classes);
        let obj = &objects[3];
        let problems = reported(obj, |sink| match &obj.value {
            FleetObject::Cache(c) => check_cache(sink, &c.spec, "ml", &set),
            FleetObject::Claim(c) => check_claim(sink, &c.spec, &set, &mut selectors),
            _ => panic!("neither a cache nor a claim"),
        });
        fields(&problems).into_iter().map(String::from).collect()
    }

    fn cache(size: &str, targets: &str) -> String {
        format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: ModelCache\nmetadata: {{name: w, namespace: ml}}\nspec:\n  source: hf://org/m\n  size: {size}\n  targets: {targets}"
        )
    }

    fn claim(pod_sets: &str, capacity: &str) -> String {
        format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: CapacityClaim\nmetadata: {{name: launch, namespace: ml}}\nspec:\n  podSets: {pod_sets}\n  capacity: {capacity}"
        )
    }

    #[test]
    fn a_cache_has_a_positive_size_and_targets_deployments_of_the_set() {
        assert!(on_last(&cache("16G", "{deployments: [a]}")).is_empty());
        assert_eq!(on_last(&cache("\"0\"", "{deployments: [a, b]}")), vec!["spec.size", "spec.targets.deployments[1]"]);
        let nowhere = "{clusterSelector: {matchLabels: {tier: none}}}";
        assert_eq!(on_last(&cache("16G", nowhere)), vec!["spec.targets.clusterSelector"]);
    }

    #[test]
    fn a_claim_names_pod_sets_once_that_fit_a_node_of_known_classes() {
        let ok = claim(
            "[{name: tp8, count: 2, devicesPerPod: 8}]",
            "{capacityTypes: [on-demand], deviceClasses: [{class: h100}]}",
        );
        assert!(on_last(&ok).is_empty());
        let pods = "[{name: tp8, count: 1, devicesPerPod: 16}, {name: tp8, count: 1, devicesPerPod: 1}]";
        let capacity = "{capacityTypes: [spot, spot], reservationIds: [cr-1], deviceClasses: [{class: a100}]}";
        assert_eq!(
            on_last(&claim(pods, capacity)),
            vec![
                "spec.podSets[1].name",
                "spec.capacity.reservationIds",
                "spec.capacity.capacityTypes",
                "spec.capacity.deviceClasses[0].class"
            ],
            "no known class: the pod's size is not judged"
        );
        let big = claim(
            "[{name: tp8, count: 1, devicesPerPod: 16}]",
            "{capacityTypes: [on-demand], deviceClasses: [{class: h100}]}",
        );
        assert_eq!(on_last(&big), vec!["spec.podSets[0].devicesPerPod"]);
    }
}
