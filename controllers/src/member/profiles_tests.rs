use serde_json::json;

use super::*;

/// A ClusterProfile as a cluster manager publishes it (conditions, properties and all).
fn profile(providers: serde_json::Value) -> ClusterProfile {
    serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
        "metadata": {"name": "eu-fra-1", "namespace": "fleet-system", "resourceVersion": "7",
                     "labels": {"x-k8s.io/cluster-manager": "ocm"}},
        "spec": {"displayName": "eu-fra-1", "clusterManager": {"name": "ocm"}},
        "status": {
            "conditions": [{"type": "ControlPlaneHealthy", "status": "True", "reason": "Healthy", "message": "",
                            "lastTransitionTime": "2026-12-01T10:00:00Z"}],
            "properties": [{"name": "location", "value": "eu-central-1"}],
            "accessProviders": providers
        }
    }))
    .unwrap()
}

fn access(name: &str, server: &str) -> serde_json::Value {
    json!({"name": name, "cluster": {"server": server, "certificate-authority-data": "Q0E=",
        "extensions": [{"name": EXEC_EXTENSION, "extension": {"clusterName": "eu-fra-1"}}]}})
}

fn file(text: serde_json::Value) -> ProviderFile {
    ProviderFile::parse(&text.to_string()).unwrap()
}

fn providers() -> ProviderFile {
    // KEP-5339's format, as JSON.
    file(json!({"providers": [
        {"name": "eks", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/eks-token",
                                       "args": ["--region", "eu-central-1"], "provideClusterInfo": true}},
        {"name": "secretreader", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1",
                                                "command": "/bin/secretreader", "provideClusterInfo": true}}
    ]}))
}

fn exec_of(r: &Resolved) -> &ExecConfig {
    r.kubeconfig.auth_infos[0].auth_info.as_ref().unwrap().exec.as_ref().unwrap()
}

#[test]
fn the_first_provider_of_the_file_that_the_profile_offers_is_used() {
    let p = profile(json!([access("secretreader", "https://a:6443"), access("eks", "https://b:6443")]));
    let r = resolve(&p, Some(&providers())).unwrap();
    assert_eq!(r.provider, "eks", "the file's order decides, not the profile's");
    let cluster = r.kubeconfig.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some("https://b:6443"));
    assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
    let exec = exec_of(&r);
    assert_eq!(exec.command.as_deref(), Some("/bin/eks-token"));
    assert_eq!(exec.args.as_deref(), Some(&["--region".to_string(), "eu-central-1".into()][..]));
    assert!(exec.provide_cluster_info);
    assert_eq!(exec.interactive_mode, Some(ExecInteractiveMode::Never), "a controller never prompts");
    // The exec extension stays on the cluster: kube hands it to the plugin as spec.cluster.config.
    let ext = cluster.extensions.as_ref().unwrap();
    assert_eq!(ext[0].name, EXEC_EXTENSION);
    assert_eq!(r.kubeconfig.current_context.as_deref(), Some("member"));
    // Only eks configured: secretreader's cluster is never used.
    let only = file(json!({"providers": [{"name": "secretreader", "execConfig":
        {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "sr"}}]}));
    let r = resolve(&p, Some(&only)).unwrap();
    let cluster = r.kubeconfig.clusters[0].cluster.as_ref().unwrap();
    assert_eq!((r.provider.as_str(), cluster.server.as_deref()), ("secretreader", Some("https://a:6443")));
}

#[test]
fn credential_providers_are_still_read_and_access_providers_win_a_shared_name() {
    let mut p = profile(json!([access("eks", "https://new:6443")]));
    p.status.as_mut().unwrap().credential_providers = vec![
        serde_json::from_value(access("eks", "https://old:6443")).unwrap(),
        serde_json::from_value(access("secretreader", "https://legacy:6443")).unwrap(),
    ];
    let r = resolve(&p, Some(&providers())).unwrap();
    assert_eq!(r.kubeconfig.clusters[0].cluster.as_ref().unwrap().server.as_deref(), Some("https://new:6443"));
    // Only the deprecated list: used.
    let mut p = profile(json!([]));
    p.status.as_mut().unwrap().credential_providers =
        vec![serde_json::from_value(access("secretreader", "https://legacy:6443")).unwrap()];
    assert_eq!(resolve(&p, Some(&providers())).unwrap().provider, "secretreader");
}

