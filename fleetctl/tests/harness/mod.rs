//! A small copy of `controllers/tests/harness` for fleetctl's e2e test: real clusters from
//! `tests/e2e/harness/up.sh` (etcd + kube-apiserver + controller-manager + scheduler + kwok per
//! cluster) in `$FLOTILLA_E2E_DIR` (else a fresh temporary directory), fake GPU nodes, the
//! CRDs, server-side apply, and a `flotilla-controller` process. The controller binary is not
//! this package's, so its path comes from `$FLOTILLA_CONTROLLER_BIN` or sits next to
//! `fleetctl` in the target directory (`cargo build -p flotilla-controllers --bin
//! flotilla-controller`; `scripts/test-e2e.sh` builds it with the controllers' tests).
//! Everything is torn down on drop. The controller runs as the chart's ServiceAccount and member
//! kubeconfig Secrets hold the member-rbac identity (`identity`, shared with the controllers'
//! harness).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../../controllers/tests/harness/identity.rs"]
pub mod identity;

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
}

impl Fleet {
    /// Starts the named clusters in `$FLOTILLA_E2E_DIR` (cleared first) or a fresh directory.
    pub fn up(test: &str, names: &[&str]) -> Self {
        let dir = std::env::var_os("FLOTILLA_E2E_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join(format!("flotilla-e2e-{test}-{}", std::process::id())));
        let fleet = Fleet { dir };
        if fleet.dir.exists() {
            let _ = fleet.script("down.sh", &[]);
            let _ = std::fs::remove_dir_all(&fleet.dir);
        }
        std::fs::create_dir_all(&fleet.dir).unwrap();
        fleet.run("up.sh", names);
        fleet
    }

    fn script(&self, script: &str, args: &[&str]) -> std::process::Output {
        Command::new("bash")
            .arg(harness(script))
            .args(args)
            .env("FLOTILLA_E2E_DIR", &self.dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {script}: {e}"))
    }

    fn run(&self, script: &str, args: &[&str]) -> String {
        let out = self.script(script, args);
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
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::env::var_os("FLOTILLA_E2E_KEEP").is_some() {
            eprintln!("FLOTILLA_E2E_KEEP: clusters left running in {}", self.dir.display());
            return;
        }
        let _ = self.script("down.sh", &[]);
    }
}

/// A client from a kubeconfig.
pub async fn client_of(kc: Kubeconfig) -> Client {
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.unwrap();
    flotilla_apis::crypto::install_crypto();
    Client::try_from(config).unwrap()
}

/// The `flotilla-controller` binary.
pub fn controller_bin() -> PathBuf {
    let path = std::env::var_os("FLOTILLA_CONTROLLER_BIN").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_BIN_EXE_fleetctl"))
            .with_file_name(format!("flotilla-controller{}", std::env::consts::EXE_SUFFIX))
    });
    assert!(
        path.exists(),
        "{} does not exist: build it first (cargo build -p flotilla-controllers --bin flotilla-controller) \
         or set FLOTILLA_CONTROLLER_BIN",
        path.display()
    );
    path
}

/// A running `flotilla-controller` with its logs captured in a file; killed on drop.
pub struct ControllerProcess {
    pub child: Child,
    pub log: PathBuf,
}

impl ControllerProcess {
    /// Starts the controller authenticated as the chart's ServiceAccount
    /// (`Fleet::controller_kubeconfig`).
    pub fn start(fleet: &Fleet, control: &str, extra: &[&str]) -> Self {
        let log = fleet.dir.join("controller.log");
        let file = std::fs::File::create(&log).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(controller_bin())
            .arg("--kubeconfig")
            .arg(fleet.controller_kubeconfig(control, &[]))
            .args(["--probe-addr", &format!("127.0.0.1:{port}"), "--identity", "ctl-cli"])
            .args(["--lease-namespace", identity::RELEASE_NAMESPACE])
            .args(["--member-secret-namespace", identity::MEMBER_SECRET_NAMESPACE])
            .args(extra)
            .env("RUST_LOG", "info,flotilla_controllers=debug")
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap();
        Self { child, log }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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
    let kind = value["kind"].as_str().unwrap().to_string();
    let (group, version) = value["apiVersion"].as_str().unwrap().split_once('/').unwrap_or(("", "v1"));
    let name = value["metadata"]["name"].as_str().unwrap().to_string();
    let ar = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(group, version, &kind));
    let api: Api<kube::core::DynamicObject> = match value["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let obj: kube::core::DynamicObject = serde_json::from_value(value).unwrap();
    api.patch(&name, &PatchParams::apply("flotilla-e2e").force().validation_strict(), &Patch::Apply(&obj))
        .await
        .unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
}
