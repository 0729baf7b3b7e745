//! The routing table as the control cluster describes it, as a pure function: InferenceClusters
//! (entry URL, region, jurisdiction, readiness) and ModelDeployments (model name, aliases,
//! sovereignty, fallbacks, per-cluster Ready replicas from status) go in; a [`TableFile`] and
//! the problems that kept parts of it out come out. One bad object never empties the table:
//! it is left out and named, and the rest routes.

use std::collections::{BTreeMap, HashMap};

use flotilla_apis::cluster::InferenceCluster;
use flotilla_apis::constants::condition;
use flotilla_apis::deployment::ModelDeployment;
use kube::ResourceExt;

use crate::table::{ClusterSpec, ModelSpec, RouteSpec, TableFile};

/// ModelDeployment (namespace, name) → the model name it serves in the table.
pub type Owners = BTreeMap<(String, String), String>;

/// The table for the fleet, which deployment serves each model, and what was left out and why.
pub fn table_file(clusters: &[InferenceCluster], deployments: &[ModelDeployment]) -> (TableFile, Owners, Vec<String>) {
    let mut problems = Vec::new();
    let mut owners = Owners::new();
    let mut file = TableFile { clusters: Vec::new(), models: Vec::new() };
    let mut routable: HashMap<String, bool> = HashMap::new();
    let mut sorted: Vec<&InferenceCluster> = clusters.iter().collect();
    sorted.sort_by_key(|c| c.name_any());
    for c in sorted {
        let name = c.name_any();
        let Some(url) = c.spec.endpoint.as_deref() else {
            routable.insert(name, false);
            continue;
        };
        if !url.starts_with("http://") {
            problems.push(format!(
                "InferenceCluster {name}: spec.endpoint `{url}` is not routed: the gateway speaks plain http to member entry points; use an http:// in-cluster URL"
            ));
            routable.insert(name, false);
            continue;
        }
        // Ready is written by the controller only on evidence from the member.
        let ready = c.status.as_ref().is_some_and(|s| s.conditions.is_true(condition::READY));
        routable.insert(name.clone(), ready);
        file.clusters.push(ClusterSpec {
            name,
            url: url.to_string(),
            jurisdiction: c.spec.jurisdiction.0.clone(),
            region: c.spec.region.clone(),
        });
    }

    // The oldest deployment of a model name (then namespace/name) owns it and its aliases.
    let mut live: Vec<&ModelDeployment> =
        deployments.iter().filter(|d| d.metadata.deletion_timestamp.is_none()).collect();
    live.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .then_with(|| a.namespace().cmp(&b.namespace()))
            .then_with(|| a.name_any().cmp(&b.name_any()))
    });
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for d in live {
        let who = format!("ModelDeployment {}/{}", d.namespace().unwrap_or_default(), d.name_any());
        let model = &d.spec.model;
        if let Some(first) = owner.get(&model.name) {
            problems.push(format!(
                "{who}: model name `{}` is already served by {first}: it is not routed; give it another spec.model.name",
                model.name
            ));
            continue;
        }
        owner.insert(model.name.clone(), who.clone());
        owners.insert((d.namespace().unwrap_or_default(), d.name_any()), model.name.clone());
        let mut aliases = Vec::new();
        for a in &model.aliases {
            match owner.get(a) {
                Some(first) => problems.push(format!(
                    "{who}: alias `{a}` is already a name or alias of {first}: the alias is not routed; remove it from spec.model.aliases"
                )),
                None => {
                    owner.insert(a.clone(), who.clone());
                    aliases.push(a.clone());
                }
            }
        }
        let mut ready: BTreeMap<&str, i32> = BTreeMap::new();
        // Replicas still serving the previous spec during a rollout are routed to as well.
        for p in d.status.iter().flat_map(|s| &s.placements) {
            *ready.entry(p.cluster.as_str()).or_default() += p.ready.max(p.serving).max(0);
        }
        let routes = ready
            .into_iter()
            .filter(|(c, n)| *n > 0 && routable.get(*c).copied().unwrap_or(false))
            .map(|(c, n)| RouteSpec {
                cluster: c.to_string(),
                weight: n.unsigned_abs(),
                ready: true,
                continuation: None,
            })
            .collect();
        file.models.push(ModelSpec {
            name: model.name.clone(),
            aliases,
            sovereignty: d.spec.placement.sovereignty.clone().unwrap_or_default(),
            fallbacks: d.spec.routing.as_ref().map(|r| r.fallback_models.clone()).unwrap_or_default(),
            routes,
        });
    }
    // Fallbacks must name served models; an unknown one is dropped, not fatal.
    let names: std::collections::HashSet<String> = owner.keys().cloned().collect();
    for m in &mut file.models {
        let (keep, drop): (Vec<String>, Vec<String>) =
            m.fallbacks.drain(..).partition(|f| names.contains(f) && f != &m.name);
        for f in drop {
            problems.push(format!(
                "model `{}`: fallback `{f}` is not a model served by the fleet (or is the model itself): it is skipped",
                m.name
            ));
        }
        m.fallbacks = keep;
    }
    file.models.sort_by(|a, b| a.name.cmp(&b.name));
    (file, owners, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RoutingTable;

    fn cluster(name: &str, juris: &str, ready: bool, endpoint: Option<&str>) -> InferenceCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
            "metadata": {"name": name},
            "spec": {"provider": {"static": {"site": "lab"}}, "region": format!("{}-1", juris.to_lowercase()),
                     "jurisdiction": juris, "endpoint": endpoint, "pools": []},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}, "reason": "X",
                        "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap()
    }

    fn deployment(ns: &str, name: &str, model: &str, created: &str, ready: &[(&str, i32)]) -> ModelDeployment {
        let placements: Vec<_> = ready
            .iter()
            .map(|(c, r)| {
                serde_json::json!({"cluster": c, "pool": "p", "class": "h100", "capacityType": "on-demand",
                                              "fallbackRank": 1, "desired": r, "ready": r})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
            "spec": {"model": {"name": model, "aliases": ["alias"], "source": "hf://o/m"}, "replicas": 2,
                     "engine": {"image": "vllm"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
                     "devices": {"alternatives": [{"class": "h100"}]},
                     "placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}},
                     "routing": {"fallbackModels": ["nope"]}},
            "status": {"placements": placements}
        }))
        .unwrap()
    }

    #[test]
    fn routes_only_ready_replicas_on_ready_clusters_with_an_http_entry() {
        let clusters = [
            cluster("eu1", "EU", true, Some("http://10.0.0.1:8000")),
            cluster("eu2", "EU", false, Some("http://10.0.0.2:8000")),
            cluster("eu3", "EU", true, None),
            cluster("eu4", "EU", true, Some("https://tls:443")),
            cluster("eu5", "EU", true, Some("http://10.0.0.5:8000")),
        ];
        let d = deployment(
            "a",
            "llama",
            "llama",
            "2026-01-01T00:00:00Z",
            &[("eu1", 2), ("eu2", 1), ("eu3", 1), ("eu4", 1), ("eu5", 0)],
        );
        let (file, owners, problems) = table_file(&clusters, &[d]);
        assert_eq!(owners.get(&("a".to_string(), "llama".to_string())).map(String::as_str), Some("llama"));
        let routes: Vec<(&str, u32)> = file.models[0].routes.iter().map(|r| (r.cluster.as_str(), r.weight)).collect();
        assert_eq!(routes, [("eu1", 2)]);
        assert!(problems.iter().any(|p| p.contains("eu4") && p.contains("http://")), "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("fallback `nope`")), "{problems:?}");
        let table = RoutingTable::from_file("fleet", file).unwrap();
        let m = table.resolve("alias").unwrap();
        assert_eq!(m.sovereignty.allowed_jurisdictions[0].0, "EU");
    }

    #[test]
    fn replicas_still_serving_the_previous_spec_are_routed_during_a_rollout() {
        let clusters = [cluster("eu1", "EU", true, Some("http://10.0.0.1:8000"))];
        let mut d = deployment("a", "llama", "llama", "2026-01-01T00:00:00Z", &[("eu1", 0)]);
        // None ready on the new spec yet, 2 serving on the old one.
        if let Some(p) = d.status.as_mut().and_then(|s| s.placements.first_mut()) {
            (p.desired, p.serving) = (2, 2);
        }
        let (file, _, _) = table_file(&clusters, std::slice::from_ref(&d));
        let routes: Vec<(&str, u32)> = file.models[0].routes.iter().map(|r| (r.cluster.as_str(), r.weight)).collect();
        assert_eq!(routes, [("eu1", 2)]);
    }

    #[test]
    fn the_oldest_deployment_owns_a_name_and_deleting_drops_it() {
        let clusters = [cluster("eu1", "EU", true, Some("http://10.0.0.1:8000"))];
        let old = deployment("b", "old", "llama", "2026-01-01T00:00:00Z", &[("eu1", 1)]);
        let new = deployment("a", "new", "llama", "2026-02-01T00:00:00Z", &[("eu1", 3)]);
        let (file, owners, problems) = table_file(&clusters, &[new.clone(), old.clone()]);
        assert_eq!(
            owners.keys().collect::<Vec<_>>(),
            [&("b".to_string(), "old".to_string())],
            "only the older one owns it"
        );
        assert_eq!(file.models.len(), 1);
        assert_eq!(file.models[0].routes[0].weight, 1, "the older deployment serves");
        assert!(problems.iter().any(|p| p.contains("ModelDeployment a/new") && p.contains("already served")));
        let mut gone = old;
        gone.metadata.deletion_timestamp = new.metadata.creation_timestamp.clone();
        let (file, _, _) = table_file(&clusters, &[gone]);
        assert!(file.models.is_empty(), "a deployment being deleted gets no new traffic");
    }
}
