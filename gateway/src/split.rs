//! Weighted traffic between the deployments that serve one model name (a canary, a version
//! roll), as pure functions. In the fleet, [`join`] says whether a ModelDeployment may share a
//! name already served by an older one (only when both give `spec.routing.weight` and both are
//! in one namespace — a tenant never takes a share of another namespace's traffic; otherwise
//! the oldest serves alone, as before weights existed). Per request, [`narrow`] keeps the routes
//! of one deployment: a weighted rendezvous hash of the request's affinity key (its prefix key,
//! else a per-request number) over the deployments that can take it now, so each gets
//! weight / sum of weights of the keys and a prefix sticks to its deployment; the usual choice
//! among that deployment's clusters follows. [`share_text`] is what `Serving` says about the
//! share each deployment received, rounded so that steady traffic does not rewrite it.

use std::time::Instant;

use flotilla_apis::common::Sovereignty;

use crate::config::RoutingMode;
use crate::feedback::{MIN_ATTEMPTS, Stats};
use crate::pick::hash;
use crate::table::{Model, ModelSpec, Route, RouteSpec};

/// Seeds the deployment hash, so a key's order of deployments is independent of its order of
/// clusters (which `pick` hashes with the key alone).
const SEED: u64 = 0x7765_6967_6874_7321;

/// How an older ModelDeployment holds a model name that a newer one also names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// As an alias of another model.
    Alias,
    /// As its model name, without `spec.routing.weight`: it serves the name alone.
    Alone,
    /// As its model name, with `spec.routing.weight`: deployments with a weight share it.
    Split,
    /// As one of its LoRA adapters (`spec.adapters[].name`).
    Adapter,
}

/// Whether `who` (giving `weight`) joins `model`, which `first` already holds as `holder`;
/// `same_namespace`: both are in one namespace (a split never crosses namespaces: the requests
/// of one team's clients, prompts included, never reach another team's deployment because it
/// chose the same name). `Err` is the problem to report (the deployment is then not routed).
pub fn join(
    model: &str,
    who: &str,
    weight: Option<u32>,
    first: &str,
    holder: Holder,
    same_namespace: bool,
) -> Result<(), String> {
    if !same_namespace && !matches!(holder, Holder::Alias | Holder::Adapter) {
        return Err(format!(
            "{who}: model name `{model}` is already served by {first}, in another namespace: a name's traffic is shared only between deployments of one namespace, so it is not routed; give it another spec.model.name"
        ));
    }
    match (holder, weight) {
        (Holder::Split, Some(_)) => Ok(()),
        (Holder::Alias, _) => Err(format!(
            "{who}: model name `{model}` is already served by {first}: it is not routed; give it another spec.model.name"
        )),
        (Holder::Adapter, _) => Err(format!(
            "{who}: model name `{model}` is already a LoRA adapter of {first}: it is not routed; give it another spec.model.name"
        )),
        (Holder::Alone, None) => Err(format!(
            "{who}: model name `{model}` is already served by {first}: it is not routed; give it another spec.model.name, or set spec.routing.weight on both to split the traffic"
        )),
        (Holder::Alone, Some(_)) => Err(format!(
            "{who}: model name `{model}` is already served by {first}, which gives no spec.routing.weight: it is not routed; set spec.routing.weight on {first} too to split the traffic"
        )),
        (Holder::Split, None) => Err(format!(
            "{who}: model name `{model}` is split by weight between {first} and the deployments that join it, but this one gives no spec.routing.weight: it is not routed; set spec.routing.weight to join the split (0 takes no traffic)"
        )),
    }
}

/// The least policy allowing every cluster that one of `policies` allows: the policy of a split
/// name as a whole (API keys' jurisdictions, fallbacks). Each route stays bound by its own
/// deployment's policy ([`route_open`]).
pub fn hull(policies: &[&Sovereignty]) -> Sovereignty {
    fn union<T: Clone + Ord>(lists: impl Iterator<Item = Vec<T>>) -> Vec<T> {
        let mut all = Vec::new();
        for l in lists {
            if l.is_empty() {
                return Vec::new(); // one policy allows any: so does the hull
            }
            all.extend(l);
        }
        all.sort();
        all.dedup();
        all
    }
    let Some(first) = policies.first() else { return Sovereignty::default() };
    let mut denied = first.denied_regions.clone();
    denied.retain(|r| policies.iter().all(|p| p.denied_regions.contains(r)));
    Sovereignty {
        allowed_jurisdictions: union(policies.iter().map(|p| p.allowed_jurisdictions.clone())),
        allowed_regions: union(policies.iter().map(|p| p.allowed_regions.clone())),
        denied_regions: denied,
    }
}

/// The deployment names in a model of a routing file are unique, and only a split model has any.
pub(crate) fn check_deployments(m: &ModelSpec) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for d in &m.deployments {
        if !seen.insert(d.name.as_str()) {
            return Err(format!("model `{}`: deployment `{}` is listed twice", m.name, d.name));
        }
    }
    Ok(())
}