#[test]
fn no_matching_provider_names_both_sides() {
    let p = profile(json!([access("gke", "https://a:6443"), access("oidc", "https://a:6443")]));
    let e = resolve(&p, Some(&providers())).unwrap_err();
    assert_eq!(e.reason(), "NoMatchingAccessProvider");
    let msg = e.to_string();
    assert!(msg.contains("ClusterProfile fleet-system/eu-fra-1") && msg.contains("[gke, oidc]"), "{msg}");
    assert!(msg.contains("[eks, secretreader]"), "{msg}");
    // No provider file at all: the same reason, saying how to give one.
    let e = resolve(&p, None).unwrap_err();
    assert_eq!(e.reason(), "NoMatchingAccessProvider");
    assert!(e.to_string().contains("--cluster-profile-providers"), "{e}");
    // A profile with no status yet offers nothing.
    let mut bare = profile(json!([]));
    bare.status = None;
    assert!(resolve(&bare, Some(&providers())).unwrap_err().to_string().contains("offers access providers []"));
}

#[test]
fn an_unusable_cluster_block_is_invalid_and_a_ca_path_is_not_read() {
    for (server, why) in [(json!(""), "empty"), (json!("ftp://x"), "not an https:// URL")] {
        let p = profile(json!([{"name": "eks", "cluster": {"server": server}}]));
        let e = resolve(&p, Some(&providers())).unwrap_err();
        assert_eq!(e.reason(), "ClusterProfileInvalid");
        assert!(e.to_string().contains(why) && e.to_string().contains("access provider \"eks\""), "{e}");
    }
    let p =
        profile(json!([{"name": "eks", "cluster": {"server": "https://a", "certificate-authority": "/etc/ca.pem"}}]));
    let r = resolve(&p, Some(&providers())).unwrap();
    assert_eq!(r.kubeconfig.clusters[0].cluster.as_ref().unwrap().certificate_authority, None);
}

fn with_extensions(policies: serde_json::Value, exts: serde_json::Value) -> Result<Resolved, MemberError> {
    let mut provider = json!({"name": "eks", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1",
        "command": "eks-token", "args": ["--a"], "env": [{"name": "REGION", "value": "eu"}, {"name": "TOKEN_URL", "value": "u"}]}});
    for (k, v) in policies.as_object().unwrap() {
        provider[k] = v.clone();
    }
    let p = profile(json!([{"name": "eks", "cluster": {"server": "https://a", "extensions": exts}}]));
    resolve(&p, Some(&file(json!({"providers": [provider]}))))
}

fn env_pairs(r: &Resolved) -> Vec<(String, String)> {
    exec_of(r).env.as_ref().unwrap().iter().map(|e| (e["name"].clone(), e["value"].clone())).collect()
}

#[test]
fn profile_sourced_args_and_envs_follow_the_providers_policies() {
    let exts = json!([{"name": ARGS_EXTENSION, "extension": ["--cluster", "fra"]},
                      {"name": ENVS_EXTENSION, "extension": {"REGION": "eu-central-1", "TENANT": "t1"}}]);
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    // Default: both ignored.
    let r = with_extensions(json!({}), exts.clone()).unwrap();
    assert_eq!(exec_of(&r).args.as_deref(), Some(&["--a".to_string()][..]));
    assert_eq!(env_pairs(&r), [pair("REGION", "eu"), pair("TOKEN_URL", "u")]);
    // Append / AppendIfNotExists: added, the provider's REGION kept.
    let r = with_extensions(
        json!({"profileSourcedCLIArgsPolicy": "Append", "profileSourcedEnvVarsPolicy": "AppendIfNotExists"}),
        exts.clone(),
    )
    .unwrap();
    assert_eq!(exec_of(&r).args.as_deref(), Some(&["--a".to_string(), "--cluster".into(), "fra".into()][..]));
    assert_eq!(env_pairs(&r), [pair("REGION", "eu"), pair("TOKEN_URL", "u"), pair("TENANT", "t1")]);
    // Replace: the profile's REGION wins.
    let r = with_extensions(json!({"profileSourcedEnvVarsPolicy": "Replace"}), exts).unwrap();
    assert_eq!(env_pairs(&r), [pair("REGION", "eu-central-1"), pair("TOKEN_URL", "u"), pair("TENANT", "t1")]);
    // A malformed extension is refused only when it would be used.
    let bad = json!([{"name": ARGS_EXTENSION, "extension": {"not": "a list"}}]);
    assert!(with_extensions(json!({}), bad.clone()).is_ok());
    let e = with_extensions(json!({"profileSourcedCLIArgsPolicy": "Append"}), bad).unwrap_err();
    assert_eq!(e.reason(), "ClusterProfileInvalid");
    assert!(e.to_string().contains("not a list of strings"), "{e}");
}

/// The healthy profile beside each hostile one below: https, a CA, no transport override.
fn healthy() -> ClusterProfile {
    profile(json!([access("eks", "https://a:6443")]))
}

