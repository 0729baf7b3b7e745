//! Autoscaling and scale to zero on the gateway test's fleet (its control cluster, its members
//! eu2 and us1, its engine simulators and its gateway, whose elected replica decides every
//! second). Queued requests reported by an engine raise a deployment's replicas across two
//! clusters (seen in `status.autoscaling` and in the members' Deployments), removing them brings
//! the count back down after the scale-down window; a `minReplicas: 0` deployment drops to zero
//! when idle and stays in `/v1/models`; a request for it is held, activates a replica and is
//! answered (the held-requests metric and the cold start say so); a gateway whose activation
//! wait is short answers 503 with `Retry-After`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flotilla_apis::ModelDeployment;
use flotilla_enginesim::SimHandle;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::json;

use super::harness::{Fleet, apply, wait_for};
use super::{Gw, call, model_ids, reqwest_lite};

fn autoscaled(name: &str, replicas: i32, autoscaling: serde_json::Value) -> serde_json::Value {
    let mut v = super::model(name, replicas, json!({"spread": {"by": "cluster", "maxSkew": 1}}));
    v["spec"]["autoscaling"] = autoscaling;
    v
}

/// Replicas of `name` in each live member's Deployments (absent: 0).
async fn member_replicas(fleet: &Fleet, name: &str) -> BTreeMap<&'static str, i32> {
    let mut out = BTreeMap::new();
    for member in ["eu2", "us1"] {
        let api: Api<Deployment> = Api::namespaced(fleet.client(member).await, "ml");
        let lp = ListParams::default().labels(&format!("app.kubernetes.io/name={name}"));
        let n = api
            .list(&lp)
            .await
            .map_or(0, |l| l.items.iter().map(|d| d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)).sum::<i32>());
        out.insert(member, n);
    }
    out
}

async fn autoscaling(
    api: &Api<ModelDeployment>,
    name: &str,
) -> Option<(i32, flotilla_apis::autoscaling::AutoscalingStatus)> {
    let md = api.get(name).await.ok()?;
    Some((md.spec.replicas, md.status?.autoscaling?))
}

async fn events(control: &Client, name: &str, reason: &str) -> usize {
    let api: Api<Event> = Api::namespaced(control.clone(), "ml");
    let list = api.list(&ListParams::default()).await.unwrap();
    list.items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .count()
}

