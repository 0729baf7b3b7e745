//! The scrape loop: each cluster's `/metrics` is read every `--scrape-interval-ms` for its
//! engine's queue depth and KV-cache use, which `pick` adds to the cluster's load (and the
//! autoscaler's demand book reads per model from the same page). The engines' metric names are
//! one table, [`engine_metric`]: vLLM, llama.cpp's `llama-server --metrics`, SGLang and TGI. An
//! entry point that answers without engine metrics (a 404, another server's page) is not scraped
//! every interval for ever: after `--scrape-quiet-after` such answers in a row it is scraped at
//! doubling intervals up to `--scrape-max-interval-ms`, logged once, and shown by the
//! `scrape_quiet{cluster}` gauge; engine metrics seen again bring it back to the normal
//! interval. When to scrape next is [`next`], a pure function of what the last scrape found.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header;
use http_body_util::{BodyExt, Full, Limited};

use crate::AppState;
use crate::config::ms;
use crate::table::Cluster;

/// What an engine metric measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Requests waiting for the engine (summed).
    Waiting,
    /// Requests being generated (summed).
    Running,
    /// KV-cache use, 0 to 1 (the highest sample).
    KvCache,
}

/// The engines' metric names, and what each measures. Every engine's page counts: a cluster
/// serves one engine, so no page carries two engines' names for one thing.
const ENGINE_METRICS: [(&str, Measure); 12] = [
    // vLLM (V1 `kv_cache_usage_perc`; V0 `gpu_cache_usage_perc`), per `model_name` label.
    ("vllm:num_requests_waiting", Measure::Waiting),
    ("vllm:num_requests_running", Measure::Running),
    ("vllm:kv_cache_usage_perc", Measure::KvCache),
    ("vllm:gpu_cache_usage_perc", Measure::KvCache),
    // llama.cpp's `llama-server --metrics`: one model, no labels. Tasks waiting for a free slot
    // are `requests_deferred`; `kv_cache_usage_ratio` is only on builds older than the tested one.
    ("llamacpp:requests_deferred", Measure::Waiting),
    ("llamacpp:requests_processing", Measure::Running),
    ("llamacpp:kv_cache_usage_ratio", Measure::KvCache),
    // SGLang, per `model_name` label; `token_usage` is the share of KV-cache tokens in use.
    ("sglang:num_queue_reqs", Measure::Waiting),
    ("sglang:num_running_reqs", Measure::Running),
    ("sglang:token_usage", Measure::KvCache),
    // Hugging Face TGI: no KV-cache figure.
    ("tgi_queue_size", Measure::Waiting),
    ("tgi_batch_current_size", Measure::Running),
];

/// What the metric `name` (without labels) measures, when it is one of an engine's.
pub fn engine_metric(name: &str) -> Option<Measure> {
    ENGINE_METRICS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// `(measure, labels, value)` of every engine sample in a Prometheus text page (labels without
/// their braces; non-finite values skipped).
pub fn engine_samples(text: &str) -> impl Iterator<Item = (Measure, &str, f64)> {
    text.lines().filter_map(|line| {
        let (name, rest) = line.split_at(line.find(['{', ' '])?);
        let signal = engine_metric(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once('}')?,
            None => ("", rest),
        };
        let value = value.split_whitespace().next()?.parse::<f64>().ok().filter(|v| v.is_finite())?;
        Some((signal, labels, value))
    })
}

/// The sum of the waiting-request samples in a Prometheus text page.
pub fn waiting_from_metrics(text: &str) -> Option<u64> {
    engine_samples(text)
        .filter(|(s, _, _)| *s == Measure::Waiting)
        .map(|(_, _, v)| v.max(0.0))
        .reduce(|a, b| a + b)
        .map(|v| v as u64)
}

/// KV-cache use (0 to 1), the highest sample when an entry serves several engines.
pub fn kv_cache_from_metrics(text: &str) -> Option<f64> {
    engine_samples(text)
        .filter(|(s, _, _)| *s == Measure::KvCache)
        .map(|(_, _, v)| v)
        .reduce(f64::max)
        .map(|v| v.clamp(0.0, 1.0))
}

/// What one scrape found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scraped {
    /// A page with engine metrics.
    Engine,
    /// An answer without engine metrics (a 404, a page of other metrics).
    NotEngine,
    /// No answer (down, timeout): says nothing about what the entry point is.
    NoAnswer,
}

/// A cluster's scrape schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Answers without engine metrics in a row.
    pub misses: u32,
    /// When to scrape next.
    pub at: Instant,
}