/// The index of the deployment `r` names among `m`'s (0 for a model that is not split).
pub(crate) fn route_deployment(m: &ModelSpec, r: &RouteSpec) -> Result<usize, String> {
    let at = |d: &str| m.deployments.iter().position(|x| x.name == d);
    match (&r.deployment, m.deployments.is_empty()) {
        (None, true) => Ok(0),
        (Some(d), false) => at(d).ok_or_else(|| {
            format!("model `{}`: the route to cluster `{}` names unknown deployment `{d}`", m.name, r.cluster)
        }),
        (None, false) => Err(format!(
            "model `{}` is split between deployments: the route to cluster `{}` must name one (`deployment`)",
            m.name, r.cluster
        )),
        (Some(d), true) => Err(format!(
            "model `{}`: the route to cluster `{}` names deployment `{d}`, but the model lists no `deployments`",
            m.name, r.cluster
        )),
    }
}

/// Whether `r`'s deployment takes traffic there: a weight above 0 and a policy allowing the
/// cluster. Routes of a model that is not split always do.
pub fn route_open(m: &Model, r: &Route) -> bool {
    m.deployments
        .get(r.deployment)
        .is_none_or(|d| d.weight > 0 && d.sovereignty.allows(&r.cluster.jurisdiction, &r.cluster.region))
}

/// The key a request is split by: its prefix key under prefix affinity, else `n` (a per-request
/// number) hashed, so requests without affinity spread by weight too.
pub fn key(mode: RoutingMode, prefix: Option<u64>, n: u64) -> u64 {
    match (mode, prefix) {
        (RoutingMode::Prefix, Some(k)) => k,
        _ => hash(SEED, &n.to_le_bytes()),
    }
}

/// The option (`(name, weight)`) that `key` goes to: weighted rendezvous hashing, so each option
/// receives weight / sum of weights of the keys, a key keeps its option while that option stays,
/// and an option leaving moves only its own keys. Weight 0 is never chosen.
pub fn choose(options: &[(&str, u32)], key: u64) -> Option<usize> {
    options
        .iter()
        .enumerate()
        .filter(|(_, (_, w))| *w > 0)
        .map(|(i, (name, w))| {
            let u = ((hash(key ^ SEED, name.as_bytes()) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (i, f64::from(*w) / -u.ln())
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
}

/// `idx` (the routes of `model`, in `routes`, that can take the request now) narrowed to those
/// of one deployment: the one [`choose`] gives `key` among the deployments with a route this
/// request has not tried yet (else among all of them), so a failed attempt moves to another
/// deployment only when its own are spent. A model that is not split passes through.
pub fn narrow(
    model: &Model,
    routes: &[&Route],
    idx: Vec<usize>,
    tried: impl Fn(usize) -> bool,
    key: u64,
) -> Vec<usize> {
    if model.deployments.is_empty() {
        return idx;
    }
    let present = |untried: bool| {
        let mut ds: Vec<usize> =
            idx.iter().filter(|&&i| !(untried && tried(i))).map(|&i| routes[i].deployment).collect();
        ds.sort_unstable();
        ds.dedup();
        ds
    };
    let mut ds = present(true);
    if ds.is_empty() {
        ds = present(false);
    }
    let options: Vec<(usize, &str, u32)> =
        ds.iter().filter_map(|&d| model.deployments.get(d).map(|x| (d, x.name.as_str(), x.weight))).collect();
    let named: Vec<(&str, u32)> = options.iter().map(|(_, n, w)| (*n, *w)).collect();
    let Some(j) = choose(&named, key) else { return Vec::new() };
    let d = options[j].0;
    idx.into_iter().filter(|&i| routes[i].deployment == d).collect()
}

/// Rounds a share to 5 % (to 1 % below 9.5 %), so a steady split reads the same each minute.
pub fn bucket(share: f64) -> u32 {
    let pct = (share * 100.0).clamp(0.0, 100.0);
    if pct < 9.5 { pct.round() as u32 } else { ((pct / 5.0).round() * 5.0) as u32 }
}

/// What `Serving` adds for a deployment of a split `model`: its `weight` of `total`, and the
/// share of the model's answered requests over the last minute it answered (`mine` of `all`),
/// rounded by [`bucket`]. `routable`: it has a route the gateway may use.
pub fn share_text(model: &str, weight: u32, total: u64, mine: u64, all: u64, routable: bool) -> String {
    if weight == 0 {
        return format!("; spec.routing.weight is 0 (of {total}): it takes none of the traffic for `{model}`");
    }
    if !routable {
        return format!(
            "; weight {weight} of {total}: while it has no routable replica its share of `{model}` goes to the other deployments"
        );
    }
    if all < MIN_ATTEMPTS {
        return format!(
            "; weight {weight} of {total}: too few requests for `{model}` in the last minute to measure its share"
        );
    }
    let share = bucket(mine as f64 / all as f64);
    format!("; receives about {share} % of the traffic for `{model}` over the last minute (weight {weight} of {total})")
}

/// [`share_text`] for the deployment named `deployment` of `model` from the answers counted in
/// `shares` (model, deployment); `None` when the model is not split or has no such deployment.
pub fn share_note(model: &Model, deployment: &str, routable: bool, shares: &Stats, now: Instant) -> Option<String> {
    let me = model.deployments.iter().find(|d| d.name == deployment)?;
    let total: u64 = model.deployments.iter().map(|d| u64::from(d.weight)).sum();
    let seen = |d: &str| shares.observe(&model.name, d, now).ok;
    let all: u64 = model.deployments.iter().map(|d| seen(&d.name)).sum();
    Some(share_text(&model.name, me.weight, total, seen(&me.name), all, routable))
}

#[cfg(test)]
#[path = "split_tests.rs"]
mod tests;
