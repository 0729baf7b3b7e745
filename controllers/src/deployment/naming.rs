//! Workload names that cannot collide across the deployments of a namespace. A workload is
//! named `<deployment>-<pool>[-<role>]` (`render::workload_name`), so `qwen` on pool `h100-spot`
//! and `qwen-h100` on pool `spot` would both write `qwen-h100-spot` in the same member namespace
//! and fight over it. Of two deployments whose names could meet on the fleet's pools, the older
//! (creation time, then name) keeps the plain names and the younger ends each of its names in
//! a suffix (`render::workload_suffix`), recorded in its status before any object carries it
//! and kept for its life (`status.workloadSuffix`), so nothing is renamed when the other goes.
//!
//! Cost: one pass over the namespace's deployments comparing names, then, only for the few
//! whose name extends the other's by `-…` (the one way two joins can be equal), the names each
//! renders on the fleet's pools.

use std::collections::BTreeSet;

use flotilla_apis::ModelDeployment;
use flotilla_apis::deployment::TopologyType;
use kube::ResourceExt;

use crate::render::{workload_name, workload_suffix};

/// The suffix `md`'s workload names carry: the one its status recorded, else one when an older
/// deployment among `others` (any namespace; only `md`'s counts) renders a name `md` renders on
/// one of `pools` (asked for only then: most deployments have no such neighbour).
pub fn suffix<'a>(
    md: &ModelDeployment,
    others: impl IntoIterator<Item = &'a ModelDeployment>,
    pools: impl FnOnce() -> BTreeSet<String>,
) -> Option<String> {
    if let Some(kept) = md.status.as_ref().and_then(|s| s.workload_suffix.clone()) {
        return Some(kept);
    }
    let (ns, name) = (md.namespace(), md.name_any());
    let near: Vec<&ModelDeployment> = others
        .into_iter()
        .filter(|other| {
            other.namespace() == ns
                && other.name_any() != name
                // A suffixed deployment's names end in its hash: they meet no plain name.
                && other.status.as_ref().and_then(|s| s.workload_suffix.as_ref()).is_none()
                && extends(&name, &other.name_any())
                && older(other, md)
        })
        .collect();
    if near.is_empty() {
        return None;
    }
    let pools = pools();
    let mine = names(md, &pools);
    near.iter().any(|other| !names(other, &pools).is_disjoint(&mine)).then(|| workload_suffix(md))
}

/// Whether one name is the other followed by `-…`: only then can `<a>-<pool>…` equal `<b>-<pool>…`.
fn extends(a: &str, b: &str) -> bool {
    let (short, long) = if a.len() < b.len() { (a, b) } else { (b, a) };
    long.strip_prefix(short).is_some_and(|rest| rest.starts_with('-'))
}

/// Whether `a` was created before `b` (by name when the second is the same).
fn older(a: &ModelDeployment, b: &ModelDeployment) -> bool {
    let key = |d: &ModelDeployment| (d.metadata.creation_timestamp.as_ref().map(|t| t.0), d.name_any());
    key(a) < key(b)
}

/// Every plain workload name `md` renders on `pools`: per pool, the pool's (its budget's, and
/// its Deployment's when the deployment has no roles) and each role's.
fn names(md: &ModelDeployment, pools: &BTreeSet<String>) -> BTreeSet<String> {
    let name = md.name_any();
    let roles: &[Option<&str>] = match md.spec.topology.type_ {
        TopologyType::Disaggregated => &[None, Some("prefill"), Some("decode")],
        _ => &[None],
    };
    pools.iter().flat_map(|p| roles.iter().map(|r| workload_name(&name, p, *r, None)).collect::<Vec<_>>()).collect()
}

#[cfg(test)]
mod tests {
    use flotilla_apis::deployment::ModelDeploymentStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn md(ns: &str, name: &str, created: i64) -> ModelDeployment {
        let mut d: ModelDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"name": name, "source": "hf://org/m"}, "replicas": 1, "engine": {"image": "i"},
                     "topology": {"type": "Standalone", "devicesPerReplica": 1},
                     "devices": {"alternatives": [{"class": "h100"}]}}
        }))
        .unwrap();
        d.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        d
    }

    fn pools(p: &[&str]) -> BTreeSet<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_younger_of_a_colliding_pair_gets_the_suffix() {
        let (qwen, qwen_h100) = (md("ml", "qwen", 1), md("ml", "qwen-h100", 2));
        let fleet = pools(&["h100-spot", "spot"]);
        let all = [qwen.clone(), qwen_h100.clone()];
        assert_eq!(suffix(&qwen, &all, || fleet.clone()), None, "the older keeps today's names");
        assert_eq!(suffix(&qwen_h100, &all, || fleet.clone()), Some(workload_suffix(&qwen_h100)));
        // Created the other way round, the other one yields.
        let (qwen, qwen_h100) = (md("ml", "qwen", 2), md("ml", "qwen-h100", 1));
        let all = [qwen.clone(), qwen_h100.clone()];
        assert_eq!(suffix(&qwen, &all, || fleet.clone()), Some(workload_suffix(&qwen)));
        assert_eq!(suffix(&qwen_h100, &all, || fleet.clone()), None);
    }

    #[test]
    fn names_that_cannot_meet_stay_plain() {
        let fleet = pools(&["h100", "h100-spot"]);
        // `llama` and `llama-70b` meet only on a pool named `70b-…`: none here.
        let all = [md("ml", "llama", 1), md("ml", "llama-70b", 2)];
        assert_eq!(suffix(&all[1], &all, || fleet.clone()), None);
        // Another namespace's objects live in another member namespace.
        let all = [md("other", "qwen", 1), md("ml", "qwen-h100", 2)];
        assert_eq!(suffix(&all[1], &all, || pools(&["spot", "h100-spot"])), None);
        // A prefix that does not end at a `-` never meets.
        let all = [md("ml", "qwen", 1), md("ml", "qwenh100", 2)];
        assert_eq!(suffix(&all[1], &all, || pools(&["spot", "h100-spot"])), None);
    }

    #[test]
    fn a_recorded_suffix_is_kept_and_a_suffixed_deployment_blocks_nobody() {
        let fleet = pools(&["h100-spot", "spot"]);
        let mut young = md("ml", "qwen-h100", 2);
        young.status = Some(ModelDeploymentStatus { workload_suffix: Some("0a1b2c3d".into()), ..Default::default() });
        // The older one is gone: the younger keeps its names.
        assert_eq!(suffix(&young, [&young], || fleet.clone()).as_deref(), Some("0a1b2c3d"));
        // A third, younger still, collides only with the older plain one, not with the suffixed.
        let third = md("ml", "qwen", 3);
        assert_eq!(suffix(&third, [&young, &third], || fleet.clone()), None);
    }

    #[test]
    fn roles_of_a_disaggregated_deployment_count() {
        let fleet = pools(&["h100", "h100-decode"]);
        let mut older = md("ml", "qwen", 1);
        older.spec.topology.type_ = TopologyType::Disaggregated;
        // `qwen-h100` on pool `h100` or `h100-decode` meets none of `qwen`'s names there ...
        let younger = md("ml", "qwen-h100", 2);
        // ... but on pool `decode` it renders `qwen-h100-decode`: `qwen`'s decode role on `h100`.
        let fleet2 = pools(&["h100", "decode"]);
        assert_eq!(suffix(&younger, [&older, &younger], || fleet.clone()), None, "{fleet:?}");
        assert_eq!(
            suffix(&younger, [&older, &younger], || fleet2.clone()),
            Some(workload_suffix(&younger)),
            "role decode on h100"
        );
    }
}
