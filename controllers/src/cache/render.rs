//! What a member cluster runs for one ModelCache: a PersistentVolumeClaim sized from
//! `spec.size` (storage class from the cache, else the InferenceCluster's
//! `cacheStorageClassName`, else the member's default), an optional copy of the source's
//! credentials Secret, and one staging Job running `flotilla-stage` as `docs/staging.md`
//! describes (args, termination message, volume at `/cache`, the cache's service account for
//! IRSA / EKS Pod Identity, the instance metadata service closed to the AWS SDK unless the
//! operator allows it). The Job's name carries a hash of what it stages (source, revision,
//! digest) and the service account, so a finished Job is never run again for the same spec —
//! scaling a deployment out re-downloads nothing — and a changed spec gets a new Job.
//! Every object carries the cache label, so cleanup finds exactly these. Pure: JSON out.

use std::collections::BTreeMap;

use flotilla_apis::ModelCache;
use flotilla_apis::constants::labels;
use flotilla_apis::stage::StageReason;
use serde_json::{Value, json};

use crate::deployment::members::content_hash;
use crate::render::MANAGED_BY;

/// Where the staging program is in its image.
pub const STAGE_BINARY: &str = "/usr/local/bin/flotilla-stage";
/// Where the staging Job mounts the volume.
pub const STAGE_MOUNT: &str = "/cache";
/// Where the credentials Secret is mounted in the staging Job.
pub const CREDENTIALS_MOUNT: &str = "/var/run/flotilla/credentials";
/// Default key of the token in the credentials Secret.
pub const DEFAULT_TOKEN_KEY: &str = "token";
/// The AWS SDK's switch that keeps it from the instance metadata service (credentials and
/// region of the node's instance profile); `flotilla-stage` honours it too.
pub const IMDS_DISABLED: &str = "AWS_EC2_METADATA_DISABLED";
/// Retries of a Job whose failure may pass (`SourceUnavailable`, `StorageUnavailable`, a killed pod).
pub const BACKOFF_LIMIT: i32 = 4;

/// `<namespace>.<name>` (shortened with a hash past 63 characters): the cache label value.
pub fn cache_key(cache: &ModelCache) -> String {
    flotilla_apis::names::owner_key(
        cache.metadata.namespace.as_deref().unwrap_or("default"),
        cache.metadata.name.as_deref().unwrap_or(""),
    )
}

/// The label selector that finds every member object of a cache.
pub fn selector(cache: &ModelCache) -> String {
    format!("{}={},{}={MANAGED_BY}", labels::CACHE, cache_key(cache), labels::MANAGED_BY)
}

/// The PersistentVolumeClaim holding a cache's files (in the cache's namespace).
pub fn pvc_name(cache: &str) -> String {
    format!("flotilla-cache-{cache}")
}

/// Where replicas of a deployment with `cacheRef: <cache>` find the files (read-only).
pub fn model_dir(cache: &str) -> String {
    format!("/models/{cache}")
}

/// Where replicas of a deployment with an adapter of `cacheRef: <cache>` find its files
/// (read-only); the member router loads the adapter from there.
pub fn adapter_dir(cache: &str) -> String {
    format!("/adapters/{cache}")
}

/// The member copy of the credentials Secret.
pub fn credentials_secret_name(cache: &str) -> String {
    format!("flotilla-stage-{cache}-credentials")
}

/// The staging Job for what the spec asks now: `flotilla-stage-<cache>-<8 hex>`. The service
/// account counts too (when set, so names without one stay as they were): changing it after a
/// refusal is how credentials get fixed, and a new Job re-verifies what is already staged
/// instead of downloading it again.
pub fn job_name(cache: &ModelCache) -> String {
    let s = &cache.spec;
    let what = match &s.service_account_name {
        None => json!([s.source, s.revision, s.digest]),
        Some(sa) => json!([s.source, s.revision, s.digest, sa]),
    };
    let hash = content_hash(&what);
    format!("flotilla-stage-{}-{}", cache.metadata.name.as_deref().unwrap_or(""), &hash[..8])
}

fn object_labels(cache: &ModelCache) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(labels::MANAGED_BY.to_string(), MANAGED_BY.to_string());
    l.insert(labels::CACHE.to_string(), cache_key(cache));
    l
}

