//! Members reached through SIG Multicluster's Cluster Inventory API. An InferenceCluster's
//! `spec.clusterProfileRef` names a `ClusterProfile` (`multicluster.x-k8s.io/v1alpha1`, read
//! from a watch by name like kubeconfig Secrets, `secrets.rs`); its status lists access
//! providers (`accessProviders`, or the older `credentialProviders`; a name in both: the
//! former wins), each a name and a clientcmd `Cluster` (server, CA, extensions). The
//! controller's provider file (`--cluster-profile-providers`, KEP-5339's format) maps provider
//! names to exec credential plugins. [`resolve`] (pure) picks the first provider of the file
//! that the profile offers, applies the profile-sourced `additional-args` / `additional-envs`
//! extensions as the provider's policies allow, and returns an in-memory kubeconfig: the
//! profile's cluster block (its `client.authentication.k8s.io/exec` extension reaches the
//! plugin as `spec.cluster.config` when `provideClusterInfo` is set) and a user whose only
//! credential is the exec plugin, never interactive. Its fingerprint changes only when what
//! the client is built from changes, so a cluster manager refreshing conditions or properties
//! rebuilds nothing. Nothing here prints a credential: the plugin's stdout is never quoted.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::Path;

use kube::CustomResource;
use kube::config::{
    AuthInfo, Cluster, Context, ExecConfig, ExecInteractiveMode, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use serde::{Deserialize, Serialize};

use super::MemberError;

/// The extension of a clientcmd Cluster that carries the exec plugin's per-cluster config.
pub const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";
/// KEP-5339: arguments a profile adds to the plugin's command line (a list of strings).
pub const ARGS_EXTENSION: &str = "clusterprofiles.multicluster.x-k8s.io/exec/additional-args";
/// KEP-5339: environment variables a profile adds to the plugin's (a map of strings).
pub const ENVS_EXTENSION: &str = "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs";

/// The ClusterProfile spec; nothing of it is read.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterProfile",
    namespaced,
    status = "ClusterProfileStatus",
    schema = "disabled"
)]
pub struct ClusterProfileSpec {}

/// What is read of a ClusterProfile's status (conditions and properties are dropped on read).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileStatus {
    /// How to reach the cluster, per access provider.
    #[serde(default)]
    pub access_providers: Vec<AccessProvider>,
    /// The deprecated name of `accessProviders`, still read.
    #[serde(default)]
    pub credential_providers: Vec<AccessProvider>,
}

/// One access provider of a ClusterProfile.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct AccessProvider {
    /// The provider's name, matched against the provider file.
    pub name: String,
    /// clientcmd's Cluster: server, CA, extensions.
    #[serde(default)]
    pub cluster: Cluster,
}

/// What a stored ClusterProfile keeps: its name, namespace and version, and the status above.
pub fn strip(p: &mut ClusterProfile) {
    p.metadata.managed_fields = None;
    p.metadata.annotations = None;
    p.metadata.labels = None;
    p.metadata.owner_references = None;
}

/// KEP-5339: whether profile-sourced arguments are appended to the plugin's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum ArgsPolicy {
    /// Ignored (the default).
    #[default]
    Ignore,
    /// Appended after the provider's own arguments.
    Append,
}

/// KEP-5339: how profile-sourced environment variables meet the provider's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum EnvsPolicy {
    /// Ignored (the default).
    #[default]
    Ignore,
    /// Added; the provider file's value wins for a name both set.
    AppendIfNotExists,
    /// Added; the profile's value wins for a name both set.
    Replace,
}

/// One `name`/`value` environment variable of an exec plugin.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// clientcmd's ExecConfig as the provider file writes it.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecPlugin {
    /// `client.authentication.k8s.io/v1` or `/v1beta1`: the ExecCredential version spoken.
    pub api_version: String,
    /// The program (a path, or a name looked up in `PATH`).
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables added to the controller's own.
    #[serde(default)]
    pub env: Vec<EnvVar>,
    /// Pass the cluster (server, CA, the exec extension's config) in `KUBERNETES_EXEC_INFO`.
    #[serde(default)]
    pub provide_cluster_info: bool,
    /// Shown when the command cannot be started.
    #[serde(default)]
    pub install_hint: Option<String>,
    /// Accepted for compatibility; the controller always runs plugins non-interactively.
    #[serde(default)]
    pub interactive_mode: Option<String>,
}