fn with_cluster(fields: serde_json::Value) -> ClusterProfile {
    let mut cluster = json!({"server": "https://a:6443", "certificate-authority-data": "Q0E="});
    for (k, v) in fields.as_object().unwrap() {
        cluster[k] = v.clone();
    }
    profile(json!([{"name": "eks", "cluster": cluster}]))
}

#[test]
fn a_plain_http_server_is_refused_and_the_https_one_beside_it_accepted() {
    let r = resolve(&healthy(), Some(&providers())).unwrap();
    assert_eq!(r.kubeconfig.clusters[0].cluster.as_ref().unwrap().server.as_deref(), Some("https://a:6443"));
    for server in ["http://a:6443", "HTTP://a:6443", " http://a"] {
        let e = resolve(&with_cluster(json!({"server": server})), Some(&providers())).unwrap_err();
        assert_eq!(e.reason(), "ClusterProfileInvalid");
        let msg = e.to_string();
        assert!(msg.contains("cluster.server") && msg.contains("not an https:// URL"), "{msg}");
        assert!(msg.contains("ClusterProfile fleet-system/eu-fra-1, access provider \"eks\""), "{msg}");
    }
}

#[test]
fn transport_overrides_from_a_profile_are_refused_each_naming_its_field() {
    let cases = [
        (json!({"insecure-skip-tls-verify": true}), "cluster.insecure-skip-tls-verify is set"),
        (json!({"proxy-url": "http://proxy.attacker:3128"}), "cluster.proxy-url is set"),
        (json!({"tls-server-name": "kubernetes.default"}), "cluster.tls-server-name is set"),
    ];
    for (fields, want) in cases {
        let e = resolve(&with_cluster(fields.clone()), Some(&providers())).unwrap_err();
        assert_eq!(e.reason(), "ClusterProfileInvalid", "{fields}");
        assert!(e.to_string().contains(want), "{fields}: {e}");
    }
    // Verification explicitly on, and empty overrides, change nothing: accepted, the same client.
    let same = with_cluster(json!({"insecure-skip-tls-verify": false, "proxy-url": "", "tls-server-name": " "}));
    let r = resolve(&same, Some(&providers())).unwrap();
    let cluster = r.kubeconfig.clusters[0].cluster.as_ref().unwrap();
    assert_ne!(cluster.insecure_skip_tls_verify, Some(true));
    assert!(resolve(&with_cluster(json!({})), Some(&providers())).is_ok());
}

#[test]
fn loader_path_and_proxy_variables_are_denied_whatever_the_env_policy() {
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    for policy in ["AppendIfNotExists", "Replace"] {
        let policies = json!({"profileSourcedEnvVarsPolicy": policy});
        for name in
            ["LD_PRELOAD", "ld_library_path", "DYLD_INSERT_LIBRARIES", "PATH", "PYTHONPATH", "https_proxy", "BASH_ENV"]
        {
            let exts = json!([{"name": ENVS_EXTENSION, "extension": {"TENANT": "t1", name: "/tmp/x"}}]);
            let e = with_extensions(policies.clone(), exts).unwrap_err();
            assert_eq!(e.reason(), "ClusterProfileInvalid", "{policy} {name}");
            assert!(e.to_string().contains(&format!("sets {name}")), "{policy} {name}: {e}");
        }
        // The healthy variable alone beside them: added.
        let exts = json!([{"name": ENVS_EXTENSION, "extension": {"TENANT": "t1"}}]);
        let r = with_extensions(policies, exts).unwrap();
        assert!(env_pairs(&r).contains(&pair("TENANT", "t1")));
    }
    // Ignore: the extension is not read, so nothing of it reaches the plugin and nothing is refused.
    let exts = json!([{"name": ENVS_EXTENSION, "extension": {"LD_PRELOAD": "/tmp/x.so"}}]);
    let r = with_extensions(json!({}), exts).unwrap();
    assert!(env_pairs(&r).iter().all(|(n, _)| n != "LD_PRELOAD"));
    // The operator's own provider file may set them: its PATH is the operator's choice.
    let f = file(json!({"providers": [{"name": "eks", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1",
        "command": "x", "env": [{"name": "PATH", "value": "/opt/bin"}]}}]}));
    assert_eq!(env_pairs(&resolve(&healthy(), Some(&f)).unwrap()), [pair("PATH", "/opt/bin")]);
    assert!(!denied_env("TENANT") && !denied_env("AWS_REGION") && denied_env(" Ld_Audit"));
}

