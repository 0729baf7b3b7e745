//! Member-cluster access: the kubeconfig Secret named by an `InferenceCluster` becomes a kube
//! `Client` (cached per Secret `resourceVersion`), and one observation lists what inventory
//! needs. Every failure is classified (`SecretMissing`, `SecretInvalid`, `Unauthorized`,
//! `Unreachable`) with a message that never carries the credentials themselves.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use flotilla_apis::InferenceCluster;
use flotilla_apis::constants::reason;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::inventory::MemberObservation;

/// Namespace of the kubeconfig Secret when the spec names none.
pub const DEFAULT_SECRET_NAMESPACE: &str = "flotilla-system";
/// Key of the kubeconfig in the Secret when the spec names none.
pub const DEFAULT_SECRET_KEY: &str = "kubeconfig";

/// Why a member could not be observed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    /// The Secret does not exist (or the spec names none).
    #[error("{0}")]
    SecretMissing(String),
    /// The Secret holds no usable kubeconfig.
    #[error("{0}")]
    SecretInvalid(String),
    /// The member refused the credentials.
    #[error("{0}")]
    Unauthorized(String),
    /// The member did not answer.
    #[error("{0}")]
    Unreachable(String),
}

impl MemberError {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SecretMissing(_) => reason::SECRET_MISSING,
            Self::SecretInvalid(_) => reason::SECRET_INVALID,
            Self::Unauthorized(_) => reason::UNAUTHORIZED,
            Self::Unreachable(_) => reason::UNREACHABLE,
        }
    }
}

/// How long one member call may take before the member counts as unreachable.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// TCP connect.
    pub connect: Duration,
    /// A whole observation (all list calls).
    pub observe: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { connect: Duration::from_secs(3), observe: Duration::from_secs(8) }
    }
}

/// Member clients, cached by cluster and Secret version.
#[derive(Default)]
pub struct MemberClients {
    cache: Mutex<HashMap<String, (String, Client)>>,
}

impl MemberClients {
    /// Forgets a cluster's client (deleted cluster, or a failure that may be the client's).
    pub fn forget(&self, cluster: &str) {
        if let Ok(mut c) = self.cache.lock() {
            c.remove(cluster);
        }
    }

    /// The client for a member, built from its kubeconfig Secret.
    pub async fn client(&self, control: &Client, ic: &InferenceCluster, t: Timeouts) -> Result<Client, MemberError> {
        let name = ic.metadata.name.clone().unwrap_or_default();
        let Some(creds) = &ic.spec.credentials else {
            return Err(MemberError::SecretMissing(
                "spec.credentials.secretRef is not set: name the Secret holding the member's kubeconfig".into(),
            ));
        };
        let r = &creds.secret_ref;
        let ns = r.namespace.as_deref().unwrap_or(DEFAULT_SECRET_NAMESPACE);
        let key = r.key.as_deref().unwrap_or(DEFAULT_SECRET_KEY);
        let secrets: Api<Secret> = Api::namespaced(control.clone(), ns);
        let secret = match secrets.get_opt(&r.name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(MemberError::SecretMissing(format!(
                    "Secret {ns}/{} does not exist: create it with the member's kubeconfig under key {key:?}",
                    r.name
                )));
            }
            Err(e) => return Err(MemberError::Unreachable(format!("reading Secret {ns}/{}: {}", r.name, brief(&e)))),
        };
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        if let Ok(cache) = self.cache.lock()
            && let Some((v, client)) = cache.get(&name)
            && *v == version
        {
            return Ok(client.clone());
        }
        let bytes = secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.clone());
        let Some(bytes) = bytes else {
            return Err(MemberError::SecretInvalid(format!("Secret {ns}/{} has no key {key:?}", r.name)));
        };
        let invalid = |what: &str| MemberError::SecretInvalid(format!("Secret {ns}/{} key {key:?}: {what}", r.name));
        let text = String::from_utf8(bytes).map_err(|_| invalid("not UTF-8 text"))?;
        let kubeconfig = Kubeconfig::from_yaml(&text).map_err(|_| invalid("not a kubeconfig"))?;
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|_| invalid("the kubeconfig has no usable context, cluster or user"))?;
        config.connect_timeout = Some(t.connect);
        config.read_timeout = Some(t.observe);
        config.write_timeout = Some(t.observe);
        let client = Client::try_from(config).map_err(|_| invalid("cannot build a client from it"))?;
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(name, (version, client.clone()));
        }
        Ok(client)
    }
}

/// An error's gist: API status code and reason, or the transport failure, never a body that
/// could echo credentials.
pub fn brief(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("HTTP {} {}", s.code, s.reason),
        kube::Error::HyperError(_) | kube::Error::Service(_) => "connection failed".into(),
        other => {
            let text = other.to_string();
            text.chars().take(160).collect()
        }
    }
}

fn classify(e: &kube::Error) -> MemberError {
    match e {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => MemberError::Unauthorized(format!(
            "the member API server refused the credentials (HTTP {}): renew the kubeconfig in the Secret",
            s.code
        )),
        _ => MemberError::Unreachable(format!("the member API server did not answer: {}", brief(e))),
    }
}

/// Lists what inventory needs, within the observation timeout. ResourceSlices and claims are
/// optional: a member without DRA yields none.
pub async fn observe(client: &Client, t: Timeouts) -> Result<(MemberObservation, String), MemberError> {
    let work = async {
        let version = client.apiserver_version().await.map_err(|e| classify(&e))?;
        let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await.map_err(|e| classify(&e))?;
        let pods = Api::<Pod>::all(client.clone())
            .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
            .await
            .map_err(|e| classify(&e))?;
        let slices = optional(Api::<ResourceSlice>::all(client.clone()).list(&ListParams::default()).await)?;
        let claims = optional(Api::<ResourceClaim>::all(client.clone()).list(&ListParams::default()).await)?;
        Ok((MemberObservation { nodes: nodes.items, pods: pods.items, slices, claims }, version.git_version))
    };
    match tokio::time::timeout(t.observe, work).await {
        Ok(r) => r,
        Err(_) => Err(MemberError::Unreachable(format!(
            "the member API server did not answer within {} s",
            t.observe.as_secs()
        ))),
    }
}

fn optional<T: Clone + k8s_openapi::serde::de::DeserializeOwned>(
    r: Result<kube::core::ObjectList<T>, kube::Error>,
) -> Result<Vec<T>, MemberError> {
    match r {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(classify(&e)),
    }
}
