//! Label selectors over InferenceClusters, as the solver, the controllers and `fleetctl
//! validate` read them: one definition of which labels a cluster has and what matches them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::InferenceCluster;

/// The labels cluster selectors match: the cluster's metadata labels plus the `flotilla.dev/*`
/// facts (`cluster`, `region`, `jurisdiction`, `country`).
pub fn cluster_labels(c: &InferenceCluster) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = c.metadata.labels.clone().unwrap_or_default().into_iter().collect();
    labels.insert("flotilla.dev/cluster".into(), c.metadata.name.clone().unwrap_or_default());
    labels.insert("flotilla.dev/region".into(), c.spec.region.clone());
    labels.insert("flotilla.dev/jurisdiction".into(), c.spec.jurisdiction.0.clone());
    if let Some(country) = &c.spec.country {
        labels.insert("flotilla.dev/country".into(), country.clone());
    }
    labels
}

/// Whether `labels` match a Kubernetes label selector. An empty selector matches everything.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> Result<(), String> {
    if let Some(ml) = &selector.match_labels {
        for (k, v) in ml {
            match labels.get(k) {
                Some(have) if have == v => {}
                Some(have) => return Err(format!("label {k}={have}, selector wants {k}={v}")),
                None => return Err(format!("no label {k}, selector wants {k}={v}")),
            }
        }
    }
    for e in selector.match_expressions.iter().flatten() {
        let have = labels.get(&e.key);
        let values = e.values.clone().unwrap_or_default();
        let ok = match e.operator.as_str() {
            "In" => have.is_some_and(|h| values.contains(h)),
            "NotIn" => !have.is_some_and(|h| values.contains(h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            other => return Err(format!("unknown selector operator {other:?}")),
        };
        if !ok {
            return Err(format!(
                "label {}={} fails `{} {} [{}]`",
                e.key,
                have.map_or("<none>", String::as_str),
                e.key,
                e.operator,
                values.join(", ")
            ));
        }
    }
    Ok(())
}
