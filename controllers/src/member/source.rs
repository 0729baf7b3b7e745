//! Where a member's kubeconfig comes from: the Secret `spec.credentials.secretRef` names, or
//! the ClusterProfile `spec.clusterProfileRef` names resolved against the provider file
//! (`profiles.rs`). Both objects come from watches by name (`secrets.rs`). What is fetched
//! carries a version — the Secret's `resourceVersion`, the resolved profile's fingerprint —
//! and the clients are built again only when it changes; the kubeconfig itself is parsed only
//! then ([`clients`]: on the blocking pool, since building runs the exec plugin if there is
//! one, bounded in time, one build per cluster at a time). Every failure is a `MemberError`
//! whose message names the object and what to change.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_apis::InferenceCluster;
use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::profiles::{ClusterProfile, ProviderFile, Resolved, resolve};
use super::secrets::{NamedWatches, SecretError, SecretWatches};
use super::{DEFAULT_SECRET_KEY, MemberError, Timeouts};

/// The control-cluster object a cluster is reached through (`namespace`, `name`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Ref {
    /// A kubeconfig Secret.
    Secret(String, String),
    /// A ClusterProfile.
    Profile(String, String),
}

/// What was read for one cluster, before any client is built.
pub enum Fetched {
    /// A kubeconfig Secret.
    Secret {
        /// `namespace/name` of the Secret and the key read.
        ns: String,
        /// Its name.
        name: String,
        /// The data key.
        key: String,
        /// The Secret as the watch holds it.
        secret: Arc<Secret>,
    },
    /// A ClusterProfile, resolved.
    Profile(Box<Resolved>),
}

impl Fetched {
    /// Identifies what the clients are built from; equal versions, equal clients.
    pub fn version(&self) -> String {
        match self {
            Self::Secret { ns, name, secret, .. } => {
                format!("secret:{ns}/{name}@{}", secret.metadata.resource_version.as_deref().unwrap_or_default())
            }
            Self::Profile(r) => format!("profile:{}@{:016x}", r.provider, r.fingerprint),
        }
    }

    /// The kubeconfig to build the clients from.
    pub fn kubeconfig(&self) -> Result<Kubeconfig, MemberError> {
        match self {
            Self::Profile(r) => Ok(r.kubeconfig.clone()),
            Self::Secret { ns, name, key, secret } => {
                let bytes = secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.clone());
                let Some(bytes) = bytes else {
                    return Err(MemberError::SecretInvalid(format!("Secret {ns}/{name} has no key {key:?}")));
                };
                let invalid =
                    |what: &str| MemberError::SecretInvalid(format!("Secret {ns}/{name} key {key:?}: {what}"));
                let text = String::from_utf8(bytes).map_err(|_| invalid("not UTF-8 text"))?;
                // Bounded before kube's YAML reader sees it: nesting and aliases (the message
                // gives a line and a bound, never the text).
                flotilla_apis::yaml_bound::check_stream(&text).map_err(|e| invalid(&format!("the kubeconfig {e}")))?;
                Kubeconfig::from_yaml(&text).map_err(|_| invalid("not a kubeconfig"))
            }
        }
    }

    /// The error of a kubeconfig kube could not turn into a config or clients (`e`). A
    /// Secret's error is not quoted (a kubeconfig holds credentials); a profile's cluster block
    /// holds none, so its error is.
    pub fn unusable(&self, e: &dyn std::fmt::Display) -> MemberError {
        match self {
            Self::Secret { ns, name, key, .. } => MemberError::SecretInvalid(format!(
                "Secret {ns}/{name} key {key:?}: the kubeconfig has no usable context, cluster or user, or no \
                 client can be built from it"
            )),
            Self::Profile(r) => MemberError::ClusterProfileInvalid(format!(
                "{}, access provider {:?}: its cluster cannot be used ({e}): check cluster.server and \
                 certificate-authority-data",
                r.id, r.provider
            )),
        }
    }

    /// The exec plugin's command, when the clients' credentials come from one.
    pub fn plugin(&self) -> Option<&str> {
        match self {
            Self::Profile(r) => Some(&r.command),
            Self::Secret { .. } => None,
        }
    }
}

/// What the cluster names (`None`: neither a Secret nor a ClusterProfile).
pub fn reference(ic: &InferenceCluster, default_namespace: &str) -> Option<Ref> {
    if let Some(p) = &ic.spec.cluster_profile_ref {
        return Some(Ref::Profile(p.namespace.clone(), p.name.clone()));
    }
    let r = &ic.spec.credentials.as_ref()?.secret_ref;
    Some(Ref::Secret(r.namespace.clone().unwrap_or_else(|| default_namespace.to_string()), r.name.clone()))
}

/// The watches and configuration sources are read with.
pub struct Sources<'a> {
    /// Kubeconfig Secrets.
    pub secrets: &'a SecretWatches,
    /// ClusterProfiles.
    pub profiles: &'a NamedWatches<ClusterProfile>,
    /// The provider file, if the controller has one.
    pub providers: Option<&'a ProviderFile>,
}

