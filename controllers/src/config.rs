//! The controller's tunables (the binary's flags, `controllers/src/bin/flotilla-controller.rs`),
//! and the checks and defaults of the ones with rules.

use std::sync::Arc;
use std::time::Duration;

use crate::{member, render, sweep, tenancy};

/// Tunables.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// How often each member is observed.
    pub poll: Duration,
    /// How often the heartbeat is refreshed when nothing else changes; zero (the default):
    /// only with a change, so a quiet fleet writes nothing (`--heartbeat-seconds`).
    pub heartbeat_every: Duration,
    /// A replica whose pod the member's scheduler refuses for longer than this is placed
    /// elsewhere (`--unschedulable-seconds`).
    pub unschedulable_after: Duration,
    /// A pool that refused a deployment's pods takes no new replica of it for this long after
    /// (`status.refusedPools`, `--unschedulable-backoff-seconds`); zero: no back-off.
    pub unschedulable_backoff: Duration,
    /// At most this many ModelDeployment reconciles run at once (`--deployment-concurrency`):
    /// a burst of a thousand applies queues instead of holding a thousand reconciles' memory
    /// and member requests in flight on the runtime's workers.
    pub deployment_concurrency: u16,
    /// Member call timeouts.
    pub timeouts: member::Timeouts,
    /// Field manager of status writes (identifies the replica too).
    pub field_manager: String,
    /// Image of the ModelCache staging Job (`flotilla-stage`, see docs/staging.md).
    pub stage_image: String,
    /// Whether staging Jobs may reach the instance metadata service (the node's IAM role)
    /// through the AWS SDK (`--stage-allow-instance-metadata`); off by default.
    pub stage_instance_metadata: bool,
    /// Where CapacityClaims get capacity; without one, claims are left alone.
    pub capacity: Option<Capacity>,
    /// The namespaces tenant objects may use.
    pub tenancy: tenancy::Tenancy,
    /// How often every member is swept for objects no ModelDeployment or ModelCache owns.
    pub sweep_every: Duration,
    /// A sweep pass that would delete more than this percentage of a member's objects of this
    /// installation (and more than [`sweep::ALWAYS`]) deletes nothing and waits for an
    /// operator (`--sweep-max-share`).
    pub sweep_max_share: u32,
    /// Objects younger than this are never swept (`--sweep-grace-seconds`).
    pub sweep_grace: Duration,
    /// One incremental re-plan in this many is solved again whole and compared, off the
    /// reconciles' path; 0: never (`--replan-check-every`, `deployment::crosscheck`).
    pub replan_check_every: u64,
    /// Where a re-plan check writes the reproducer of a divergence (`--replan-check-dir`).
    pub replan_check_dir: std::path::PathBuf,
    /// This installation's identity, the value of `flotilla.dev/install` on everything it writes
    /// to members (`--install-id`; by default the control cluster's `kube-system` UID).
    pub install_id: String,
    /// Namespace of member kubeconfig Secrets whose `secretRef` names none.
    pub secret_namespace: String,
    /// The provider file ClusterProfiles are resolved against (`--cluster-profile-providers`).
    pub cluster_profile_providers: Option<Arc<member::profiles::ProviderFile>>,
}

/// The capacity provider claims are solved against.
#[derive(Clone)]
pub struct Capacity {
    /// The provider.
    pub provider: Arc<dyn flotilla_providers::CapacityProvider>,
    /// Whether its acquisitions' nodes are created in members (simulated clouds).
    pub materialize: bool,
}

impl std::fmt::Debug for Capacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capacity")
            .field("provider", &self.provider.name())
            .field("materialize", &self.materialize)
            .finish()
    }
}

/// The install id of a configuration built with `Default` (tests); the controller binary always
/// sets its own.
pub const DEFAULT_INSTALL_ID: &str = "local";

/// Checks an install id: a label value (at most 63 letters, digits, `-`, `_`, `.`, beginning
/// and ending with a letter or digit).
pub fn check_install_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= render::MAX_LABEL
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{id:?} is not a label value: use 1 to 63 letters, digits, '-', '_' or '.', beginning and ending with a \
             letter or digit"
        ))
    }
}

/// The staging image used when none is configured.
pub const DEFAULT_STAGE_IMAGE: &str = concat!("ghcr.io/flotilla-dev/flotilla-stage:", env!("CARGO_PKG_VERSION"));

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(10),
            heartbeat_every: Duration::ZERO,
            unschedulable_after: Duration::from_secs(120),
            unschedulable_backoff: Duration::from_secs(600),
            deployment_concurrency: 32,
            timeouts: member::Timeouts::default(),
            field_manager: "flotilla-controller".into(),
            capacity: None,
            stage_image: DEFAULT_STAGE_IMAGE.into(),
            stage_instance_metadata: false,
            tenancy: tenancy::Tenancy::new([member::DEFAULT_SECRET_NAMESPACE.to_string()], []),
            sweep_every: Duration::from_secs(300),
            sweep_max_share: 50,
            sweep_grace: sweep::GRACE,
            replan_check_every: 16,
            replan_check_dir: std::env::temp_dir(),
            install_id: DEFAULT_INSTALL_ID.into(),
            secret_namespace: member::DEFAULT_SECRET_NAMESPACE.into(),
            cluster_profile_providers: None,
        }
    }
}
