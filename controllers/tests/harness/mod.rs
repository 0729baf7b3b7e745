//! The Rust side of the e2e harness: starts real clusters with `tests/e2e/harness/up.sh`
//! (etcd + kube-apiserver + controller-manager + scheduler + kwok per cluster), adds fake GPU
//! nodes, stops and starts members, runs `flotilla-controller` processes with captured logs,
//! and tears everything down on drop. A harness that cannot start fails the test loudly. The
//! controller runs as the chart's ServiceAccount, and member kubeconfig Secrets hold the
//! member-rbac identity's token (`identity`): never the harness's admin kubeconfigs.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod apiserver;
pub mod http;
pub mod identity;
pub mod staging;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn harness(script: &str) -> PathBuf {
    repo().join("tests/e2e/harness").join(script)
}

/// Real clusters for one test.
pub struct Fleet {
    pub dir: PathBuf,
    /// The API servers write audit logs (`audit_log`).
    audit: bool,
}

impl Fleet {
    /// Starts the named clusters in a fresh directory.
    pub fn up(test: &str, names: &[&str]) -> Self {
        Self::start_fleet(test, names, false)
    }

    /// Like `up`, and every API server writes an audit log of its LISTs and writes with each
    /// client's User-Agent (`tests/e2e/harness/audit-policy.yaml`).
    pub fn up_audited(test: &str, names: &[&str]) -> Self {
        Self::start_fleet(test, names, true)
    }

