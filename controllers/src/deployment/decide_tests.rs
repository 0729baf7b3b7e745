use flotilla_apis::deployment::ClusterPlacement;
use flotilla_apis::document::parse_stream;
use flotilla_apis::{CapacityType, FleetObject, InferenceClass};
use flotilla_placement::plan::{Assignment, InvalidSpec};
use k8s_openapi::jiff::Timestamp;

use super::*;

/// The EU Llama of the example fleet (alternative 2: any 80 GB GPU) and the example classes.
fn fleet() -> (ModelDeployment, BTreeMap<String, InferenceClassSpec>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/fleet");
    let (mut md, mut classes) = (None, BTreeMap::new());
    for file in ["classes.yaml", "deployments/llama-3.3-70b-eu.yaml"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for o in parse_stream(file, &text).objects {
            match o.value {
                FleetObject::Deployment(d) => md = Some(d),
                FleetObject::Class(InferenceClass { metadata, spec, .. }) => {
                    classes.insert(metadata.name.unwrap(), spec);
                }
                _ => {}
            }
        }
    }
    let mut md = md.unwrap();
    md.metadata.generation = Some(3);
    md.spec.model.cache_ref = None;
    (md, classes)
}

fn plan(items: &[(&str, u32)]) -> DeploymentPlan {
    DeploymentPlan {
        namespace: "ml".into(),
        name: "llama-3.3-70b-eu".into(),
        model: "llama-3.3-70b-instruct".into(),
        desired: 4,
        assignments: items
            .iter()
            .map(|(c, n)| Assignment {
                cluster: c.to_string(),
                pool: "h100".into(),
                class: "h100-sxm-80g".into(),
                capacity_type: CapacityType::OnDemand,
                fallback_rank: 2,
                replicas: *n,
                cost_micros_per_hour: 0,
            })
            .collect(),
        ..Default::default()
    }
}

/// A status placing `desired` on each cluster, `ready` of them ready.
fn placed(items: &[(&str, i32, i32)]) -> ModelDeploymentStatus {
    ModelDeploymentStatus {
        placements: items
            .iter()
            .map(|(c, desired, ready)| ClusterPlacement {
                cluster: c.to_string(),
                pool: "h100".into(),
                class: "h100-sxm-80g".into(),
                capacity_type: CapacityType::OnDemand,
                fallback_rank: 2,
                desired: *desired,
                ready: *ready,
                serving: *ready,
                unschedulable: 0,
            })
            .collect(),
        ..Default::default()
    }
}

/// Members that answered, with (cluster, applied, ready).
fn seen(items: &[(&str, i32, i32)]) -> Seen {
    let mut s = Seen::default();
    for (c, applied, ready) in items {
        s.answered.insert(c.to_string());
        if *applied > 0 {
            s.running
                .insert((c.to_string(), "h100".into()), Running { applied: *applied, ready: *ready, current: *ready });
        }
    }
    s
}

fn now() -> Time {
    Time(Timestamp::from_second(1_000_000).unwrap())
}

struct Case {
    md: ModelDeployment,
    classes: BTreeMap<String, InferenceClassSpec>,
    plan: DeploymentPlan,
    seen: Seen,
    cache: Option<CacheView>,
    adapters: AdapterView,
    dra: BTreeSet<String>,
    gateways: BTreeMap<String, flotilla_apis::cluster::GatewayRef>,
    now: Time,
    suffix: Option<String>,
}

impl Case {
    fn new(status: Option<ModelDeploymentStatus>, plan: DeploymentPlan, seen: Seen) -> Self {
        let (mut md, classes) = fleet();
        md.status = status;
        Case {
            md,
            classes,
            plan,
            seen,
            cache: None,
            adapters: AdapterView::default(),
            dra: BTreeSet::new(),
            gateways: BTreeMap::new(),
            now: now(),
            suffix: None,
        }
    }

    fn input(&self) -> Input<'_> {
        Input {
            md: &self.md,
            workload_suffix: self.suffix.as_deref(),
            plan: &self.plan,
            seen: &self.seen,
            claim: None,
            cache: self.cache.as_ref(),
            adapters: &self.adapters,
            classes: &self.classes,
            dra: &self.dra,
            gateways: &self.gateways,
            now: &self.now,
            backoff: std::time::Duration::from_secs(600),
        }
    }

    fn decide(&self) -> Decision {
        let d = decide(&self.input());
        // Objects only where a status in effect while applying names the cluster.
        let in_effect = d.write_ahead.as_ref().or(self.md.status.as_ref());
        for (cluster, objects) in &d.members {
            assert!(
                objects.is_empty() || in_effect.is_some_and(|s| s.placements.iter().any(|p| p.cluster == *cluster)),
                "objects for {cluster} that no status names"
            );
        }
        d
    }
}

