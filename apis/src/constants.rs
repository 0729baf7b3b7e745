//! Every name Flotilla writes into the API that users may alert or match on: the API group,
//! condition types, condition reasons (a closed set per kind), event reasons, finalizers,
//! labels and the field manager. Nothing else in the workspace spells these strings.

/// The API group of every Flotilla kind.
pub const GROUP: &str = "flotilla.dev";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in YAML.
pub const API_VERSION: &str = "flotilla.dev/v1alpha1";

/// The field manager used for every server-side apply Flotilla makes.
pub const FIELD_MANAGER: &str = "flotilla";
/// Finalizer that lets a ModelDeployment remove what it created in member clusters.
pub const FINALIZER_MEMBER_CLEANUP: &str = "flotilla.dev/member-cleanup";
/// Finalizer that lets a ModelCache remove its staging volumes and jobs.
pub const FINALIZER_CACHE_CLEANUP: &str = "flotilla.dev/cache-cleanup";
/// Finalizer that releases capacity obtained for a CapacityClaim.
pub const FINALIZER_CAPACITY_RELEASE: &str = "flotilla.dev/capacity-release";
/// Finalizer that lets an InferenceCluster apply its `spec.deletionPolicy` to the member.
pub const FINALIZER_CLUSTER_CLEANUP: &str = "flotilla.dev/cluster-cleanup";

/// Annotations users set on Flotilla objects to steer the controller.
pub mod annotations {
    /// On a ModelDeployment, ModelCache or InferenceCluster being deleted, `"true"`: stop waiting for members
    /// that cannot be reached and leave whatever Flotilla runs there (a later sweep removes it
    /// once the member answers again, if its InferenceCluster still exists).
    pub const ORPHAN_ON_UNREACHABLE: &str = "flotilla.dev/orphan-on-unreachable";
    /// On an InferenceCluster, a number: the periodic sweep of its member may delete up to that
    /// many objects in one pass, past the share bound that otherwise holds it
    /// (`SweepHeld`). Remove it once the sweep has run.
    pub const APPROVE_SWEEP: &str = "flotilla.dev/approve-sweep";
    /// On the HTTPRoutes Flotilla renders in members: the model name the route serves (member
    /// routers list it at `GET /v1/models`).
    pub const MODEL: &str = "flotilla.dev/model";
    /// On the HTTPRoutes Flotilla renders in members: the adapters the route's replicas may
    /// load in that cluster, as a JSON object of adapter name → directory in the engine
    /// container (`{"support-fr": "/adapters/support-fr-lora"}`); only adapters allowed there
    /// and staged and verified there. Absent: no adapters. A member router loads no other.
    pub const ADAPTERS: &str = "flotilla.dev/adapters";
    /// On the same HTTPRoutes, with [`ADAPTERS`]: how many adapters one replica holds loaded at
    /// once (the engine's `--max-loras`), a decimal number.
    pub const MAX_ADAPTERS: &str = "flotilla.dev/max-adapters";
}

/// The request header by which the fleet gateway names the ModelDeployment a request is for
/// (`<namespace>/<name>`), and which the HTTPRoutes Flotilla renders in members match on.
pub const DEPLOYMENT_HEADER: &str = "x-flotilla-deployment";

/// Namespaces no tenant object (ModelDeployment, ModelCache) may use, on the control cluster or
/// in a member; Flotilla's own namespace is added by the controller.
pub const PROTECTED_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// Labels Flotilla puts on the objects it creates in member clusters and on nodes it asks for.
pub mod labels {
    /// The ModelDeployment (`<namespace>.<name>`, [`crate::names::owner_key`]) a member object
    /// belongs to.
    pub const DEPLOYMENT: &str = "flotilla.dev/deployment";
    /// The ModelCache (`<namespace>.<name>`, [`crate::names::owner_key`]) a member volume,
    /// staging Job or Secret belongs to.
    pub const CACHE: &str = "flotilla.dev/cache";
    /// The generation of the ModelDeployment that rendered the object.
    pub const GENERATION: &str = "flotilla.dev/generation";
    /// The InferenceCluster pool a node belongs to.
    pub const POOL: &str = "flotilla.dev/pool";
    /// The InferenceClass of a node.
    pub const CLASS: &str = "flotilla.dev/class";
    /// The CapacityClaim that asked for a node (its [`crate::names::owner_key`]).
    pub const CLAIM: &str = "flotilla.dev/claim";
    /// The provider acquisition (node group) a claim's node came from.
    pub const ACQUISITION: &str = "flotilla.dev/acquisition";
    /// The claim's `disruption.consolidation` on the nodes it obtained.
    pub const CONSOLIDATION: &str = "flotilla.dev/consolidation";
    /// The claim's `disruption.scaleDown` on the nodes it obtained.
    pub const SCALE_DOWN: &str = "flotilla.dev/scale-down";
    /// Standard Kubernetes label marking who manages an object.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// The installation (control plane) that wrote a member object: the controller's
    /// `--install-id`, by default the UID of the control cluster's `kube-system` Namespace.
    /// Every selector, prune, sweep and cleanup matches it, so two control planes sharing a
    /// member never touch each other's objects.
    pub const INSTALL: &str = "flotilla.dev/install";
    /// The InferenceCluster through which a member object was written: its deletion with
    /// `deletionPolicy: Cleanup` removes only the objects carrying its name.
    pub const CLUSTER: &str = "flotilla.dev/cluster";
}

