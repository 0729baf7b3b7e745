//! The data path into members (docs/operations.md, "What each member needs"): a control cluster
//! and two members (eu1 in the EU, us1 in the US) with the Gateway API's published CRDs, a
//! Gateway, and `flotilla-member-router` as the member-side Gateway implementation, running with
//! the identity of `examples/member-router/`; each InferenceCluster's `spec.endpoint` is its
//! member's router and `spec.gatewayRef` its Gateway. The controller (the chart's identity on the
//! control cluster, the member-RBAC example's on members) renders an HTTPRoute per deployment
//! and member; kwok gives the replicas' pods addresses from the nodes' `spec.podCIDR`, inside
//! 198.18.0.0/15 (RFC 2544's benchmarking range), which the test makes local by adding it to `lo`
//! for its duration (EndpointSlices refuse loopback addresses), and the test starts one engine
//! simulator per pod on its pod IP, serving only that pod's model.
//! Requests through the fleet gateway then reach exactly their own deployment's pods — never
//! another deployment's, never the other member's, never a rogue HTTPRoute's in another namespace
//! that claims a deployment's header — and deleting a deployment prunes its route. Run by
//! `scripts/test-e2e.sh`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "e2e_datapath/adapters.rs"]
mod adapters;
mod harness;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use flotilla_apis::ModelDeployment;
use flotilla_enginesim::{SimConfig, SimHandle};
use flotilla_gateway::{AppState, GatewayConfig, feed};
use harness::{ControllerProcess, Fleet, apply, free_port, install_crds, repo, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

/// (member, region, jurisdiction, the tens digit of its nodes' pod CIDRs' third octet).
const MEMBERS: [(&str, &str, &str, u8); 2] = [("eu1", "eu-central-1", "EU", 1), ("us1", "us-east-1", "US", 2)];
/// The pods' addresses: made local (on `lo`) while the test runs.
const POD_RANGE: &str = "198.18.0.1/15";

/// Adds `POD_RANGE` to `lo` (a local route for the whole /15, so an engine can bind any pod IP in
/// it) unless it is there, and removes it again when dropped. Needs CAP_NET_ADMIN (root).
struct LocalPodRange(bool);

impl LocalPodRange {
    fn add() -> Self {
        let shown = Command::new("ip").args(["-4", "addr", "show", "dev", "lo"]).output().unwrap();
        if String::from_utf8_lossy(&shown.stdout).contains(POD_RANGE) {
            return LocalPodRange(false);
        }
        let added = Command::new("ip").args(["addr", "add", POD_RANGE, "dev", "lo"]).output().unwrap();
        assert!(
            added.status.success(),
            "ip addr add {POD_RANGE} dev lo (needs root): {}",
            String::from_utf8_lossy(&added.stderr)
        );
        LocalPodRange(true)
    }
}

impl Drop for LocalPodRange {
    fn drop(&mut self) {
        if self.0 {
            let _ = Command::new("ip").args(["addr", "del", POD_RANGE, "dev", "lo"]).output();
        }
    }
}
const ROUTER_NAMESPACE: &str = "flotilla-router";
const ROUTER_SA: &str = "flotilla-member-router";
const HEADER: &str = "x-flotilla-deployment";

fn httproutes(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"));
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// `flotilla-member-router`, built beside this test binary (target/<profile>/).
fn router_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir.join("flotilla-member-router");
    assert!(bin.exists(), "{} is missing: cargo build --workspace", bin.display());
    bin
}

struct Router {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The member's Gateway API CRDs, the example's router identity and Gateway, and the router.
async fn member_routing(fleet: &Fleet, member: &str) -> Router {
    let crds = Command::new("bash").arg(repo().join("tests/e2e/harness/gateway-api-crds.sh")).output().unwrap();
    assert!(crds.status.success(), "{}", String::from_utf8_lossy(&crds.stderr));
    let crds = PathBuf::from(String::from_utf8_lossy(&crds.stdout).trim().to_string());
    fleet.apply_file(member, &crds);
    let admin = fleet.client(member).await;
    wait_for(&format!("HTTPRoutes served by {member}"), Duration::from_secs(30), || async {
        httproutes(&admin, "default").list(&ListParams::default()).await.ok().map(|_| ())
    })
    .await;
    let manifest = repo().join("examples/member-router/member-router.yaml");
    let kubeconfig = fleet.identity_kubeconfig(member, &manifest, ROUTER_NAMESPACE, ROUTER_SA);
    let port = free_port();
    let log = fleet.dir.join(format!("router-{member}.log"));
    let file = std::fs::File::create(&log).unwrap();
    let child = Command::new(router_binary())
        .args(["--gateway", &format!("{ROUTER_NAMESPACE}/flotilla"), "--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info,flotilla_gateway=debug")
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap();
    Router { child, url: format!("http://127.0.0.1:{port}"), log }
}

/// Gives the member's GPU nodes pod CIDRs in the local range (198.18.<tens><node>.0/24): kwok
/// assigns pod IPs from them, so an engine started on a pod's IP is what its EndpointSlice
/// points at.
async fn local_pod_cidrs(fleet: &Fleet, member: &str, tens: u8) {
    let nodes: Api<Node> = Api::all(fleet.client(member).await);
    for (i, n) in nodes.list(&ListParams::default()).await.unwrap().items.iter().enumerate() {
        let cidr = format!("198.18.{}.0/24", u32::from(tens) * 10 + i as u32 + 1);
        let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
        nodes.patch(n.metadata.name.as_deref().unwrap(), &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }
}

fn model(name: &str, replicas: i32, placement: Value) -> Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"model": {"name": name, "source": "hf://org/model"}, "replicas": replicas,
                 "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
                 "devices": {"alternatives": [{"class": "h100"}]}, "placement": placement}})
}