/// Reads what `ic` names (from the watches, waiting at most `wait` for a first list).
pub async fn fetch(
    s: &Sources<'_>,
    control: &Client,
    ic: &InferenceCluster,
    r: Option<&Ref>,
    wait: Duration,
) -> Result<Fetched, MemberError> {
    match r {
        None => Err(MemberError::SecretMissing(
            "neither spec.credentials.secretRef nor spec.clusterProfileRef is set: name the Secret holding the \
             member's kubeconfig, or the ClusterProfile describing it"
                .into(),
        )),
        Some(Ref::Secret(ns, name)) => {
            let key = ic
                .spec
                .credentials
                .as_ref()
                .and_then(|c| c.secret_ref.key.clone())
                .unwrap_or_else(|| DEFAULT_SECRET_KEY.to_string());
            let secret = match s.secrets.get(control, ns, name, wait).await {
                Ok(Some(secret)) => secret,
                Ok(None) => {
                    return Err(MemberError::SecretMissing(format!(
                        "Secret {ns}/{name} does not exist: create it with the member's kubeconfig under key {key:?}"
                    )));
                }
                Err(SecretError::NotServed) => {
                    return Err(MemberError::Unreachable(format!("reading Secret {ns}/{name}: HTTP 404")));
                }
                Err(SecretError::Forbidden) => {
                    return Err(MemberError::SecretMissing(format!(
                        "reading Secret {ns}/{name} is forbidden (HTTP 403): kubeconfig Secrets must be in one of the \
                         namespaces of controller.memberSecrets.namespaces (and named in memberSecrets.names when \
                         that is set); move the Secret there or add {ns} to those values"
                    )));
                }
                Err(SecretError::Unavailable(why)) => {
                    return Err(MemberError::Unreachable(format!("reading Secret {ns}/{name}: {why}")));
                }
            };
            Ok(Fetched::Secret { ns: ns.clone(), name: name.clone(), key, secret })
        }
        Some(Ref::Profile(ns, name)) => match s.profiles.get(control, ns, name, wait).await {
            Ok(Some(profile)) => Ok(Fetched::Profile(Box::new(resolve(&profile, s.providers)?))),
            Ok(None) => Err(MemberError::ClusterProfileNotFound(format!(
                "ClusterProfile {ns}/{name} does not exist: have your cluster manager create it, or fix \
                 spec.clusterProfileRef"
            ))),
            Err(SecretError::Forbidden) => Err(MemberError::ClusterProfileNotFound(format!(
                "reading ClusterProfile {ns}/{name} is forbidden (HTTP 403): let the controller get, list and watch \
                 clusterprofiles.multicluster.x-k8s.io (chart: controller.clusterProfiles.enabled)"
            ))),
            Err(SecretError::NotServed) => Err(MemberError::ClusterProfileCrdMissing(format!(
                "spec.clusterProfileRef names ClusterProfile {ns}/{name}, but the control cluster does not serve \
                 clusterprofiles.multicluster.x-k8s.io/v1alpha1: install the Cluster Inventory API CRD \
                 (sigs.k8s.io/cluster-inventory-api, config/crd/bases)"
            ))),
            Err(SecretError::Unavailable(why)) => {
                Err(MemberError::Unreachable(format!("reading ClusterProfile {ns}/{name}: {why}")))
            }
        },
    }
}

/// The two clients of what `fetched` gives: requests bounded by `t`; watches without a read
/// timeout. Built on the blocking pool (building runs the exec plugin, if any) and bounded by
/// `t.observe`; while one build of `cluster` runs, another is not started.
pub(super) async fn clients(
    fetched: &Fetched,
    cluster: &str,
    building: &Arc<Mutex<HashSet<String>>>,
    t: Timeouts,
) -> Result<(Client, Client), MemberError> {
    let kubeconfig = fetched.kubeconfig()?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| fetched.unusable(&e))?;
    config.connect_timeout = Some(t.connect);
    config.write_timeout = Some(t.observe);
    crate::identify(&mut config);
    let mut request = config.clone();
    request.read_timeout = Some(t.observe);
    // A pooled connection's idle time must not count against the next request's timeout.
    request.reset_reader_on_write = true;
    config.read_timeout = None;
    crate::install_crypto();
    let plugin = fetched.plugin().map(str::to_string);
    let failed = |e: &kube::Error| match &plugin {
        Some(command) => MemberError::ExecPluginFailed(super::profiles::exec_failure(e, Some(command))),
        None => fetched.unusable(&"cannot build a client from it"),
    };
    if building.lock().map(|mut b| !b.insert(cluster.to_string())).unwrap_or(true) {
        return Err(match &plugin {
            Some(command) => MemberError::ExecPluginFailed(format!(
                "exec plugin {command:?}, started by an earlier poll, has not finished yet"
            )),
            None => MemberError::Unreachable(
                "building the member's clients, started by an earlier poll, has not finished yet".into(),
            ),
        });
    }
    let done = Building(building.clone(), cluster.to_string());
    let task = tokio::task::spawn_blocking(move || {
        let _done = done;
        // The second is not built (its plugin not run again) when the first failed.
        Client::try_from(request).and_then(|request| Ok((request, Client::try_from(config)?)))
    });
    match tokio::time::timeout(t.observe, task).await {
        Ok(Ok(Ok(clients))) => Ok(clients),
        Ok(Ok(Err(e))) => Err(failed(&e)),
        Ok(Err(_)) => Err(MemberError::Unreachable("building the member's clients panicked".into())),
        Err(_) => Err(match &plugin {
            Some(command) => MemberError::ExecPluginFailed(format!(
                "exec plugin {command:?} did not finish within {} s",
                t.observe.as_secs()
            )),
            None => MemberError::Unreachable(format!(
                "building the member's clients did not finish within {} s",
                t.observe.as_secs()
            )),
        }),
    }
}

