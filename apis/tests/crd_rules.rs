//! Every CEL rule of the CRDs (`x-kubernetes-validations`), evaluated client-side on the
//! generated schema: each rule rejects what it should, and its negative twin passes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use flotilla_apis::document::Kind;
use flotilla_apis::schema_check::Checker;
use serde_json::{Value, json};

fn class() -> Value {
    json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass",
        "metadata": {"name": "h100"},
        "spec": {
            "device": {"driver": "gpu.nvidia.com",
                       "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
                       "capacity": {"memory": "80Gi"}},
            "devicesPerNode": 8,
            "pricePerNodeHour": {"onDemand": "98.32"}
        }
    })
}

fn cluster() -> Value {
    json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
        "metadata": {"name": "eu-fra-1"},
        "spec": {
            "provider": {"aws": {"eksCluster": "fra", "region": "eu-central-1"}},
            "region": "eu-central-1", "jurisdiction": "EU",
            "pools": [{"name": "h100", "class": "h100", "minNodes": 0, "maxNodes": 4, "capacityTypes": ["on-demand"]}]
        }
    })
}

fn deployment() -> Value {
    json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "replicas": 2,
            "engine": {"image": "vllm/vllm-openai:v0.11.0"},
            "topology": {"type": "Standalone", "devicesPerReplica": 1},
            "devices": {"alternatives": [{"class": "h100"}]}
        }
    })
}

fn problems(kind: Kind, obj: &Value) -> Vec<(String, String)> {
    Checker::get().check(kind, obj)
}

fn assert_refused(kind: Kind, obj: &Value, field: &str, message_part: &str) {
    let p = problems(kind, obj);
    assert!(
        p.iter().any(|(f, m)| f.contains(field) && m.contains(message_part)),
        "expected a problem at {field} containing {message_part:?}, got {p:?}"
    );
}

#[test]
fn the_baselines_pass() {
    assert_eq!(problems(Kind::InferenceClass, &class()), vec![]);
    assert_eq!(problems(Kind::InferenceCluster, &cluster()), vec![]);
    assert_eq!(problems(Kind::ModelDeployment, &deployment()), vec![]);
}

#[test]
fn device_attribute_needs_exactly_one_value() {
    let mut c = class();
    c["spec"]["device"]["attributes"]["productName"] = json!({"string": "x", "int": 3});
    assert_refused(Kind::InferenceClass, &c, "attributes", "exactly one");
    c["spec"]["device"]["attributes"]["productName"] = json!({});
    assert_refused(Kind::InferenceClass, &c, "attributes", "exactly one");
}

#[test]
fn class_driver_is_immutable() {
    let old = class();
    let mut new = class();
    new["spec"]["device"]["driver"] = json!("gpu.amd.com");
    let p = Checker::get().check_update(Kind::InferenceClass, &new, Some(&old));
    assert!(p.iter().any(|(_, m)| m.contains("immutable")), "{p:?}");
    // Twin: an unchanged driver with a changed price is accepted.
    let mut twin = class();
    twin["spec"]["pricePerNodeHour"]["onDemand"] = json!("90.00");
    assert_eq!(Checker::get().check_update(Kind::InferenceClass, &twin, Some(&old)), vec![]);
}

#[test]
fn cluster_region_and_jurisdiction_are_immutable() {
    let old = cluster();
    let mut new = cluster();
    new["spec"]["jurisdiction"] = json!("US");
    let p = Checker::get().check_update(Kind::InferenceCluster, &new, Some(&old));
    assert!(p.iter().any(|(_, m)| m.contains("jurisdiction is immutable")), "{p:?}");
    let mut new = cluster();
    new["spec"]["region"] = json!("eu-west-3");
    new["spec"]["provider"]["aws"]["region"] = json!("eu-west-3");
    let p = Checker::get().check_update(Kind::InferenceCluster, &new, Some(&old));
    assert!(p.iter().any(|(_, m)| m.contains("region is immutable")), "{p:?}");
}

#[test]
fn exactly_one_provider() {
    let mut c = cluster();
    c["spec"]["provider"]["static"] = json!({"site": "dc1"});
    assert_refused(Kind::InferenceCluster, &c, "provider", "exactly one");
    c["spec"]["provider"] = json!({});
    assert_refused(Kind::InferenceCluster, &c, "provider", "exactly one");
}

