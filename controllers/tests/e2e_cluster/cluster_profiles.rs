//! The ClusterProfile scenario of `e2e_cluster.rs`, on the same control cluster and member m1.
//! The ClusterProfile CRD comes from its published Go module
//! (`tests/e2e/harness/cluster-inventory-crd.sh`). InferenceClusters are registered before
//! the CRD exists (`ClusterProfileCRDMissing`); then a profile whose access provider carries
//! m1's server and CA, and an exec plugin — a script written here that answers only when
//! `KUBERNETES_EXEC_INFO` carries m1's server and the profile's exec extension, and prints an
//! ExecCredential with the token of m1's member-rbac identity — make `pm1` Ready with m1's capacity. A
//! profile offering only an unconfigured provider, a missing profile, a plugin that fails and
//! a hostile profile (m1's server and CA with a `proxy-url`: the controller's credential would
//! go through the profile's proxy) each get their reason; the plugin's stdout never shows, and
//! `pm1` beside the hostile one stays Ready. A deleted profile is reported and
//! tears nothing down, and when it comes back unchanged nothing is built again.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use flotilla_apis::InferenceCluster;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::json;

use crate::harness::{ControllerProcess, Fleet, apply, repo, wait_for};
use crate::wait_reason;

const NS: &str = "fleet-system";
/// The access provider the provider file configures, and the one whose plugin fails.
const PROVIDER: &str = "flotilla-e2e";
const BROKEN: &str = "broken-token-service";
/// What the failing plugin prints on stdout: it must never reach a status or a log.
const BROKEN_STDOUT_TOKEN: &str = "flotilla-e2e-plugin-stdout-3c9d";

pub struct Scenario {
    pub provider_file: PathBuf,
    crd: PathBuf,
    plugin_log: PathBuf,
    server: String,
    ca: String,
    /// The member-rbac token the plugin hands out (must never leak).
    token: String,
}

fn write_script(path: &PathBuf, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

fn profile_cluster(name: &str, profile: &str, pools: &serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": name},
        "spec": {"provider": {"sim": {"cloud": "e2e"}}, "region": "us-east-1", "jurisdiction": "US",
                 "clusterProfileRef": {"namespace": NS, "name": profile},
                 "endpoint": format!("http://127.0.0.1:1/{name}"), "pools": pools}})
}

fn profiles_api(control: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ClusterProfile");
    Api::namespaced_with(control.clone(), NS, &ApiResource::from_gvk(&gvk))
}

impl Scenario {
    /// Fetches the CRD, writes the plugins and the provider file, registers the clusters.
    pub async fn prepare(fleet: &Fleet, control: &Client, pools: serde_json::Value) -> Self {
        let script = repo().join("tests/e2e/harness/cluster-inventory-crd.sh");
        let out = Command::new("bash").arg(&script).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let crd = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());