/// Marks a cluster's client build as finished when dropped (also when it panicked).
struct Building(Arc<Mutex<HashSet<String>>>, String);

impl Drop for Building {
    fn drop(&mut self) {
        if let Ok(mut b) = self.0.lock() {
            b.remove(&self.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use serde_json::json;

    use super::*;

    /// A plugin that hangs is given up after the member timeout, and not started again while
    /// it still runs; once it has returned, the next poll may start it again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hanging_plugin_times_out_and_runs_once_at_a_time() {
        let dir = std::env::temp_dir().join(format!("flotilla-hang-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (script, runs) = (dir.join("hang.sh"), dir.join("runs"));
        let text = format!("#!/bin/sh\necho run >> '{}'\nsleep 1\nexit 1\n", runs.display());
        std::fs::write(&script, text).unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let file = ProviderFile::parse(
            &json!({"providers": [{"name": "p", "execConfig":
                {"apiVersion": "client.authentication.k8s.io/v1", "command": script}}]})
            .to_string(),
        )
        .unwrap();
        let profile: ClusterProfile = serde_json::from_value(json!({
            "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
            "metadata": {"name": "c", "namespace": "fleet"}, "spec": {},
            "status": {"accessProviders": [{"name": "p", "cluster": {"server": "https://127.0.0.1:9"}}]}}))
        .unwrap();
        let fetched = Fetched::Profile(Box::new(resolve(&profile, Some(&file)).unwrap()));
        let building = Arc::default();
        let t = Timeouts { connect: Duration::from_secs(1), observe: Duration::from_millis(300) };
        let started = Instant::now();
        let e = clients(&fetched, "c", &building, t).await.err().unwrap();
        assert_eq!(e.reason(), "ExecPluginFailed");
        assert!(e.to_string().contains("did not finish within 0 s"), "{e}");
        assert!(started.elapsed() < Duration::from_millis(900), "the poll is not held up by the plugin");
        let e = clients(&fetched, "c", &building, t).await.err().unwrap();
        assert!(e.to_string().contains("has not finished yet"), "{e}");
        // Another member is not held up by this one's plugin.
        let other = clients(&fetched, "other", &building, t).await.err().unwrap();
        assert!(other.to_string().contains("did not finish"), "{other}");
        tokio::time::sleep(Duration::from_millis(2000)).await;
        assert!(building.lock().unwrap().is_empty(), "both builds ended");
        let e = clients(&fetched, "c", &building, t).await.err().unwrap();
        assert!(e.to_string().contains("did not finish"), "started again: {e}");
        // One run per build (a failed first client stops the build): c, other, c again — the
        // second poll of c started none.
        let count = std::fs::read_to_string(&runs).unwrap().lines().count();
        assert_eq!(count, 3);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A kubeconfig Secret is measured before kube's YAML reader sees it: one nested past the
    /// bound is refused with the line and the bound, and without its text; a healthy one
    /// beside it reads.
    #[test]
    fn a_kubeconfig_nested_past_the_bound_is_refused_before_it_is_parsed() {
        let fetched = |text: String| Fetched::Secret {
            ns: "fleet".into(),
            name: "m1".into(),
            key: "kubeconfig".into(),
            secret: Arc::new(Secret {
                data: Some([("kubeconfig".to_string(), k8s_openapi::ByteString(text.into_bytes()))].into()),
                ..Secret::default()
            }),
        };
        let healthy = "apiVersion: v1\nkind: Config\nclusters:\n- name: m1\n  cluster: {server: https://m1:6443}\n";
        assert!(fetched(healthy.to_string()).kubeconfig().is_ok());
        let deep = format!("{healthy}preferences: {}1{}\n", "{a: ".repeat(100_000), "}".repeat(100_000));
        let Err(MemberError::SecretInvalid(message)) = fetched(deep).kubeconfig() else { panic!("not refused") };
        assert!(message.contains("Secret fleet/m1 key \"kubeconfig\": the kubeconfig nests more than 64"), "{message}");
        assert!(message.contains("at line 6, column") && !message.contains("{a:"), "{message}");
    }
}