#[test]
fn pool_min_at_most_max_and_nodes_at_most_max() {
    let mut c = cluster();
    c["spec"]["pools"][0]["minNodes"] = json!(5);
    assert_refused(Kind::InferenceCluster, &c, "pools", "minNodes must be at most maxNodes");
    let mut c = cluster();
    c["spec"]["pools"][0]["nodes"] = json!(9);
    assert_refused(Kind::InferenceCluster, &c, "pools", "nodes must be at most maxNodes");
    let mut c = cluster();
    c["spec"]["pools"][0]["nodes"] = json!(4);
    assert_eq!(problems(Kind::InferenceCluster, &c), vec![]);
}

#[test]
fn model_name_is_immutable() {
    let old = deployment();
    let mut new = deployment();
    new["spec"]["model"]["name"] = json!("other");
    let p = Checker::get().check_update(Kind::ModelDeployment, &new, Some(&old));
    assert!(p.iter().any(|(_, m)| m.contains("immutable")), "{p:?}");
    let mut twin = deployment();
    twin["spec"]["replicas"] = json!(5);
    assert_eq!(Checker::get().check_update(Kind::ModelDeployment, &twin, Some(&old)), vec![]);
}

#[test]
fn topology_rules() {
    let mut d = deployment();
    d["spec"]["topology"]["devicesPerReplica"] = json!(4);
    assert_refused(Kind::ModelDeployment, &d, "topology", "Standalone replicas use exactly 1 device");
    d["spec"]["topology"]["type"] = json!("TensorParallel");
    assert_eq!(problems(Kind::ModelDeployment, &d), vec![]);
    d["spec"]["topology"]["nodesPerReplica"] = json!(2);
    assert_refused(Kind::ModelDeployment, &d, "topology", "needs type MultiNode");
    d["spec"]["topology"]["type"] = json!("MultiNode");
    assert_eq!(problems(Kind::ModelDeployment, &d), vec![]);
    d["spec"]["topology"] = json!({"type": "Disaggregated", "devicesPerReplica": 1});
    assert_refused(Kind::ModelDeployment, &d, "topology", "roles are required");
    d["spec"]["topology"]["roles"] =
        json!([{"name": "prefill", "pods": 1, "devicesPerPod": 4}, {"name": "decode", "pods": 2, "devicesPerPod": 4}]);
    assert_eq!(problems(Kind::ModelDeployment, &d), vec![]);
    d["spec"]["topology"]["type"] = json!("TensorParallel");
    assert_refused(Kind::ModelDeployment, &d, "topology", "only for, type Disaggregated");
}

#[test]
fn alternative_needs_class_or_selectors_and_ordered_bounds() {
    let mut d = deployment();
    d["spec"]["devices"]["alternatives"] = json!([{"minReplicas": 1}]);
    assert_refused(Kind::ModelDeployment, &d, "alternatives", "name a class, give selectors, or both");
    d["spec"]["devices"]["alternatives"] = json!([{"selectors": ["device.driver == 'gpu.nvidia.com'"]}]);
    assert_eq!(problems(Kind::ModelDeployment, &d), vec![]);
    d["spec"]["devices"]["alternatives"] = json!([{"class": "h100", "minReplicas": 3, "maxReplicas": 2}]);
    assert_refused(Kind::ModelDeployment, &d, "alternatives", "minReplicas must be at most maxReplicas");
}

#[test]
fn toleration_exists_has_no_value() {
    let mut d = deployment();
    d["spec"]["placement"] = json!({"tolerations": [{"key": "dedicated", "operator": "Exists", "value": "x"}]});
    assert_refused(Kind::ModelDeployment, &d, "tolerations", "value must be empty");
    d["spec"]["placement"] = json!({"tolerations": [{"key": "dedicated", "operator": "Exists"}]});
    assert_eq!(problems(Kind::ModelDeployment, &d), vec![]);
}

