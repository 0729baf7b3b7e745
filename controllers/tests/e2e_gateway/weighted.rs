//! The weighted-traffic scenario of `e2e_gateway.rs`, on its control cluster, members, engine
//! simulators and gateway: two ModelDeployments serve the model name `chat-split` with
//! `spec.routing.weight` 90 and 10, the stable one in eu-central-1 (eu1) and the canary in
//! eu-west-3 (eu2), each on a cluster of its own so that the simulators count each
//! deployment's requests. 1,000 requests with distinct prompts split 90/10 within ±5 points
//! at the simulators and none reaches us1; one prompt always lands on the same deployment;
//! each deployment's `Serving` states the share it received and its weight. Both are deleted
//! at the end, so the rest of the test sees the fleet it had.

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_apis::ModelDeployment;
use flotilla_enginesim::SimHandle;
use kube::api::DeleteParams;
use kube::{Api, Client};
use serde_json::json;

use super::harness::{apply, wait_for};
use super::{model_ids, requests_to, reqwest_lite, serving};

/// The model name both deployments serve.
pub(super) const MODEL: &str = "chat-split";

fn deployment(name: &str, region: &str, weight: i32) -> serde_json::Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"model": {"name": MODEL, "source": "hf://org/model"}, "replicas": 1,
                 "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
                 "devices": {"alternatives": [{"class": "h100"}]},
                 "placement": {"sovereignty": {"allowedJurisdictions": ["EU"], "allowedRegions": [region]}},
                 "routing": {"weight": weight}}})
}

/// The share `Serving` reports (`receives about N %`), with the whole condition.
async fn reported_share(api: &Api<ModelDeployment>, name: &str) -> Option<(u32, String)> {
    let (status, _, message) = serving(api, name).await?;
    let tail = message.split("receives about ").nth(1)?;
    let share = tail.split(' ').next()?.parse().ok()?;
    (status == "True").then_some((share, message))
}

pub(super) async fn ninety_ten(
    control: &Client,
    api: &Api<ModelDeployment>,
    gw_url: &str,
    sims: &BTreeMap<&str, SimHandle>,
) {
    apply(control, deployment("split-stable", "eu-central-1", 90)).await;
    apply(control, deployment("split-canary", "eu-west-3", 10)).await;
    for (name, cluster) in [("split-stable", "eu1"), ("split-canary", "eu2")] {
        wait_for(&format!("{name} Serving through {cluster}"), Duration::from_secs(90), || async {
            serving(api, name).await.filter(|(s, r, m)| s == "True" && r == "Routable" && m.contains(cluster))
        })
        .await;
    }
    let before: Vec<usize> = ["eu1", "eu2", "us1"].iter().map(|c| requests_to(sims, c, MODEL)).collect();

    // 1,000 requests with distinct prompts, eight at a time.
    let mut workers = Vec::new();
    for w in 0..8 {
        let url = gw_url.to_string();
        workers.push(tokio::spawn(async move {
            let http = reqwest_lite::Client::new();
            let mut by_cluster: BTreeMap<String, u32> = BTreeMap::new();
            for i in 0..125 {
                let prompt = format!("conversation {w}-{i}: what does the fleet serve today?");
                let r = http.chat_prompt(&url, MODEL, Some("sk-ops"), &prompt).await;
                assert_eq!(r.status, 200, "{:?}", r.body);
                *by_cluster.entry(r.cluster).or_default() += 1;
            }
            by_cluster
        }));
    }
    let mut answered: BTreeMap<String, u32> = BTreeMap::new();
    for w in workers {
        for (c, n) in w.await.unwrap() {
            *answered.entry(c).or_default() += n;
        }
    }
    let counted: Vec<usize> =
        ["eu1", "eu2", "us1"].iter().zip(&before).map(|(c, b)| requests_to(sims, c, MODEL) - b).collect();
    eprintln!("1,000 requests for {MODEL}: answered by {answered:?}; engines counted eu1/eu2/us1 = {counted:?}");
    assert_eq!(counted[0] + counted[1], 1000, "every request reached exactly one engine, once");
    assert_eq!(counted[2], 0, "neither deployment may serve in the US: us1 got nothing");
    let canary = counted[1] as f64 / 1000.0;
    assert!((canary - 0.10).abs() <= 0.05, "the canary (weight 10 of 100) got {:.1} % of the requests", canary * 100.0);
    assert_eq!(answered.get("eu2").copied().unwrap_or(0) as usize, counted[1], "the gateway's header agrees");

    // Sticky per prefix: one prompt lands on one deployment, whichever it is.
    let http = reqwest_lite::Client::new();
    let mut homes = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let r = http.chat_prompt(gw_url, MODEL, Some("sk-ops"), "the same conversation, again and again").await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        homes.insert(r.cluster);
    }
    assert_eq!(homes.len(), 1, "one prompt, one deployment: {homes:?}");

    // Each deployment's Serving reports the share it received (rounded) and its weight.
    for (name, weight, expect) in [("split-stable", 90, 90.0), ("split-canary", 10, 10.0)] {
        let (share, message) =
            wait_for(&format!("{name} Serving reports its share"), Duration::from_secs(30), || async {
                reported_share(api, name).await
            })
            .await;
        eprintln!("{name} Serving: {message}");
        assert!((f64::from(share) - expect).abs() <= 5.0, "{name}: {message}");
        assert!(message.contains(&format!("(weight {weight} of 100)")), "{message}");
        assert!(message.contains(&format!("traffic for `{MODEL}`")), "{message}");
    }

    for name in ["split-stable", "split-canary"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait_for(&format!("{MODEL} gone from /v1/models"), Duration::from_secs(30), || async {
        (!model_ids(&http, gw_url).await.contains(&MODEL.to_string())).then_some(())
    })
    .await;
}