    fn start_fleet(test: &str, names: &[&str], audit: bool) -> Self {
        let dir = std::env::temp_dir().join(format!("flotilla-e2e-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fleet = Fleet { dir, audit };
        fleet.run("up.sh", names);
        fleet
    }

    /// Cluster `name`'s audit log (written only by a fleet from `up_audited`).
    pub fn audit_log(&self, name: &str) -> Option<PathBuf> {
        self.audit.then(|| self.dir.join("kwok/clusters").join(name).join("logs/audit.log"))
    }

    fn run(&self, script: &str, args: &[&str]) -> String {
        let mut command = Command::new("bash");
        if self.audit {
            command.env("FLOTILLA_E2E_AUDIT", "1");
        }
        let out = command
            .arg(harness(script))
            .args(args)
            .env("FLOTILLA_E2E_DIR", &self.dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
        assert!(
            out.status.success(),
            "the e2e harness failed: {script} {args:?}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    pub fn kubeconfig(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.kubeconfig"))
    }

    /// The harness's admin kubeconfig of cluster `name` (for the tests' own setup and checks;
    /// member kubeconfig Secrets take `member_kubeconfig_text`).
    pub fn kubeconfig_text(&self, name: &str) -> String {
        std::fs::read_to_string(self.kubeconfig(name)).unwrap()
    }

    /// An admin client of cluster `name`.
    pub async fn client(&self, name: &str) -> Client {
        client_of(Kubeconfig::read_from(self.kubeconfig(name)).unwrap()).await
    }

    /// Adds `count` fake GPU nodes of a profile (h100, a100, l40s) in pool `pool`.
    pub fn gpu_nodes(&self, cluster: &str, profile: &str, count: u32, pool: &str, region: &str) {
        let kc = self.kubeconfig(cluster);
        self.run(
            "gpu-nodes.sh",
            &[kc.to_str().unwrap(), profile, "--count", &count.to_string(), "--pool", pool, "--region", region],
        );
    }

    pub fn stop(&self, name: &str) {
        self.run("stop.sh", &[name]);
    }

    pub fn start(&self, name: &str) {
        self.run("start.sh", &[name]);
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::env::var_os("FLOTILLA_E2E_KEEP").is_some() {
            eprintln!("FLOTILLA_E2E_KEEP: clusters left running in {}", self.dir.display());
            return;
        }
        let _ = Command::new("bash").arg(harness("down.sh")).env("FLOTILLA_E2E_DIR", &self.dir).output();
    }
}

/// A client from a kubeconfig.
pub async fn client_of(kc: Kubeconfig) -> Client {
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.unwrap();
    flotilla_controllers::install_crypto();
    Client::try_from(config).unwrap()
}

/// A running `flotilla-controller` with its logs captured in a file.
pub struct ControllerProcess {
    pub child: Child,
    pub log: PathBuf,
    pub probe: String,
    pub identity: String,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl ControllerProcess {
    /// Starts a replica authenticated as the chart's controller ServiceAccount
    /// (`Fleet::controller_kubeconfig`). With `--cluster-profile-providers` in `extra`, the chart
    /// is rendered with `controller.clusterProfiles.enabled=true`, as a user who configures
    /// ClusterProfile providers sets it.
    /// `--tenant-namespaces A,B` renders `controller.tenantNamespaces={A,B}` (the chart passes
    /// that flag from that value), which grants the Secret reads ModelCaches need there.
    pub fn start(fleet: &Fleet, control: &str, identity: &str, extra: &[&str]) -> Self {
        let mut values: Vec<String> = Vec::new();
        if extra.contains(&"--cluster-profile-providers") {
            values.push("controller.clusterProfiles.enabled=true".into());
        }
        if let Some(i) = extra.iter().position(|a| *a == "--tenant-namespaces") {
            values.push(format!("controller.tenantNamespaces={{{}}}", extra[i + 1]));
        }
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let kubeconfig = fleet.controller_kubeconfig(control, &values);
        let log = fleet.dir.join(format!("controller-{identity}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let port = free_port();
        let probe = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_flotilla-controller"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--probe-addr", &probe, "--identity", identity])
            .args(["--lease-namespace", identity::RELEASE_NAMESPACE])
            .args(["--member-secret-namespace", identity::MEMBER_SECRET_NAMESPACE])
            .args(extra)
            .env("RUST_LOG", "info,flotilla_controllers=debug")
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap();
        Self { child, log, probe, identity: identity.to_string() }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The Prometheus text of this replica, empty if it does not answer.
    pub fn metrics(&self) -> String {
        let Ok(mut s) = std::net::TcpStream::connect(&self.probe) else { return String::new() };
        use std::io::{Read, Write};
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// Sum of a metric's samples whose line contains `filter`.
    pub fn metric_sum(&self, name: &str, filter: &str) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The process id, for its `/proc` figures (`apiserver::proc_stats`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `f` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        // One attempt that never returns must not outlast the wait either.
        let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_secs(1));
        if let Ok(Some(v)) = tokio::time::timeout(left, f()).await {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Installs every Flotilla CRD with server-side apply and waits until each is Established.
pub async fn install_crds(control: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(control.clone());
    for crd in flotilla_apis::crd::all() {
        let name = crd.metadata.name.clone().unwrap();
        crds.patch(&name, &PatchParams::apply("flotilla-e2e").force(), &Patch::Apply(&crd)).await.unwrap();
    }
    for crd in flotilla_apis::crd::all() {
        let name = crd.metadata.name.clone().unwrap();
        wait_for(&format!("CRD {name} Established"), Duration::from_secs(30), || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let c = crds.get(&name).await.ok()?;
                c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
            }
        })
        .await;
    }
}

/// Server-side applies one object given as JSON, with strict field validation.
pub async fn apply(client: &Client, value: serde_json::Value) {
    try_apply(client, value).await.unwrap();
}

/// Server-side applies one object, returning the API server's refusal if any.
pub async fn try_apply(client: &Client, value: serde_json::Value) -> Result<(), kube::Error> {
    let gvk = (value["apiVersion"].as_str().unwrap().to_string(), value["kind"].as_str().unwrap().to_string());
    let name = value["metadata"]["name"].as_str().unwrap().to_string();
    let namespaced = matches!(value["kind"].as_str(), Some("ModelDeployment" | "ModelCache" | "CapacityClaim"));
    let ns = value["metadata"]["namespace"]
        .as_str()
        .map(str::to_string)
        .or_else(|| namespaced.then(|| "default".to_string()));
    let (group, version) = gvk.0.split_once('/').map_or(("", gvk.0.as_str()), |(g, v)| (g, v));
    let ar = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(group, version, &gvk.1));
    let api: Api<kube::core::DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), &ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let obj: kube::core::DynamicObject = serde_json::from_value(value).map_err(kube::Error::SerdeError)?;
    api.patch(&name, &PatchParams::apply("flotilla-e2e").force().validation_strict(), &Patch::Apply(&obj))
        .await
        .map(|_| ())
}
