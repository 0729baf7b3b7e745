//! What a CRD schema cannot check, over a whole set of documents: duplicate names, references
//! between objects (classes, caches, deployments), CEL device selectors that do not compile or
//! do not return bool, device descriptions whose quantities or versions are invalid, and
//! sums that cannot add up. Runs after `document::parse_stream` has checked each document.
//! `validate_set` runs the checks in order: names, classes, what the set holds (`Set`), each
//! object by kind (`cluster`, `deployment`, `cache_claim`, with `selectors`), shared model names.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::cel::{CelValue, SelectorEngine, SelectorError};
use crate::common::CapacityType;
use crate::document::{FleetObject, Kind, Located, Problem, Severity, SourceLocation};

mod cache_claim;
mod cluster;
mod deployment;
mod quota;
mod selectors;

use selectors::SelectorChecker;

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
    let engine = SelectorEngine::new();
    let mut sink = Sink { problems: Vec::new(), current: None };
    check_duplicate_names(&mut sink, objects);
    let classes = describe_classes(&mut sink, objects, &engine);
    let set = Set::of(objects, refused, &classes);
    let mut selectors = SelectorChecker::new(&engine, &classes);
    for obj in objects {
        sink.current = Some(obj);
        let ns = obj.value.namespace().unwrap_or("");
        match &obj.value {
            FleetObject::Class(_) => {}
            FleetObject::Cluster(c) => cluster::check_cluster(&mut sink, c, &set),
            FleetObject::Deployment(d) => deployment::check_deployment(&mut sink, &d.spec, ns, &set, &mut selectors),
            FleetObject::Cache(c) => cache_claim::check_cache(&mut sink, &c.spec, ns, &set),
            FleetObject::Claim(c) => cache_claim::check_claim(&mut sink, &c.spec, &set, &mut selectors),
            FleetObject::Quota(q) => quota::check_quota(&mut sink, &q.spec, &set),
        }
    }
    check_shared_model_names(&mut sink, objects);
    check_adapter_names(&mut sink, objects);
    sink.problems
}

/// A second object of the same kind, namespace and name as an earlier one.
fn check_duplicate_names<'a>(sink: &mut Sink<'a>, objects: &'a [Located<FleetObject>]) {
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
}

/// Every class's device described to CEL once (`None` when it cannot be: an error), by name;
/// a class with no price at all is warned about.
fn describe_classes<'a>(
    sink: &mut Sink<'a>,
    objects: &'a [Located<FleetObject>],
    engine: &SelectorEngine,
) -> BTreeMap<&'a str, Option<CelValue>> {
    let mut classes = BTreeMap::new();
    for obj in objects {
        let FleetObject::Class(c) = &obj.value else { continue };
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
    classes
}

/// What the checks of one object look up in the rest of the set.
struct Set<'a> {
    /// The documents already refused with errors (kind, namespace, name).
    refused: &'a [(Kind, Option<String>, String)],
    class_names: BTreeSet<&'a str>,
    /// Devices per node of each class.
    per_node: BTreeMap<&'a str, u32>,
    /// The jurisdictions of the set's InferenceClusters.
    jurisdictions: BTreeSet<&'a str>,
    /// Each InferenceCluster's name and the labels selectors match.
    cluster_labels: Vec<(&'a str, BTreeMap<String, String>)>,
    /// (namespace, name) of the set's ModelDeployments and ModelCaches.
    deployments: BTreeSet<(&'a str, &'a str)>,
    caches: BTreeSet<(&'a str, &'a str)>,
    /// (namespace, name) of the set's ModelCaches without `spec.digest`.
    unverified_caches: BTreeSet<(&'a str, &'a str)>,
    /// The `spec.targets.clusterSelector` of the set's ModelCaches that give one.
    cache_selectors: BTreeMap<(&'a str, &'a str), &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    /// Each InferenceCluster's jurisdiction and region, by name.
    places: BTreeMap<&'a str, (&'a str, &'a str)>,
}