/// The scrape settings `next` needs.
#[derive(Clone, Copy, Debug)]
pub struct Cadence {
    /// The normal interval.
    pub interval: Duration,
    /// Answers without engine metrics in a row after which the cluster is scraped rarely.
    pub quiet_after: u32,
    /// The longest interval of a quiet cluster.
    pub max: Duration,
}

impl Schedule {
    /// Whether the cluster is scraped rarely now.
    pub fn quiet(&self, c: &Cadence) -> bool {
        c.quiet_after > 0 && self.misses >= c.quiet_after
    }
}

/// The schedule after a scrape at `now` found `got`: the normal interval, or for a cluster
/// that answered `quiet_after` times or more in a row without engine metrics, twice the interval
/// for each further miss (capped at `max`).
pub fn next(s: Schedule, got: Scraped, now: Instant, c: &Cadence) -> Schedule {
    let misses = match got {
        Scraped::Engine => 0,
        Scraped::NotEngine => s.misses.saturating_add(1),
        Scraped::NoAnswer => s.misses,
    };
    let quiet = Schedule { misses, at: now }.quiet(c);
    let wait = if quiet {
        let doublings = (misses - c.quiet_after + 1).min(20);
        c.interval.saturating_mul(1 << doublings).min(c.max.max(c.interval))
    } else {
        c.interval
    };
    Schedule { misses, at: now + wait }
}

