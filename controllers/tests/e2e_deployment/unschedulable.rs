//! A replica whose pod its member's scheduler refuses is placed elsewhere. Every eu1 node is
//! tainted `NoSchedule` by someone else (a taint the solver does not see, as it does not see
//! devices split across nodes), then a one-replica model that prefers eu1 is applied: after
//! the controller's `--unschedulable-seconds` it says so in one `ReplicasUnschedulable` Warning
//! naming the pool and the scheduler's word, runs on another member, and nothing of it is left
//! in eu1, whose pool stays backed off for it (`status.refusedPools`); the replicas another
//! model runs on eu1 are untouched. The taint and the model are
//! removed at the end.

use k8s_openapi::api::core::v1::Node;

use super::*;

const TAINT: &str = "e2e.flotilla.dev/blocked";

async fn set_taint(nodes: &Api<Node>, on: bool) {
    let names: Vec<String> = nodes
        .list_metadata(&ListParams::default().labels("flotilla.dev/pool=h100"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert!(!names.is_empty(), "eu1 has h100 nodes");
    for n in &names {
        let node = nodes.get(n).await.unwrap();
        let mut taints: Vec<serde_json::Value> = node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .filter(|t| t.key != TAINT)
            .map(|t| serde_json::to_value(t).unwrap())
            .collect();
        if on {
            taints.push(json!({"key": TAINT, "value": "yes", "effect": "NoSchedule"}));
        }
        nodes.patch(n, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"taints": taints}}))).await.unwrap();
    }
}

pub async fn refused_replica_moves(control: &Client, api: &Api<ModelDeployment>, members: &BTreeMap<&str, Client>) {
    let nodes = Api::<Node>::all(members["eu1"].clone());
    set_taint(&nodes, true).await;
    // Allowed anywhere; eu1 comes first (by name, at the same price) and has devices free as
    // the solver sees them.
    apply(control, model("refused-model", 1, json!({"type": "Standalone", "devicesPerReplica": 1}), json!({}))).await;
    let refused = event_about(control, "ReplicasUnschedulable", "refused-model", Duration::from_secs(90)).await;
    assert_eq!(refused.type_.as_deref(), Some("Warning"));
    let note = refused.note.unwrap_or_default();
    assert!(
        note.contains("eu1/h100") && note.contains("untolerated taint"),
        "names the pool and the scheduler's word: {note}"
    );
    let placed =
        wait_for("refused-model Ready elsewhere, nothing of it left in eu1", Duration::from_secs(90), || async {
            let s = status_of(api, "refused-model").await;
            let elsewhere: Vec<String> =
                s.placements.iter().filter(|p| p.cluster != "eu1" && p.ready == 1).map(|p| p.cluster.clone()).collect();
            let in_eu1 = member_deployments(&members["eu1"], "refused-model").await;
            (s.conditions.is_true("Ready") && !elsewhere.is_empty() && in_eu1.is_empty()).then_some(elsewhere)
        })
        .await;
    assert_eq!(placed.len(), 1, "one replica, one member: {placed:?}");
    // eu1's pool stays backed off for the model (the harness runs the default 600 s): its pods
    // are gone, but nothing sends the replica back while the taint may still be there. A taint
    // concerns this model only: not `devicesShort`, which would close the pool to others too.
    let s = status_of(api, "refused-model").await;
    let backed: Vec<_> =
        s.refused_pools.iter().map(|r| (r.cluster.as_str(), r.pool.as_str(), r.devices_short)).collect();
    assert_eq!(backed, [("eu1", "h100", false)], "{:?}", s.refused_pools);
    assert!(s.refused_pools[0].message.contains("untolerated taint"), "{:?}", s.refused_pools);
    assert_eq!(
        member_deployments(&members[placed[0].as_str()], "refused-model").await,
        BTreeMap::from([("refused-model-h100".into(), 1)])
    );
    // The running replicas of eu-model on the tainted eu1 never moved.
    let s = status_of(api, "eu-model").await;
    assert!(s.ready_replicas == 4 && s.conditions.is_true("Ready"), "eu-model untouched: {s:?}");
    assert_eq!(member_deployments(&members["eu1"], "eu-model").await, BTreeMap::from([("eu-model-h100".into(), 2)]));

    set_taint(&nodes, false).await;
    api.delete("refused-model", &DeleteParams::default()).await.unwrap();
    wait_for("refused-model deleted", Duration::from_secs(60), || async {
        api.get_opt("refused-model").await.unwrap().is_none().then_some(())
    })
    .await;
    for (name, client) in members {
        let left: Vec<String> =
            flotilla_objects(client).await.into_iter().filter(|o| o.contains("ml.refused-model")).collect();
        assert!(left.is_empty(), "nothing of refused-model left in {name}: {left:?}");
    }
}