/// Condition types. Every kind has one aggregate `Ready`.
/// Each one is documented per kind in [`crate::reasons::CONDITIONS`].
pub mod condition {
    /// Aggregate readiness, on every kind.
    pub const READY: &str = "Ready";
    /// InferenceCluster: the member's API server answers with the given credentials.
    pub const REACHABLE: &str = "Reachable";
    /// InferenceCluster: observed capacity is known and fresh.
    pub const CAPACITY_KNOWN: &str = "CapacityKnown";
    /// ModelDeployment: every replica has a place in the plan.
    pub const PLACED: &str = "Placed";
    /// ModelDeployment: the fleet (or a claim) has room for what the plan needs.
    pub const CAPACITY_AVAILABLE: &str = "CapacityAvailable";
    /// ModelDeployment: the gateway can route requests for the model.
    pub const SERVING: &str = "Serving";
    /// ModelDeployment: some but not all of the desired replicas are ready.
    pub const DEGRADED: &str = "Degraded";
    /// ModelDeployment: replicas wait for a ModelCache to be Ready in their cluster.
    pub const WAITING_FOR_CACHE: &str = "WaitingForCache";
    /// ModelCache / CapacityClaim: the spec is valid and accepted.
    pub const ACCEPTED: &str = "Accepted";
    /// ModelCache: weights are staged and verified in every target cluster.
    pub const STAGED: &str = "Staged";
    /// CapacityClaim: every pod set has the capacity it asked for.
    pub const FULFILLED: &str = "Fulfilled";
    /// CapacityClaim: a provider request is in flight.
    pub const PROVISIONING: &str = "Provisioning";
    /// CapacityClaim: it holds more nodes than its pod sets need, and the disruption policy
    /// keeps them for now.
    pub const SURPLUS: &str = "Surplus";
    /// FleetQuota: a limit binds — replicas of the namespace are unplaced because of it.
    pub const EXHAUSTED: &str = "Exhausted";
}

/// Reasons, grouped by the kind whose conditions carry them. Each set is closed: a reason not
/// listed here is never written.
/// Each one is documented (meaning, what to do) in [`crate::reasons::ALL`], from which
/// `docs/api.md` is rendered; a test fails when one is missing there.
pub mod reason {
    // Shared by every kind.
    /// The spec failed validation; the message names the field.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// FleetQuota: the namespace's plan holds a limit exactly; the next replica it counts is refused.
    pub const AT_LIMIT: &str = "AtLimit";
    /// All is as asked.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// Deletion waits: a member that holds the object's workloads cannot be reached.
    pub const CLEANUP_BLOCKED: &str = "CleanupBlocked";
    /// Deletion waits while Flotilla's objects are removed from the member; the message counts
    /// what is left.
    pub const CLEANING_UP: &str = "CleaningUp";
    /// The controller has not observed enough yet to say.
    pub const PENDING: &str = "Pending";