/// Never prints the environment: values may be credentials.
impl std::fmt::Debug for ExecPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env: Vec<&str> = self.env.iter().map(|e| e.name.as_str()).collect();
        f.debug_struct("ExecPlugin")
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &env)
            .finish()
    }
}

/// One provider of the provider file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Provider {
    /// Matched against the names of a ClusterProfile's access providers.
    pub name: String,
    /// The credential plugin.
    pub exec_config: ExecPlugin,
    /// Whether a profile's `additional-args` extension is used.
    #[serde(default, rename = "profileSourcedCLIArgsPolicy")]
    pub args_policy: ArgsPolicy,
    /// Whether and how a profile's `additional-envs` extension is used.
    #[serde(default, rename = "profileSourcedEnvVarsPolicy")]
    pub envs_policy: EnvsPolicy,
}

/// The provider file (`--cluster-profile-providers`): `{"providers": [...]}`, JSON or YAML.
/// Earlier providers are preferred when a profile offers several.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderFile {
    /// The providers, in order of preference.
    pub providers: Vec<Provider>,
}

const EXEC_VERSIONS: [&str; 2] = ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"];

impl ProviderFile {
    /// Parses and checks a provider file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        flotilla_apis::yaml_bound::check_stream(text).map_err(|e| format!("not a provider file: it {e}"))?;
        let file: Self = serde_yaml_ng::from_str(text).map_err(|e| format!("not a provider file: {e}"))?;
        let mut seen = std::collections::BTreeSet::new();
        for (i, p) in file.providers.iter().enumerate() {
            let at = format!("providers[{i}]");
            if p.name.trim().is_empty() {
                return Err(format!("{at}.name is empty"));
            }
            if !seen.insert(p.name.as_str()) {
                return Err(format!("{at}.name {:?} is listed twice", p.name));
            }
            if p.exec_config.command.trim().is_empty() {
                return Err(format!("{at}.execConfig.command is empty"));
            }
            if !EXEC_VERSIONS.contains(&p.exec_config.api_version.as_str()) {
                return Err(format!(
                    "{at}.execConfig.apiVersion {:?} is not one of {}",
                    p.exec_config.api_version,
                    EXEC_VERSIONS.join(", ")
                ));
            }
        }
        Ok(file)
    }

    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn names(&self) -> Vec<&str> {
        self.providers.iter().map(|p| p.name.as_str()).collect()
    }
}

/// A ClusterProfile resolved against the provider file.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// `ClusterProfile <namespace>/<name>`, for messages.
    pub id: String,
    /// The access provider used.
    pub provider: String,
    /// Its plugin's command, for messages.
    pub command: String,
    /// A kubeconfig of one context: the profile's cluster, the plugin as the user.
    pub kubeconfig: Kubeconfig,
    /// Changes exactly when the kubeconfig does (within this process).
    pub fingerprint: u64,
}