/// The replicas of the Deployment rendered for a member (None: no Deployment).
fn replicas(d: &Decision, cluster: &str) -> Option<i64> {
    d.members.get(cluster)?.iter().find(|o| o["kind"] == "Deployment").and_then(|o| o["spec"]["replicas"].as_i64())
}

fn key(c: &str) -> Key {
    (c.to_string(), "h100".to_string())
}

#[test]
fn a_move_keeps_the_old_cluster_until_the_new_one_serves() {
    let status = placed(&[("eu1", 4, 4)]);
    // 1. The plan moves all 4 to eu2: eu2 starts 4, eu1 keeps its 4.
    let c = Case::new(Some(status.clone()), plan(&[("eu2", 4)]), seen(&[("eu1", 4, 4), ("eu2", 0, 0)]));
    let d = c.decide();
    assert_eq!(d.step, BTreeMap::from([(key("eu1"), 4), (key("eu2"), 4)]));
    assert_eq!((replicas(&d, "eu1"), replicas(&d, "eu2")), (Some(4), Some(4)));
    // 2. eu2 has 2 ready: eu1 may drop 2.
    let c = Case::new(Some(status.clone()), plan(&[("eu2", 4)]), seen(&[("eu1", 4, 4), ("eu2", 4, 2)]));
    assert_eq!(replicas(&c.decide(), "eu1"), Some(2));
    // 3. eu2 all ready: eu1 holds nothing (its objects are pruned), and the step is the target.
    let c = Case::new(Some(status), plan(&[("eu2", 4)]), seen(&[("eu1", 2, 2), ("eu2", 4, 4)]));
    let d = c.decide();
    assert_eq!(d.members.get("eu1"), Some(&Vec::new()), "eu1 is written: everything there is pruned");
    assert_eq!(d.outcome.pace, Pace::Converging, "until eu1 is seen empty");
    // 4. eu1 seen empty: settled.
    let c = Case::new(
        Some(placed(&[("eu1", 0, 2), ("eu2", 4, 4)])),
        plan(&[("eu2", 4)]),
        seen(&[("eu1", 0, 0), ("eu2", 4, 4)]),
    );
    assert_eq!(c.decide().outcome.pace, Pace::Settled);
}

#[test]
fn the_new_cluster_is_recorded_in_status_before_anything_is_applied_there() {
    let status = placed(&[("eu1", 4, 4)]);
    let c = Case::new(Some(status.clone()), plan(&[("eu2", 4)]), seen(&[("eu1", 4, 4), ("eu2", 0, 0)]));
    let d = c.decide();
    let ahead = d.write_ahead.as_ref().expect("eu2 is fresh: written ahead");
    let clusters: Vec<&str> = ahead.placements.iter().map(|p| p.cluster.as_str()).collect();
    assert_eq!(clusters, ["eu1", "eu2"], "the draining cluster stays named too");
    // The final status is decided from the write-ahead, not from the status read.
    assert_eq!(d.outcome.status.placements, ahead.placements);
    // Twin: a cluster the status already names gets no write-ahead.
    let c = Case::new(Some(placed(&[("eu1", 4, 2)])), plan(&[("eu1", 4)]), seen(&[("eu1", 4, 2)]));
    assert_eq!(c.decide().write_ahead, None);
}

#[test]
fn a_workload_suffix_is_recorded_before_any_object_carries_it() {
    let names = |d: &Decision, c: &str| -> Vec<String> {
        d.members[c]
            .iter()
            .filter(|o| o["kind"] != "Service")
            .map(|o| o["metadata"]["name"].as_str().unwrap().into())
            .collect()
    };
    // A settled deployment whose names now need a suffix (naming.rs chose one).
    let mut c = Case::new(Some(placed(&[("eu1", 2, 2)])), plan(&[("eu1", 2)]), seen(&[("eu1", 2, 2)]));
    let plain = c.decide();
    assert_eq!(plain.write_ahead, None);
    assert!(names(&plain, "eu1").iter().all(|n| !n.ends_with("-0a1b2c3d")));
    c.suffix = Some("0a1b2c3d".into());
    let d = c.decide();
    let ahead = d.write_ahead.as_ref().expect("the suffix is written ahead");
    assert_eq!(ahead.workload_suffix.as_deref(), Some("0a1b2c3d"));
    assert_eq!(d.outcome.status.workload_suffix.as_deref(), Some("0a1b2c3d"), "and kept in the final status");
    let suffixed = names(&d, "eu1");
    assert!(!suffixed.is_empty() && suffixed.iter().all(|n| n.ends_with("-0a1b2c3d")), "{suffixed:?}");
    // Once recorded, no further write-ahead, same names.
    c.md.status = Some(d.outcome.status.clone());
    let again = c.decide();
    assert_eq!(again.write_ahead, None);
    assert_eq!(names(&again, "eu1"), suffixed);
}

