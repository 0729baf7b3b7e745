//! The table of every condition reason per kind: which conditions carry it, what it means and
//! what to do about it. One row per (kind, reason); shared reasons (`AsExpected`, `InvalidSpec`,
//! `Pending`) have a row on each kind that uses them. Rows marked `reserved` belong to the
//! closed set but no component of this release writes them yet.

use super::{
    CAPACITY_CLAIM, FLEET_QUOTA, INFERENCE_CLASS, INFERENCE_CLUSTER, MODEL_CACHE, MODEL_DEPLOYMENT, ReasonDoc,
};
use crate::constants::reason;

macro_rules! r {
    ($kind:expr, $c:ident, $conds:expr, $meaning:expr, $action:expr $(,)?) => {
        ReasonDoc {
            constant: stringify!($c),
            reason: reason::$c,
            kind: $kind,
            conditions: $conds,
            meaning: $meaning,
            action: $action,
        }
    };
}

const VALIDATE: &str =
    "Fix the field the message names; `fleetctl validate -f <dir>` reports the same error before you commit.";
const NOTHING: &str = "Nothing.";
const WAIT: &str =
    "Wait; if it persists for minutes, check that `flotilla-controller` runs and holds the leader Lease.";

/// Every reason, per kind, in the order of [`super::KINDS`].
pub const ALL: &[ReasonDoc] = &[
    // InferenceClass.
    r!(INFERENCE_CLASS, AS_EXPECTED, "`Ready`=True", "The class's device can be handed to device selectors.", NOTHING),
    r!(
        INFERENCE_CLASS,
        INVALID_SPEC,
        "`Ready`=False",
        "The device cannot be handed to selectors (a capacity a Kubernetes Quantity cannot hold, a negative capacity, DRA's bounds passed); the message names the field. No replica is placed on pools of this class.",
        VALIDATE
    ),
    r!(INFERENCE_CLASS, PENDING, "reserved: `Ready`=Unknown", "The controller has not looked at the class yet.", WAIT),
    // InferenceCluster.
    r!(
        INFERENCE_CLUSTER,
        AS_EXPECTED,
        "`Reachable`=True, `CapacityKnown`=True, `Ready`=True",
        "The member answered and capacity was observed; the message gives devices, free devices and pools without ready nodes.",
        NOTHING,
    ),
    r!(
        INFERENCE_CLUSTER,
        SECRET_MISSING,
        "`Reachable`=False, `CapacityKnown`=Unknown, `Ready`=False",
        "Neither `spec.credentials.secretRef` nor `spec.clusterProfileRef` is set, or the Secret `secretRef` names does not exist in the control cluster.",
        "Create the Secret named in `spec.credentials.secretRef` (namespace `secretRef.namespace`, default `flotilla-system`) with the member's kubeconfig under key `secretRef.key` (default `kubeconfig`), or set `spec.credentials.secretRef`; it is read again on the next poll.",
    ),
    r!(
        INFERENCE_CLUSTER,
        SECRET_INVALID,
        "`Reachable`=False, `CapacityKnown`=Unknown, `Ready`=False",
        "The Secret exists but the key is absent, not UTF-8, not a kubeconfig, or the kubeconfig has no usable context, cluster or user.",
        "Store a complete kubeconfig (current context, cluster `server` and CA, user credentials) under the key the message names; check it with `kubectl --kubeconfig <file> version`.",
    ),
    r!(
        INFERENCE_CLUSTER,
        UNAUTHORIZED,
        "`Reachable`=False, `CapacityKnown`=Unknown, `Ready`=False",
        "The member's API server answered 401 or 403 to the kubeconfig's credentials.",
        "Renew the token or client certificate in the Secret, and let its user get `/version` and list and watch nodes, pods and (with DRA) ResourceSlices and ResourceClaims; a rotated Secret is picked up on the next poll.",
    ),
    r!(
        INFERENCE_CLUSTER,
        UNREACHABLE,
        "`Reachable`=False, `CapacityKnown`=Unknown, `Ready`=False",
        "The member did not answer within `--member-timeout-seconds` (8 s by default), the connection failed, its watches did not sync, or the Secret could not be read.",
        "Check the kubeconfig's `server` URL, the network path from the controller to the member and the member's API server; until it answers the cluster gets no new replicas and no traffic.",
    ),
    r!(
        INFERENCE_CLUSTER,
        NO_MATCHING_NODES,
        "`CapacityKnown`=False, `Ready`=False",
        "The cluster declares no pools, or no declared pool has a Ready, schedulable node labelled `flotilla.dev/pool=<pool>`.",
        "Add `spec.pools`, or label the member's accelerator nodes `flotilla.dev/pool=<pool name>` and make sure they are Ready and not cordoned.",
    ),
    r!(
        INFERENCE_CLUSTER,
        UNKNOWN_CLASS,
        "`CapacityKnown`=False, `Ready`=False",
        "A pool's `class` names an InferenceClass that does not exist.",
        "Create the InferenceClass the message names, or fix `spec.pools[].class`.",
    ),
    r!(
        INFERENCE_CLUSTER,
        CLUSTER_PROFILE_NOT_FOUND,
        "`Reachable`=False, `CapacityKnown`=Unknown, `Ready`=False",
        "The ClusterProfile named by `spec.clusterProfileRef` does not exist in the control cluster, or the controller may not read ClusterProfiles there (HTTP 403; the message says which).",
        "Create the ClusterProfile (your cluster manager does), or fix `spec.clusterProfileRef`; when the message says forbidden, enable `controller.clusterProfiles` in the chart so the controller may get, list and watch `clusterprofiles.multicluster.x-k8s.io`. It is read again on the next poll.",
    ),
    r!(
        INFERENCE_CLUSTER,
        CLUSTER_PROFILE_CRD_MISSING,
        "`Reachable`=False, `CapacityKnown`=Unknown, `Ready`=False",
        "`spec.clusterProfileRef` is set but the control cluster does not serve `clusterprofiles.multicluster.x-k8s.io/v1alpha1` (the Cluster Inventory API CRD is not installed).",
        "Install the ClusterProfile CRD (from `sigs.k8s.io/cluster-inventory-api`, `config/crd/bases`), or use `spec.credentials` instead; the controller asks again within 10 seconds of the next poll.",
    ),
    r!(
        INFERENCE_CLUSTER,
        NO_MATCHING_ACCESS_PROVIDER,
        "`Reachable`=False, `CapacityKnown`=Unknown, `Ready`=False",
        "None of the names in the ClusterProfile's `status.accessProviders` (or the older `credentialProviders`) is a provider of the controller's provider file (`--cluster-profile-providers`), or the controller has no provider file; the message lists both sides.",
        "Add a provider of that name with its exec plugin to the provider file (chart: `controller.clusterProfiles.providers`), or have the cluster manager publish an access provider you configured.",
    ),
    r!(
        INFERENCE_CLUSTER,
        CLUSTER_PROFILE_INVALID,
        "`Reachable`=False, `CapacityKnown`=Unknown, `Ready`=False",
        "The matching access provider's `cluster` block cannot be used: no `server`, `certificate-authority-data` that is not base64 PEM, or an `additional-args`/`additional-envs` extension that is not a list of strings or a map of strings.",
        "Fix the ClusterProfile's status (it is written by your cluster manager); the message names the access provider and the field.",
    ),
    r!(
        INFERENCE_CLUSTER,
        EXEC_PLUGIN_FAILED,
        "`Reachable`=False, `CapacityKnown`=Unknown, `Ready`=False",
        "The access provider's exec credential plugin could not be started, exited non-zero, did not finish within `--member-timeout-seconds`, or printed no usable ExecCredential. The message carries the exit status and the last line the plugin wrote to stderr, never its stdout (where credentials are).",
        "Check that the plugin's `command` exists in the controller's image or volume and runs as the controller's user; run it by hand with `KUBERNETES_EXEC_INFO` set as in docs/operations.md.",
    ),
    r!(
        INFERENCE_CLUSTER,
        CAPACITY_STALE,
        "reserved: `CapacityKnown`=False",
        "Capacity was observed once but is older than the staleness bound.",
        "Check that `flotilla-controller` runs and holds the leader Lease, and that the member answers.",
    ),
    r!(
        INFERENCE_CLUSTER,
        CLEANING_UP,
        "`Ready`=False",
        "The cluster is being deleted with `deletionPolicy: Cleanup` and Flotilla's objects written through it are being removed from the member; the message counts what is left. The finalizer stays until none is left, or 10 minutes have passed (then the rest is orphaned).",
        "Wait. To stop now and leave the rest running, set `spec.deletionPolicy: Orphan`.",
    ),
    r!(
        INFERENCE_CLUSTER,
        CLEANUP_BLOCKED,
        "`Ready`=False",
        "The cluster is being deleted with `deletionPolicy: Cleanup` and the member cannot be reached to remove Flotilla's workloads; after 10 minutes of this they are orphaned.",
        "Bring the member back, or let go now: set `spec.deletionPolicy: Orphan` or annotate the cluster `flotilla.dev/orphan-on-unreachable=true` (the workloads stay in the member, unmanaged).",
    ),
    r!(
        INFERENCE_CLUSTER,
        INVALID_SPEC,
        "reserved: `Ready`=False",
        "The spec failed validation; the message names the field.",
        VALIDATE
    ),
    r!(
        INFERENCE_CLUSTER,
        PENDING,
        "reserved: `Ready`=Unknown",
        "The controller has not observed the member yet.",
        WAIT
    ),
    // ModelDeployment.
    r!(
        MODEL_DEPLOYMENT,
        PLACED,
        "`Placed`=True",
        "Every replica has a place on its first device alternative.",
        NOTHING
    ),
    r!(
        MODEL_DEPLOYMENT,
        FALLBACK_SELECTED,
        "`Placed`=True",
        "Every replica has a place, some on a later device alternative (`status.placements[].fallbackRank` above 1).",
        "Nothing is required. To run on the preferred devices, add or free capacity matching `spec.devices.alternatives[0]`; placements are sticky, so running replicas stay where they are.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        INSUFFICIENT_CAPACITY,
        "`Placed`=False, `CapacityAvailable`=False",
        "On `Placed`: some replicas, or an alternative's `minReplicas`, found no room, and some cluster passed the selector, sovereignty, readiness and taint rules (or some replicas were placed). On `CapacityAvailable`: some replica is unplaced, whatever `Placed` says.",
        "Read `status.unplaced.reasons` (or `fleetctl explain --live md/<name> -n <namespace>`) for each cluster's reason and numbers; then add capacity to an allowed pool, widen the policy (more `devices.alternatives`, `capacityTypes`, regions), lower `replicas` or `minReplicas`, raise `placement.priority`, or set `placement.capacityClaimTemplate` so that a CapacityClaim asks a provider for the rest.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        NO_ELIGIBLE_CLUSTER,
        "`Placed`=False",
        "No replica could be placed and every cluster was refused by a cluster-level rule: selector, sovereignty, readiness, cordon or taint.",
        "Read `status.unplaced.reasons`: fix `placement.clusterSelector` or `placement.sovereignty`, add `placement.tolerations`, or make an allowed cluster Ready; the sovereignty policy is never bent to place a replica.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        COST_CEILING_EXCEEDED,
        "`Placed`=False",
        "One more replica would have taken the deployment above `placement.maxCostPerHour`.",
        "Raise `placement.maxCostPerHour`, allow cheaper capacity types or device alternatives, or lower `replicas`.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        QUOTA_EXCEEDED,
        "`Placed`=False",
        "One more replica would have taken the namespace past a limit of one of its FleetQuotas; `status.unplaced.reasons` names the quota, the limit and the usage, and no CapacityClaim asks for these replicas.",
        "Ask the platform team to raise the FleetQuota (its status shows what each limit holds), lower `replicas` here or in another deployment of the namespace, or add an alternative the limit does not count.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        CLAIM_PENDING,
        "`Placed`=False",
        "A CapacityClaim was created or updated from `placement.capacityClaimTemplate` to obtain what is missing.",
        "Watch the CapacityClaim's conditions; the replicas are placed once its capacity shows up in an InferenceCluster's status.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        ALL_REPLICAS_READY,
        "`Ready`=True",
        "Every desired replica is observed ready in its member cluster.",
        NOTHING,
    ),
    r!(
        MODEL_DEPLOYMENT,
        AS_EXPECTED,
        "`Ready`=True, `CapacityAvailable`=True, `Degraded`=False",
        "On `Ready`: the deployment is scaled to zero. On `CapacityAvailable`: the fleet has room for every replica. On `Degraded`: nothing is degraded.",
        NOTHING,
    ),
    r!(
        MODEL_DEPLOYMENT,
        REPLICAS_NOT_READY,
        "`Ready`=False, `Degraded`=True",
        "Some but not all desired replicas are ready; the message counts them and names members that could not be observed or written.",
        "Look at the member Deployments labelled `flotilla.dev/deployment=<namespace>.<name>` (pod events, engine logs, image pulls, device allocation); during a rollout or move this clears by itself.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        NO_REPLICAS_READY,
        "`Ready`=False",
        "No desired replica is ready anywhere (or none is placed); the message names members that could not be observed.",
        "Check `Placed` first; then the member pods of the deployment (pending, crash-looping, pulling weights). Requests for the model get 503 until one is ready.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        NAME_CONFLICT,
        "`Ready`=False, `Degraded`=True",
        "An object the deployment renders in a member (the message names cluster, kind, namespace and name) already exists and is not this installation's object of this deployment: another team's object, another ModelDeployment's, or another Flotilla installation's. Flotilla leaves it alone byte for byte and writes the deployment's other objects.",
        "Rename the ModelDeployment (or the pool) so its names do not collide, or delete the other object if it is truly unused; the apply is retried on every reconcile.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        APPLY_FAILED,
        "`Degraded`=True",
        "A member cluster rejected the rendered workload; the message carries the member and its answer.",
        "Fix what the member refused (admission policy, quota, missing CRD such as LeaderWorkerSet, RBAC of the kubeconfig's user); the apply is retried on every reconcile.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        MOVING,
        "reserved: `Degraded`=True",
        "Replicas are moving between clusters, make-before-break.",
        "Nothing; it clears when the new replicas are ready and the old ones are removed.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        ROUTABLE,
        "`Serving`=True",
        "The gateway routes the model; the message lists the clusters and their ready replicas.",
        NOTHING,
    ),
    r!(
        MODEL_DEPLOYMENT,
        SERVING_DEGRADED,
        "`Serving`=True",
        "The gateway routes the model, but some clusters are ejected by its circuit breaker or fail at least `--degraded-error-rate` (5%) of 10 or more attempts in the last minute — for the model or for one of its LoRA adapters, which the message names; traffic avoids them.",
        "Check the engines on the clusters the message names (logs, `/metrics`, GPU health); the gateway takes them back once probes and requests succeed.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        ALL_ENDPOINTS_EJECTED,
        "`Serving`=False",
        "Every cluster serving the model is ejected by the gateway's circuit breaker after consecutive failures; requests get 503.",
        "Check the engines and the InferenceClusters' `spec.endpoint` on the clusters the message names; a cluster is taken back when a probe succeeds.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        NO_READY_ENDPOINTS,
        "`Serving`=False",
        "The gateway has no Ready InferenceCluster with an `http(s)` `spec.endpoint` and a ready replica of the model; requests get 503.",
        "Check the deployment's `Ready` and `Placed` conditions and that the clusters it runs on are Ready and set `spec.endpoint`.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        CACHE_NOT_READY,
        "`WaitingForCache`=True",
        "The ModelCache named in `spec.model.cacheRef` is not Ready in a cluster the plan uses.",
        "Look at the ModelCache's `status.clusters[]` for that cluster's phase and reason.",
    ),
    r!(
        MODEL_DEPLOYMENT,
        INVALID_SPEC,
        "`Placed`=False, `Ready`=False",
        "The spec failed validation (for instance a device selector that does not compile, nests too deep, costs too much or names an unknown variable), or the deployment is in a namespace the controller refuses (`kube-system`, `kube-public`, `kube-node-lease`, Flotilla's own, or one outside `--tenant-namespaces`); the message names the field or the namespace. Nothing is written to any member and no capacity is asked for until it is fixed.",
        "Fix the field the message names, or create the deployment in a tenant namespace the controller accepts (docs/operations.md, \"Tenant isolation\").",
    ),
    r!(
        MODEL_DEPLOYMENT,
        CLEANUP_BLOCKED,
        "`Ready`=False",
        "The deployment is being deleted and a member that holds its objects cannot be reached; the message names the member. Only this deployment waits.",
        "Bring the member back, or annotate the deployment `flotilla.dev/orphan-on-unreachable=true` to let it go and leave its objects there (removed by the sweep once the member answers).",
    ),
    r!(
        MODEL_DEPLOYMENT,
        PENDING,
        "reserved: `Ready`=Unknown",
        "The controller has not planned the deployment yet.",
        WAIT
    ),
    // ModelCache.
    r!(
        MODEL_CACHE,
        AS_EXPECTED,
        "`status.clusters[].reason` (phase Ready)",
        "The weights are staged in the cluster and the manifest digest was verified (and equals `spec.digest` when set).",
        NOTHING,
    ),
    r!(
        MODEL_CACHE,
        CACHE_PENDING,
        "`status.clusters[].reason` (phase Pending)",
        "Staging has not started in the cluster yet.",
        WAIT
    ),
    r!(
        MODEL_CACHE,
        DOWNLOADING,
        "`status.clusters[].reason` (phase Downloading)",
        "Weights are being downloaded; `bytes` grows.",
        NOTHING
    ),
    r!(
        MODEL_CACHE,
        VERIFYING,
        "`status.clusters[].reason` (phase Verifying)",
        "The manifest digest is being computed and compared.",
        NOTHING
    ),
    r!(
        MODEL_CACHE,
        SOURCE_UNAUTHORIZED,
        "`status.clusters[].reason` (phase Failed)",
        "The source answered 401/403 (a gated or private repository), or the token file could not be read.",
        "Put a token with access in the Secret named by `spec.credentialsRef` (key `token`; for S3 the AWS keys), and accept the model's licence on the Hub if it is gated.",
    ),
    r!(
        MODEL_CACHE,
        SOURCE_NOT_FOUND,
        "`status.clusters[].reason` (phase Failed)",
        "The source has no such repository, revision, bucket, prefix or tag, or lists no files.",
        "Fix `spec.source` (immutable: create a new ModelCache) or `spec.revision`.",
    ),
    r!(
        MODEL_CACHE,
        DIGEST_MISMATCH,
        "`status.clusters[].reason` (phase Failed)",
        "A file's SHA-256 differs from the source's, a pinned OCI manifest differs, or the manifest digest differs from `spec.digest`; the cache is never Ready on it.",
        "If the source changed on purpose, update `spec.digest` (or pin `spec.revision`); otherwise the download was corrupted or tampered with: investigate before retrying.",
    ),
    r!(
        MODEL_CACHE,
        STORAGE_UNAVAILABLE,
        "`status.clusters[].reason` (phase Failed)",
        "No volume could be provisioned, or the staging program cannot write to it (read-only, full, not a directory).",
        "Set `spec.storage.storageClassName` to a class the member has, make `spec.size` large enough, and check the PersistentVolumeClaim's events; staging resumes.",
    ),
    r!(
        MODEL_CACHE,
        SOURCE_UNAVAILABLE,
        "`status.clusters[].reason` (phase Failed)",
        "The source did not answer, or answered 5xx, 408 or 429, after every retry.",
        "Retry later (a retried Job resumes where it stopped); check the member's egress to the source.",
    ),
    r!(
        MODEL_CACHE,
        INVALID_SOURCE,
        "`status.clusters[].reason` (phase Failed)",
        "The source URL, or a file name it lists, is not one the staging program accepts (unsafe path, OCI index, untitled layer).",
        "Use a source of the form `hf://org/name`, `s3://bucket/prefix` or `oci://registry/repo:tag` whose files have plain relative names.",
    ),
    r!(
        MODEL_CACHE,
        SIZE_MISMATCH,
        "`status.clusters[].reason` (phase Failed)",
        "A staged file is longer or shorter than the source listed (a truncated or altered download); the message names the file.",
        "Retry; if it repeats, the source's listing and content disagree: report it to the source's owner.",
    ),
    r!(
        MODEL_CACHE,
        JOB_FAILED,
        "`status.clusters[].reason` (phase Failed)",
        "The staging Job failed without a verdict (killed, out of memory, no result), or its result is for another source; the message carries the log tail.",
        "Read the message and the Job's pod events in the member; fix the cause and let the Job run again.",
    ),
    r!(
        MODEL_CACHE,
        IN_USE,
        "`Ready`=False",
        "Deletion waits because deployments still mount the cache.",
        "Remove `spec.model.cacheRef` from the ModelDeployments that use it, or delete them.",
    ),
    r!(
        MODEL_CACHE,
        CLEANUP_BLOCKED,
        "`Ready`=False",
        "The cache is being deleted and a member that holds its volume, Job or credentials copy (a cluster in `status.clusters`) cannot be reached; the message names the member. Members that never held the cache do not hold deletion up, reachable or not.",
        "Bring the member back, or annotate the cache `flotilla.dev/orphan-on-unreachable=true` to let it go and leave its objects there (removed by the sweep once the member answers).",
    ),
    r!(
        MODEL_CACHE,
        CREDENTIALS_OUTSIDE_NAMESPACE,
        "`Accepted`=False, `Staged`=False, `Ready`=False",
        "`spec.credentialsRef.namespace` names another namespace than the cache's own (an object written before the CRD refused the field). The controller reads no Secret, copies nothing to any member, and removes the copy an earlier version made from the members in `status.clusters`; running replicas are untouched.",
        "Remove `spec.credentialsRef.namespace` and put the Secret in the cache's namespace.",
    ),
    r!(
        MODEL_CACHE,
        INVALID_SPEC,
        "`Accepted`=False, `Ready`=False",
        "The spec failed validation, or the cache is in a namespace the controller refuses (`kube-system`, `kube-public`, `kube-node-lease`, Flotilla's own, or one outside `--tenant-namespaces`); nothing is written to any member.",
        "Fix the field the message names, or create the cache in a tenant namespace the controller accepts.",
    ),
    // CapacityClaim.
    r!(
        CAPACITY_CLAIM,
        AS_EXPECTED,
        "`Surplus`=False; reserved: `Accepted`=True",
        "The claim holds no more nodes than its pod sets need.",
        NOTHING
    ),
    r!(
        CAPACITY_CLAIM,
        INVALID_SPEC,
        "reserved: `Accepted`=False",
        "The spec failed validation (an unknown class, a bad selector); nothing is requested.",
        VALIDATE
    ),
    r!(
        CAPACITY_CLAIM,
        PROVISIONING,
        "`Provisioning`=True, `Fulfilled`=False, `Ready`=False",
        "A provider request is in flight, or every pod set has nodes and some are not ready yet.",
        "Wait; `status.attempts` records each provider request.",
    ),
    r!(
        CAPACITY_CLAIM,
        FULFILLED,
        "`Fulfilled`=True, `Ready`=True",
        "Every pod set has ready nodes of its first choice.",
        NOTHING,
    ),
    r!(
        CAPACITY_CLAIM,
        PARTIALLY_FULFILLED,
        "`Fulfilled`=False, `Ready`=False",
        "Some pod sets, or some of their pods, have capacity; the search ran out for the rest.",
        "Read `status.attempts` for each refusal; widen `spec.capacity` (capacity types, device classes, regions) or lower pod counts.",
    ),
    r!(
        CAPACITY_CLAIM,
        CLAIM_FALLBACK_SELECTED,
        "`Fulfilled`=True, `Ready`=True",
        "Fulfilled with a later device class or capacity type than the first.",
        "Nothing is required; to get the first choice, free a reservation or retry later.",
    ),
    r!(
        CAPACITY_CLAIM,
        CAPACITY_UNAVAILABLE,
        "`Fulfilled`=False, `Ready`=False",
        "No provider offering had capacity for any allowed alternative; nothing was obtained.",
        "Allow more capacity types, device classes or regions in `spec.capacity`, or retry later; refused offerings are retried after a back-off.",
    ),
    r!(
        CAPACITY_CLAIM,
        QUOTA_EXCEEDED,
        "`Fulfilled`=False, `Ready`=False",
        "Nothing was obtained and a provider quota (vCPU, instances, spot, placement groups) was the only refusal.",
        "Raise the quota with the provider (the message names it) or ask for fewer nodes.",
    ),
    r!(
        CAPACITY_CLAIM,
        RESERVATION_MISMATCH,
        "`Fulfilled`=False, `Ready`=False",
        "Nothing was obtained and the only refusal was a reservation in `spec.capacity.reservationIds` that does not match the request (instance type, zone, state, free count, or a region that does not hold it).",
        "Fix `spec.capacity.reservationIds` or the pod sets so they fit the reservation, or allow `on-demand`/`spot`.",
    ),
    r!(
        CAPACITY_CLAIM,
        EXPIRED,
        "`Fulfilled`=False, `Ready`=False",
        "The claim stayed unfulfilled past `maxProvisioningLatency` (counted from creation, or from when it last stopped being fulfilled); no more requests are made.",
        "Raise `spec.latency.maxProvisioningLatency` or widen the policy, then recreate the claim.",
    ),
    r!(
        CAPACITY_CLAIM,
        INTERRUPTED,
        "`Fulfilled`=False, `Ready`=False",
        "The provider took capacity back (spot interruption, capacity block end); the claim releases it and asks again, skipping that offering for a while.",
        "Nothing; to avoid repeats, prefer `reserved` or `on-demand` over `spot` in `spec.capacity.capacityTypes`.",
    ),
    r!(
        CAPACITY_CLAIM,
        PROVIDER_UNAVAILABLE,
        "`Fulfilled`=False, `Ready`=False",
        "The provider did not answer, timed out, answered 5xx or kept throttling after retries; the claim backs off (5 s, doubling to 5 minutes) and tries again.",
        "Nothing if it clears; if it persists, check the provider's status, the controller's network path to its API and its rate limits.",
    ),
    r!(
        CAPACITY_CLAIM,
        PROVIDER_UNAUTHORIZED,
        "`Fulfilled`=False, `Ready`=False",
        "The provider refused the controller's credentials or a permission is missing (`UnauthorizedOperation`, `AccessDenied`, expired token).",
        "Grant the controller's provider identity the permission the message names, or renew its credentials.",
    ),
    r!(
        CAPACITY_CLAIM,
        PROVIDER_REJECTED,
        "`Fulfilled`=False, `Ready`=False",
        "The provider rejected the request as invalid (unknown subnet, role, instance type or parameter).",
        "Fix what the message names: the instance types offered for the class, or the provider settings.",
    ),
    r!(
        CAPACITY_CLAIM,
        NO_ALLOWED_REGION,
        "`Fulfilled`=False, `Ready`=False",
        "No region the provider offers is allowed by `spec.capacity.sovereignty`; nothing is requested.",
        "Allow one of the regions or jurisdictions the message lists, or configure a provider with an allowed region.",
    ),
    r!(
        CAPACITY_CLAIM,
        DRAIN_REQUIRED,
        "`Surplus`=True",
        "Surplus nodes (the claim shrank, or is being deleted) still run pods, and `disruption.scaleDown: ApplicationDrainOnly` releases a node only after the application left it.",
        "Move or stop the pods on the nodes the message names (scale the workload down); each node is released once empty. To release busy nodes anyway, set `scaleDown: Any` with `consolidation: WhenUnderutilized`.",
    ),
    r!(
        CAPACITY_CLAIM,
        CONSOLIDATION_BLOCKED,
        "`Surplus`=True",
        "The claim holds surplus nodes that `spec.disruption` keeps for now: `consolidation: Disabled`, `minLifetime` not yet reached, `WhenEmpty` nodes that still run pods, or pods on the nodes that cannot be seen (member unreachable).",
        "Nothing if intended; the message says when or what releases them. Change `spec.disruption` to release sooner.",
    ),
    r!(
        CAPACITY_CLAIM,
        SCALING_DOWN,
        "`Surplus`=True",
        "Surplus nodes are being given back to the provider (released or the node group shrunk); the next look confirms it.",
        NOTHING,
    ),
    // FleetQuota.
    r!(
        FLEET_QUOTA,
        AS_EXPECTED,
        "`Ready`=True, `Exhausted`=False",
        "The quota is valid and enforced, and every limit has room.",
        NOTHING
    ),
    r!(
        FLEET_QUOTA,
        INVALID_SPEC,
        "`Ready`=False",
        "A limit names an InferenceClass that does not exist (it counts nothing until one does), or two limits count the same devices.",
        VALIDATE
    ),
    r!(
        FLEET_QUOTA,
        QUOTA_EXCEEDED,
        "`Exhausted`=True",
        "Replicas of the namespace are unplaced because one more would pass a limit of this quota; the message names the limit, the usage and the replicas. Their ModelDeployments say `QuotaExceeded` on the clusters that refused them.",
        "Raise the limit, lower `replicas` in the namespace, or give the deployments an alternative the limit does not count. Within the namespace, higher `placement.priority` takes the quota first.",
    ),
    r!(
        FLEET_QUOTA,
        AT_LIMIT,
        "`Exhausted`=True",
        "The namespace's plan uses a limit exactly; nothing is refused yet, but the next replica it counts would be.",
        "Nothing, unless the namespace is about to grow: raise the limit first.",
    ),
];
