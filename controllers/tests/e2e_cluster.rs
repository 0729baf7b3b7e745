//! The InferenceCluster controller on real API servers (a control cluster and three members
//! started by the e2e harness, fake GPU nodes from kwok): observed capacity matches the fake
//! nodes exactly; a wrong token is `Unauthorized`, a missing Secret `SecretMissing`; a stopped
//! member turns `Reachable=False` within the bound and returns to Ready; credentials never
//! appear in logs, events or status; only the leader writes and a killed leader hands over; a
//! quiet fleet makes no writes; the leader holds one WATCH per Flotilla kind on the control
//! cluster. Beside them, members reached through SIG Multicluster
//! ClusterProfiles (the CRD from its published Go module, `cluster_profiles.rs`): Ready with
//! capacity observed through an exec plugin's credentials, and each ClusterProfile problem
//! under its reason. Run by `scripts/test-e2e.sh` (ignored in a plain `cargo test`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "e2e_cluster/cluster_profiles.rs"]
mod cluster_profiles;
mod harness;

use std::time::{Duration, Instant};

use flotilla_apis::InferenceCluster;
use futures_util::StreamExt;
use harness::{ControllerProcess, Fleet, apply, install_crds, wait_for};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;

const BOGUS_TOKEN: &str = "flotilla-bogus-token-7f3a9c";
const MEMBERS: [&str; 3] = ["m1", "m2", "m3"];

fn class(name: &str, product: &str, per_node: u32) -> serde_json::Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": name},
        "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": product}}},
                 "devicesPerNode": per_node, "pricePerNodeHour": {"onDemand": "10.00"}}})
}

fn cluster(name: &str, secret: &str, pools: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": name},
        "spec": {"provider": {"sim": {"cloud": "e2e"}}, "region": "us-east-1", "jurisdiction": "US",
                 "credentials": {"secretRef": {"namespace": "flotilla-system", "name": secret}},
                 "endpoint": format!("http://127.0.0.1:1/{name}"), "pools": pools}})
}

fn pool(name: &str, class: &str) -> serde_json::Value {
    json!({"name": name, "class": class, "maxNodes": 10, "capacityTypes": ["on-demand"]})
}

async fn secret(control: &Client, name: &str, kubeconfig: &str) {
    let api: Api<Secret> = Api::namespaced(control.clone(), "flotilla-system");
    let s: Secret =
        serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"kubeconfig": kubeconfig}})).unwrap();
    api.patch(name, &PatchParams::apply("flotilla-e2e").force(), &Patch::Apply(&s)).await.unwrap();
}

/// A kubeconfig for `server` that authenticates with a token the server does not know.
fn bogus_kubeconfig(real: &str) -> String {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(real).unwrap();
    let c = &v["clusters"][0]["cluster"];
    let server = c["server"].as_str().unwrap();
    let ca = c["certificate-authority-data"].as_str().unwrap();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: x\n  user:\n    token: {BOGUS_TOKEN}\ncontexts:\n- name: x\n  context: {{cluster: x, user: x}}\ncurrent-context: x\n"
    )
}

async fn get(api: &Api<InferenceCluster>, name: &str) -> InferenceCluster {
    api.get(name).await.unwrap()
}

fn cond<'a>(
    ic: &'a InferenceCluster,
    t: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    ic.status.as_ref()?.conditions.get(t)
}