#[test]
fn only_clusters_that_answered_count_as_fresh() {
    // eu2 is planned but did not answer: nothing goes there, so nothing is written ahead.
    let mut s = seen(&[("eu1", 2, 2)]);
    s.unreachable.insert("eu2".into(), "did not answer in time".into());
    let c = Case::new(Some(placed(&[("eu1", 2, 2)])), plan(&[("eu1", 2), ("eu2", 2)]), s);
    let d = c.decide();
    assert_eq!(d.write_ahead, None);
    assert!(!d.members.contains_key("eu2"));
    // Twin: eu2 answers, and is written ahead.
    let c = Case::new(
        Some(placed(&[("eu1", 2, 2)])),
        plan(&[("eu1", 2), ("eu2", 2)]),
        seen(&[("eu1", 2, 2), ("eu2", 0, 0)]),
    );
    assert!(c.decide().write_ahead.is_some());
}

#[test]
fn an_unreachable_member_is_neither_written_nor_pruned_and_keeps_its_placement() {
    // The plan moved everything to eu1; eu2, which ran 2, does not answer.
    let mut s = seen(&[("eu1", 4, 4)]);
    s.unreachable.insert("eu2".into(), "connection refused".into());
    let c = Case::new(Some(placed(&[("eu1", 4, 4), ("eu2", 2, 2)])), plan(&[("eu1", 4)]), s);
    let d = c.decide();
    assert!(!d.members.contains_key("eu2"), "no write and no prune where nothing was seen");
    let p = d.outcome.status.placements.iter().find(|p| p.cluster == "eu2").expect("eu2 stays in status");
    assert_eq!((p.desired, p.ready), (0, 0));
    let ready = d.outcome.status.conditions.get("Ready").unwrap();
    assert_eq!(ready.status, "True", "4/4 ready on eu1");
    assert_ne!(d.outcome.pace, Pace::Settled, "an unreachable member is looked at again soon");
    // A vanished cluster (its InferenceCluster deleted) is dropped from status instead.
    let mut s = seen(&[("eu1", 4, 4)]);
    s.unreachable.insert("eu2".into(), "no such InferenceCluster".into());
    s.vanished.insert("eu2".into());
    let c = Case::new(Some(placed(&[("eu1", 4, 4), ("eu2", 2, 2)])), plan(&[("eu1", 4)]), s);
    assert!(c.decide().outcome.status.placements.iter().all(|p| p.cluster != "eu2"));
}

#[test]
fn replicas_start_only_where_the_cache_is_ready() {
    let mut c = Case::new(
        Some(placed(&[("eu1", 2, 2)])),
        plan(&[("eu1", 2), ("eu2", 2)]),
        seen(&[("eu1", 2, 2), ("eu2", 0, 0)]),
    );
    c.cache = Some(CacheView {
        name: "ml/llama".into(),
        exists: true,
        phases: BTreeMap::from([
            ("eu1".into(), (CachePhase::Ready, None)),
            ("eu2".into(), (CachePhase::Downloading, None)),
        ]),
    });
    let d = c.decide();
    assert_eq!(d.step.get(&key("eu2")), Some(&0), "held back");
    assert_eq!(replicas(&d, "eu2"), None);
    assert_eq!(d.write_ahead, None, "nothing starts on eu2: not fresh");
    let w = d.outcome.status.conditions.get("WaitingForCache").unwrap();
    assert_eq!(w.status, "True");
    assert!(w.message.contains("eu2 (Downloading)"), "{}", w.message);
    assert_eq!(d.outcome.pace, Pace::WaitingForCache);
    // The cache Ready there too: eu2 starts.
    c.cache.as_mut().unwrap().phases.insert("eu2".into(), (CachePhase::Ready, None));
    let d = c.decide();
    assert_eq!(replicas(&d, "eu2"), Some(2));
    assert_eq!(d.outcome.status.conditions.get("WaitingForCache").unwrap().status, "False");
    // No such cache: nothing new starts anywhere, and status says why.
    c.cache = Some(CacheView { name: "ml/llama".into(), exists: false, phases: BTreeMap::new() });
    let d = c.decide();
    assert_eq!(replicas(&d, "eu1"), Some(2), "what runs keeps running");
    assert_eq!(replicas(&d, "eu2"), None);
    assert!(d.outcome.status.conditions.get("WaitingForCache").unwrap().message.contains("does not exist"));
}

