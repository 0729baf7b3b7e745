//! The members' schedulers pack a pool's nodes as the solver counted them. The solver fits
//! replicas best-fit on each node's free devices; a member's default scheduler, left to itself,
//! spreads pods over the emptiest nodes (its scoring does not weigh devices), which splits the
//! devices a larger replica needs on one node. Flotilla's pods prefer the nodes already running
//! the pool's Flotilla pods (`render::packing_affinity`), so: us-model's three one-device
//! replicas share one of us1's two 8-device nodes and eu-model's two TP4 replicas one of eu1's
//! three, and a whole-node replica allowed only in the US then finds us1's other node whole, is
//! placed there and runs. Spread, the same replicas would leave 6 + 7 devices on us1 and the
//! whole-node model unplaced. The whole-node model is deleted at the end.

use std::collections::BTreeSet;

use super::*;

/// The nodes `model`'s pods in `member` are bound to, and how many pods are.
async fn pod_nodes(member: &Client, model: &str) -> (usize, BTreeSet<String>) {
    let pods = model_pods(member, model).await.unwrap();
    let nodes = pods.iter().filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone())).collect();
    (pods.len(), nodes)
}

pub async fn replicas_pack_as_planned(control: &Client, api: &Api<ModelDeployment>, members: &BTreeMap<&str, Client>) {
    let (pods, us_nodes) = pod_nodes(&members["us1"], "us-model").await;
    assert_eq!((pods, us_nodes.len()), (3, 1), "us-model's 3 replicas share one us1 node: {us_nodes:?}");
    let (pods, eu_nodes) = pod_nodes(&members["eu1"], "eu-model").await;
    assert_eq!((pods, eu_nodes.len()), (2, 1), "eu-model's 2 TP4 replicas share one eu1 node: {eu_nodes:?}");

    let whole = json!({"type": "TensorParallel", "devicesPerReplica": 8});
    apply(control, model("us-whole", 1, whole, json!({"sovereignty": {"allowedJurisdictions": ["US"]}}))).await;
    wait_for("us-whole Ready 1/1 on us1", Duration::from_secs(60), || async {
        let s = status_of(api, "us-whole").await;
        let on: Vec<(&str, i32)> = s.placements.iter().map(|p| (p.cluster.as_str(), p.ready)).collect();
        (s.ready_replicas == 1 && s.conditions.is_true("Ready") && on == [("us1", 1)]).then_some(())
    })
    .await;
    let (pods, whole_nodes) = pod_nodes(&members["us1"], "us-whole").await;
    assert_eq!(pods, 1);
    assert!(whole_nodes.is_disjoint(&us_nodes), "the node us-model left whole: {whole_nodes:?} vs {us_nodes:?}");

    api.delete("us-whole", &DeleteParams::default()).await.unwrap();
    wait_for("us-whole gone, from us1 too", Duration::from_secs(60), || async {
        let gone = api.get_opt("us-whole").await.unwrap().is_none();
        (gone
            && member_deployments(&members["us1"], "us-whole").await.is_empty()
            && pod_nodes(&members["us1"], "us-whole").await.0 == 0)
            .then_some(())
    })
    .await;
}