/// One engine per Running pod of the deployment in the member, on the pod's IP, serving only
/// the deployment's model; `engines` keeps them by pod name.
async fn engines_for_pods(
    fleet: &Fleet,
    member: &str,
    deployment: &str,
    want: usize,
    engines: &mut BTreeMap<String, (String, String, SimHandle)>,
) {
    let pods: Api<Pod> = Api::namespaced(fleet.client(member).await, "ml");
    let selector = format!("flotilla.dev/deployment=ml.{deployment}");
    let running =
        wait_for(&format!("{want} pods of {deployment} with IPs in {member}"), Duration::from_secs(120), || {
            let pods = pods.clone();
            let selector = selector.clone();
            async move {
                let list = pods.list(&ListParams::default().labels(&selector)).await.ok()?;
                let ips: Vec<(String, String)> = list
                    .items
                    .iter()
                    .filter_map(|p| Some((p.metadata.name.clone()?, p.status.as_ref()?.pod_ip.clone()?)))
                    .collect();
                (ips.len() == want).then_some(ips)
            }
        })
        .await;
    for (pod, ip) in running {
        assert!(ip.starts_with("198.18."), "pod {pod} got {ip}, not an address of its node's podCIDR");
        if engines.contains_key(&pod) {
            continue;
        }
        let config = SimConfig {
            listen: format!("{ip}:8000"),
            name: pod.clone(),
            models: vec![deployment.to_string()],
            ttft_ms: 2,
            itl_ms: 1,
            ..SimConfig::default()
        };
        let sim = flotilla_enginesim::spawn(config).await.unwrap();
        engines.insert(pod, (member.to_string(), deployment.to_string(), sim));
    }
}

async fn chat(http: &harness::http::Client, url: &str, model: &str) -> (u16, String) {
    let answer = http.chat(url, model, None).await;
    (answer.status, answer.body.to_string())
}

async fn fleet_gateway(fleet: &Fleet) -> (String, Arc<AppState>, feed::ControlTasks) {
    let mut cfg = GatewayConfig::with_table("unused");
    cfg.config = None;
    cfg.control_cluster = true;
    cfg.kubeconfig = Some(fleet.kubeconfig("control"));
    cfg.allow_anonymous = true;
    cfg.identity = Some("gw-1".into());
    cfg.connect_timeout_ms = 500;
    cfg.request_timeout_ms = 5000;
    let state = AppState::load(cfg).unwrap();
    let client = feed::client(&state).await.unwrap();
    let control = feed::start_control(state.clone(), client).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let st = state.clone();
    tokio::spawn(async move {
        flotilla_gateway::serve::run(listener, st, std::future::pending()).await.unwrap();
    });
    (url, state, control)
}