#[test]
fn cache_targets_and_claim_device_classes() {
    let cache = json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct", "size": "16Gi", "targets": {}}
    });
    assert_refused(Kind::ModelCache, &cache, "targets", "clusterSelector, deployments, or both");
    let mut ok = cache.clone();
    ok["spec"]["targets"] = json!({"deployments": ["llama"]});
    assert_eq!(problems(Kind::ModelCache, &ok), vec![]);
    // The staging Job's service account (IRSA / EKS Pod Identity) must be a valid object name.
    let mut with_sa = ok.clone();
    with_sa["spec"]["serviceAccountName"] = json!("model-stager");
    assert_eq!(problems(Kind::ModelCache, &with_sa), vec![]);
    for bad in ["Model_Stager", "-stager", "", "stager/../x"] {
        with_sa["spec"]["serviceAccountName"] = json!(bad);
        assert!(
            problems(Kind::ModelCache, &with_sa).iter().any(|(f, _)| f.contains("serviceAccountName")),
            "{bad:?} must be refused"
        );
    }
    let mut old = ok.clone();
    old["spec"]["source"] = json!("hf://other/model");
    assert!(
        Checker::get().check_update(Kind::ModelCache, &ok, Some(&old)).iter().any(|(_, m)| m.contains("immutable"))
    );

    // The credentials Secret is read in the cache's own namespace only: no namespace may be named.
    let mut creds = ok.clone();
    creds["spec"]["credentialsRef"] = json!({"name": "hf-token", "key": "token"});
    assert_eq!(problems(Kind::ModelCache, &creds), vec![]);
    for ns in ["flotilla-system-members", "ml", ""] {
        creds["spec"]["credentialsRef"]["namespace"] = json!(ns);
        assert_refused(Kind::ModelCache, &creds, "spec.credentialsRef.namespace", "remove credentialsRef.namespace");
    }

    let claim = json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "CapacityClaim",
        "metadata": {"name": "burst", "namespace": "ml"},
        "spec": {"podSets": [{"name": "decode", "count": 2, "devicesPerPod": 8}],
                 "capacity": {"capacityTypes": ["reserved"], "deviceClasses": [{}]}}
    });
    assert_refused(Kind::CapacityClaim, &claim, "deviceClasses", "name a class, give selectors, or both");
    let mut ok = claim.clone();
    ok["spec"]["capacity"]["deviceClasses"] = json!([{"class": "h100"}]);
    assert_eq!(problems(Kind::CapacityClaim, &ok), vec![]);
}

#[test]
fn schema_checks_name_the_field() {
    let mut d = deployment();
    d["spec"]["replicas"] = json!(-1);
    assert_refused(Kind::ModelDeployment, &d, "spec.replicas", "at least 0");
    let mut d = deployment();
    d["spec"]["engine"]["imagee"] = json!("typo");
    assert_refused(Kind::ModelDeployment, &d, "spec.engine.imagee", "unknown field");
    let mut c = cluster();
    c["spec"]["jurisdiction"] = json!("europe");
    assert_refused(Kind::InferenceCluster, &c, "spec.jurisdiction", "does not match");
    let mut c = cluster();
    c["spec"]["pools"][0]["capacityTypes"] = json!(["ondemand"]);
    assert_refused(Kind::InferenceCluster, &c, "spec.pools[0].capacityTypes[0]", "use one of");
    let mut c = cluster();
    c["metadata"]["namespace"] = json!("ml");
    assert_refused(Kind::InferenceCluster, &c, "metadata.namespace", "cluster-scoped");
}

#[test]
fn credentials_and_cluster_profile_ref_are_exclusive() {
    let secret = json!({"secretRef": {"namespace": "flotilla-system", "name": "eu-fra-1-kubeconfig"}});
    let profile = json!({"namespace": "fleet-system", "name": "eu-fra-1"});
    // Either one alone passes (twins of the refusal below).
    let mut c = cluster();
    c["spec"]["credentials"] = secret.clone();
    assert_eq!(problems(Kind::InferenceCluster, &c), vec![]);
    let mut c = cluster();
    c["spec"]["clusterProfileRef"] = profile.clone();
    assert_eq!(problems(Kind::InferenceCluster, &c), vec![]);
    // Both: refused, naming the field.
    c["spec"]["credentials"] = secret;
    assert_refused(Kind::InferenceCluster, &c, "spec.clusterProfileRef", "at most one of spec.credentials");
    // The reference's own shape: both names are required and DNS names.
    let mut c = cluster();
    c["spec"]["clusterProfileRef"] = json!({"name": "eu-fra-1"});
    assert_refused(Kind::InferenceCluster, &c, "spec.clusterProfileRef.namespace", "is required");
    c["spec"]["clusterProfileRef"] = json!({"namespace": "Fleet", "name": "eu-fra-1"});
    assert_refused(Kind::InferenceCluster, &c, "spec.clusterProfileRef.namespace", "does not match");
}

