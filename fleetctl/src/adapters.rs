//! Where each LoRA adapter of the plan's deployments may be served, offline: the clusters the
//! plan places its deployment in that the adapter's policy allows (its `sovereignty` narrowing
//! the deployment's, and its `clusterSelector`), and those it leaves out with why. Whether its
//! ModelCache is staged there is known only live (`status.adapters`); offline an adapter is
//! served in an allowed cluster once its cache is Ready there.

use std::collections::BTreeMap;

use flotilla_apis::document::{FleetObject, Located};
use flotilla_apis::selector::cluster_labels;
use flotilla_placement::Plan;
use serde::Serialize;

use crate::render::table;

/// One adapter of a planned deployment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdapterPreview {
    /// The deployment's `namespace/name`.
    pub deployment: String,
    /// The adapter's name (what clients put in `model`).
    pub adapter: String,
    /// The deployment's model: the adapter's `parent` in `/v1/models`.
    pub parent: String,
    /// Clusters the plan places the deployment in where the adapter may be served.
    pub clusters: Vec<String>,
    /// Clusters the plan places the deployment in that the adapter's policy leaves out, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outside_policy: Vec<Outside>,
}

/// A planned cluster an adapter may not be served in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Outside {
    /// The InferenceCluster.
    pub cluster: String,
    /// Why.
    pub reason: String,
}

/// Every adapter of the plan's deployments, in plan order.
pub fn previews(objects: &[Located<FleetObject>], plan: &Plan) -> Vec<AdapterPreview> {
    let mut deployments = BTreeMap::new();
    let mut clusters = BTreeMap::new();
    for o in objects {
        match &o.value {
            FleetObject::Deployment(md) => {
                deployments.insert((md.metadata.namespace.clone().unwrap_or_default(), o.value.name().to_string()), md);
            }
            FleetObject::Cluster(c) => {
                clusters.insert(
                    o.value.name().to_string(),
                    (c.spec.jurisdiction.0.clone(), c.spec.region.clone(), cluster_labels(c)),
                );
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for d in &plan.deployments {
        let Some(md) = deployments.get(&(d.namespace.clone(), d.name.clone())) else { continue };
        let base = md.spec.placement.sovereignty.clone().unwrap_or_default();
        let mut placed: Vec<&str> = d.assignments.iter().map(|a| a.cluster.as_str()).collect();
        placed.sort_unstable();
        placed.dedup();
        for a in &md.spec.adapters {
            let mut preview = AdapterPreview {
                deployment: format!("{}/{}", d.namespace, d.name),
                adapter: a.name.clone(),
                parent: md.spec.model.name.clone(),
                clusters: Vec::new(),
                outside_policy: Vec::new(),
            };
            for c in &placed {
                let why = match clusters.get(*c) {
                    Some((j, r, labels)) => a.outside_policy(&base, j, r, labels),
                    None => Some("no InferenceCluster of that name in the files".to_string()),
                };
                match why {
                    None => preview.clusters.push((*c).to_string()),
                    Some(reason) => preview.outside_policy.push(Outside { cluster: (*c).to_string(), reason }),
                }
            }
            out.push(preview);
        }
    }
    out
}

/// The `ADAPTERS` section of `plan`, or nothing when no planned deployment has adapters.
pub fn render(previews: &[AdapterPreview]) -> String {
    if previews.is_empty() {
        return String::new();
    }
    let mut rows = vec![
        ["ADAPTER", "PARENT", "DEPLOYMENT", "SERVED IN (once staged)", "OUTSIDE POLICY"].map(String::from).to_vec(),
    ];
    for p in previews {
        let list = |v: &[String]| if v.is_empty() { "-".to_string() } else { v.join(",") };
        let outside: Vec<String> = p.outside_policy.iter().map(|o| o.cluster.clone()).collect();
        rows.push(vec![p.adapter.clone(), p.parent.clone(), p.deployment.clone(), list(&p.clusters), list(&outside)]);
    }
    format!("\nADAPTERS\n{}", table(&rows))
}
