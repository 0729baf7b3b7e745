use flotilla_apis::InferenceCluster;

use super::*;

fn k(name: &str) -> DeploymentKey {
    ("ml".to_string(), name.to_string())
}

/// A plan where each named deployment wants `n` replicas.
fn plan(items: &[(&str, u32)]) -> Arc<Plan> {
    Arc::new(Plan {
        deployments: items
            .iter()
            .map(|(name, n)| DeploymentPlan {
                namespace: "ml".into(),
                name: name.to_string(),
                desired: *n,
                ..Default::default()
            })
            .collect(),
        ..Plan::default()
    })
}

fn live(names: &[&str]) -> HashSet<DeploymentKey> {
    names.iter().map(|n| k(n)).collect()
}

fn keys(names: &[&str]) -> BTreeSet<DeploymentKey> {
    names.iter().map(|n| k(n)).collect()
}

#[test]
fn only_deployments_whose_entry_changed_are_woken_once_per_plan() {
    let acted = Acted::default();
    let p1 = plan(&[("a", 1), ("b", 1), ("c", 1)]);
    for name in ["a", "b", "c"] {
        acted.act_on(k(name), (1, p1.clone()));
    }
    let all = live(&["a", "b", "c"]);
    assert!(acted.changed(1, &p1, &all).is_empty(), "the plan they acted on: nothing to wake");
    // Plan 2 changes b only.
    let p2 = plan(&[("a", 1), ("b", 2), ("c", 1)]);
    assert_eq!(acted.changed(2, &p2, &all), keys(&["b"]));
    assert!(acted.changed(2, &p2, &all).is_empty(), "woken once for plan 2, not on every pass");
    // Plan 3 changes b again before it was reconciled: woken again (new information), and a
    // and c, advanced to plan 2, are compared with plan 2's entries.
    let p3 = plan(&[("a", 1), ("b", 3), ("c", 1)]);
    assert_eq!(acted.changed(3, &p3, &all), keys(&["b"]));
    // b reconciles on plan 3: quiet.
    acted.act_on(k("b"), (3, p3.clone()));
    assert!(acted.changed(3, &p3, &all).is_empty());
}

#[test]
fn a_reconcile_that_read_an_older_plan_acts_on_the_newer_one_already_compared() {
    // The race: b's reconcile solved plan 1; before it records, the trigger compares plan 2
    // (b's old record, from plan 0, has the same entry as plan 2, so the trigger wakes nobody).
    let acted = Acted::default();
    let p0 = plan(&[("b", 2)]);
    acted.act_on(k("b"), (0, p0));
    let p1 = plan(&[("b", 1)]);
    let p2 = plan(&[("b", 2)]);
    assert!(acted.changed(2, &p2, &live(&["b"])).is_empty());
    // Now b's reconcile records with its plan 1: it gets plan 2, the one compared.
    let got = acted.act_on(k("b"), (1, p1));
    assert!(Arc::ptr_eq(&got, &p2), "acting on plan 1 would leave b on a stale entry with no wake-up");
    // A reconcile with a plan newer than any compared keeps its own.
    let p4 = plan(&[("b", 4)]);
    assert!(Arc::ptr_eq(&acted.act_on(k("b"), (4, p4.clone())), &p4));
    assert!(acted.changed(3, &plan(&[("b", 3)]), &live(&["b"])).is_empty(), "b acted on a newer plan than 3");
}

#[test]
fn a_deployment_never_reconciled_or_deleted_is_not_woken() {
    let acted = Acted::default();
    let p1 = plan(&[("a", 1)]);
    acted.act_on(k("a"), (1, p1));
    // b has no record (its first reconcile, from its own watch event, is still to come).
    assert!(acted.changed(2, &plan(&[("a", 1), ("b", 1)]), &live(&["a", "b"])).is_empty());
    // a is deleted: its record goes; were it kept, plan 3 would wake it.
    assert!(acted.changed(3, &plan(&[("a", 5)]), &live(&[])).is_empty());
    assert!(acted.changed(4, &plan(&[("a", 6)]), &live(&["a"])).is_empty(), "the record is gone");
}

fn cluster(name: &str, reachable: &str) -> InferenceCluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
        "metadata": {"name": name},
        "spec": {"provider": {"static": {}}, "region": "eu-1", "jurisdiction": "EU",
                 "credentials": {"secretRef": {"name": "x"}}, "endpoint": "http://x", "pools": []},
        "status": {"conditions": [{"type": "Reachable", "status": reachable, "reason": "R", "message": "m",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    }))
    .unwrap()
}

fn reachable(c: &InferenceCluster) -> Option<String> {
    c.status.as_ref()?.conditions.get("Reachable").map(|c| c.status.clone())
}

fn name(c: &InferenceCluster) -> String {
    c.metadata.name.clone().unwrap_or_default()
}

#[test]
fn a_fact_that_flips_and_flips_back_between_passes_still_counts() {
    let changes = Changes::default();
    changes.event(&Event::Apply(cluster("eu1", "True")), name, reachable);
    assert_eq!(changes.take(), BTreeSet::from(["eu1".to_string()]), "first seen: changed");
    // A heartbeat: the same fact, no change.
    changes.event(&Event::Apply(cluster("eu1", "True")), name, reachable);
    assert!(changes.take().is_empty());
    // Lost and back before the trigger looks: changed (a reconcile may have read "False").
    changes.event(&Event::Apply(cluster("eu1", "False")), name, reachable);
    changes.event(&Event::Apply(cluster("eu1", "True")), name, reachable);
    assert_eq!(changes.take().len(), 1);
    changes.event(&Event::Delete(cluster("eu1", "True")), name, reachable);
    assert_eq!(changes.take().len(), 1, "deleted");
}