/// The rogue: a tenant with its own rights on eu1 makes, in its own namespace and before any
/// deployment exists (so it would be the oldest route), an HTTPRoute on the same Gateway that
/// claims `ml/chat-eu`, to a Service whose endpoint is an engine it runs.
async fn rogue_route(fleet: &Fleet) -> SimHandle {
    let admin = fleet.client("eu1").await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "rogue"}})).unwrap();
    Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &ns).await.unwrap();
    let engine = flotilla_enginesim::spawn(SimConfig {
        listen: "198.18.99.1:8000".into(),
        name: "rogue".into(),
        models: vec!["chat-eu".into()],
        ..SimConfig::default()
    })
    .await
    .unwrap();
    apply(
        &admin,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "steal", "namespace": "rogue"},
        "spec": {"ports": [{"name": "http", "port": 8000, "targetPort": 8000}]}}),
    )
    .await;
    apply(
        &admin,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "steal-1", "namespace": "rogue", "labels": {"kubernetes.io/service-name": "steal"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["198.18.99.1"], "conditions": {"ready": true}}]}),
    )
    .await;
    apply(
        &admin,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "steal", "namespace": "rogue", "annotations": {"flotilla.dev/model": "chat-eu"}},
        "spec": {"parentRefs": [{"namespace": ROUTER_NAMESPACE, "name": "flotilla"}],
                 "rules": [{"matches": [{"headers": [{"type": "Exact", "name": HEADER, "value": "ml/chat-eu"}]}],
                            "backendRefs": [{"name": "steal", "port": 8000}]}]}}),
    )
    .await;
    engine
}

/// Both members: GPU nodes with local pod CIDRs, the Gateway API and a member router each.
async fn members_with_routers(fleet: &Fleet) -> BTreeMap<&'static str, Router> {
    let mut routers = BTreeMap::new();
    for (member, region, _, octet) in MEMBERS {
        fleet.gpu_nodes(member, "h100", 2, "h100", region);
        local_pod_cidrs(fleet, member, octet).await;
        routers.insert(member, member_routing(fleet, member).await);
    }
    routers
}