async fn wait_reason(
    api: &Api<InferenceCluster>,
    name: &str,
    t: &str,
    status: &str,
    reason: &str,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    wait_for(&format!("{name} {t}={status} ({reason})"), within, || async {
        let ic = api.get(name).await.ok()?;
        let c = cond(&ic, t)?;
        (c.status == status && c.reason == reason).then_some(())
    })
    .await;
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn inference_cluster_controller_on_real_api_servers() {
    let fleet = Fleet::up("cluster", &["control", "m1", "m2", "m3"]);
    fleet.gpu_nodes("m1", "h100", 2, "h100", "us-east-1");
    fleet.gpu_nodes("m2", "a100", 1, "a100", "us-east-1");
    fleet.gpu_nodes("m2", "l40s", 2, "l40s", "us-east-1");
    fleet.gpu_nodes("m3", "l40s", 3, "l40s", "us-east-1");
    let control = fleet.client("control").await;

    // A pod holding 4 GPUs on m1: allocated must show it.
    let m1 = fleet.client("m1").await;
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "busy"}, "spec": {"nodeSelector": {"flotilla.dev/pool": "h100"},
        "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}),
    )
    .unwrap();
    Api::<Pod>::namespaced(m1.clone(), "default").create(&PostParams::default(), &pod).await.unwrap();

    install_crds(&control).await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "flotilla-system"}})).unwrap();
    Api::<Namespace>::all(control.clone()).create(&PostParams::default(), &ns).await.unwrap();
    for m in MEMBERS {
        secret(&control, &format!("{m}-kubeconfig"), &fleet.member_kubeconfig_text(m)).await;
    }
    secret(&control, "wrong-kubeconfig", &bogus_kubeconfig(&fleet.kubeconfig_text("m1"))).await;
    apply(&control, class("h100", "NVIDIA H100 80GB HBM3", 8)).await;
    apply(&control, class("a100", "NVIDIA A100-SXM4-80GB", 8)).await;
    apply(&control, class("l40s", "NVIDIA L40S", 4)).await;
    apply(&control, cluster("m1", "m1-kubeconfig", json!([pool("h100", "h100")]))).await;
    apply(&control, cluster("m2", "m2-kubeconfig", json!([pool("a100", "a100"), pool("l40s", "l40s")]))).await;
    apply(&control, cluster("m3", "m3-kubeconfig", json!([pool("l40s", "l40s")]))).await;
    apply(&control, cluster("wrong", "wrong-kubeconfig", json!([pool("h100", "h100")]))).await;
    apply(&control, cluster("missing", "no-such-secret", json!([pool("h100", "h100")]))).await;
    // Members by ClusterProfile, registered before the ClusterProfile CRD exists.
    let profiles = cluster_profiles::Scenario::prepare(&fleet, &control, json!([pool("h100", "h100")])).await;

    let providers = profiles.provider_file.to_str().unwrap();
    let extra = [
        "--poll-seconds",
        "3",
        "--member-timeout-seconds",
        "8",
        "--lease-duration",
        "6",
        "--cluster-profile-providers",
        providers,
    ];
    let mut a = ControllerProcess::start(&fleet, "control", "replica-a", &extra);
    tokio::time::sleep(Duration::from_secs(2)).await; // let replica-a take the lease first
    let mut b = ControllerProcess::start(&fleet, "control", "replica-b", &extra);

    let api: Api<InferenceCluster> = Api::all(control.clone());
    for m in MEMBERS {
        wait_reason(&api, m, "Ready", "True", "AsExpected", Duration::from_secs(60)).await;
    }
    // The controller got there with the chart's rights and the member-rbac example's, no more.
    harness::identity::assert_least_rights(&fleet, "control", "m1").await;
    // No ClusterProfile CRD yet: its own reason; then the CRD from the Go module, and the profiles.
    let profile_started = Instant::now();
    wait_reason(&api, "pm1", "Ready", "False", "ClusterProfileCRDMissing", Duration::from_secs(30)).await;
    profiles.install(&control).await;
    // Observed capacity matches the fake nodes exactly.
    let pools = |ic: &InferenceCluster| {
        ic.status
            .as_ref()
            .unwrap()
            .pools
            .iter()
            .map(|p| (p.name.clone(), p.nodes, p.devices_total, p.devices_allocated, p.devices_free))
            .collect::<Vec<_>>()
    };
    wait_for("the busy pod counted on m1", Duration::from_secs(30), || async {
        (pools(&get(&api, "m1").await) == vec![("h100".to_string(), 2, 16, 4, 12)]).then_some(())
    })
    .await;
    assert_eq!(pools(&get(&api, "m2").await), vec![("a100".into(), 1, 8, 0, 8), ("l40s".into(), 2, 8, 0, 8)]);
    assert_eq!(pools(&get(&api, "m3").await), vec![("l40s".into(), 3, 12, 0, 12)]);
    let m1s = get(&api, "m1").await.status.unwrap();
    assert_eq!((m1s.devices_total, m1s.devices_free), (Some(16), Some(12)));
    // Node by node: the busy pod's node has 4 free, the other all 8 (written through the CRD's
    // schema by the real API server).
    let bars: Vec<(i32, i32, i32)> = m1s.pools[0].node_devices.iter().map(|b| (b.free, b.managed, b.nodes)).collect();
    assert_eq!(bars, [(4, 0, 1), (8, 0, 1)], "{:?}", m1s.pools[0]);
    assert_eq!(m1s.kubernetes_version.as_deref(), Some("v1.36.3"));

    wait_reason(&api, "wrong", "Reachable", "False", "Unauthorized", Duration::from_secs(30)).await;
    wait_reason(&api, "missing", "Ready", "False", "SecretMissing", Duration::from_secs(30)).await;

    // The ClusterProfile member: Ready, with m1's capacity seen through the plugin's credentials.
    wait_reason(&api, "pm1", "Ready", "True", "AsExpected", Duration::from_secs(45)).await;
    assert_eq!(pools(&get(&api, "pm1").await), pools(&get(&api, "m1").await), "the same member, seen twice");
    profiles.assert_problems(&api).await;
    eprintln!("ClusterProfile scenario converged {:?} after the Secret members", profile_started.elapsed());

    // Only the leader writes.
    let writes = |p: &ControllerProcess| p.metric_sum("flotilla_controller_status_writes_total", "InferenceCluster");
    assert!(writes(&a) > 0.0, "replica-a leads and writes:\n{}", a.logs());
    assert_eq!(writes(&b), 0.0, "the standby never writes");

    // Steady state: nothing changes for 60 s, and no Flotilla object is written.
    let watch_api = api.clone();
    let counter = tokio::spawn(async move {
        let mut n = 0u32;
        let mut events = watcher(watch_api, watcher::Config::default()).boxed();
        let deadline = tokio::time::sleep(Duration::from_secs(60));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return n,
                e = events.next() => if let Some(Ok(watcher::Event::Apply(_))) = e { n += 1 },
            }
        }
    });
    let quiet_writes = counter.await.unwrap();
    assert_eq!(quiet_writes, 0, "a quiet fleet makes no writes to InferenceClusters");
    // The watches open on the control cluster while replica-a leads (the standby watches no
    // Flotilla kind); compared with the count once no controller runs, at the end.
    let watches_while_leading = settled_watches(&control).await;

    // A profile that goes away is reported and tears nothing down; back unchanged, the clients
    // and watches are the ones from before (not built again).
    profiles.remove_and_restore(&api, &a).await;

    // A stopped member is Unreachable within the bound (30 s), and Ready again when back.
    fleet.stop("m3");
    let took = wait_reason(&api, "m3", "Reachable", "False", "Unreachable", Duration::from_secs(30)).await;
    assert!(!get(&api, "m3").await.status.unwrap().conditions.is_true("Ready"));
    eprintln!("m3 Unreachable after {took:?}");
    fleet.start("m3");
    wait_reason(&api, "m3", "Ready", "True", "AsExpected", Duration::from_secs(60)).await;

    // The leader dies: the standby takes over and writes.
    a.kill();
    fleet.stop("m2");
    wait_reason(&api, "m2", "Reachable", "False", "Unreachable", Duration::from_secs(45)).await;
    assert!(writes(&b) > 0.0, "replica-b took over:\n{}", b.logs());
    fleet.start("m2");
    wait_reason(&api, "m2", "Ready", "True", "AsExpected", Duration::from_secs(60)).await;

    // Credentials appear nowhere: logs, events, status.
    let secrets: Vec<String> = MEMBERS
        .iter()
        .flat_map(|m| {
            let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&fleet.member_kubeconfig_text(m)).unwrap();
            let user = &v["users"][0]["user"];
            ["token"].map(|k| user[k].as_str().unwrap_or("").to_string())
        })
        .filter(|s| s.len() > 20)
        .map(|s| s[..40.min(s.len())].to_string())
        .chain([BOGUS_TOKEN.to_string()])
        .chain(profiles.credentials())
        .collect();
    let events = Api::<Event>::all(control.clone()).list(&ListParams::default()).await.unwrap();
    let statuses = serde_json::to_string(
        &api.list(&ListParams::default()).await.unwrap().items.iter().map(|c| &c.status).collect::<Vec<_>>(),
    )
    .unwrap();
    let haystacks = [a.logs(), b.logs(), serde_json::to_string(&events.items).unwrap(), statuses];
    for s in &secrets {
        for (i, h) in haystacks.iter().enumerate() {
            assert!(!h.contains(s.as_str()), "a credential leaked into haystack {i}");
        }
    }
    assert!(a.logs().contains("became leader"), "{}", a.logs());
    b.kill();
    // One watch per Flotilla kind: the controller's reconcilers, its fleet trigger and its
    // inventory share it (crate::watched), as the control API server counts its open WATCHes.
    let without = settled_watches(&control).await;
    for kind in ["inferenceclasses", "inferenceclusters", "modeldeployments", "modelcaches", "capacityclaims"] {
        let (with, without) = (watches_while_leading.get(kind).copied(), without.get(kind).copied().unwrap_or(0.0));
        assert_eq!(
            with.unwrap_or(0.0) - without,
            1.0,
            "the leading controller held one WATCH of {kind}: {with:?} open while it led, {without} with no controller"
        );
    }
}

/// The control API server's open WATCHes by resource, once two readings a second apart agree
/// (a closed watch leaves the gauge a moment after its client went).
async fn settled_watches(control: &Client) -> std::collections::BTreeMap<String, f64> {
    let mut last = harness::apiserver::apiserver_watches(control).await.unwrap();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = harness::apiserver::apiserver_watches(control).await.unwrap();
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("the control API server's open WATCHes never settled: {last:?}");
}
