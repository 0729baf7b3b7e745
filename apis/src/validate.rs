//! What a CRD schema cannot check, over a whole set of documents: duplicate names, references
//! between objects (classes, caches, deployments), CEL device selectors that do not compile or
//! do not return bool, device descriptions whose quantities or versions are invalid, and
//! sums that cannot add up. Runs after `document::parse_stream` has checked each document.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::cel::{CelValue, Selector, SelectorEngine, SelectorError};
use crate::common::CapacityType;
use crate::deployment::CelExpression;
use crate::document::{FleetObject, Kind, Located, Problem, Severity, SourceLocation};

struct Sink<'a> {
    problems: Vec<Problem>,
    current: Option<&'a Located<FleetObject>>,
}

impl<'a> Sink<'a> {
    fn push(&mut self, severity: Severity, field: impl Into<String>, message: impl Into<String>) {
        let Some(obj) = self.current else { return };
        self.problems.push(Problem {
            severity,
            location: obj.location.clone(),
            object: Some(obj.value.display_name()),
            field: field.into(),
            message: message.into(),
        });
    }
    fn error(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Error, field, message);
    }
    fn warn(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Warning, field, message);
    }
}

/// Checks a set of objects together and returns every problem found. `refused` names the
/// documents already refused with errors: references to them are not reported again.
pub fn validate_set(objects: &[Located<FleetObject>], refused: &[(Kind, Option<String>, String)]) -> Vec<Problem> {
    let refused_named = |kind: Kind, ns: Option<&str>, name: &str| {
        refused.iter().any(|(k, n, m)| {
            *k == kind && m == name && (ns.is_none() || n.as_deref().unwrap_or("default") == ns.unwrap_or(""))
        })
    };
    let engine = SelectorEngine::new();
    let mut sink = Sink { problems: Vec::new(), current: None };

    // Duplicates, and indexes for references.
    let mut seen: HashMap<(Kind, Option<&str>, &str), &SourceLocation> = HashMap::new();
    for obj in objects {
        let key = (obj.value.kind(), obj.value.namespace(), obj.value.name());
        sink.current = Some(obj);
        if let Some(first) = seen.get(&key) {
            sink.error(
                "metadata.name",
                format!("duplicate name: already defined at {first}; names are unique per kind"),
            );
        } else {
            seen.insert(key, &obj.location);
        }
    }

    // Devices of every class, compiled once.
    let mut classes: BTreeMap<&str, Option<CelValue>> = BTreeMap::new();
    for obj in objects {
        if let FleetObject::Class(c) = &obj.value {
            sink.current = Some(obj);
            let device = match engine.device(&c.spec.device) {
                Ok(v) => Some(v),
                Err(SelectorError::Quantity { field, message } | SelectorError::DeviceBounds { field, message }) => {
                    sink.error(field, message);
                    None
                }
                Err(e) => {
                    sink.error("spec.device", format!("the device cannot be described to CEL: {e}"));
                    None
                }
            };
            if CapacityType::ALL.iter().all(|t| c.spec.price_per_node_hour.micros(*t).is_none()) {
                sink.warn(
                    "spec.pricePerNodeHour",
                    "no price for any capacity type: cost ceilings and cost ordering will treat it as free",
                );
            }
            classes.insert(c.metadata.name.as_deref().unwrap_or(""), device);
        }
    }
    let class_names: BTreeSet<&str> = classes.keys().copied().collect();
    let per_node: BTreeMap<&str, u32> = objects
        .iter()
        .filter_map(|o| match &o.value {
            FleetObject::Class(c) => Some((o.value.name(), c.spec.devices_per_node)),
            _ => None,
        })
        .collect();
    let known_class = |name: &str| class_names.contains(name) || refused_named(Kind::InferenceClass, None, name);
    let jurisdictions: BTreeSet<&str> = objects
        .iter()
        .filter_map(|o| match &o.value {
            FleetObject::Cluster(c) => Some(c.spec.jurisdiction.as_str()),
            _ => None,
        })
        .collect();
    // Each InferenceCluster's name and the labels selectors match.
    let cluster_labels: Vec<(&str, BTreeMap<String, String>)> = objects
        .iter()
        .filter_map(|o| match &o.value {
            FleetObject::Cluster(c) => Some((o.value.name(), crate::selector::cluster_labels(c))),
            _ => None,
        })
        .collect();
    let deployments: BTreeSet<(&str, &str)> = objects
        .iter()
        .filter(|o| o.value.kind() == Kind::ModelDeployment)
        .map(|o| (o.value.namespace().unwrap_or(""), o.value.name()))
        .collect();
    let caches: BTreeSet<(&str, &str)> = objects
        .iter()
        .filter(|o| o.value.kind() == Kind::ModelCache)
        .map(|o| (o.value.namespace().unwrap_or(""), o.value.name()))
        .collect();
    let unknown_class = |name: &str| {
        let known: Vec<&str> = class_names.iter().copied().collect();
        format!(
            "unknown InferenceClass {name:?}; defined here: [{}] (add its file with another -f, or fix the name)",
            known.join(", ")
        )
    };

    let mut selectors =
        SelectorChecker { engine: &engine, classes: &classes, compiled: HashMap::new(), verdicts: HashMap::new() };
    for obj in objects {
        sink.current = Some(obj);
        let ns = obj.value.namespace().unwrap_or("");
        match &obj.value {
            FleetObject::Class(_) => {}
            FleetObject::Cluster(c) => {
                let s = &c.spec;
                if let Some(aws) = &s.provider.aws
                    && aws.region != s.region
                {
                    sink.error(
                        "spec.provider.aws.region",
                        format!("{} differs from spec.region {}: they must name the same region", aws.region, s.region),
                    );
                }
                let mut pools = BTreeSet::new();
                for (i, p) in s.pools.iter().enumerate() {
                    if !pools.insert(p.name.as_str()) {
                        sink.error(
                            format!("spec.pools[{i}].name"),
                            format!("duplicate pool name {:?} in this cluster", p.name),
                        );
                    }
                    if !known_class(&p.class) {
                        sink.error(format!("spec.pools[{i}].class"), unknown_class(&p.class));
                    }
                    if has_duplicates(&p.capacity_types) {
                        sink.error(format!("spec.pools[{i}].capacityTypes"), "lists a capacity type twice");
                    }
                    if !p.reservation_ids.is_empty() && !p.capacity_types.contains(&CapacityType::Reserved) {
                        sink.warn(
                            format!("spec.pools[{i}].reservationIds"),
                            "reservations are named but capacityTypes does not include reserved",
                        );
                    }
                    if p.capacity_types.contains(&CapacityType::Reserved)
                        && p.reservation_ids.is_empty()
                        && s.provider.aws.is_some()
                    {
                        sink.warn(
                            format!("spec.pools[{i}].reservationIds"),
                            "offers reserved capacity on AWS but names no reservation",
                        );
                    }
                }
                if s.endpoint.is_none() {
                    sink.warn("spec.endpoint", "no entry URL: the gateway cannot route requests to this cluster");
                }
                if s.credentials.is_none() && s.cluster_profile_ref.is_none() {
                    sink.warn(
                        "spec.credentials",
                        "neither credentials nor clusterProfileRef: the controller cannot reach this member",
                    );
                }
                for (i, o) in c.status.iter().flat_map(|st| st.pools.iter()).enumerate() {
                    let field = format!("status.pools[{i}]");
                    let per_node = per_node.get(o.class.as_str()).copied();
                    let totals = [o.nodes.into(), o.devices_free, o.devices_managed];
                    check_node_devices(&mut sink, &field, &o.node_devices, totals, per_node);
                    for (j, r) in o.reserved.iter().enumerate() {
                        let totals = [r.nodes.into(), r.devices_total - r.devices_allocated, r.devices_managed];
                        check_node_devices(
                            &mut sink,
                            &format!("{field}.reserved[{j}]"),
                            &r.node_devices,
                            totals,
                            per_node,
                        );
                    }
                }
            }
            FleetObject::Deployment(d) => {
                let s = &d.spec;
                let mut min_sum: i64 = 0;
                for (i, alt) in s.devices.alternatives.iter().enumerate() {
                    let field = format!("spec.devices.alternatives[{i}]");
                    if let Some(class) = &alt.class
                        && !known_class(class)
                    {
                        sink.error(format!("{field}.class"), unknown_class(class));
                    }
                    min_sum += i64::from(alt.min_replicas.unwrap_or(0));
                    selectors.check(&mut sink, &field, alt.class.as_deref(), &alt.selectors);
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
                if let Some(cache) = &s.model.cache_ref
                    && !caches.contains(&(ns, cache.as_str()))
                    && !refused_named(Kind::ModelCache, Some(ns), cache)
                {
                    sink.error(
                        "spec.model.cacheRef",
                        format!("no ModelCache {ns}/{cache} in this set: add it or remove cacheRef"),
                    );
                }
                if has_duplicates(&s.placement.capacity_types) {
                    sink.error("spec.placement.capacityTypes", "lists a capacity type twice");
                }
                if let Some(sov) = &s.placement.sovereignty {
                    for (i, j) in sov.allowed_jurisdictions.iter().enumerate() {
                        if !jurisdictions.is_empty() && !jurisdictions.contains(j.as_str()) {
                            sink.warn(
                                format!("spec.placement.sovereignty.allowedJurisdictions[{i}]"),
                                format!("no InferenceCluster in this set is in jurisdiction {}", j.as_str()),
                            );
                        }
                    }
                }
                check_fit_deployment(&mut sink, s, &per_node);
                if let Some(sel) = &s.placement.cluster_selector {
                    check_label_selector(&mut sink, "spec.placement.clusterSelector", sel);
                    check_selects_some(&mut sink, "spec.placement.clusterSelector", sel, &cluster_labels);
                }
                if let Some(t) = &s.placement.capacity_claim_template
                    && has_duplicates(&t.capacity_types)
                {
                    sink.error("spec.placement.capacityClaimTemplate.capacityTypes", "lists a capacity type twice");
                }
                if let Some(sov) = &s.placement.sovereignty {
                    for r in sov.allowed_regions.iter().filter(|r| sov.denied_regions.contains(r)) {
                        sink.warn(
                            "spec.placement.sovereignty.deniedRegions",
                            format!("{r} is both allowed and denied; denied wins"),
                        );
                    }
                }
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
            FleetObject::Cache(c) => {
                if let Some(sel) = &c.spec.targets.cluster_selector {
                    check_label_selector(&mut sink, "spec.targets.clusterSelector", sel);
                    check_selects_some(&mut sink, "spec.targets.clusterSelector", sel, &cluster_labels);
                }
                let size = c.spec.size.0.trim();
                if size.starts_with('-')
                    || size.trim_start_matches(['0', '.', '+']).chars().next().is_none_or(|ch| !ch.is_ascii_digit())
                {
                    sink.error("spec.size", format!("{size:?} must be a positive quantity such as 140Gi"));
                }
                for (i, d) in c.spec.targets.deployments.iter().enumerate() {
                    if !deployments.contains(&(ns, d.as_str())) && !refused_named(Kind::ModelDeployment, Some(ns), d) {
                        sink.error(
                            format!("spec.targets.deployments[{i}]"),
                            format!("no ModelDeployment {ns}/{d} in this set"),
                        );
                    }
                }
            }
            FleetObject::Claim(c) => {
                let mut names = BTreeSet::new();
                for (i, p) in c.spec.pod_sets.iter().enumerate() {
                    if !names.insert(p.name.as_str()) {
                        sink.error(format!("spec.podSets[{i}].name"), format!("duplicate pod set name {:?}", p.name));
                    }
                }
                if let Some(max) =
                    largest_node(c.spec.capacity.device_classes.iter().map(|dc| dc.class.as_deref()), &per_node)
                {
                    for (i, p) in c.spec.pod_sets.iter().enumerate() {
                        if p.devices_per_pod.max(0) as u32 > max {
                            sink.error(
                                format!("spec.podSets[{i}].devicesPerPod"),
                                format!("{} devices on one node, but the usable classes have at most {max} devices per node", p.devices_per_pod),
                            );
                        }
                    }
                }
                if !c.spec.capacity.reservation_ids.is_empty()
                    && !c.spec.capacity.capacity_types.contains(&CapacityType::Reserved)
                {
                    sink.warn(
                        "spec.capacity.reservationIds",
                        "reservations are named but capacityTypes does not include reserved",
                    );
                }
                if has_duplicates(&c.spec.capacity.capacity_types) {
                    sink.error("spec.capacity.capacityTypes", "lists a capacity type twice");
                }
                for (i, dc) in c.spec.capacity.device_classes.iter().enumerate() {
                    let field = format!("spec.capacity.deviceClasses[{i}]");
                    if let Some(class) = &dc.class
                        && !known_class(class)
                    {
                        sink.error(format!("{field}.class"), unknown_class(class));
                    }
                    selectors.check(&mut sink, &field, dc.class.as_deref(), &dc.selectors);
                }
            }
        }
    }
    // A model name several deployments serve: all of them are routed only with weights on all.
    let mut by_model: BTreeMap<&str, Vec<&Located<FleetObject>>> = BTreeMap::new();
    for obj in objects {
        if let FleetObject::Deployment(d) = &obj.value {
            by_model.entry(d.spec.model.name.as_str()).or_default().push(obj);
        }
    }
    let weighted = |o: &Located<FleetObject>| matches!(&o.value, FleetObject::Deployment(d) if d.spec.routing.as_ref().is_some_and(|r| r.weight.is_some()));
    for (model, group) in by_model.iter().filter(|(_, g)| g.len() > 1 && !g.iter().all(|o| weighted(o))) {
        let names: Vec<String> = group.iter().map(|o| o.value.display_name()).collect();
        let names = first_of(&names, NAMED_AT_MOST);
        for obj in group.iter().filter(|o| !weighted(o)) {
            sink.current = Some(obj);
            let message = format!(
                "model name `{model}` is served by {names}: without spec.routing.weight this one is routed only if it is the oldest of them, and then alone; give each a weight to split the traffic (docs/gateway.md, weighted traffic)"
            );
            sink.warn("spec.routing.weight", message);
        }
    }
    sink.problems
}

/// How many objects a message names before it counts the rest: a model name shared by
/// hundreds of deployments gives one short warning per deployment, not a list of all of them
/// each time (that grew with the square of the fleet).
const NAMED_AT_MOST: usize = 5;

/// `a, b, c` — or, past `most`, the first `most` and how many more there are.
fn first_of(names: &[String], most: usize) -> String {
    if names.len() <= most {
        return names.join(", ");
    }
    format!("{} and {} more", names[..most].join(", "), names.len() - most)
}

#[cfg(test)]
#[test]
fn a_long_list_of_names_is_cut_and_counted() {
    let names: Vec<String> = (0..8).map(|i| format!("d{i}")).collect();
    assert_eq!(first_of(&names[..5], 5), "d0, d1, d2, d3, d4");
    assert_eq!(first_of(&names, 5), "d0, d1, d2, d3, d4 and 3 more");
}

/// The most devices per node among the classes some alternative may use (a named class, or any
/// class when the alternative names none); `None` when no such class is in the set.
fn largest_node<'a>(classes: impl Iterator<Item = Option<&'a str>>, per_node: &BTreeMap<&str, u32>) -> Option<u32> {
    classes
        .flat_map(|c| match c {
            Some(name) => per_node.get(name).copied().into_iter().collect::<Vec<_>>(),
            None => per_node.values().copied().collect(),
        })
        .max()
}

/// A pod of the topology needs more devices on one node than any class it may use offers.
fn check_fit_deployment(sink: &mut Sink<'_>, s: &crate::ModelDeploymentSpec, per_node: &BTreeMap<&str, u32>) {
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

/// A pool's per-node breakdown (`nodeDevices`) adds up to its totals `[nodes, free, managed]`
/// and no node holds more devices than its class has.
fn check_node_devices(
    sink: &mut Sink<'_>,
    field: &str,
    bars: &[crate::cluster::NodeDevices],
    [nodes, free, managed]: [i64; 3],
    per_node: Option<u32>,
) {
    let free_field = if field.contains(".reserved[") { "devicesTotal - devicesAllocated" } else { "devicesFree" };
    for message in crate::cluster::node_devices_problems(
        bars,
        (&format!("{field}.nodes"), nodes),
        (&format!("{field}.{free_field}"), free),
        (&format!("{field}.devicesManaged"), managed),
    ) {
        sink.error(format!("{field}.nodeDevices"), message);
    }
    let Some(per_node) = per_node else { return };
    for (j, b) in bars.iter().enumerate() {
        if i64::from(b.free) + i64::from(b.managed) > i64::from(per_node) {
            sink.error(
                format!("{field}.nodeDevices[{j}]"),
                format!(
                    "free {} + managed {} devices on one node, but its class has {per_node} per node: lower them",
                    b.free, b.managed
                ),
            );
        }
    }
}

/// Operators and values of a label selector, as the API server checks them.
fn check_label_selector(
    sink: &mut Sink<'_>,
    field: &str,
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) {
    for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
        let f = format!("{field}.matchExpressions[{i}]");
        let n = e.values.as_ref().map_or(0, Vec::len);
        match e.operator.as_str() {
            "In" | "NotIn" if n == 0 => {
                sink.error(format!("{f}.values"), format!("{} needs at least one value", e.operator))
            }
            "Exists" | "DoesNotExist" if n > 0 => {
                sink.error(format!("{f}.values"), format!("{} takes no values", e.operator))
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => sink.error(
                format!("{f}.operator"),
                format!("{other:?} is not allowed; use one of \"In\", \"NotIn\", \"Exists\", \"DoesNotExist\""),
            ),
        }
        if e.key.is_empty() {
            sink.error(format!("{f}.key"), "must not be empty");
        }
    }
}

/// A warning when the set holds InferenceClusters and `sel` matches none of them, naming why
/// for the first few (nothing can be placed there until a cluster's labels or the selector
/// change). A set without clusters (a deployment's own file) says nothing.
fn check_selects_some(
    sink: &mut Sink<'_>,
    field: &str,
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    clusters: &[(&str, BTreeMap<String, String>)],
) {
    let valid = |op: &str| matches!(op, "In" | "NotIn" | "Exists" | "DoesNotExist");
    // An invalid selector is an error already (`check_label_selector`).
    if clusters.is_empty() || sel.match_expressions.iter().flatten().any(|e| !valid(&e.operator)) {
        return;
    }
    let mut why = Vec::new();
    for (name, labels) in clusters {
        match crate::selector::selector_matches(sel, labels) {
            Ok(()) => return,
            Err(e) => why.push(format!("{name}: {e}")),
        }
    }
    let more = why.len().saturating_sub(3);
    why.truncate(3);
    if more > 0 {
        why.push(format!("{more} more"));
    }
    sink.warn(
        field,
        format!(
            "matches none of the {} InferenceClusters in this set ({}): nothing can be placed until one matches",
            clusters.len(),
            why.join("; ")
        ),
    );
}

fn has_duplicates(types: &[CapacityType]) -> bool {
    types.iter().enumerate().any(|(i, t)| types[..i].contains(t))
}

struct SelectorChecker<'e> {
    engine: &'e SelectorEngine,
    classes: &'e BTreeMap<&'e str, Option<CelValue>>,
    /// Each distinct selector compiled once: a fleet repeats the same few selectors across
    /// thousands of deployments.
    compiled: HashMap<&'e str, Result<Selector, SelectorError>>,
    /// Each (selector, class) evaluated once: the outcome depends on nothing else.
    verdicts: HashMap<(&'e str, &'e str), Result<bool, SelectorError>>,
}

impl<'e> SelectorChecker<'e> {
    /// Compiles each selector, then evaluates it on the devices it could see (the named class,
    /// or every class) so that a selector returning a non-bool is caught before it is applied.
    fn check(&mut self, sink: &mut Sink<'_>, field: &str, class: Option<&str>, selectors: &'e [CelExpression]) {
        let mut any_match_possible = true;
        // The selectors no class satisfies, each with why when every class lacked what it reads.
        let mut unmet: Vec<String> = Vec::new();
        let engine = self.engine;
        for (i, expr) in selectors.iter().enumerate() {
            let f = format!("{field}.selectors[{i}]");
            let selector = match self.compiled.entry(expr.0.as_str()).or_insert_with(|| engine.compile(&expr.0)) {
                Ok(s) => &*s,
                Err(e) => {
                    sink.error(f, e.to_string());
                    any_match_possible = false;
                    continue;
                }
            };
            let mut matched_any = false;
            // (classes looked at, those lacking a key it reads, the first such message)
            let (mut looked, mut lacking, mut missing) = (0, 0, None::<String>);
            for (name, device) in self.classes.iter() {
                if class.is_some_and(|c| c != *name) {
                    continue;
                }
                let Some(device) = device else { continue };
                looked += 1;
                let verdict =
                    self.verdicts.entry((expr.0.as_str(), *name)).or_insert_with(|| engine.matches(selector, device));
                match verdict {
                    Ok(true) => matched_any = true,
                    Ok(false) => {}
                    Err(SelectorError::Evaluation { missing_key: true, message, .. }) => {
                        lacking += 1;
                        missing.get_or_insert_with(|| message.clone());
                    }
                    Err(e @ SelectorError::NonBool { .. }) => {
                        sink.error(f.clone(), e.to_string());
                        break;
                    }
                    Err(e) => {
                        sink.error(f.clone(), format!("on InferenceClass {name}: {e}"));
                        break;
                    }
                }
            }
            any_match_possible &= matched_any;
            if !matched_any && looked > 0 {
                unmet.push(match missing {
                    Some(m) if lacking == looked => {
                        format!("selectors[{i}] reads what no InferenceClass publishes ({m})")
                    }
                    _ => format!("selectors[{i}] is false for every InferenceClass"),
                });
            }
        }
        if !selectors.is_empty() && any_match_possible {
            return;
        }
        if !selectors.is_empty()
            && !self.classes.is_empty()
            && sink.problems.last().is_none_or(|p| !p.field.starts_with(field))
        {
            let why = if unmet.is_empty() { String::new() } else { format!(" ({})", unmet.join("; ")) };
            sink.warn(
                field.to_string(),
                format!(
                    "no InferenceClass in this set satisfies every selector{why}: this alternative can never be used"
                ),
            );
        }
    }
}