impl<'a> Set<'a> {
    fn of(
        objects: &'a [Located<FleetObject>],
        refused: &'a [(Kind, Option<String>, String)],
        classes: &BTreeMap<&'a str, Option<CelValue>>,
    ) -> Self {
        let clusters = || {
            objects.iter().filter_map(|o| match &o.value {
                FleetObject::Cluster(c) => Some((o, c)),
                _ => None,
            })
        };
        let named = |kind: Kind| -> BTreeSet<(&'a str, &'a str)> {
            objects
                .iter()
                .filter(|o| o.value.kind() == kind)
                .map(|o| (o.value.namespace().unwrap_or(""), o.value.name()))
                .collect()
        };
        Set {
            refused,
            class_names: classes.keys().copied().collect(),
            per_node: objects
                .iter()
                .filter_map(|o| match &o.value {
                    FleetObject::Class(c) => Some((o.value.name(), c.spec.devices_per_node)),
                    _ => None,
                })
                .collect(),
            jurisdictions: clusters().map(|(_, c)| c.spec.jurisdiction.as_str()).collect(),
            cluster_labels: clusters().map(|(o, c)| (o.value.name(), crate::selector::cluster_labels(c))).collect(),
            deployments: named(Kind::ModelDeployment),
            caches: named(Kind::ModelCache),
            unverified_caches: objects
                .iter()
                .filter_map(|o| match &o.value {
                    FleetObject::Cache(c) if c.spec.digest.is_none() => {
                        Some((o.value.namespace().unwrap_or(""), o.value.name()))
                    }
                    _ => None,
                })
                .collect(),
            cache_selectors: objects
                .iter()
                .filter_map(|o| match &o.value {
                    FleetObject::Cache(c) => Some((
                        (o.value.namespace().unwrap_or(""), o.value.name()),
                        c.spec.targets.cluster_selector.as_ref()?,
                    )),
                    _ => None,
                })
                .collect(),
            places: clusters()
                .map(|(o, c)| (o.value.name(), (c.spec.jurisdiction.as_str(), c.spec.region.as_str())))
                .collect(),
        }
    }

    /// Whether a document of `kind` named `name` (in namespace `ns`, when given) was refused.
    fn refused_named(&self, kind: Kind, ns: Option<&str>, name: &str) -> bool {
        self.refused.iter().any(|(k, n, m)| {
            *k == kind && m == name && (ns.is_none() || n.as_deref().unwrap_or("default") == ns.unwrap_or(""))
        })
    }

    /// Whether the set defines (or refused) the class `name`.
    fn known_class(&self, name: &str) -> bool {
        self.class_names.contains(name) || self.refused_named(Kind::InferenceClass, None, name)
    }

    /// The message for a reference to a class the set does not define.
    fn unknown_class(&self, name: &str) -> String {
        let known: Vec<&str> = self.class_names.iter().copied().collect();
        format!(
            "unknown InferenceClass {name:?}; defined here: [{}] (add its file with another -f, or fix the name)",
            known.join(", ")
        )
    }
}

/// A model name several deployments serve: all of them are routed only with weights on all.
fn check_shared_model_names<'a>(sink: &mut Sink<'a>, objects: &'a [Located<FleetObject>]) {
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
}

/// An adapter's name is no other deployment's model name, alias or adapter: clients could not
/// tell which one they ask for (the gateway routes the oldest and leaves the other out).
fn check_adapter_names<'a>(sink: &mut Sink<'a>, objects: &'a [Located<FleetObject>]) {
    let mut names: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, obj) in objects.iter().enumerate() {
        if let FleetObject::Deployment(d) = &obj.value {
            let m = &d.spec.model;
            for n in std::iter::once(&m.name).chain(&m.aliases).chain(d.spec.adapters.iter().map(|a| &a.name)) {
                let owners = names.entry(n.as_str()).or_default();
                if !owners.contains(&i) {
                    owners.push(i);
                }
            }
        }
    }
    for (i, obj) in objects.iter().enumerate() {
        let FleetObject::Deployment(d) = &obj.value else { continue };
        for (k, a) in d.spec.adapters.iter().enumerate() {
            let others: Vec<String> = names
                .get(a.name.as_str())
                .into_iter()
                .flatten()
                .filter(|j| **j != i)
                .map(|j| objects[*j].value.display_name())
                .collect();
            if !others.is_empty() {
                sink.current = Some(obj);
                sink.error(
                    format!("spec.adapters[{k}].name"),
                    format!(
                        "`{}` is also a model, alias or adapter of {}: give the adapter a name no other deployment uses",
                        a.name,
                        first_of(&others, NAMED_AT_MOST)
                    ),
                );
            }
        }
    }
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

fn has_duplicates(types: &[CapacityType]) -> bool {
    types.iter().enumerate().any(|(i, t)| types[..i].contains(t))
}

#[cfg(test)]
mod tests;