/// The control cluster: Flotilla's CRDs, namespaces `flotilla-system` and `ml`, the h100 class
/// and one InferenceCluster per member whose endpoint is its router.
async fn control_with_members(fleet: &Fleet, routers: &BTreeMap<&'static str, Router>) -> Client {
    let control = fleet.client("control").await;
    install_crds(&control).await;
    for ns in ["flotilla-system", "ml"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(control.clone()).create(&PostParams::default(), &n).await.unwrap();
    }
    apply(&control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": "h100"},
        "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
                 "capacity": {"memory": "80Gi"}}, "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "98.32"}}}))
    .await;
    let secrets: Api<Secret> = Api::namespaced(control.clone(), "flotilla-system");
    for (member, region, jurisdiction, _) in MEMBERS {
        let s: Secret = serde_json::from_value(json!({"metadata": {"name": format!("{member}-kubeconfig")},
            "stringData": {"kubeconfig": fleet.member_kubeconfig_text(member)}}))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
        apply(&control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": member},
            "spec": {"provider": {"sim": {"cloud": "e2e"}}, "region": region, "jurisdiction": jurisdiction,
                     "credentials": {"secretRef": {"namespace": "flotilla-system", "name": format!("{member}-kubeconfig")}},
                     "endpoint": routers[member].url,
                     "gatewayRef": {"namespace": ROUTER_NAMESPACE, "name": "flotilla"},
                     "pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]}}))
        .await;
    }
    control
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn requests_reach_only_their_own_deployments_pods_through_each_members_gateway() {
    let _range = LocalPodRange::add();
    let fleet = Fleet::up("datapath", &["control", "eu1", "us1"]);
    let routers = members_with_routers(&fleet).await;
    let rogue = rogue_route(&fleet).await;
    let control = control_with_members(&fleet, &routers).await;
    let _ctl =
        ControllerProcess::start(&fleet, "control", "ctl-1", &["--poll-seconds", "3", "--member-timeout-seconds", "8"]);
    let (gw, _state, control_tasks) = fleet_gateway(&fleet).await;
    let http = harness::http::Client::new();

    apply(&control, model("chat-eu", 2, json!({"sovereignty": {"allowedJurisdictions": ["EU"]}}))).await;
    apply(&control, model("chat-us", 1, json!({"sovereignty": {"allowedJurisdictions": ["US"]}}))).await;
    apply(&control, model("chat-any", 2, json!({"spread": {"by": "cluster", "maxSkew": 1}}))).await;
    let mut engines = BTreeMap::new();
    for (member, deployment, n) in
        [("eu1", "chat-eu", 2), ("us1", "chat-us", 1), ("eu1", "chat-any", 1), ("us1", "chat-any", 1)]
    {
        engines_for_pods(&fleet, member, deployment, n, &mut engines).await;
    }
    // The route the controller rendered: in the deployment's namespace, carrying this
    // installation's labels, matching the deployment's own header.
    for (member, deployment) in [("eu1", "chat-eu"), ("us1", "chat-us"), ("eu1", "chat-any"), ("us1", "chat-any")] {
        let routes = httproutes(&fleet.client(member).await, "ml");
        let route = wait_for(&format!("{deployment}'s HTTPRoute in {member}"), Duration::from_secs(60), || {
            let routes = routes.clone();
            async move { routes.get(deployment).await.ok() }
        })
        .await;
        let labels = route.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("flotilla.dev/deployment").map(String::as_str), Some(&*format!("ml.{deployment}")));
        assert_eq!(labels.get("flotilla.dev/cluster").map(String::as_str), Some(member));
        let value = &route.data["spec"]["rules"][0]["matches"][0]["headers"][0]["value"];
        assert_eq!(value, &json!(format!("ml/{deployment}")));
    }
    // Never rendered where the deployment runs nothing.
    assert!(httproutes(&fleet.client("us1").await, "ml").get("chat-eu").await.is_err(), "chat-eu has no route in us1");
    assert!(httproutes(&fleet.client("eu1").await, "ml").get("chat-us").await.is_err(), "chat-us has no route in eu1");

    for m in ["chat-eu", "chat-us", "chat-any"] {
        wait_for(&format!("{m} answered through the fleet gateway"), Duration::from_secs(120), || async {
            (chat(&http, &gw, m).await.0 == 200).then_some(())
        })
        .await;
    }
    let before: BTreeMap<String, usize> =
        engines.iter().map(|(p, (_, _, s))| (p.clone(), s.state.request_count())).collect();
    let rogue_before = rogue.state.request_count();
    for _ in 0..10 {
        for m in ["chat-eu", "chat-us", "chat-any"] {
            let (status, body) = chat(&http, &gw, m).await;
            assert_eq!(status, 200, "{m}: {body}");
        }
    }
    let mut served: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (pod, (member, deployment, sim)) in &engines {
        let requests = sim.state.requests();
        // Every request an engine saw was for its own deployment, named by the fleet gateway.
        for r in &requests {
            assert_eq!(r.model, *deployment, "pod {pod} ({deployment}) got a request for {}", r.model);
            let header: Vec<&str> = r.headers.iter().filter(|(k, _)| k == HEADER).map(|(_, v)| v.as_str()).collect();
            assert_eq!(header, [format!("ml/{deployment}").as_str()], "pod {pod}");
        }
        *served.entry((member.clone(), deployment.clone())).or_default() += sim.state.request_count() - before[pod];
    }
    eprintln!("requests per (member, deployment): {served:?}");
    assert_eq!(served[&("eu1".into(), "chat-eu".into())], 10, "chat-eu only in eu1");
    assert_eq!(served[&("us1".into(), "chat-us".into())], 10, "chat-us only in us1");
    assert_eq!(
        served[&("eu1".into(), "chat-any".into())] + served[&("us1".into(), "chat-any".into())],
        10,
        "chat-any in its two members"
    );
    assert_eq!(rogue.state.request_count(), rogue_before, "the rogue route in another namespace got nothing");
    assert_eq!(rogue_before, 0);

    // What the router tells the fleet gateway's probe: the models behind its routes.
    let (status, list) = http.get_with(&format!("{}/v1/models", routers["eu1"].url), &[]).await;
    assert_eq!(status, 200, "{list}");
    let ids: Vec<String> = serde_json::from_str::<Value>(&list).unwrap()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.contains(&"chat-eu".to_string()) && ids.contains(&"chat-any".to_string()), "{ids:?}");
    assert!(!ids.contains(&"chat-us".to_string()), "{ids:?}");

    // Deleting a deployment prunes its routes from both members; the others keep serving.
    let mds: Api<ModelDeployment> = Api::namespaced(control.clone(), "ml");
    mds.delete("chat-any", &DeleteParams::default()).await.unwrap();
    for (member, _, _, _) in MEMBERS {
        let routes = httproutes(&fleet.client(member).await, "ml");
        wait_for(&format!("chat-any's HTTPRoute pruned from {member}"), Duration::from_secs(60), || {
            let routes = routes.clone();
            async move { routes.get("chat-any").await.is_err().then_some(()) }
        })
        .await;
    }
    wait_for("us1's router drops the deleted deployment's route", Duration::from_secs(30), || async {
        let (status, _) = http.get_with(&format!("{}/v1/models", routers["us1"].url), &[(HEADER, "ml/chat-any")]).await;
        (status == 404).then_some(())
    })
    .await;
    let (status, body) = chat(&http, &gw, "chat-eu").await;
    assert_eq!(status, 200, "{body}");
    for (member, router) in &routers {
        let log = std::fs::read_to_string(&router.log).unwrap_or_default();
        assert!(!log.contains("panicked"), "router {member} panicked:\n{log}");
    }
    // The fleet gateway's watches stop before the clusters go.
    control_tasks.stop().await;
}