    // InferenceCluster.
    /// The referenced kubeconfig Secret does not exist.
    pub const SECRET_MISSING: &str = "SecretMissing";
    /// The Secret exists but holds no usable kubeconfig.
    pub const SECRET_INVALID: &str = "SecretInvalid";
    /// The member API server rejected the credentials.
    pub const UNAUTHORIZED: &str = "Unauthorized";
    /// The member API server did not answer in time.
    pub const UNREACHABLE: &str = "Unreachable";
    /// No node of the member matches any declared pool.
    pub const NO_MATCHING_NODES: &str = "NoMatchingNodes";
    /// Capacity was observed but is older than the staleness bound.
    pub const CAPACITY_STALE: &str = "CapacityStale";
    /// A pool names an InferenceClass that does not exist.
    pub const UNKNOWN_CLASS: &str = "UnknownClass";
    /// The ClusterProfile named by `spec.clusterProfileRef` does not exist (or may not be read).
    pub const CLUSTER_PROFILE_NOT_FOUND: &str = "ClusterProfileNotFound";
    /// The ClusterProfile CRD (`clusterprofiles.multicluster.x-k8s.io`) is not installed.
    pub const CLUSTER_PROFILE_CRD_MISSING: &str = "ClusterProfileCRDMissing";
    /// None of the ClusterProfile's access providers is one the controller's provider file names.
    pub const NO_MATCHING_ACCESS_PROVIDER: &str = "NoMatchingAccessProvider";
    /// The matching access provider's `cluster` block is unusable (no server, bad CA, bad extension).
    pub const CLUSTER_PROFILE_INVALID: &str = "ClusterProfileInvalid";
    /// The access provider's exec credential plugin did not start, failed, timed out or printed
    /// no usable ExecCredential.
    pub const EXEC_PLUGIN_FAILED: &str = "ExecPluginFailed";

    // ModelDeployment.
    /// Every replica placed.
    pub const PLACED: &str = "Placed";
    /// Some or all replicas have no cluster with enough free devices.
    pub const INSUFFICIENT_CAPACITY: &str = "InsufficientCapacity";
    /// No cluster passes the deployment's selector and sovereignty rules.
    pub const NO_ELIGIBLE_CLUSTER: &str = "NoEligibleCluster";
    /// Placement uses a later device alternative than the first.
    pub const FALLBACK_SELECTED: &str = "FallbackSelected";
    /// The cheapest placement is above `maxCostPerHour`.
    pub const COST_CEILING_EXCEEDED: &str = "CostCeilingExceeded";
    /// A CapacityClaim was created or updated to obtain what is missing.
    pub const CLAIM_PENDING: &str = "ClaimPending";
    /// All desired replicas are ready.
    pub const ALL_REPLICAS_READY: &str = "AllReplicasReady";
    /// Some desired replicas are not ready.
    pub const REPLICAS_NOT_READY: &str = "ReplicasNotReady";
    /// No replica is ready anywhere.
    pub const NO_REPLICAS_READY: &str = "NoReplicasReady";
    /// A move between clusters is in progress (make-before-break).
    pub const MOVING: &str = "Moving";
    /// The gateway ejected every endpoint of the model.
    pub const ALL_ENDPOINTS_EJECTED: &str = "AllEndpointsEjected";
    /// The gateway routes the model with elevated errors or latency.
    pub const SERVING_DEGRADED: &str = "Degraded";
    /// The gateway has no ready, reachable cluster to route the model to.
    pub const NO_READY_ENDPOINTS: &str = "NoReadyEndpoints";
    /// The gateway routes the model normally.
    pub const ROUTABLE: &str = "Routable";
    /// A member cluster rejected an apply.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// The referenced ModelCache is not Ready in the cluster.
    pub const CACHE_NOT_READY: &str = "CacheNotReady";
    /// A member object the deployment renders exists and is not this installation's object of
    /// this deployment: it is left alone and the message names it.
    pub const NAME_CONFLICT: &str = "NameConflict";

