//! What a claim's nodes run, read from a member's watch caches (the ones inventory uses): every
//! node labelled for the claim, with the pods the application has there (not DaemonSet or mirror pods, not finished ones), so the
//! claim engine can tell empty nodes from busy ones (and name the empty ones to the provider by
//! their `spec.providerID`). The same pass puts the disruption policy
//! onto the nodes as the annotations cluster-autoscaler and Karpenter honour: a node the claim
//! keeps is marked do-not-disrupt, one it lets go is not.

use flotilla_apis::constants::labels;
use flotilla_providers::NodeUse;
use flotilla_providers::claim::{CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED, KARPENTER_DO_NOT_DISRUPT};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::inventory::MemberObservation;

/// Pods of the application on `node` among `pods` (not DaemonSet or mirror pods, not finished).
pub fn app_pods(node: &str, pods: &[Pod]) -> u32 {
    let counted = pods.iter().filter(|p| {
        let here = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
        let daemon = p.owner_references().iter().any(|o| o.kind == "DaemonSet");
        let mirror = p.annotations().contains_key("kubernetes.io/config.mirror");
        let done =
            p.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
        here && !daemon && !mirror && !done
    });
    u32::try_from(counted.count()).unwrap_or(u32::MAX)
}

/// The annotation patch that makes `node` say `protect`, or `None` when it already does.
pub fn protection_patch(node: &Node, protect: bool) -> Option<Value> {
    let a = node.annotations();
    let keys = [CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED, KARPENTER_DO_NOT_DISRUPT];
    let has = keys.iter().all(|k| a.get(*k).is_some_and(|v| v == "true"));
    let none = keys.iter().all(|k| !a.contains_key(*k));
    if (protect && has) || (!protect && none) {
        return None;
    }
    let value = if protect { json!("true") } else { Value::Null };
    Some(json!({"metadata": {"annotations": {keys[0]: value, keys[1]: value}}}))
}

/// The nodes of claim `claim` (`<namespace>.<name>`) in what the member's watches hold, with
/// their application pods; marks each do-not-disrupt when `protect(acquisition)` says so.
pub async fn observe(
    client: &Client,
    seen: &MemberObservation,
    claim: &str,
    field_manager: &str,
    protect: impl Fn(&str) -> bool,
) -> Vec<NodeUse> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut out = Vec::new();
    for node in seen.nodes.iter().filter(|n| n.labels().get(labels::CLAIM).is_some_and(|c| c == claim)) {
        let name = node.name_any();
        let acquisition = node.labels().get(labels::ACQUISITION).cloned().unwrap_or_default();
        if let Some(patch) = protection_patch(node, protect(&acquisition))
            && let Err(e) = nodes.patch(&name, &PatchParams::apply(field_manager), &Patch::Merge(&patch)).await
        {
            // The pods are still seen; only the autoscalers' hint is missing (RBAC: nodes/patch).
            tracing::warn!(node = %name, claim, error = %crate::member::brief(&e), "could not mark the claim's node for node autoscalers");
        }
        let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.clone());
        out.push(NodeUse { pods: app_pods(&name, &seen.pods), name, acquisition, provider_id });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn on(node: &str) -> Value {
        json!({"nodeName": node, "containers": [{"name": "c", "image": "i"}]})
    }

    #[test]
    fn only_the_applications_running_pods_count() {
        let pods = [
            pod(json!({"metadata": {"name": "llama-0"}, "spec": on("n1"), "status": {"phase": "Running"}})),
            pod(json!({"metadata": {"name": "llama-1"}, "spec": on("n1"), "status": {"phase": "Pending"}})),
            pod(json!({"metadata": {"name": "dcgm", "ownerReferences": [{"apiVersion": "apps/v1",
                "kind": "DaemonSet", "name": "dcgm", "uid": "u"}]}, "spec": on("n1"), "status": {"phase": "Running"}})),
            pod(json!({"metadata": {"name": "static", "annotations": {"kubernetes.io/config.mirror": "x"}},
                "spec": on("n1")})),
            pod(json!({"metadata": {"name": "job"}, "spec": on("n1"), "status": {"phase": "Succeeded"}})),
            pod(json!({"metadata": {"name": "elsewhere"}, "spec": on("n2"), "status": {"phase": "Running"}})),
        ];
        assert_eq!(app_pods("n1", &pods), 2);
        assert_eq!(app_pods("n2", &pods), 1);
        assert_eq!(app_pods("n3", &pods), 0);
    }

    #[test]
    fn protection_is_written_only_when_it_changes() {
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        let patch = protection_patch(&bare, true).unwrap();
        assert_eq!(patch["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT], "true");
        assert_eq!(patch["metadata"]["annotations"][CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED], "true");
        assert!(protection_patch(&bare, false).is_none());
        let marked: Node = serde_json::from_value(json!({"metadata": {"name": "n", "annotations": {
            KARPENTER_DO_NOT_DISRUPT: "true", CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED: "true"}}}))
        .unwrap();
        assert!(protection_patch(&marked, true).is_none());
        let unmark = protection_patch(&marked, false).unwrap();
        assert!(unmark["metadata"]["annotations"][KARPENTER_DO_NOT_DISRUPT].is_null());
    }
}
