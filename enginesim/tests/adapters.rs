//! LoRA adapters as vLLM serves them: loaded and unloaded over vLLM's API with its answers,
//! listed in `/v1/models` under their base model, served (with their own answers and extra time
//! to first token) only while loaded, held to `--max-loras`, failing when told to, and named in
//! `vllm:lora_requests_info` while their requests wait and run. Time is tokio's paused clock.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, header};
use common::*;
use flotilla_enginesim::canonical::canonical_text;
use flotilla_enginesim::config::{LoadFailure, LoraArgs};
use flotilla_enginesim::generate::Kind;
use flotilla_enginesim::{SimConfig, SimState, api};
use serde_json::{Value, json};
use tower::ServiceExt;

fn with_loras(lora: LoraArgs) -> Arc<SimState> {
    sim(|c| c.lora = lora)
}

async fn load(s: &Arc<SimState>, name: &str, path: &str) -> Response<Body> {
    post(s, "/v1/load_lora_adapter", &json!({"lora_name": name, "lora_path": path})).await
}

async fn unload(s: &Arc<SimState>, name: &str) -> Response<Body> {
    post(s, "/v1/unload_lora_adapter", &json!({"lora_name": name})).await
}

/// Status, `error.type` and `error.message` of an error answer.
async fn refusal(r: Response<Body>) -> (u16, String, String) {
    let status = r.status().as_u16();
    let v = json_of(r).await;
    (status, v["error"]["type"].as_str().unwrap().into(), v["error"]["message"].as_str().unwrap().into())
}

async fn model_cards(s: &Arc<SimState>) -> Vec<Value> {
    json_of(get(s, "/v1/models").await).await["data"].as_array().unwrap().clone()
}

async fn card(s: &Arc<SimState>, id: &str) -> Option<Value> {
    model_cards(s).await.into_iter().find(|c| c["id"] == id)
}

#[tokio::test(start_paused = true)]
async fn an_adapter_loads_lists_under_its_base_model_and_unloads_as_in_vllm() {
    let s = sim(|_| {});
    let r = load(&s, "sql", "/adapters/sql").await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get(header::CONTENT_TYPE).is_none(), "vLLM's plain message, no content type");
    assert_eq!(text_of(r).await, "Success: LoRA adapter 'sql' added successfully.");
    let sql = card(&s, "sql").await.expect("listed once loaded");
    assert_eq!((sql["root"].as_str(), sql["parent"].as_str()), (Some("/adapters/sql"), Some("m")), "{sql}");
    assert_eq!(card(&s, "m").await.unwrap()["parent"], Value::Null, "a base model has no parent");

    let on_other = json!({"lora_name": "chat", "lora_path": "/a/chat", "base_model_name": "other"});
    assert_eq!(post(&s, "/v1/load_lora_adapter", &on_other).await.status(), 200);
    assert_eq!(card(&s, "chat").await.unwrap()["parent"], "other", "base_model_name picks the base");

    let (status, kind, message) = refusal(load(&s, "sql", "/adapters/sql").await).await;
    assert_eq!((status, kind.as_str()), (400, "InvalidUserInput"));
    assert!(message.contains("'sql' has already been loaded") && message.contains("load_inplace"), "{message}");

    let inplace = json!({"lora_name": "sql", "lora_path": "/adapters/sql-v2", "load_inplace": true});
    assert_eq!(post(&s, "/v1/load_lora_adapter", &inplace).await.status(), 200);
    assert_eq!(card(&s, "sql").await.unwrap()["root"], "/adapters/sql-v2", "reloaded in place");

    let r = unload(&s, "sql").await;
    assert_eq!(r.status(), 200);
    assert_eq!(text_of(r).await, "Success: LoRA adapter 'sql' removed successfully.");
    assert!(card(&s, "sql").await.is_none(), "gone from /v1/models");
    let (status, kind, message) = refusal(unload(&s, "sql").await).await;
    assert_eq!(
        (status, kind.as_str(), message.as_str()),
        (404, "NotFoundError", "The lora adapter 'sql' cannot be found.")
    );

    let c = s.lora_counters("sql");
    assert_eq!((c.loads, c.unloads, c.load_refused, c.load_failures), (2, 1, 1, 0));
    let stats = json_of(get(&s, "/sim/stats").await).await;
    assert_eq!(stats["loras"]["sql"]["loaded"], false);
    assert_eq!(stats["loras"]["chat"]["loaded"], true);
    assert_eq!(stats["loras"]["chat"]["loads"], 1);
}

