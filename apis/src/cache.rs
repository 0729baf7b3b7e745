//! `ModelCache`: weights staged once per member cluster and verified there before replicas
//! depend on them. Status follows each target cluster through
//! `Pending → Downloading → Verifying → Ready | Failed`.

use k8s_openapi::apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::Conditions;

/// Model weights staged in member clusters.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "flotilla.dev",
    version = "v1alpha1",
    kind = "ModelCache",
    namespaced,
    shortname = "mc",
    category = "flotilla",
    status = "ModelCacheStatus",
    printcolumn(name = "Source", type_ = "string", json_path = ".spec.source"),
    printcolumn(name = "Size", type_ = "string", json_path = ".spec.size"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Clusters", type_ = "string", json_path = ".status.readyClusters"),
    printcolumn(name = "Phases", type_ = "string", json_path = ".status.summary", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("self.source == oldSelf.source").message("spec.source is immutable: create a new ModelCache"))]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheSpec {
    /// `hf://org/name`, `s3://bucket/prefix` or `oci://registry/repo:tag`.
    #[schemars(length(max = 1024), regex(pattern = r"^(hf|s3|oci)://.+$"))]
    pub source: String,
    /// Revision (commit, tag or branch) for `hf://` sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Expected size of all files; the volume is sized from it.
    pub size: Quantity,
    /// Expected manifest digest (`sha256:<64 hex>`); Ready only after it matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^sha256:[a-f0-9]{64}$"))]
    pub digest: Option<String>,
    /// Clusters to stage in.
    pub targets: CacheTargets,
    /// Volume to stage into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<CacheStorage>,
    /// Secret with the source's token (`token` key by default; for `s3://` the AWS keys), read
    /// by the controller in the cache's own namespace of the control cluster only, and copied
    /// to `flotilla-stage-<cache>-credentials` in the cache's namespace of every target cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<CacheCredentialsRef>,
    /// Service account the staging Job's pod runs as, in the cache's namespace of every target
    /// cluster (it must exist there). How pods get cloud credentials without a Secret: for
    /// `s3://`, annotate it for IRSA (`eks.amazonaws.com/role-arn`) or give it an EKS Pod
    /// Identity association. The namespace's `default` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub service_account_name: Option<String>,
}

/// The Secret with a source's credentials: always in the cache's own namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.__namespace__)").field_path(".namespace").message("a ModelCache reads its credentials Secret in its own namespace only: remove credentialsRef.namespace"))]
#[serde(rename_all = "camelCase")]
pub struct CacheCredentialsRef {
    /// Not allowed: a ModelCache reads Secrets in its own namespace only. Refused when set
    /// (kept in the schema so that an object written before this was refused is still read:
    /// the controller accepts it only when it names the cache's own namespace, and refuses
    /// any other with `CredentialsOutsideNamespace`, copying nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the Secret, in the cache's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key of the token (not for `s3://`, which reads the keys `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`); `token` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Which clusters to stage in: selected clusters, wherever named deployments are placed, or both.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.clusterSelector) || (has(self.deployments) && size(self.deployments) > 0)").message("give a clusterSelector, deployments, or both"))]
#[serde(rename_all = "camelCase")]
pub struct CacheTargets {
    /// Clusters whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// ModelDeployments in this namespace: stage wherever they are placed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub deployments: Vec<String>,
}

/// The volume weights are staged into.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheStorage {
    /// Storage class of the PersistentVolumeClaim; the member's default when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// Staging phase in one cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CachePhase {
    /// Waiting to start.
    #[default]
    Pending,
    /// Files are being fetched.
    Downloading,
    /// The manifest digest is being computed and compared.
    Verifying,
    /// Staged and verified.
    Ready,
    /// Staging failed; the reason says why.
    Failed,
}

/// Observed state of a ModelCache.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheStatus {
    /// The generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`, `Staged`, `Ready`.
    #[serde(default)]
    pub conditions: Conditions,
    /// Target clusters where the cache is Ready, over all targets: `2/3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_clusters: Option<String>,
    /// Phase per target cluster: `eu1:Ready,eu2:Downloading`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Per target cluster.
    // Written even when empty: the last cluster that stops being a target leaves status.
    #[serde(default)]
    pub clusters: Vec<ClusterCacheStatus>,
}

/// Staging state in one cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCacheStatus {
    /// The InferenceCluster.
    pub cluster: String,
    /// Where staging is.
    pub phase: CachePhase,
    /// Bytes staged so far.
    #[serde(default)]
    pub bytes: i64,
    /// Manifest digest observed in the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Reason for the phase (see `constants::reason`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What happened and what to change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