#[test]
fn a_relist_that_no_longer_lists_an_object_counts_as_its_deletion() {
    let changes = Changes::default();
    for c in ["eu1", "eu2"] {
        changes.event(&Event::Apply(cluster(c, "True")), name, reachable);
    }
    let _ = changes.take();
    changes.event(&Event::Init, name, reachable);
    changes.event(&Event::InitApply(cluster("eu1", "True")), name, reachable);
    changes.event(&Event::InitDone, name, reachable);
    assert_eq!(changes.take(), BTreeSet::from(["eu2".to_string()]), "eu1 relisted unchanged; eu2 gone");
}

fn watched(name: &str, cache: Option<&str>, uses: &[(&str, &str)]) -> Watched {
    Watched {
        key: k(name),
        caches: cache.iter().map(|c| format!("ml/{c}")).collect(),
        uses: uses.iter().map(|(c, k)| (c.to_string(), k.to_string())).collect(),
    }
}

#[test]
fn a_change_wakes_only_the_deployments_it_concerns() {
    let deps = [
        watched("a", Some("llama"), &[("eu1", "h100")]),
        watched("b", None, &[("eu2", "a100")]),
        watched("c", Some("qwen"), &[("us1", "h100")]),
    ];
    let none = BTreeSet::new();
    let wake = |changed: Changed| to_wake(&deps, &none, &changed);
    // Nothing the reconciles read changed (a heartbeat, a capacity figure): nobody.
    assert!(wake(Changed::default()).is_empty());
    let caches = Changed { caches: BTreeSet::from(["ml/llama".to_string()]), ..Default::default() };
    assert_eq!(wake(caches), BTreeMap::from([(k("a"), Why::CacheChanged)]));
    let clusters = Changed { clusters: BTreeSet::from(["eu2".to_string()]), ..Default::default() };
    assert_eq!(wake(clusters), BTreeMap::from([(k("b"), Why::ClusterChanged)]));
    let classes = Changed { classes: BTreeSet::from(["h100".to_string()]), ..Default::default() };
    assert_eq!(wake(classes), BTreeMap::from([(k("a"), Why::ClassChanged), (k("c"), Why::ClassChanged)]));
    // A cache of the same name in another namespace is another cache.
    let other = Changed { caches: BTreeSet::from(["prod/llama".to_string()]), ..Default::default() };
    assert!(wake(other).is_empty());
    // Plan changes are woken whatever else changed, with that reason.
    let plan_changed = keys(&["c"]);
    assert_eq!(
        to_wake(&deps, &plan_changed, &Changed { clusters: BTreeSet::from(["us1".to_string()]), ..Default::default() }),
        BTreeMap::from([(k("c"), Why::PlanChanged)])
    );
}

#[test]
fn an_adapter_cache_wakes_the_deployments_that_reference_it_and_no_other() {
    let mut with_adapters = watched("a", Some("llama"), &[("eu1", "h100")]);
    with_adapters.caches.extend(["ml/support-fr".to_string(), "ml/sql".to_string()]);
    let deps = [with_adapters, watched("b", Some("qwen"), &[("eu1", "a100")])];
    let none = BTreeSet::new();
    let changed = |c: &str| Changed { caches: BTreeSet::from([c.to_string()]), ..Default::default() };
    assert_eq!(to_wake(&deps, &none, &changed("ml/support-fr")), BTreeMap::from([(k("a"), Why::CacheChanged)]));
    assert_eq!(to_wake(&deps, &none, &changed("ml/sql")), BTreeMap::from([(k("a"), Why::CacheChanged)]));
    assert!(to_wake(&deps, &none, &changed("prod/support-fr")).is_empty(), "another namespace's cache");
}

#[test]
fn a_cache_fact_moves_with_the_digest_an_adapter_is_checked_against() {
    use flotilla_apis::cache::{CachePhase, ClusterCacheStatus, ModelCacheStatus};
    let mut cache: flotilla_apis::ModelCache = serde_json::from_value(serde_json::json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelCache", "metadata": {"name": "fr", "namespace": "ml"},
        "spec": {"source": "hf://org/fr", "size": "1Gi", "targets": {"deployments": ["a"]}}
    }))
    .unwrap();
    let changes: Changes<super::super::trigger::CacheFact> = Changes::default();
    let key = |c: &flotilla_apis::ModelCache| super::super::trigger::namespaced_key(c);
    let fact = super::super::trigger::cache_fact;
    changes.event(&Event::Apply(cache.clone()), key, fact);
    let _ = changes.take();
    // spec.digest added: an adapter waiting CacheUnverified must be looked at again.
    cache.spec.digest = Some(format!("sha256:{}", "a".repeat(64)));
    changes.event(&Event::Apply(cache.clone()), key, fact);
    assert_eq!(changes.take(), BTreeSet::from(["ml/fr".to_string()]));
    // The digest observed in a cluster changes while the phase stays Ready.
    let ready = |digest: &str| ClusterCacheStatus {
        cluster: "eu1".into(),
        phase: CachePhase::Ready,
        digest: Some(digest.into()),
        ..Default::default()
    };
    cache.status = Some(ModelCacheStatus { clusters: vec![ready("sha256:old")], ..Default::default() });
    changes.event(&Event::Apply(cache.clone()), key, fact);
    let _ = changes.take();
    cache.status = Some(ModelCacheStatus { clusters: vec![ready("sha256:new")], ..Default::default() });
    changes.event(&Event::Apply(cache.clone()), key, fact);
    assert_eq!(changes.take(), BTreeSet::from(["ml/fr".to_string()]));
    // Progress bytes alone are no change.
    cache.status.as_mut().unwrap().clusters[0].bytes = 42;
    changes.event(&Event::Apply(cache), key, fact);
    assert!(changes.take().is_empty());
}