async fn scrape_once(st: &AppState, c: &Cluster) -> Scraped {
    let Ok(mut req) = hyper::Request::get(format!("{}/metrics", c.url)).body(Full::new(Bytes::new())) else {
        return Scraped::NoAnswer;
    };
    if let Some(a) = &c.auth {
        req.headers_mut().insert(header::AUTHORIZATION, a.clone());
    }
    let fetch = async {
        let resp = st.conn(c).request(req).await.ok()?;
        let ok = resp.status().is_success();
        let body = Limited::new(resp.into_body(), 4 << 20).collect().await.ok()?.to_bytes();
        if !ok {
            return Some(None);
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        // Per-model demand for the autoscaler, from the same page.
        st.autoscale.demand.record(&c.name, &text, Instant::now());
        Some(Some((waiting_from_metrics(&text), kv_cache_from_metrics(&text))))
    };
    match tokio::time::timeout(Duration::from_secs(1), fetch).await {
        Ok(Some(Some((depth, kv)))) if depth.is_some() || kv.is_some() => {
            let h = st.health.get(&c.name);
            if let Some(d) = depth {
                h.set_queue_depth(d);
            }
            if let Some(k) = kv {
                h.set_kv_cache(k);
            }
            Scraped::Engine
        }
        Ok(Some(_)) => Scraped::NotEngine,
        Ok(None) | Err(_) => Scraped::NoAnswer,
    }
}

/// Scrape every cluster of the table in force on its schedule until cancelled
/// (`--scrape-interval-ms 0`: never).
pub async fn scrape_loop(st: Arc<AppState>) {
    if st.cfg.scrape_interval_ms == 0 {
        return;
    }
    let c = Cadence {
        interval: ms(st.cfg.scrape_interval_ms),
        quiet_after: st.cfg.scrape_quiet_after,
        max: ms(st.cfg.scrape_max_interval_ms),
    };
    let mut schedules: HashMap<String, Schedule> = HashMap::new();
    let mut tick = tokio::time::interval((c.interval / 4).max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let table = st.table.load_full();
        let now = Instant::now();
        schedules.retain(|name, _| table.clusters().any(|cl| &cl.name == name));
        st.autoscale.demand.retain(|name| table.clusters().any(|cl| cl.name == name));
        let due: Vec<Arc<Cluster>> =
            table.clusters().filter(|cl| schedules.get(&cl.name).is_none_or(|s| s.at <= now)).cloned().collect();
        let found = futures_util::future::join_all(due.iter().map(|c| scrape_once(&st, c))).await;
        let now = Instant::now();
        for (cl, got) in due.into_iter().zip(found) {
            let (name, url) = (cl.name.clone(), &cl.url);
            let old = schedules.get(&name).copied().unwrap_or(Schedule { misses: 0, at: now });
            let new = next(old, got, now, &c);
            match (old.quiet(&c), new.quiet(&c)) {
                (false, true) => {
                    tracing::info!(cluster = %name, %url, misses = new.misses, "no engine metrics at /metrics: scraping this cluster rarely from now on (up to every {} s)", c.max.as_secs());
                    st.metrics.set_scrape_quiet(&name, true);
                }
                (true, false) => {
                    tracing::info!(cluster = %name, "engine metrics at /metrics again: scraping at the normal interval");
                    st.metrics.set_scrape_quiet(&name, false);
                }
                _ => {}
            }
            schedules.insert(name, new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_queue_depth() {
        let text = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 3\nvllm:num_requests_waiting_other 9\nvllm:num_requests_waiting{model_name=\"n\"} 2.0\n";
        assert_eq!(waiting_from_metrics(text), Some(5));
        assert_eq!(waiting_from_metrics("nothing 1"), None);
        let kv = "vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\nvllm:gpu_cache_usage_perc{engine=\"1\"} 0.75\n";
        assert_eq!(kv_cache_from_metrics(kv), Some(0.75));
        assert_eq!(kv_cache_from_metrics("vllm:kv_cache_usage_perc_x 1\n"), None);
        // A sample's timestamp is not its value.
        assert_eq!(waiting_from_metrics("vllm:num_requests_waiting{model_name=\"m\"} 4 1765000000000\n"), Some(4));
    }

    #[test]
    fn reads_llama_cpp_sglang_and_tgi_pages() {
        // As `llama-server --metrics` writes it (tests/gateway/test_real_engine.py reads a live one).
        let llama = "# HELP llamacpp:requests_processing Number of requests processing\n\
# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n\
# HELP llamacpp:requests_deferred Number of requests deferred\n\
# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 3\n\
llamacpp:n_busy_slots_per_decode 1\n";
        assert_eq!((waiting_from_metrics(llama), kv_cache_from_metrics(llama)), (Some(3), None));
        assert_eq!(kv_cache_from_metrics("llamacpp:kv_cache_usage_ratio 0.5\n"), Some(0.5), "older builds");
        let sglang = "sglang:num_queue_reqs{model_name=\"qwen\"} 2.0\nsglang:num_running_reqs{model_name=\"qwen\"} 8.0\n\
sglang:token_usage{model_name=\"qwen\"} 0.62\n";
        assert_eq!((waiting_from_metrics(sglang), kv_cache_from_metrics(sglang)), (Some(2), Some(0.62)));
        let tgi = "# TYPE tgi_queue_size gauge\ntgi_queue_size 5\ntgi_batch_current_size 16\n";
        assert_eq!((waiting_from_metrics(tgi), kv_cache_from_metrics(tgi)), (Some(5), None));
        let running: Vec<f64> = engine_samples(&format!("{llama}{sglang}{tgi}"))
            .filter(|(m, _, _)| *m == Measure::Running)
            .map(|(_, _, v)| v)
            .collect();
        assert_eq!(running, [1.0, 8.0, 16.0]);
        // Another server's page is no engine's.
        assert_eq!(engine_samples("process_cpu_seconds_total 12\nhttp_requests_total 3\n").count(), 0);
    }

    #[test]
    fn an_entry_without_vllm_metrics_is_scraped_at_doubling_intervals_and_comes_back() {
        let c = Cadence { interval: Duration::from_secs(2), quiet_after: 3, max: Duration::from_secs(300) };
        let t0 = Instant::now();
        let mut s = Schedule { misses: 0, at: t0 };
        let mut waits = Vec::new();
        for _ in 0..12 {
            let n = next(s, Scraped::NotEngine, s.at, &c);
            waits.push((n.at - s.at).as_secs());
            s = n;
        }
        assert_eq!(waits, [2, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert!(s.quiet(&c));
        // Being down says nothing: the schedule neither backs off further nor resets.
        let down = next(s, Scraped::NoAnswer, s.at, &c);
        assert_eq!((down.misses, (down.at - s.at).as_secs()), (s.misses, 300));
        let back = next(s, Scraped::Engine, s.at, &c);
        assert!(!back.quiet(&c));
        assert_eq!((back.misses, (back.at - s.at).as_secs()), (0, 2));
        // An engine that answers is never backed off, and neither is an unreachable one.
        let mut e = Schedule { misses: 0, at: t0 };
        for got in [Scraped::Engine, Scraped::NoAnswer, Scraped::NoAnswer, Scraped::NoAnswer, Scraped::NoAnswer] {
            let n = next(e, got, e.at, &c);
            assert_eq!((n.at - e.at).as_secs(), 2);
            e = n;
        }
        // quiet_after 0: never quiet.
        let never = Cadence { quiet_after: 0, ..c };
        let n = next(Schedule { misses: 50, at: t0 }, Scraped::NotEngine, t0, &never);
        assert_eq!((n.at - t0).as_secs(), 2);
    }
}