#[test]
fn the_fingerprint_changes_with_what_the_client_is_built_from_only() {
    let base = profile(json!([access("eks", "https://a:6443")]));
    let fp = |p: &ClusterProfile, f: &ProviderFile| resolve(p, Some(f)).unwrap().fingerprint;
    let f = providers();
    // Conditions, properties and resourceVersion move all the time: no rebuild.
    let mut busy = base.clone();
    busy.metadata.resource_version = Some("99".into());
    assert_eq!(fp(&base, &f), fp(&busy, &f));
    let mut strippped = base.clone();
    strip(&mut strippped);
    assert_eq!(fp(&base, &f), fp(&strippped, &f));
    // The server, the CA or the plugin: rebuilt.
    assert_ne!(fp(&base, &f), fp(&profile(json!([access("eks", "https://b:6443")])), &f));
    let mut ca = base.clone();
    ca.status.as_mut().unwrap().access_providers[0].cluster.certificate_authority_data = Some("Q0I=".into());
    assert_ne!(fp(&base, &f), fp(&ca, &f));
    let mut other = f.clone();
    other.providers[0].exec_config.args.push("--role=x".into());
    assert_ne!(fp(&base, &f), fp(&base, &other));
}

#[test]
fn the_provider_file_is_checked_when_loaded() {
    let one = |exec: serde_json::Value| json!({"providers": [{"name": "eks", "execConfig": exec}]}).to_string();
    let ok = json!({"apiVersion": "client.authentication.k8s.io/v1", "command": "x"});
    assert!(ProviderFile::parse(&one(ok.clone())).is_ok());
    // YAML too, as a chart's ConfigMap would hold it.
    let yaml =
        "providers:\n- name: eks\n  execConfig:\n    apiVersion: client.authentication.k8s.io/v1\n    command: x\n";
    assert_eq!(ProviderFile::parse(yaml).unwrap(), ProviderFile::parse(&one(ok)).unwrap());
    let cases = [
        (one(json!({"apiVersion": "v1", "command": "x"})), "apiVersion \"v1\" is not one of"),
        (one(json!({"apiVersion": "client.authentication.k8s.io/v1", "command": " "})), "command is empty"),
        (one(json!({"apiVersion": "client.authentication.k8s.io/v1", "comand": "x"})), "unknown field `comand`"),
        (
            json!({"providers": [{"name": "a", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x"}},
                                 {"name": "a", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "y"}}]})
            .to_string(),
            "providers[1].name \"a\" is listed twice",
        ),
        (
            json!({"providers": [{"name": "a", "profileSourcedCLIArgsPolicy": "Prepend",
                   "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x"}}]})
            .to_string(),
            "unknown variant `Prepend`",
        ),
    ];
    for (text, want) in cases {
        let e = ProviderFile::parse(&text).unwrap_err();
        assert!(e.contains(want), "{text}: {e}");
    }
    let e = ProviderFile::load(Path::new("/nonexistent/providers.json")).unwrap_err();
    assert!(e.contains("cannot read /nonexistent/providers.json"), "{e}");
}

#[test]
fn debug_output_never_shows_plugin_environment_values() {
    let f = file(json!({"providers": [{"name": "eks", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1",
        "command": "x", "env": [{"name": "API_TOKEN", "value": "s3cr3t-value"}]}}]}));
    let text = format!("{f:?}");
    assert!(text.contains("API_TOKEN") && !text.contains("s3cr3t-value"), "{text}");
}

/// A real plugin process: kube runs it while the client is built; what it printed on stdout
/// (where credentials go) never reaches the message, its exit status and stderr do.
#[tokio::test]
async fn a_failing_plugin_is_reported_without_its_stdout() {
    let dir = std::env::temp_dir().join(format!("flotilla-plugin-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("plugin.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho '{\"status\":{\"token\":\"leaked-token-123\"}}'\necho 'token service down' >&2\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let command = script.to_str().unwrap();
    let f = file(json!({"providers": [{"name": "eks", "execConfig":
        {"apiVersion": "client.authentication.k8s.io/v1", "command": command, "provideClusterInfo": true}}]}));
    let r =
        resolve(&profile(json!([{"name": "eks", "cluster": {"server": "https://127.0.0.1:9"}}])), Some(&f)).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(r.kubeconfig, &kube::config::KubeConfigOptions::default()).await.unwrap();
    crate::install_crypto();
    let e = kube::Client::try_from(config).err().expect("the plugin fails, so does the client");
    let msg = exec_failure(&e, Some(&r.command));
    assert!(msg.contains("exit status: 3") && msg.contains("token service down"), "{msg}");
    assert!(!msg.contains("leaked-token-123"), "{msg}");
    // A command that does not exist.
    let e =
        kube::Error::Auth(kube::client::AuthError::AuthExecStart(std::io::Error::from(std::io::ErrorKind::NotFound)));
    assert!(exec_failure(&e, Some("/no/such/plugin")).contains("\"/no/such/plugin\" could not be started"));
    let _ = std::fs::remove_dir_all(&dir);
}