#[tokio::test(start_paused = true)]
async fn a_loaded_adapter_answers_with_its_own_text_and_an_unloaded_one_is_an_unknown_model() {
    let s = sim(|_| {});
    let body = chat("sql", "list the tables");
    let before = post(&s, "/v1/chat/completions", &body).await;
    let unknown = post(&s, "/v1/chat/completions", &chat("nothing", "list the tables")).await;
    assert_eq!((before.status().as_u16(), unknown.status().as_u16()), (404, 404));
    let (before, unknown) = (json_of(before).await, json_of(unknown).await);
    assert_eq!(before["error"]["type"], unknown["error"]["type"]);
    assert_eq!(before["error"]["message"], "The model `sql` does not exist.");

    assert_eq!(load(&s, "sql", "/adapters/sql").await.status(), 200);
    let adapter = json_of(post(&s, "/v1/chat/completions", &body).await).await;
    let base = json_of(post(&s, "/v1/chat/completions", &chat("m", "list the tables")).await).await;
    let text = adapter["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(adapter["model"], "sql");
    assert_eq!(text, canonical_text(&s.config, Kind::Chat, &body), "keyed on the adapter's name");
    assert_ne!(text, base["choices"][0]["message"]["content"].as_str().unwrap(), "not the base model's answer");

    let sse = read_sse(post(&s, "/v1/chat/completions", &streamed(body.clone())).await).await;
    assert!(sse.done && !sse.cut);
    assert_eq!((sse.text(), sse.chunks[0]["model"].as_str()), (text.to_string(), Some("sql")));
    let completion = json!({"model": "sql", "prompt": "select", "max_tokens": 3});
    let done = json_of(post(&s, "/v1/completions", &completion).await).await;
    assert_eq!(done["choices"][0]["text"].as_str().unwrap(), canonical_text(&s.config, Kind::Completion, &completion));

    assert_eq!(unload(&s, "sql").await.status(), 200);
    assert_eq!(post(&s, "/v1/chat/completions", &body).await.status(), 404, "unloaded: unknown again");
    assert_eq!(s.lora_counters("sql").requests, 3, "the served ones only");
    assert_eq!(s.lora_counters("nothing"), Default::default(), "no counters for a name never loaded");
}

#[tokio::test(start_paused = true)]
async fn a_load_beyond_max_loras_is_refused_until_one_is_unloaded() {
    let s = with_loras(LoraArgs { loras: vec!["a=m".parse().unwrap()], max_loras: 2, ..Default::default() });
    assert!(card(&s, "a").await.is_some(), "--lora adapters are loaded at start");
    assert_eq!(s.lora_counters("a").loads, 1);
    assert_eq!(load(&s, "b", "/p/b").await.status(), 200);
    let (status, kind, message) = refusal(load(&s, "c", "/p/c").await).await;
    assert_eq!((status, kind.as_str()), (400, "BadRequestError"));
    assert!(message.contains("Maximum number of loaded LoRA adapters is 2"), "{message}");
    assert!(card(&s, "c").await.is_none());
    assert_eq!(post(&s, "/v1/chat/completions", &chat("c", "hi")).await.status(), 404);

    assert_eq!(unload(&s, "a").await.status(), 200);
    assert_eq!(load(&s, "c", "/p/c").await.status(), 200, "a slot is free again");
    assert_eq!(s.lora_counters("c").load_refused, 1);
    let ids: Vec<_> = s.loaded_loras().into_iter().map(|l| l.name).collect();
    assert_eq!(ids, ["b", "c"]);
}

#[tokio::test(start_paused = true)]
async fn an_injected_load_failure_answers_as_vllm_and_gives_its_slot_back() {
    let s =
        with_loras(LoraArgs { max_loras: 1, lora_load_fail: vec!["broken".parse().unwrap()], ..Default::default() });
    for _ in 0..2 {
        let (status, kind, message) = refusal(load(&s, "broken", "/p/broken").await).await;
        assert_eq!(
            (status, kind.as_str(), message.as_str()),
            (500, "InternalServerError", "Loading lora /p/broken failed")
        );
    }
    assert!(card(&s, "broken").await.is_none());
    assert_eq!(post(&s, "/v1/chat/completions", &chat("broken", "hi")).await.status(), 404);
    assert_eq!(s.lora_counters("broken").load_failures, 2, "every load of it fails");

    let r = post(&s, "/sim/loras", &json!({"lora_name": "flaky", "fail_load": "not-found", "count": 1})).await;
    assert_eq!(r.status(), 204);
    let (status, kind, message) = refusal(load(&s, "flaky", "/p/flaky").await).await;
    assert_eq!((status, kind.as_str()), (404, "NotFoundError"));
    assert_eq!(message, "Loading lora flaky failed: No adapter found for /p/flaky");
    assert_eq!(load(&s, "flaky", "/p/flaky").await.status(), 200, "once, then it loads: the failed one held no slot");

    s.set_lora_load_failure("broken", None, None);
    assert_eq!(unload(&s, "flaky").await.status(), 200);
    assert_eq!(load(&s, "broken", "/p/broken").await.status(), 200, "cleared");
    let bad = post(&s, "/sim/loras", &json!({"lora_name": "x", "fail_load": "explode"})).await;
    assert_eq!(bad.status(), 400);
    s.set_lora_load_failure("y", Some(LoadFailure::Error), Some(1));
    assert_eq!(unload(&s, "broken").await.status(), 200);
    assert_eq!(load(&s, "y", "/p/y").await.status(), 500);
    assert_eq!(load(&s, "y", "/p/y").await.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_load_takes_its_time_and_the_adapter_serves_only_after_it() {
    let s = with_loras(LoraArgs { lora_load_ms: 2_000, ..Default::default() });
    let loading = tokio::spawn({
        let s = s.clone();
        async move { load(&s, "slow", "/p/slow").await.status() }
    });
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(card(&s, "slow").await.is_none(), "not listed while loading");
    assert_eq!(post(&s, "/v1/chat/completions", &chat("slow", "hi")).await.status(), 404);
    assert_eq!(unload(&s, "slow").await.status(), 404, "nothing to unload yet");
    let (status, kind, _) = refusal(load(&s, "slow", "/p/slow").await).await;
    assert_eq!((status, kind.as_str()), (400, "InvalidUserInput"), "a second load while the first runs");
    assert_eq!(loading.await.unwrap(), 200);
    assert_eq!(post(&s, "/v1/chat/completions", &chat("slow", "hi")).await.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_request_to_an_adapter_takes_longer_to_its_first_token() {
    let s = sim(|c| {
        c.ttft_ms = 20;
        c.lora.lora_ttft_ms = 300;
    });
    assert_eq!(load(&s, "sql", "/p/sql").await.status(), 200);
    let mut first_token = Vec::new();
    for model in ["m", "sql"] {
        let started = tokio::time::Instant::now();
        let mut body = post(&s, "/v1/chat/completions", &streamed(chat(model, "hi"))).await.into_body();
        http_body_util::BodyExt::frame(&mut body).await.unwrap().unwrap();
        first_token.push(started.elapsed());
    }
    assert!(first_token[1] > first_token[0], "the adapter's first token comes later: {first_token:?}");
}

#[tokio::test(start_paused = true)]
async fn the_lora_metric_names_the_adapters_of_running_and_waiting_requests() {
    let s = sim(|c| {
        c.max_num_seqs = 1;
        c.ttft_ms = 1_000;
        c.lora.max_loras = 3;
    });
    for name in ["a", "b"] {
        assert_eq!(load(&s, name, &format!("/p/{name}")).await.status(), 200);
    }
    let idle = text_of(get(&s, "/metrics").await).await;
    let line = |text: &str| text.lines().find(|l| l.starts_with("vllm:lora_requests_info{")).map(str::to_string);
    let sample = line(&idle).expect("the gauge is there with adapters enabled");
    assert!(
        sample
            .starts_with(r#"vllm:lora_requests_info{max_lora="3",running_lora_adapters="",waiting_lora_adapters=""} "#)
    );
    let value: f64 = sample.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value > 1.0e9, "the value is a Unix time, as vLLM sets it: {value}");

    let send = |model: &'static str| {
        let s = s.clone();
        tokio::spawn(async move { post(&s, "/v1/chat/completions", &chat(model, "hi")).await.status() })
    };
    let (first, second, third) = (send("a"), send("b"), send("m"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let busy = line(&text_of(get(&s, "/metrics").await).await).unwrap();
    assert!(busy.contains(r#"running_lora_adapters="a""#) && busy.contains(r#"waiting_lora_adapters="b""#), "{busy}");
    for t in [first, second, third] {
        assert_eq!(t.await.unwrap(), 200);
    }
    let after = line(&text_of(get(&s, "/metrics").await).await).unwrap();
    assert!(after.contains(r#"running_lora_adapters="",waiting_lora_adapters="""#), "{after}");

    let off = sim(|c| c.lora.max_loras = 0);
    assert!(line(&text_of(get(&off, "/metrics").await).await).is_none(), "no gauge without adapters");
    let r = load(&off, "a", "/p/a").await;
    assert_eq!(r.status(), 404);
    assert_eq!(json_of(r).await, json!({"detail": "Not Found"}), "vLLM without --enable-lora has no such route");
}

#[tokio::test(start_paused = true)]
async fn bad_load_and_unload_bodies_get_a_400_naming_the_field() {
    let s = sim(|_| {});
    let cases = [
        (json!({"lora_name": "x"}), "Bad Request", "`lora_path`: Field required"),
        (json!({"lora_name": 3, "lora_path": "/p"}), "Bad Request", "`lora_name`: Input should be a valid string"),
        (json!({"lora_name": "x", "lora_path": "/p", "load_inplace": "yes"}), "Bad Request", "`load_inplace`"),
        (
            json!({"lora_name": "", "lora_path": "/p"}),
            "InvalidUserInput",
            "Both 'lora_name' and 'lora_path' must be provided.",
        ),
        (json!({"lora_name": "m", "lora_path": "/p"}), "InvalidUserInput", "`lora_name`: `m` is a base model"),
        (
            json!({"lora_name": "x", "lora_path": "/p", "base_model_name": "nope"}),
            "InvalidUserInput",
            "`base_model_name`: `nope`",
        ),
        (json!(["x"]), "Bad Request", "JSON object"),
    ];
    for (body, kind, message) in cases {
        let (status, k, m) = refusal(post(&s, "/v1/load_lora_adapter", &body).await).await;
        assert_eq!((status, k.as_str()), (400, kind), "{body}: {m}");
        assert!(m.contains(message), "{body}: {m}");
    }
    let (status, _, m) = refusal(post(&s, "/v1/unload_lora_adapter", &json!({})).await).await;
    assert_eq!((status, m.as_str()), (400, "`lora_name`: Field required"));
    let (status, kind, _) = refusal(unload(&s, "").await).await;
    assert_eq!((status, kind.as_str()), (400, "InvalidUserInput"));

    let text =
        Request::post("/v1/load_lora_adapter").body(Body::from(r#"{"lora_name":"x","lora_path":"/p"}"#)).unwrap();
    let (status, _, m) = refusal(api::router(s.clone()).oneshot(text).await.unwrap()).await;
    assert_eq!((status, m.as_str()), (400, "Unsupported Media Type: Only 'application/json' is allowed"));
    let broken = Request::post("/v1/load_lora_adapter")
        .header("content-type", "application/json")
        .body(Body::from("{"))
        .unwrap();
    assert_eq!(api::router(s.clone()).oneshot(broken).await.unwrap().status(), 400);
    assert!(s.loaded_loras().is_empty(), "nothing was loaded by any of them");
}

#[tokio::test]
async fn a_simulator_with_an_adapter_on_a_model_it_does_not_serve_does_not_start() {
    let config = SimConfig {
        lora: LoraArgs { loras: vec!["sql=llama".parse().unwrap()], ..Default::default() },
        ..Default::default()
    };
    let err = flotilla_enginesim::spawn(config).await.unwrap_err().to_string();
    assert!(err.contains("--lora sql=llama") && err.contains("`llama` is not served"), "{err}");
}