/// The access provider of `profile` to use under `file`, and the kubeconfig it gives. Pure.
pub fn resolve(profile: &ClusterProfile, file: Option<&ProviderFile>) -> Result<Resolved, MemberError> {
    let id = format!(
        "ClusterProfile {}/{}",
        profile.metadata.namespace.as_deref().unwrap_or_default(),
        profile.metadata.name.as_deref().unwrap_or_default()
    );
    let mut offered: BTreeMap<&str, &AccessProvider> = BTreeMap::new();
    if let Some(status) = &profile.status {
        // The deprecated list first, so that the current one wins a name both carry.
        for p in status.credential_providers.iter().chain(&status.access_providers) {
            offered.insert(p.name.as_str(), p);
        }
    }
    let Some(file) = file else {
        return Err(MemberError::NoMatchingAccessProvider(format!(
            "{id} offers access providers [{}], but the controller has no provider file: start it with \
             --cluster-profile-providers (chart: controller.clusterProfiles.providers)",
            offered.keys().copied().collect::<Vec<_>>().join(", ")
        )));
    };
    let Some((provider, access)) = file.providers.iter().find_map(|p| offered.get(p.name.as_str()).map(|a| (p, *a)))
    else {
        return Err(MemberError::NoMatchingAccessProvider(format!(
            "{id} offers access providers [{}]; the provider file configures [{}]: add a provider of one of the \
             offered names, or have the cluster manager publish one of the configured",
            offered.keys().copied().collect::<Vec<_>>().join(", "),
            file.names().join(", ")
        )));
    };
    let invalid =
        |what: String| MemberError::ClusterProfileInvalid(format!("{id}, access provider {:?}: {what}", provider.name));
    let mut cluster = access.cluster.clone();
    match cluster.server.as_deref().map(str::trim) {
        Some(s) if s.get(..8).is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://")) => {}
        Some("") | None => return Err(invalid("cluster.server is empty".into())),
        Some(s) => {
            return Err(invalid(format!(
                "cluster.server {s:?} is not an https:// URL: the exec plugin's credential is sent only over TLS"
            )));
        }
    }
    if let Some(field) = transport_override(&cluster) {
        return Err(invalid(format!(
            "cluster.{field} is set: a ClusterProfile may not change where or how the controller's credential is              sent; remove it from the access provider (the server's CA goes in certificate-authority-data)"
        )));
    }
    // A file path names a file on the cluster manager's machine, not on the controller's.
    cluster.certificate_authority = None;
    let mut exec = provider.exec_config.clone();
    for ext in cluster.extensions.iter().flatten() {
        match ext.name.as_str() {
            ARGS_EXTENSION if provider.args_policy == ArgsPolicy::Append => {
                let args: Vec<String> = serde_json::from_value(ext.extension.clone())
                    .map_err(|_| invalid(format!("extension {ARGS_EXTENSION} is not a list of strings")))?;
                exec.args.extend(args);
            }
            ENVS_EXTENSION if provider.envs_policy != EnvsPolicy::Ignore => {
                let envs: BTreeMap<String, String> = serde_json::from_value(ext.extension.clone())
                    .map_err(|_| invalid(format!("extension {ENVS_EXTENSION} is not a map of strings")))?;
                if let Some(name) = envs.keys().find(|name| denied_env(name)) {
                    return Err(invalid(format!(
                        "extension {ENVS_EXTENSION} sets {name}: a ClusterProfile may not set loader, search-path, \
                         interpreter-startup, proxy or trust-store variables of the exec plugin (LD_*, DYLD_*, \
                         *PATH, *_PROXY, ...), whatever the provider's profileSourcedEnvVarsPolicy; set it in the \
                         provider file if the plugin needs it"
                    )));
                }
                exec.env = merge_env(&exec.env, &envs, provider.envs_policy);
            }
            _ => {}
        }
    }
    let env: Vec<HashMap<String, String>> = exec
        .env
        .iter()
        .map(|e| HashMap::from([("name".to_string(), e.name.clone()), ("value".to_string(), e.value.clone())]))
        .collect();
    let exec_config = ExecConfig {
        api_version: Some(exec.api_version.clone()),
        command: Some(exec.command.clone()),
        args: Some(exec.args.clone()),
        env: Some(env),
        install_hint: exec.install_hint.clone(),
        interactive_mode: Some(ExecInteractiveMode::Never),
        provide_cluster_info: exec.provide_cluster_info,
        ..ExecConfig::default()
    };
    let mut hasher = std::hash::DefaultHasher::new();
    provider.name.hash(&mut hasher);
    serde_json::to_string(&cluster).unwrap_or_default().hash(&mut hasher);
    serde_json::to_string(&exec).unwrap_or_default().hash(&mut hasher);
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster { name: "member".into(), cluster: Some(cluster), ..NamedCluster::default() }],
        auth_infos: vec![NamedAuthInfo {
            name: provider.name.clone(),
            auth_info: Some(AuthInfo { exec: Some(exec_config), ..AuthInfo::default() }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: "member".into(),
            context: Some(Context {
                cluster: "member".into(),
                user: Some(provider.name.clone()),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some("member".into()),
        ..Kubeconfig::default()
    };
    Ok(Resolved {
        id,
        provider: provider.name.clone(),
        command: exec.command,
        kubeconfig,
        fingerprint: hasher.finish(),
    })
}

/// The first field of a profile's cluster block that would change where or how the
/// credential travels (a proxy, a TLS name other than the server's, no verification), if any.
/// Pure. `insecure-skip-tls-verify: false` changes nothing and passes.
pub fn transport_override(cluster: &Cluster) -> Option<&'static str> {
    let set = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.trim().is_empty());
    if cluster.insecure_skip_tls_verify == Some(true) {
        Some("insecure-skip-tls-verify")
    } else if set(&cluster.proxy_url) {
        Some("proxy-url")
    } else if set(&cluster.tls_server_name) {
        Some("tls-server-name")
    } else {
        None
    }
}

/// Variables a profile may never set in the exec plugin's environment, whatever the
/// provider's policy: they choose the code the plugin runs (the dynamic loader's `LD_*` and
/// `DYLD_*`, search paths `*PATH`, interpreters' startup and option hooks), where it sends
/// its requests (`*_PROXY`) or whom it trusts (CA bundles). Names are compared in upper case.
/// Pure.
pub fn denied_env(name: &str) -> bool {
    const EXACT: [&str; 22] = [
        "IFS",
        "ENV",
        "BASH_ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "HOME",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PERL5LIB",
        "PERL5OPT",
        "RUBYLIB",
        "RUBYOPT",
        "NODE_OPTIONS",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "CURL_CA_BUNDLE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
    ];
    let upper = name.trim().to_ascii_uppercase();
    upper.starts_with("LD_")
        || upper.starts_with("DYLD_")
        || upper.ends_with("PATH")
        || upper.ends_with("_PROXY")
        || EXACT.contains(&upper.as_str())
}

/// KEP-5339's merge of a profile's environment variables into the plugin's: the provider's in
/// their order, then the profile's new names in name order.
fn merge_env(own: &[EnvVar], profile: &BTreeMap<String, String>, policy: EnvsPolicy) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = own
        .iter()
        .map(|e| match (policy, profile.get(&e.name)) {
            (EnvsPolicy::Replace, Some(v)) => EnvVar { name: e.name.clone(), value: v.clone() },
            _ => e.clone(),
        })
        .collect();
    for (name, value) in profile {
        if !own.iter().any(|e| &e.name == name) {
            out.push(EnvVar { name: name.clone(), value: value.clone() });
        }
    }
    out
}

