//! A benchmark, not a test: LoRA adapter placement by the member router, with and without
//! adapter affinity. `FLOTILLA_BENCH_ADAPTERS` adapters (default 50) over
//! `FLOTILLA_BENCH_REPLICAS` engine simulators (default 3), each holding at most
//! `FLOTILLA_BENCH_MAX_LORAS` (default 8) at once, a load taking `--lora-load-ms`
//! (`FLOTILLA_BENCH_LOAD_MS`, default 200) and every adapter request `--lora-ttft-ms 5` on top of
//! a 20 ms time to first token. Streamed chat requests arrive open loop (Poisson,
//! `FLOTILLA_BENCH_RATE` per second, default 60, for `FLOTILLA_BENCH_SECONDS`, default 30; a
//! fixed seed), each naming an adapter drawn by Zipf (s = 1) or uniformly. Per run: the share of
//! requests that found their adapter loaded where they were sent (the router's affinity hits /
//! (hits + misses)), the loads and evictions the engines counted, errors, and the time to the
//! first streamed token as the client saw it (p50, p99; a load on the way is part of it).
//! Everything runs in one process on loopback; the times are the simulators' (sleeps), so the
//! build profile hardly matters. Prints Markdown for docs/benchmarks.md; asserts nothing on time.
//! Run by `scripts/bench-member-router-adapters.sh`; ignored in the test command.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{chat_stream, client, sim};
use flotilla_enginesim::SimHandle;
use flotilla_gateway::member_router::metrics::AdapterEvent;
use flotilla_gateway::member_router::{GatewayName, MemberRouter, Route, RouterConfig, Table, serve};
use http_body_util::{BodyExt, Full};

const HDR: &str = "x-flotilla-deployment";

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// xorshift64*: a fixed, dependency-free sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Copy, Debug)]
enum Popularity {
    Zipf,
    Uniform,
}

/// The adapter index for a uniform draw `u`.
fn draw(p: Popularity, weights: &[f64], u: f64) -> usize {
    match p {
        Popularity::Uniform => ((u * weights.len() as f64) as usize).min(weights.len() - 1),
        Popularity::Zipf => {
            let total: f64 = weights.iter().sum();
            let mut acc = 0.0;
            for (i, w) in weights.iter().enumerate() {
                acc += w / total;
                if u < acc {
                    return i;
                }
            }
            weights.len() - 1
        }
    }
}

struct Params {
    adapters: usize,
    replicas: usize,
    max_loras: usize,
    load_ms: u64,
    rate: f64,
    seconds: u64,
}

struct Outcome {
    hits: u64,
    misses: u64,
    loads: u64,
    unloads: u64,
    refused: u64,
    ok: usize,
    errors: std::collections::BTreeMap<u16, usize>,
    ttft: Vec<f64>,
    sent: usize,
}

