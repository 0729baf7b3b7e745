//! LoRA adapters in the fleet's routing table, as a pure function: a ModelDeployment's
//! `spec.adapters` and `status.adapters` go in with the routes and policy of the deployment
//! itself; one routable model per adapter comes out, named as clients name it, with its base
//! model as `parent`, the deployment's policy narrowed by the adapter's own, and only the
//! deployment's routes to clusters where the controller says the adapter is staged and verified.
//! An adapter that would take a name already served, or whose policy is wider than its
//! deployment's, is left out and named; the rest routes. A routing file's adapters (`parent`)
//! are checked against their parent model by [`check`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use flotilla_apis::common::Sovereignty;
use flotilla_apis::deployment::ModelDeployment;

use crate::split::Holder;
use crate::table::{ClusterSpec, ModelSpec, RouteSpec};

/// Name or alias (or adapter) → (the deployment that took it first, the model it names, how it
/// holds it).
pub(crate) type Names = BTreeMap<String, (String, String, Holder)>;

/// The deployment an adapter is served by, as the table sees it.
pub(crate) struct Base<'a> {
    /// `ModelDeployment ns/name`, for problems and the names it holds.
    pub who: &'a str,
    /// The model name the deployment serves (the adapters' `parent`).
    pub model: &'a str,
    /// The deployment's `spec.placement.sovereignty`.
    pub policy: &'a Sovereignty,
    /// The deployment's own routes (Ready replicas on routable clusters).
    pub routes: &'a [RouteSpec],
    /// Its `spec.routing.weight`: 0 takes no traffic, its adapters' included.
    pub weight: Option<u32>,
    /// It may scale to zero: a request for an adapter is held like one for the model.
    pub scale_to_zero: bool,
}

/// The routable adapters of `d` served by `base`; each name taken goes into `names`, and what is
/// left out is said in `problems`. `clusters` are the table's (jurisdiction and region).
pub(crate) fn specs(
    d: &ModelDeployment,
    base: &Base<'_>,
    clusters: &[ClusterSpec],
    names: &mut Names,
    problems: &mut Vec<String>,
) -> Vec<ModelSpec> {
    let who = base.who;
    let mut out = Vec::new();
    for a in &d.spec.adapters {
        let name = &a.name;
        if let Some((first, _, holder)) = names.get(name) {
            let what = match holder {
                Holder::Adapter => "an adapter",
                Holder::Alias => "an alias",
                Holder::Alone | Holder::Split => "the model name",
            };
            let of = if first == who { "this deployment".to_string() } else { first.clone() };
            problems.push(format!(
                "{who}: adapter `{name}` (spec.adapters) is already {what} of {of}: the adapter is not routed; give it another name"
            ));
            continue;
        }
        if let Some((field, message)) = a.wider_than(base.policy) {
            problems.push(format!("{who}: spec.adapters[{name}].{field}: {message}: the adapter is not routed"));
            continue;
        }
        names.insert(name.clone(), (who.to_string(), base.model.to_string(), Holder::Adapter));
        let sovereignty = a.sovereignty(base.policy);
        // Only where the controller staged and verified it; never the deployment's other clusters.
        let staged: BTreeSet<&str> = d
            .status
            .iter()
            .flat_map(|s| &s.adapters)
            .filter(|s| s.name == *name)
            .flat_map(|s| s.clusters.iter().map(String::as_str))
            .collect();
        let mut routes = Vec::new();
        for r in base.routes.iter().filter(|r| staged.contains(r.cluster.as_str())) {
            let allowed = clusters
                .iter()
                .find(|c| c.name == r.cluster)
                .is_some_and(|c| sovereignty.allows(&c.jurisdiction, &c.region));
            if !allowed {
                // A status written before the policy was narrowed, or a controller's mistake.
                problems.push(format!(
                    "{who}: status.adapters[{name}] lists cluster {}, which the adapter's sovereignty does not allow: not routed there",
                    r.cluster
                ));
                continue;
            }
            if base.weight != Some(0) {
                routes.push(RouteSpec { deployment: None, ..r.clone() });
            }
        }
        out.push(ModelSpec {
            name: name.clone(),
            aliases: Vec::new(),
            sovereignty,
            fallbacks: Vec::new(),
            routes,
            deployments: Vec::new(),
            scale_to_zero: base.scale_to_zero,
            parent: Some(base.model.to_string()),
        });
    }
    out
}

/// What an adapter is checked against: each non-adapter model's policy and route clusters,
/// and the names of the adapters.
pub(crate) struct Bases {
    models: HashMap<String, (Sovereignty, HashSet<String>)>,
    pub(crate) adapters: HashSet<String>,
}

pub(crate) fn bases(models: &[ModelSpec]) -> Bases {
    let mut b = Bases { models: HashMap::new(), adapters: HashSet::new() };
    for m in models {
        if m.parent.is_some() {
            b.adapters.insert(m.name.clone());
        } else {
            let clusters = m.routes.iter().map(|r| r.cluster.clone()).collect();
            b.models.insert(m.name.clone(), (m.sovereignty.clone(), clusters));
        }
    }
    b
}

/// A routing file's adapter `m` of `parent`: its effective policy, its parent's narrowed by its own (as
/// `flotilla_apis::deployment::Adapter::sovereignty`), or what is wrong with it.
pub(crate) fn check(m: &ModelSpec, bases: &Bases, parent: &str) -> Result<Sovereignty, String> {
    let name = &m.name;
    let Some((base, clusters)) = bases.models.get(parent) else {
        let what =
            if bases.adapters.contains(parent) { "is an adapter itself" } else { "is not a model name in `models`" };
        return Err(format!("adapter `{name}`: parent `{parent}` {what}: name the canonical name of the base model"));
    };
    if !m.fallbacks.is_empty() {
        return Err(format!(
            "adapter `{name}` lists fallbacks: an adapter has none (another model would answer without its fine-tuning)"
        ));
    }
    if !m.deployments.is_empty() {
        return Err(format!(
            "adapter `{name}` lists deployments: an adapter is served by one deployment of its parent, its routes name no deployment"
        ));
    }
    if let Some(r) = m.routes.iter().find(|r| !clusters.contains(&r.cluster)) {
        return Err(format!(
            "adapter `{name}`: route to cluster `{}`, where its parent `{parent}` has no route: the parent's engines serve the adapter",
            r.cluster
        ));
    }
    let adapter = flotilla_apis::deployment::Adapter {
        name: name.clone(),
        cache_ref: String::new(),
        sovereignty: Some(m.sovereignty.clone()),
        cluster_selector: None,
    };
    if let Some((field, message)) = adapter.wider_than(base) {
        return Err(format!("adapter `{name}`: {field}: {message} (the parent is `{parent}`)"));
    }
    Ok(adapter.sovereignty(base))
}

#[cfg(test)]
#[path = "adapters_tests.rs"]
mod tests;