#[test]
fn an_invalid_spec_touches_no_member_and_waits_for_a_change() {
    let mut p = plan(&[]);
    p.invalid = Some(InvalidSpec { field: "spec.devices.alternatives[1].selectors[0]".into(), message: "bad".into() });
    let c = Case::new(Some(placed(&[("eu1", 4, 4)])), p, seen(&[("eu1", 4, 4)]));
    let d = c.decide();
    assert!(d.members.is_empty() && d.step.is_empty() && d.write_ahead.is_none());
    assert_eq!(d.outcome.pace, Pace::AwaitChange);
    assert_eq!(d.outcome.status.conditions.get("Placed").unwrap().reason, "InvalidSpec");
    assert_eq!(d.outcome.status.placements, c.md.status.as_ref().unwrap().placements, "placements kept");
    assert!(d.outcome.events.is_empty());
    // A failed write cannot happen (nothing is written): the outcome stays.
    let failed = BTreeMap::from([("eu1".to_string(), "x".to_string())]);
    assert_eq!(d.after_failures(&c.input(), &failed, &BTreeMap::new()), d.outcome);
}

#[test]
fn placement_changed_only_when_the_targets_change() {
    // Ready 3 → 4 on the same targets: the status changes, no event.
    let c = Case::new(Some(placed(&[("eu1", 4, 3)])), plan(&[("eu1", 4)]), seen(&[("eu1", 4, 4)]));
    let d = c.decide();
    assert_ne!(Some(&d.outcome.status), c.md.status.as_ref());
    assert!(d.outcome.events.is_empty(), "{:?}", d.outcome.events);
    // The plan moves 2 to eu2: one PlacementChanged naming both.
    let c = Case::new(
        Some(placed(&[("eu1", 4, 4)])),
        plan(&[("eu1", 2), ("eu2", 2)]),
        seen(&[("eu1", 4, 4), ("eu2", 0, 0)]),
    );
    let events = c.decide().outcome.events;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason, event::PLACEMENT_CHANGED);
    assert!(events[0].message.contains("eu1:4/2") && events[0].message.contains("eu2:0/2"), "{}", events[0].message);
    // The first placement of a new deployment is a change too.
    let c = Case::new(None, plan(&[("eu1", 4)]), seen(&[("eu1", 0, 0)]));
    assert_eq!(c.decide().outcome.events.len(), 1);
}

#[test]
fn a_settled_deployment_writes_nothing_and_is_looked_at_rarely() {
    let c = Case::new(Some(placed(&[("eu1", 4, 4)])), plan(&[("eu1", 4)]), seen(&[("eu1", 4, 4)]));
    let settled = c.decide().outcome.status;
    let c = Case::new(Some(settled.clone()), plan(&[("eu1", 4)]), seen(&[("eu1", 4, 4)]));
    let d = c.decide();
    assert_eq!(d.outcome.status, settled, "the same facts give the same status: nothing to write");
    assert!(d.outcome.events.is_empty() && d.write_ahead.is_none());
    assert_eq!(d.outcome.pace, Pace::Settled);
    assert_eq!(replicas(&d, "eu1"), Some(4), "the member's objects are still decided (the hash skips the write)");
    // One replica not ready: converging, looked at again soon.
    let c = Case::new(Some(settled), plan(&[("eu1", 4)]), seen(&[("eu1", 4, 3)]));
    assert_eq!(c.decide().outcome.pace, Pace::Converging);
}