async fn one(url: String, model: String) -> Result<f64, u16> {
    let body = chat_stream(&model, "summarise the ticket", false);
    let req = hyper::Request::post(url)
        .header(HDR, "team-a/llama")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let start = Instant::now();
    let resp = client().request(req).await.map_err(|_| 0u16)?;
    if resp.status() != 200 {
        return Err(resp.status().as_u16());
    }
    let mut body = resp.into_body();
    let mut first = None;
    while let Some(f) = body.frame().await {
        let Ok(f) = f else { return Err(1) };
        if first.is_none() && f.data_ref().is_some_and(|d| d.windows(5).any(|w| w == b"data:")) {
            first = Some(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    first.ok_or(2)
}

async fn run(p: &Params, affinity: bool, popularity: Popularity) -> Outcome {
    let mut sims: Vec<SimHandle> = Vec::new();
    for i in 0..p.replicas {
        let load_ms = p.load_ms;
        let max = p.max_loras;
        sims.push(
            sim(&format!("replica-{i}"), &["base"], |c| {
                c.ttft_ms = 20;
                c.itl_ms = 2;
                c.default_tokens = 8;
                c.prefill_ms_per_block = 0;
                c.max_num_seqs = 64;
                c.lora.max_loras = max;
                c.lora.lora_load_ms = load_ms;
                c.lora.lora_ttft_ms = 5;
            })
            .await,
        );
    }
    let names: Vec<String> = (0..p.adapters).map(|i| format!("adapter-{i:02}")).collect();
    let paths: Vec<String> = names.iter().map(|n| format!("/adapters/{n}")).collect();
    let listed: Vec<(&str, &str)> = names.iter().zip(&paths).map(|(n, p)| (n.as_str(), p.as_str())).collect();
    let urls: Vec<String> = sims.iter().map(SimHandle::url).collect();
    let eps: Vec<(&str, f64)> = urls.iter().map(|u| (u.as_str(), 1.0)).collect();
    let route = Route::new("base", "team-a/llama", &eps).with_adapters(&listed, p.max_loras);
    let mut cfg = RouterConfig::new(GatewayName::new("flotilla-router", "flotilla"));
    cfg.adapter_affinity = affinity;
    let st = MemberRouter::with_table(cfg, Table::default().with("team-a/llama", route));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/chat/completions", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, st.clone(), async {
        let _ = stopped.await;
    }));

    let weights: Vec<f64> = (1..=p.adapters).map(|k| 1.0 / k as f64).collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let start = tokio::time::Instant::now();
    let end = Duration::from_secs(p.seconds);
    let mut at = Duration::ZERO;
    let mut tasks = Vec::new();
    loop {
        at += Duration::from_secs_f64(-(1.0 - rng.next()).ln() / p.rate);
        if at >= end {
            break;
        }
        let model = names[draw(popularity, &weights, rng.next())].clone();
        tokio::time::sleep_until(start + at).await;
        tasks.push(tokio::spawn(one(url.clone(), model)));
    }
    let sent = tasks.len();
    let mut ttft = Vec::new();
    let mut errors = std::collections::BTreeMap::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(ms) => ttft.push(ms),
            Err(status) => *errors.entry(status).or_default() += 1,
        }
    }
    ttft.sort_by(f64::total_cmp);
    let m = &st.metrics.adapters;
    let (hits, misses) =
        names.iter().fold((0, 0), |(h, s), n| (h + m.get(n, AdapterEvent::Hit), s + m.get(n, AdapterEvent::Miss)));
    let per_sim = |f: &dyn Fn(&SimHandle, &str) -> u64| -> u64 {
        sims.iter().map(|s| names.iter().map(|n| f(s, n)).sum::<u64>()).sum()
    };
    let loads = per_sim(&|s, n| s.state.lora_counters(n).loads);
    let unloads = per_sim(&|s, n| s.state.lora_counters(n).unloads);
    let refused = per_sim(&|s, n| s.state.lora_counters(n).load_refused);
    let _ = stop.send(());
    Outcome { hits, misses, loads, unloads, refused, ok: ttft.len(), errors, ttft, sent }
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: scripts/bench-member-router-adapters.sh"]
async fn adapter_affinity_against_round_robin() {
    let p = Params {
        adapters: env("FLOTILLA_BENCH_ADAPTERS", 50) as usize,
        replicas: env("FLOTILLA_BENCH_REPLICAS", 3) as usize,
        max_loras: env("FLOTILLA_BENCH_MAX_LORAS", 8) as usize,
        load_ms: env("FLOTILLA_BENCH_LOAD_MS", 200),
        rate: env("FLOTILLA_BENCH_RATE", 60) as f64,
        seconds: env("FLOTILLA_BENCH_SECONDS", 30),
    };
    println!(
        "{} adapters over {} replicas (--max-loras {}, --lora-load-ms {}, --lora-ttft-ms 5, --ttft-ms 20, --itl-ms 2, 8 tokens), {} req/s open loop for {} s\n",
        p.adapters, p.replicas, p.max_loras, p.load_ms, p.rate, p.seconds
    );
    println!(
        "| adapters drawn | placement | requests (ok / errors) | adapter already loaded | loads | evictions | loads refused by an engine | TTFT mean | TTFT p50 | TTFT p99 |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for popularity in [Popularity::Zipf, Popularity::Uniform] {
        for affinity in [true, false] {
            let o = run(&p, affinity, popularity).await;
            let placement = if affinity { "affinity (default)" } else { "no affinity (`--adapter-affinity false`)" };
            let drawn = match popularity {
                Popularity::Zipf => "Zipf, s = 1",
                Popularity::Uniform => "uniform",
            };
            let rate = 100.0 * o.hits as f64 / (o.hits + o.misses).max(1) as f64;
            // Errors by status (0: no answer, 1: the stream broke, 2: no token streamed).
            let errors = if o.errors.is_empty() {
                "0".to_string()
            } else {
                o.errors.iter().map(|(s, n)| format!("{n}× {s}")).collect::<Vec<_>>().join(", ")
            };
            println!(
                "| {drawn} | {placement} | {} ({} / {}) | {rate:.1} % | {} | {} | {} | {:.1} ms | {:.1} ms | {:.1} ms |",
                o.sent,
                o.ok,
                errors,
                o.loads,
                o.unloads,
                o.refused,
                o.ttft.iter().sum::<f64>() / o.ttft.len().max(1) as f64,
                pct(&o.ttft, 0.5),
                pct(&o.ttft, 0.99)
            );
        }
    }
}