/// What went wrong running the plugin `command` (`None`: unknown here), from kube's error,
/// without its stdout (the credentials): whether it started, its exit status and the last line
/// it wrote to stderr.
pub fn exec_failure(e: &kube::Error, command: Option<&str>) -> String {
    use kube::client::AuthError as A;
    let what = match e {
        kube::Error::Auth(A::AuthExecStart(io)) => format!("could not be started ({io})"),
        kube::Error::Auth(A::AuthExecRun { out, .. }) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
            let last: String = last.chars().take(200).collect();
            if last.is_empty() {
                format!("exited with {} and wrote nothing to stderr", out.status)
            } else {
                format!("exited with {}: {last}", out.status)
            }
        }
        kube::Error::Auth(A::AuthExecParse(_)) => "printed no ExecCredential (its stdout is not one)".into(),
        kube::Error::Auth(A::ExecPluginFailed) => "printed an ExecCredential without status".into(),
        kube::Error::Auth(A::MalformedTokenExpirationDate(_)) => {
            "printed an ExecCredential whose status.expirationTimestamp is not RFC 3339".into()
        }
        kube::Error::Auth(A::ExecMissingClusterInfo) => "asked for cluster info that was not there".into(),
        kube::Error::Auth(_) => "failed".into(),
        other => super::brief(other),
    };
    match command {
        Some(command) => format!("exec plugin {command:?} {what}"),
        None => format!("the exec credential plugin {what}"),
    }
}

#[cfg(test)]
#[path = "profiles_tests.rs"]
mod tests;