#[test]
fn a_failed_member_write_degrades_and_unsettles() {
    let c = Case::new(Some(placed(&[("eu1", 4, 4)])), plan(&[("eu1", 4)]), seen(&[("eu1", 4, 4)]));
    let d = c.decide();
    assert_eq!(d.outcome.pace, Pace::Settled);
    let failed = BTreeMap::from([("eu1".to_string(), "forbidden".to_string())]);
    let o = d.after_failures(&c.input(), &failed, &BTreeMap::new());
    let degraded = o.status.conditions.get("Degraded").unwrap();
    assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", "ApplyFailed"));
    assert!(degraded.message.contains("eu1: apply failed: forbidden"), "{}", degraded.message);
    assert_eq!(o.pace, Pace::Converging);
    assert_eq!(
        d.after_failures(&c.input(), &BTreeMap::new(), &BTreeMap::new()),
        d.outcome,
        "no failure: the outcome decided"
    );
}

#[test]
fn a_name_taken_by_someone_else_is_not_ready_and_says_which() {
    let c = Case::new(Some(placed(&[("eu1", 4, 4)])), plan(&[("eu1", 4)]), seen(&[("eu1", 4, 4)]));
    let d = c.decide();
    assert!(d.outcome.status.conditions.is_true("Ready"), "all replicas ready without the conflict");
    let taken = BTreeMap::from([(
        "eu1".to_string(),
        "Service ml/llama exists and it was not created by Flotilla: left alone".to_string(),
    )]);
    let o = d.after_failures(&c.input(), &BTreeMap::new(), &taken);
    for t in ["Ready", "Degraded"] {
        let cond = o.status.conditions.get(t).unwrap();
        assert_eq!(cond.reason, "NameConflict", "{t}");
        assert!(cond.message.contains("eu1: Service ml/llama exists"), "{t}: {}", cond.message);
    }
    assert_eq!(
        o.status.conditions.get("Ready").unwrap().status,
        "False",
        "someone else's Service serves nothing of it"
    );
}

#[test]
fn dra_members_get_claim_templates_and_the_others_do_not() {
    let mut c = Case::new(
        Some(placed(&[("eu1", 2, 2), ("eu2", 2, 2)])),
        plan(&[("eu1", 2), ("eu2", 2)]),
        seen(&[("eu1", 2, 2), ("eu2", 2, 2)]),
    );
    c.dra.insert("eu1".into());
    let d = c.decide();
    let has_rct = |cluster: &str| d.members[cluster].iter().any(|o| o["kind"] == "ResourceClaimTemplate");
    assert!(has_rct("eu1"));
    assert!(!has_rct("eu2"));
}

#[test]
fn the_involved_members_are_the_planned_and_the_recorded() {
    let (mut md, _) = fleet();
    md.status = Some(placed(&[("eu1", 2, 2), ("us1", 0, 1)]));
    let got: Vec<String> = involved(&md, &plan(&[("eu1", 2), ("eu2", 2)])).into_iter().collect();
    assert_eq!(got, ["eu1", "eu2", "us1"]);
}

#[test]
fn replicas_the_scheduler_refused_are_said_once_with_a_warning() {
    // 4 asked for on eu1, 3 ready, the fourth refused past the grace.
    let mut s = seen(&[("eu1", 4, 3)]);
    let word = "0/2 nodes are available: 2 cannot allocate all claims";
    s.refused.insert(key("eu1"), Refusal { replicas: 1, message: word.into() });
    let c = Case::new(Some(placed(&[("eu1", 4, 3)])), plan(&[("eu1", 4)]), s.clone());
    let d = c.decide();
    assert_eq!(d.outcome.status.placements[0].unschedulable, 1, "status says it: the next solve moves it");
    let warned: Vec<_> = d.outcome.events.iter().filter(|e| e.reason == event::REPLICAS_UNSCHEDULABLE).collect();
    assert_eq!(warned.len(), 1, "{:?}", d.outcome.events);
    assert!(warned[0].warning && warned[0].message.contains(word) && warned[0].message.contains("eu1/h100"));
    // Said already (the status holds it): no second event.
    let c = Case::new(Some(d.outcome.status.clone()), plan(&[("eu1", 4)]), s);
    assert!(c.decide().outcome.events.iter().all(|e| e.reason != event::REPLICAS_UNSCHEDULABLE));
    // Twin: nothing refused, no such event and nothing in status.
    let c = Case::new(Some(placed(&[("eu1", 4, 3)])), plan(&[("eu1", 4)]), seen(&[("eu1", 4, 3)]));
    let d = c.decide();
    assert_eq!(d.outcome.status.placements[0].unschedulable, 0);
    assert!(d.outcome.events.iter().all(|e| e.reason != event::REPLICAS_UNSCHEDULABLE));
}