/// The status says no replica of `name` serves anywhere (so the gateway has no route to it).
async fn no_ready_route(api: &Api<ModelDeployment>, name: &str) {
    wait_for(&format!("{name} has no Ready route"), Duration::from_secs(60), || async {
        let md = api.get(name).await.ok()?;
        md.status?.placements.iter().all(|p| p.ready == 0 && p.serving == 0).then_some(())
    })
    .await;
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

pub(crate) async fn scenario(fleet: &Fleet, control: &Client, sims: &BTreeMap<&str, SimHandle>, gw: &Gw) {
    let api: Api<ModelDeployment> = Api::namespaced(control.clone(), "ml");
    let http = reqwest_lite::Client::new();
    let (eu2, us1) = (&sims["eu2"].state, &sims["us1"].state);

    // Load raises the count across two clusters.
    let window = 4;
    apply(
        control,
        autoscaled(
            "chat-auto",
            1,
            json!({"minReplicas": 1, "maxReplicas": 4, "target": {"queuedPerReplica": 2},
                   "behavior": {"scaleDown": {"stabilizationWindowSeconds": window}}}),
        ),
    )
    .await;
    wait_for("chat-auto routable", Duration::from_secs(90), || async {
        (call(&http, &gw.url, "chat-auto", Some("sk-ops")).await.status == 200).then_some(())
    })
    .await;
    // Reported idle first: the count stays at the minimum.
    eu2.set_reported_load("chat-auto", 0, 0);
    us1.set_reported_load("chat-auto", 0, 0);
    let (_, s) = wait_for("chat-auto status.autoscaling", Duration::from_secs(30), || async {
        autoscaling(&api, "chat-auto").await.filter(|(_, s)| s.demand.is_some())
    })
    .await;
    assert_eq!(s.recommendation, 1, "{s:?}");
    eu2.set_reported_load("chat-auto", 5, 0);
    us1.set_reported_load("chat-auto", 3, 2);
    let (_, s) = wait_for("chat-auto scaled to 4 on demand", Duration::from_secs(30), || async {
        autoscaling(&api, "chat-auto").await.filter(|(n, s)| *n == 4 && s.recommendation == 4)
    })
    .await;
    eprintln!("scaled up: {s:?}");
    let demand = s.demand.clone().unwrap();
    assert_eq!((demand.queued, demand.running, demand.clusters), (8, 2, 2), "summed over both clusters");
    let members = wait_for("4 replicas Ready over eu2 and us1", Duration::from_secs(90), || async {
        let md = api.get("chat-auto").await.ok()?;
        let st = md.status?;
        let m = member_replicas(fleet, "chat-auto").await;
        (st.ready_replicas == 4 && m.values().all(|n| *n > 0) && m.values().sum::<i32>() == 4).then_some(m)
    })
    .await;
    eprintln!("members after the scale-up: {members:?}");
    assert!(events(control, "chat-auto", "ScaledUp").await >= 1, "an event records the change");

    // No load: back to the minimum, not before the scale-down window.
    let removed = Instant::now();
    eu2.set_reported_load("chat-auto", 0, 0);
    us1.set_reported_load("chat-auto", 0, 0);
    wait_for("chat-auto back to 1", Duration::from_secs(30), || async {
        autoscaling(&api, "chat-auto").await.filter(|(n, _)| *n == 1)
    })
    .await;
    let took = removed.elapsed();
    eprintln!("scaled down {:.1}s after the load went", took.as_secs_f64());
    assert!(took >= Duration::from_secs(window - 1), "held for the window ({took:?})");
    wait_for("members back to 1 replica", Duration::from_secs(60), || async {
        (member_replicas(fleet, "chat-auto").await.values().sum::<i32>() == 1).then_some(())
    })
    .await;

    // Scale to zero when idle; the model stays listed.
    eu2.set_reported_load("chat-zero", 0, 0);
    us1.set_reported_load("chat-zero", 0, 0);
    apply(
        control,
        autoscaled(
            "chat-zero",
            1,
            json!({"minReplicas": 0, "maxReplicas": 2, "target": {"runningPerReplica": 4}, "idleWindowSeconds": 3}),
        ),
    )
    .await;
    let (_, s) = wait_for("chat-zero scaled to zero", Duration::from_secs(120), || async {
        autoscaling(&api, "chat-zero").await.filter(|(n, s)| *n == 0 && s.recommendation == 0)
    })
    .await;
    assert_eq!(s.reason, Some(flotilla_apis::autoscaling::AutoscalingReason::ScaledToZero), "{s:?}");
    wait_for("no chat-zero replica in the members", Duration::from_secs(60), || async {
        (member_replicas(fleet, "chat-zero").await.values().sum::<i32>() == 0).then_some(())
    })
    .await;
    no_ready_route(&api, "chat-zero").await;
    wait_for("the gateway's table without a chat-zero route", Duration::from_secs(10), || async {
        gw.state.table.load().resolve("chat-zero").is_some_and(|m| m.routes.is_empty()).then_some(())
    })
    .await;
    assert!(model_ids(&http, &gw.url).await.contains(&"chat-zero".to_string()), "listed at zero");
    assert!(events(control, "chat-zero", "ScaledToZero").await >= 1);

    // A request at zero, sent with the official `openai` client (no client retries), is held,
    // activates a replica and is answered.
    let before = gw.state.metrics.render();
    let started = Instant::now();
    let content = openai_chat(&gw.url, "chat-zero", "sk-ops").await;
    let waited = started.elapsed();
    eprintln!("the openai client got an answer after {:.1}s: {content:?}", waited.as_secs_f64());
    assert!(!content.trim().is_empty(), "an answer with content");
    let after = gw.state.metrics.render();
    let served = "flotilla_gateway_held_requests_ended_total{result=\"served\"}";
    assert_eq!(metric(&after, served) - metric(&before, served), 1.0, "it was held, then served");
    let cold = "flotilla_gateway_cold_start_seconds_sum";
    let cold_s = metric(&after, cold) - metric(&before, cold);
    eprintln!("held {:.1}s; cold start {cold_s:.1}s", waited.as_secs_f64());
    assert!(cold_s > 0.0 && waited.as_secs_f64() >= cold_s * 0.9, "the wait covered the cold start");
    let (_, s) = wait_for("the cold start in status", Duration::from_secs(30), || async {
        autoscaling(&api, "chat-zero").await.filter(|(_, s)| s.last_cold_start_millis.is_some())
    })
    .await;
    assert!(s.last_cold_start_millis.unwrap() > 0, "{s:?}");
    assert!(events(control, "chat-zero", "Activated").await >= 1);

    // Back to zero, then a gateway with a short activation wait: 503 with Retry-After.
    wait_for("chat-zero idle to zero again", Duration::from_secs(60), || async {
        autoscaling(&api, "chat-zero").await.filter(|(n, _)| *n == 0)
    })
    .await;
    no_ready_route(&api, "chat-zero").await;
    let mut hasty = super::gateway_with(fleet, |c| {
        c.identity = Some("gw-hasty".into());
        c.feedback_interval_ms = 0;
        c.activation_timeout_ms = 300;
        c.activation_retry_after_s = 5;
    })
    .await;
    wait_for("the second gateway in sync, its keys loaded", Duration::from_secs(30), || async {
        let (status, text) = http.get(&format!("{}/v1/models", hasty.url), Some("sk-ops")).await;
        let at_zero = hasty.state.table.load().resolve("chat-zero").is_some_and(|m| m.routes.is_empty());
        (status == 200 && text.contains("chat-zero") && at_zero).then_some(())
    })
    .await;
    let r = call(&http, &hasty.url, "chat-zero", Some("sk-ops")).await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.retry_after.as_deref(), Some("5"));
    assert_eq!(r.body["error"]["code"], "model_activating", "{:?}", r.body);
    hasty.server.abort();
    if let Some(c) = hasty.control.take() {
        c.stop().await;
    }
}

/// One chat completion through the official `openai` Python client (the venv
/// `scripts/gateway-pytest.sh` makes, which `scripts/test.sh` runs before the e2e tier), with
/// the client's retries off so a refusal is not hidden by a second try. Returns the content.
async fn openai_chat(url: &str, model: &str, key: &str) -> String {
    let cache = std::env::var_os("FLOTILLA_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/flotilla"));
    let python = cache.join("venv/bin/python");
    assert!(
        python.exists(),
        "no {}: run scripts/gateway-pytest.sh once (it creates the venv with the openai client)",
        python.display()
    );
    let script = "import sys\nfrom openai import OpenAI\n\
        c = OpenAI(base_url=sys.argv[1] + '/v1', api_key=sys.argv[2], max_retries=0, timeout=120)\n\
        r = c.chat.completions.create(model=sys.argv[3], messages=[{'role': 'user', 'content': 'hello'}])\n\
        print(r.choices[0].message.content)\n";
    let args = [url.to_string(), key.to_string(), model.to_string()];
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python).arg("-c").arg(script).args(args).output().unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "the openai client failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