    // ModelCache.
    /// Staging waits to start in a cluster.
    pub const CACHE_PENDING: &str = "Pending";
    /// Weights are being downloaded.
    pub const DOWNLOADING: &str = "Downloading";
    /// The manifest digest is being checked.
    pub const VERIFYING: &str = "Verifying";
    /// The source refused the credentials.
    pub const SOURCE_UNAUTHORIZED: &str = "SourceUnauthorized";
    /// The source has no such model or revision.
    pub const SOURCE_NOT_FOUND: &str = "SourceNotFound";
    /// The staged files do not match the expected digest.
    pub const DIGEST_MISMATCH: &str = "DigestMismatch";
    /// No volume could be provisioned, or the staging program cannot write to it (read-only, full).
    pub const STORAGE_UNAVAILABLE: &str = "StorageUnavailable";
    /// The source did not answer, or answered 5xx/429, after every retry.
    pub const SOURCE_UNAVAILABLE: &str = "SourceUnavailable";
    /// The source URL, or a file name it lists, is not one the staging program accepts.
    pub const INVALID_SOURCE: &str = "InvalidSource";
    /// A staged file's size differs from the size the source listed (a truncated download).
    pub const SIZE_MISMATCH: &str = "SizeMismatch";
    /// The staging job failed for another reason; the message carries its log tail.
    pub const JOB_FAILED: &str = "JobFailed";
    /// Deletion waits because deployments still mount the cache.
    pub const IN_USE: &str = "InUse";
    /// `spec.credentialsRef.namespace` names a namespace other than the cache's own: refused,
    /// nothing read or copied.
    pub const CREDENTIALS_OUTSIDE_NAMESPACE: &str = "CredentialsOutsideNamespace";

    // CapacityClaim.
    /// A provider request is in flight.
    pub const PROVISIONING: &str = "Provisioning";
    /// Everything asked for was obtained.
    pub const FULFILLED: &str = "Fulfilled";
    /// Some pod sets or some of their pods have capacity, not all.
    pub const PARTIALLY_FULFILLED: &str = "PartiallyFulfilled";
    /// Capacity was obtained with a later device class or capacity type than the first.
    pub const CLAIM_FALLBACK_SELECTED: &str = "FallbackSelected";
    /// No provider offering had capacity for any allowed alternative.
    pub const CAPACITY_UNAVAILABLE: &str = "CapacityUnavailable";
    /// CapacityClaim: a provider quota stopped the request. FleetQuota: replicas of the
    /// namespace are unplaced because a limit of this quota binds.
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    /// The named reservation does not match the request (type, zone, size or dates).
    pub const RESERVATION_MISMATCH: &str = "ReservationMismatch";
    /// The claim passed `maxProvisioningLatency` unfulfilled, or its reservation ended.
    pub const EXPIRED: &str = "Expired";
    /// The provider took capacity back (spot interruption, reservation end).
    pub const INTERRUPTED: &str = "Interrupted";
    /// Scale-down waits for the application to drain.
    pub const DRAIN_REQUIRED: &str = "DrainRequired";
    /// Consolidation was wanted but the disruption policy forbids it now.
    pub const CONSOLIDATION_BLOCKED: &str = "ConsolidationBlocked";
    /// Surplus nodes are being given back to the provider.
    pub const SCALING_DOWN: &str = "ScalingDown";
    /// The provider was unreachable or kept throttling; the claim retries with backoff.
    pub const PROVIDER_UNAVAILABLE: &str = "ProviderUnavailable";
    /// The provider refused the controller's credentials or a permission is missing.
    pub const PROVIDER_UNAUTHORIZED: &str = "ProviderUnauthorized";
    /// The provider rejected the request as invalid (unknown subnet, role, instance type, ...).
    pub const PROVIDER_REJECTED: &str = "ProviderRejected";
    /// No region of the provider is allowed by the claim's sovereignty policy.
    pub const NO_ALLOWED_REGION: &str = "NoAllowedRegion";
}

/// Event reasons (`Normal` and `Warning` events on Flotilla objects).
pub mod event {
    /// A deployment's placement changed.
    pub const PLACEMENT_CHANGED: &str = "PlacementChanged";
    /// A member workload was applied.
    pub const APPLIED: &str = "Applied";
    /// A member workload was removed.
    pub const REMOVED: &str = "Removed";
    /// A capacity request was sent to a provider.
    pub const CAPACITY_REQUESTED: &str = "CapacityRequested";
    /// A provider refused a capacity request.
    pub const CAPACITY_REFUSED: &str = "CapacityRefused";
    /// A member object's live spec differed from what Flotilla applied; it was re-applied.
    pub const DRIFT_CORRECTED: &str = "DriftCorrected";
    /// A member's scheduler refused replicas of a deployment past the grace; they are placed
    /// elsewhere.
    pub const REPLICAS_UNSCHEDULABLE: &str = "ReplicasUnschedulable";
    /// A sweep of a member would have deleted more than its bounded share of this
    /// installation's objects there; it deleted nothing and waits for an operator.
    pub const SWEEP_HELD: &str = "SweepHeld";
}