#[test]
fn disruption_budget_is_one_count_or_percentage() {
    let mut d = deployment();
    for ok in [
        json!({}),
        json!({"maxUnavailable": 1}),
        json!({"maxUnavailable": "25%"}),
        json!({"maxUnavailable": 0}),
        json!({"minAvailable": 2}),
        json!({"minAvailable": "100%"}),
    ] {
        d["spec"]["disruptionBudget"] = ok.clone();
        assert_eq!(problems(Kind::ModelDeployment, &d), vec![], "{ok}");
    }
    d["spec"]["disruptionBudget"] = json!({"maxUnavailable": 1, "minAvailable": 1});
    assert_refused(Kind::ModelDeployment, &d, "disruptionBudget", "give maxUnavailable or minAvailable, not both");
    for (bad, message) in [
        (json!({"maxUnavailable": "150%"}), "does not match the required format"),
        (json!({"maxUnavailable": "1"}), "does not match the required format"),
        (json!({"minAvailable": "half"}), "does not match the required format"),
        (json!({"maxUnavailable": -1}), "must be at least 0"),
        (json!({"minAvailable": 1.5}), "must be an integer or a percentage"),
        (json!({"minAvailable": true}), "must be an integer or a percentage"),
    ] {
        d["spec"]["disruptionBudget"] = bad.clone();
        let p = problems(Kind::ModelDeployment, &d);
        assert!(
            p.iter().any(|(f, m)| f.starts_with("spec.disruptionBudget.") && m.contains(message)),
            "{bad}: expected {message:?} at spec.disruptionBudget.*, got {p:?}"
        );
    }
}

#[test]
fn disruption_budget_reads_counts_and_percentages() {
    use flotilla_apis::deployment::{Budget, DisruptionBudget, ReplicaCount};
    let b: DisruptionBudget = serde_json::from_value(json!({"maxUnavailable": "25%"})).unwrap();
    assert_eq!(b.max_unavailable, Some(ReplicaCount::Percent("25%".into())));
    assert_eq!(b.max_unavailable.as_ref().and_then(ReplicaCount::percent), Some(25));
    let b: DisruptionBudget = serde_json::from_value(json!({"minAvailable": 2})).unwrap();
    assert_eq!(DisruptionBudget::budget(Some(&b)), Budget::MinAvailable(ReplicaCount::Count(2)));
    assert_eq!(serde_json::to_value(&b).unwrap(), json!({"minAvailable": 2}), "written back as given");
    assert_eq!(DisruptionBudget::budget(None), Budget::MaxUnavailable(ReplicaCount::Count(1)), "the default");
}

#[test]
fn autoscaling_needs_a_range_and_a_target() {
    let mut d = deployment();
    let ok = json!({"minReplicas": 0, "maxReplicas": 4, "target": {"queuedPerReplica": 4},
        "idleWindowSeconds": 600, "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}, {"type": "Replicas", "value": 4, "periodSeconds": 15}]},
        "scaleDown": {"selectPolicy": "Disabled"}}});
    d["spec"]["autoscaling"] = ok.clone();
    assert_eq!(problems(Kind::ModelDeployment, &d), vec![], "{ok}");
    d["spec"]["autoscaling"] = json!({"minReplicas": 5, "maxReplicas": 4, "target": {"runningPerReplica": 8}});
    assert_refused(Kind::ModelDeployment, &d, "spec.autoscaling", "minReplicas must be at most maxReplicas");
    d["spec"]["autoscaling"] = json!({"minReplicas": 0, "maxReplicas": 4, "target": {}});
    assert_refused(Kind::ModelDeployment, &d, "spec.autoscaling.target", "give at least one target");
    for (bad, field, message) in [
        (
            json!({"minReplicas": 0, "maxReplicas": 0, "target": {"queuedPerReplica": 1}}),
            "spec.autoscaling.maxReplicas",
            "must be at least 1",
        ),
        (
            json!({"minReplicas": -1, "maxReplicas": 2, "target": {"queuedPerReplica": 1}}),
            "spec.autoscaling.minReplicas",
            "must be at least 0",
        ),
        (
            json!({"minReplicas": 0, "maxReplicas": 2, "target": {"kvCachePercent": 120}}),
            "spec.autoscaling.target.kvCachePercent",
            "must be at most 100",
        ),
        (
            json!({"minReplicas": 0, "maxReplicas": 2, "target": {"queuedPerReplica": 1},
                "behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 15}]}}}),
            "spec.autoscaling.behavior.scaleUp.policies[0].type",
            "",
        ),
        (
            json!({"minReplicas": 0, "maxReplicas": 2, "target": {"queuedPerReplica": 1},
                "behavior": {"scaleDown": {"policies": [{"type": "Percent", "value": 10, "periodSeconds": 3600}]}}}),
            "spec.autoscaling.behavior.scaleDown.policies[0].periodSeconds",
            "must be at most 1800",
        ),
    ] {
        d["spec"]["autoscaling"] = bad.clone();
        let p = problems(Kind::ModelDeployment, &d);
        assert!(
            p.iter().any(|(f, m)| f == field && m.contains(message)),
            "{bad}: expected {message:?} at {field}, got {p:?}"
        );
    }
}