/// The storage class: the cache's, else the cluster's, else none (the member's default).
pub fn storage_class(cache: &ModelCache, cluster_default: Option<&str>) -> Option<String> {
    cache.spec.storage.as_ref().and_then(|s| s.storage_class_name.clone()).or(cluster_default.map(str::to_string))
}

/// The PersistentVolumeClaim. `ReadWriteMany`: the Job writes it, replicas on any node read it.
pub fn pvc(cache: &ModelCache, storage_class: Option<&str>) -> Value {
    let name = cache.metadata.name.as_deref().unwrap_or("");
    let mut spec = json!({
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": cache.spec.size.0}}
    });
    if let Some(class) = storage_class {
        spec["storageClassName"] = json!(class);
    }
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": pvc_name(name), "namespace": cache.metadata.namespace, "labels": object_labels(cache)},
        "spec": spec
    })
}

/// The member copy of the credentials Secret (every key of the control cluster's Secret).
pub fn credentials_secret(cache: &ModelCache, data: &BTreeMap<String, String>) -> Value {
    let name = cache.metadata.name.as_deref().unwrap_or("");
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": credentials_secret_name(name), "namespace": cache.metadata.namespace,
                     "labels": object_labels(cache)},
        "type": "Opaque",
        "data": data
    })
}

/// The staging Job. Exit codes of failures that retrying cannot fix fail the Job at once
/// (`podFailurePolicy`); transient ones retry up to [`BACKOFF_LIMIT`] times and resume.
/// Unless `instance_metadata` (the operator's `--stage-allow-instance-metadata`), the AWS SDK
/// in the container is told not to use the instance metadata service
/// ([`IMDS_DISABLED`]), so a tenant's source is never read with the node's IAM role.
pub fn job(cache: &ModelCache, image: &str, instance_metadata: bool) -> Value {
    let name = cache.metadata.name.as_deref().unwrap_or("");
    let s = &cache.spec;
    let mut args = vec![format!("--source={}", s.source)];
    if let Some(r) = &s.revision {
        args.push(format!("--revision={r}"));
    }
    args.push(format!("--dest={STAGE_MOUNT}"));
    if let Some(d) = &s.digest {
        args.push(format!("--expected-digest={d}"));
    }
    args.push("--termination-log=/dev/termination-log".into());
    let mut env: Vec<Value> = Vec::new();
    if !instance_metadata {
        env.push(json!({"name": IMDS_DISABLED, "value": "true"}));
    }
    let mut mounts = vec![json!({"name": "cache", "mountPath": STAGE_MOUNT})];
    let mut volumes = vec![json!({"name": "cache", "persistentVolumeClaim": {"claimName": pvc_name(name)}})];
    if let Some(c) = &s.credentials_ref {
        let secret = credentials_secret_name(name);
        if s.source.starts_with("s3://") {
            for key in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"] {
                env.push(
                    json!({"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": true}}}),
                );
            }
        } else {
            let key = c.key.as_deref().unwrap_or(DEFAULT_TOKEN_KEY);
            env.push(json!({"name": "FLOTILLA_STAGE_TOKEN_FILE", "value": format!("{CREDENTIALS_MOUNT}/{key}")}));
            mounts.push(json!({"name": "credentials", "mountPath": CREDENTIALS_MOUNT, "readOnly": true}));
            volumes.push(json!({"name": "credentials", "secret": {"secretName": secret}}));
        }
    }
    let mut pod = json!({
        "restartPolicy": "Never",
        "containers": [{
            "name": "stage",
            "image": image,
            "command": [STAGE_BINARY],
            "args": args,
            "env": env,
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": mounts
        }],
        "volumes": volumes
    });
    // IRSA's webhook and EKS Pod Identity give credentials to pods of a service account: the
    // controller never copies cloud credentials into the Job itself.
    if let Some(sa) = &s.service_account_name {
        pod["serviceAccountName"] = json!(sa);
    }
    let permanent: Vec<i32> = std::iter::once(2)
        .chain(StageReason::ALL.into_iter().filter(|r| !r.is_transient()).map(StageReason::exit_code))
        .collect();
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(cache), "namespace": cache.metadata.namespace, "labels": object_labels(cache)},
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": "stage", "operator": "In", "values": permanent}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
            ]},
            "template": {
                "metadata": {"labels": object_labels(cache)},
                "spec": pod
            }
        }
    })
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