        // The plugin hands out the member-rbac identity's token, as a real one would.
        let kc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&fleet.member_kubeconfig_text("m1")).unwrap();
        let cluster = &kc["clusters"][0]["cluster"];
        let user = &kc["users"][0]["user"];
        let server = cluster["server"].as_str().unwrap().to_string();
        let ca = cluster["certificate-authority-data"].as_str().unwrap().to_string();
        let token = user["token"].as_str().unwrap().to_string();

        let cred = fleet.dir.join("m1-exec-credential.json");
        let credential = json!({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
            "status": {"token": token}});
        std::fs::write(&cred, credential.to_string()).unwrap();
        let plugin_log = fleet.dir.join("exec-plugin.log");
        let plugin = fleet.dir.join("exec-plugin.sh");
        // provideClusterInfo: kube passes the access provider's server and its
        // client.authentication.k8s.io/exec extension (as spec.cluster.config) to the plugin.
        write_script(
            &plugin,
            &format!(
                "#!/bin/sh\necho run >> '{log}'\ncase \"$KUBERNETES_EXEC_INFO\" in\n  \
                 *'\"server\":\"{server}\"'*'\"config\":{{\"member\":\"m1\"}}'*) exec cat '{cred}' ;;\nesac\n\
                 echo \"KUBERNETES_EXEC_INFO does not carry m1's cluster\" >&2\nexit 1\n",
                log = plugin_log.display(),
                cred = cred.display()
            ),
        );
        let broken = fleet.dir.join("broken-plugin.sh");
        write_script(
            &broken,
            &format!(
                "#!/bin/sh\necho '{{\"status\":{{\"token\":\"{BROKEN_STDOUT_TOKEN}\"}}}}'\necho 'token service down' >&2\nexit 1\n"
            ),
        );
        let provider_file = fleet.dir.join("cluster-profile-providers.json");
        let exec = |command: &PathBuf| json!({"apiVersion": "client.authentication.k8s.io/v1", "command": command, "provideClusterInfo": true});
        let file = json!({"providers": [{"name": PROVIDER, "execConfig": exec(&plugin)},
                                        {"name": BROKEN, "execConfig": exec(&broken)}]});
        std::fs::write(&provider_file, file.to_string()).unwrap();

        apply(control, profile_cluster("pm1", "m1", &pools)).await;
        apply(control, profile_cluster("nomatch", "foreign", &pools)).await;
        apply(control, profile_cluster("noprofile", "absent", &pools)).await;
        apply(control, profile_cluster("badexec", "broken", &pools)).await;
        apply(control, profile_cluster("proxied", "proxied", &pools)).await;
        Self { provider_file, crd, plugin_log, server, ca, token }
    }

    /// Installs the CRD (as published) and the profiles, their status as a cluster manager writes it.
    pub async fn install(&self, control: &Client) {
        let crd: CustomResourceDefinition =
            serde_yaml_ng::from_str(&std::fs::read_to_string(&self.crd).unwrap()).unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(control.clone());
        let name = crd.metadata.name.clone().unwrap();
        assert_eq!(name, "clusterprofiles.multicluster.x-k8s.io");
        crds.patch(&name, &PatchParams::apply("flotilla-e2e").force(), &Patch::Apply(&crd)).await.unwrap();
        wait_for("the ClusterProfile CRD Established", Duration::from_secs(30), || async {
            let c = crds.get(&name).await.ok()?;
            c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        })
        .await;
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
        Api::<Namespace>::all(control.clone()).create(&PostParams::default(), &ns).await.unwrap();
        self.profile(control, "m1", json!([self.access(PROVIDER)])).await;
        self.profile(control, "foreign", json!([self.access("gke-workload-identity")])).await;
        self.profile(control, "broken", json!([self.access(BROKEN)])).await;
        let mut proxied = self.access(PROVIDER);
        proxied["cluster"]["proxy-url"] = json!("http://127.0.0.1:9");
        self.profile(control, "proxied", json!([proxied])).await;
    }

    /// An access provider reaching m1: its server and CA, and the plugin's per-cluster config.
    fn access(&self, provider: &str) -> serde_json::Value {
        json!({"name": provider, "cluster": {"server": self.server, "certificate-authority-data": self.ca,
            "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"member": "m1"}}]}})
    }

    async fn profile(&self, control: &Client, name: &str, providers: serde_json::Value) {
        let api = profiles_api(control);
        let pp = PatchParams::apply("flotilla-e2e").force();
        let head = json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
            "metadata": {"name": name, "namespace": NS}});
        let mut obj = head.clone();
        obj["spec"] = json!({"displayName": name, "clusterManager": {"name": "flotilla-e2e"}});
        let obj: DynamicObject = serde_json::from_value(obj).unwrap();
        api.patch(name, &pp, &Patch::Apply(&obj)).await.unwrap();
        let mut status = head;
        status["status"] = json!({
            "conditions": [{"type": "ControlPlaneHealthy", "status": "True", "reason": "Healthy",
                            "message": "", "lastTransitionTime": "2026-12-01T10:00:00Z"}],
            "properties": [{"name": "location", "value": "us-east-1"}],
            "accessProviders": providers});
        let status: DynamicObject = serde_json::from_value(status).unwrap();
        api.patch_status(name, &pp, &Patch::Apply(&status)).await.unwrap();
    }

    fn plugin_runs(&self) -> usize {
        std::fs::read_to_string(&self.plugin_log).unwrap_or_default().lines().count()
    }

    /// Each ClusterProfile problem under its reason; the plugin ran and got its cluster info.
    pub async fn assert_problems(&self, api: &Api<InferenceCluster>) {
        let within = Duration::from_secs(30);
        wait_reason(api, "nomatch", "Ready", "False", "NoMatchingAccessProvider", within).await;
        wait_reason(api, "noprofile", "Ready", "False", "ClusterProfileNotFound", within).await;
        wait_reason(api, "badexec", "Reachable", "False", "ExecPluginFailed", within).await;
        wait_reason(api, "proxied", "Ready", "False", "ClusterProfileInvalid", within).await;
        let message = |name: &str| {
            let api = api.clone();
            let name = name.to_string();
            async move {
                let ic = api.get(&name).await.unwrap();
                ic.status.unwrap().conditions.get("Ready").unwrap().message.clone()
            }
        };
        let m = message("nomatch").await;
        assert!(m.contains("[gke-workload-identity]") && m.contains(PROVIDER), "{m}");
        let m = message("noprofile").await;
        assert!(m.contains("ClusterProfile fleet-system/absent does not exist"), "{m}");
        let m = message("badexec").await;
        assert!(m.contains("token service down") && !m.contains(BROKEN_STDOUT_TOKEN), "{m}");
        let m = message("proxied").await;
        assert!(m.contains("ClusterProfile fleet-system/proxied") && m.contains("cluster.proxy-url is set"), "{m}");
        let proxied = api.get("proxied").await.unwrap().status.unwrap();
        assert_eq!(proxied.devices_total, None, "nothing was observed through the refused profile");
        let pm1 = api.get("pm1").await.unwrap();
        assert!(pm1.status.unwrap().conditions.is_true("Ready"), "the healthy profile's member beside it stays Ready");
        assert!(self.plugin_runs() > 0, "the exec plugin was run");
        let m1 = api.get("m1").await.unwrap();
        assert!(m1.status.unwrap().conditions.is_true("Ready"), "the Secret member beside them stays Ready");
    }

    /// Deletes the profile of pm1: reported, nothing else changes; restores it unchanged: Ready
    /// again with the clients it had (the plugin is not run again).
    pub async fn remove_and_restore(&self, api: &Api<InferenceCluster>, leader: &ControllerProcess) {
        let control = api.clone().into_client();
        let runs = self.plugin_runs();
        let rebuilt =
            || leader.logs().lines().filter(|l| l.contains("member credentials changed") && l.contains("pm1")).count();
        let rebuilt_before = rebuilt();
        profiles_api(&control).delete("m1", &DeleteParams::default()).await.unwrap();
        wait_reason(api, "pm1", "Ready", "False", "ClusterProfileNotFound", Duration::from_secs(30)).await;
        let m1 = api.get("m1").await.unwrap();
        assert!(m1.status.unwrap().conditions.is_true("Ready"), "m1 (by Secret) is untouched");
        let pm1 = api.get("pm1").await.unwrap().status.unwrap();
        assert_eq!(pm1.devices_total, Some(16), "the last observed capacity stays in status");
        self.profile(&control, "m1", json!([self.access(PROVIDER)])).await;
        wait_reason(api, "pm1", "Ready", "True", "AsExpected", Duration::from_secs(30)).await;
        assert_eq!(self.plugin_runs(), runs, "same profile, same clients: the plugin was not run again");
        assert_eq!(rebuilt(), rebuilt_before, "no member client of pm1 was built again:\n{}", leader.logs());
    }

    /// Credential fragments that must appear in no log, event or status.
    pub fn credentials(&self) -> Vec<String> {
        assert!(self.token.len() > 20, "a token");
        vec![self.token.clone(), BROKEN_STDOUT_TOKEN.to_string()]
    }
}