#[test]
fn an_eu_only_adapter_is_in_the_eu_members_objects_and_status_and_nowhere_in_the_us_member() {
    use flotilla_apis::cache::{CachePhase, ModelCache};
    use flotilla_apis::deployment::AdapterWaitReason;

    use crate::deployment::adapters::{AdapterCache, AdapterView, Place};
    let mut c = Case::new(Some(placed(&[("eu1", 1, 1), ("us1", 1, 1)])), plan(&[("eu1", 1), ("us1", 1)]), seen(&[]));
    c.seen = seen(&[("eu1", 1, 1), ("us1", 1, 1)]);
    c.md.spec.placement.sovereignty = None;
    c.md.spec.adapters = serde_json::from_value(serde_json::json!([
        {"name": "support-fr", "cacheRef": "support-fr-lora", "sovereignty": {"allowedJurisdictions": ["EU"]}},
        {"name": "sql", "cacheRef": "sql-lora"}
    ]))
    .unwrap();
    let gateway =
        flotilla_apis::cluster::GatewayRef { namespace: "edge".into(), name: "gw".into(), section_name: None };
    c.gateways = BTreeMap::from([("eu1".to_string(), gateway.clone()), ("us1".to_string(), gateway)]);
    // Both caches Ready with their digest in both clusters (the EU-only one reached us1 through
    // its own clusterSelector, say): policy alone keeps it out of us1.
    let cache = |name: &str| -> ModelCache {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelCache", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"source": format!("hf://org/{name}"), "size": "1Gi", "digest": "sha256:aa", "targets": {}},
            "status": {"clusters": [
                {"cluster": "eu1", "phase": "Ready", "digest": "sha256:aa"},
                {"cluster": "us1", "phase": "Ready", "digest": "sha256:aa"}
            ]}
        }))
        .unwrap()
    };
    let (fr, sql) = (cache("support-fr-lora"), cache("sql-lora"));
    assert_eq!(AdapterCache::of(&fr).clusters["us1"].0, CachePhase::Ready);
    let places = BTreeMap::from([
        ("eu1".to_string(), Place { jurisdiction: "EU".into(), region: "eu-central-1".into(), ..Default::default() }),
        ("us1".to_string(), Place { jurisdiction: "US".into(), region: "us-east-1".into(), ..Default::default() }),
    ]);
    let by_name =
        |n: &str| [&fr, &sql].into_iter().find(|c| c.metadata.name.as_deref() == Some(n)).map(AdapterCache::of);
    c.adapters = AdapterView::of(&c.md, by_name, places);
    let d = c.decide();

    let us = serde_json::to_string(&d.members["us1"]).unwrap();
    assert!(!us.contains("support-fr"), "us1's objects name the EU-only adapter: {us}");
    assert!(us.contains("/adapters/sql-lora"), "{us}");
    let eu = serde_json::to_string(&d.members["eu1"]).unwrap();
    assert!(eu.contains("/adapters/support-fr-lora") && eu.contains("/adapters/sql-lora"), "{eu}");

    let adapters = &d.outcome.status.adapters;
    assert_eq!(adapters[0].name, "support-fr");
    assert_eq!(adapters[0].clusters, ["eu1"]);
    assert_eq!(adapters[0].waiting.len(), 1);
    assert_eq!(
        (adapters[0].waiting[0].cluster.as_str(), adapters[0].waiting[0].reason),
        ("us1", AdapterWaitReason::OutsidePolicy)
    );
    assert_eq!(
        (adapters[1].name.as_str(), adapters[1].clusters.clone()),
        ("sql", vec!["eu1".to_string(), "us1".to_string()])
    );

    // The adapter's cache is gone: it waits everywhere, is mounted nowhere, and the engine's
    // flags stay (replicas roll only for the mount).
    c.adapters =
        AdapterView::of(&c.md, |n| (n == "sql-lora").then(|| AdapterCache::of(&sql)), c.adapters.places.clone());
    let again = c.decide();
    let eu = serde_json::to_string(&again.members["eu1"]).unwrap();
    assert!(!eu.contains("support-fr") && eu.contains("--enable-lora"), "{eu}");
    let reasons: Vec<AdapterWaitReason> = again.outcome.status.adapters[0].waiting.iter().map(|w| w.reason).collect();
    assert_eq!(reasons, [AdapterWaitReason::CacheNotFound, AdapterWaitReason::OutsidePolicy]);
}
