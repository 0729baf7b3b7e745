use flotilla_apis::FleetObject;
use flotilla_apis::document::parse_stream;

use super::*;

fn caches() -> Vec<ModelCache> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/fleet/caches.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    parse_stream("caches.yaml", &text)
        .objects
        .into_iter()
        .filter_map(|o| match o.value {
            FleetObject::Cache(c) => Some(c),
            _ => None,
        })
        .collect()
}

fn yaml(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| serde_yaml_ng::to_string(&crate::render::sorted_keys(o)).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

#[test]
fn hf_cache_with_token_and_digest() {
    let c = &caches()[0];
    let class = storage_class(c, Some("efs"));
    assert_eq!(class.as_deref(), Some("fsx-lustre"), "the cache's storage class wins over the cluster's");
    let data = BTreeMap::from([("token".to_string(), "aGZfeHl6".to_string())]);
    let objects = [
        pvc(c, class.as_deref()),
        credentials_secret(c, &data),
        job(c, "ghcr.io/flotilla-dev/flotilla-stage:0.1.0", false),
    ];
    insta::assert_snapshot!("hf_cache", yaml(&objects));
    let args: Vec<&str> = objects[2]["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.contains(&"--expected-digest=sha256:99668f5da82711e698e1fb1039974b5e673a43337ef024988a0c9cc92baa451b")
    );
    assert!(args.contains(&"--revision=0b32f3e76e85c66010f843b6142e1d635d420c94"));
    assert_eq!(objects[0]["spec"]["resources"]["requests"]["storage"], "140G");
}

#[test]
fn permanent_failures_fail_the_job_transient_ones_retry() {
    let c = &caches()[1];
    let j = job(c, "img", false);
    let codes = &j["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"];
    for r in StageReason::ALL {
        let listed = codes.as_array().unwrap().contains(&json!(r.exit_code()));
        assert_eq!(listed, !r.is_transient(), "{r:?}");
    }
    assert_eq!(j["spec"]["backoffLimit"], BACKOFF_LIMIT);
}

#[test]
fn storage_class_falls_back_to_the_cluster_then_the_default() {
    let mut c = caches()[0].clone();
    c.spec.storage = None;
    assert_eq!(storage_class(&c, Some("efs")).as_deref(), Some("efs"));
    assert_eq!(storage_class(&c, None), None);
    assert!(pvc(&c, None)["spec"].get("storageClassName").is_none(), "the member's default class");
}

#[test]
fn the_job_name_follows_what_is_staged_only() {
    let c = caches()[0].clone();
    let name = job_name(&c);
    assert!(name.starts_with("flotilla-stage-llama-3.3-70b-"), "{name}");
    let mut other = c.clone();
    other.spec.size = k8s_openapi::apimachinery::pkg::api::resource::Quantity("200G".into());
    other.spec.targets.deployments.push("another".into());
    assert_eq!(job_name(&other), name, "size and targets do not restage");
    other.spec.digest = Some(format!("sha256:{}", "0".repeat(64)));
    assert_ne!(job_name(&other), name, "a new digest is a new Job");
}

#[test]
fn s3_credentials_go_to_aws_variables() {
    let mut c = caches()[1].clone();
    c.spec.source = "s3://weights/llama".into();
    let j = job(&c, "img", false);
    let env = &j["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(env[0], json!({"name": IMDS_DISABLED, "value": "true"}));
    assert_eq!(env[1]["name"], "AWS_ACCESS_KEY_ID");
    assert_eq!(env[1]["valueFrom"]["secretKeyRef"]["name"], "flotilla-stage-llama-3.1-405b-fp8-credentials");
    assert_eq!(j["spec"]["template"]["spec"]["volumes"].as_array().unwrap().len(), 1, "no token file");
}

/// An S3 cache whose Job gets credentials the way pods do on EKS: through its service account.
fn s3_cache_with_service_account() -> ModelCache {
    let mut c = caches()[1].clone();
    c.spec.source = "s3://weights/llama-3.1-405b-fp8".into();
    c.spec.revision = None;
    c.spec.credentials_ref = None;
    c.spec.service_account_name = Some("model-stager".into());
    c
}

#[test]
fn the_job_runs_as_the_caches_service_account_and_carries_no_cloud_credentials() {
    let c = s3_cache_with_service_account();
    let j = job(&c, "ghcr.io/flotilla-dev/flotilla-stage:0.1.0", false);
    insta::assert_snapshot!("s3_cache_service_account", yaml(std::slice::from_ref(&j)));
    let pod = &j["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "model-stager");
    assert_eq!(
        pod["containers"][0]["env"],
        json!([{"name": "AWS_EC2_METADATA_DISABLED", "value": "true"}]),
        "no AWS credential variables: the chain finds IRSA / Pod Identity, and not the node's role"
    );
    assert_eq!(pod["volumes"].as_array().unwrap().len(), 1, "no credentials Secret mounted");
    // Without one, the pod spec names none (the namespace's default), as before.
    let plain = job(&caches()[1], "img", false);
    assert!(plain["spec"]["template"]["spec"].get("serviceAccountName").is_none());
}

#[test]
fn the_service_account_is_part_of_the_job_name_only_when_set() {
    let without = caches()[1].clone();
    let mut with = without.clone();
    with.spec.service_account_name = Some("model-stager".into());
    assert_ne!(job_name(&with), job_name(&without), "fixing the service account after a refusal starts a new Job");
    let mut other = with.clone();
    other.spec.service_account_name = Some("other".into());
    assert_ne!(job_name(&other), job_name(&with));
    // The name without a service account is the one earlier versions gave (no restaging on upgrade).
    let what = json!([without.spec.source, without.spec.revision, without.spec.digest]);
    assert!(job_name(&without).ends_with(&content_hash(&what)[..8]));
}

#[test]
fn the_node_role_is_out_of_reach_unless_the_operator_allows_it() {
    for c in caches() {
        let closed = job(&c, "img", false);
        let env = closed["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap().clone();
        assert!(env.contains(&json!({"name": "AWS_EC2_METADATA_DISABLED", "value": "true"})), "{env:?}");
        let open = job(&c, "img", true);
        let env = open["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap().clone();
        assert!(env.iter().all(|e| e["name"] != IMDS_DISABLED), "--stage-allow-instance-metadata: {env:?}");
        assert_eq!(job_name(&c), open["metadata"]["name"], "the switch does not restage");
    }
}
