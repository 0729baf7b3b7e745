//! Fleet-wide demand per model, from the pages the scrape loop already reads. Each cluster's
//! `/metrics` page is split by the `model_name` label (vLLM's, SGLang's) into queued requests,
//! running requests and KV-cache use, read under each engine's names (`scrape::engine_metric`:
//! `vllm:num_requests_waiting`, `llamacpp:requests_deferred`, …), and kept with the time it was
//! read; [`DemandBook::signal`] sums a model over every cluster whose page is fresh, together
//! with the model's LoRA adapters: their requests run on the model's replicas (vLLM counts them
//! under the base model's `model_name`; an engine that labels them by adapter is summed too).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::autoscale::recommend::Signal;
use crate::health::lock;
use crate::scrape::{Measure, engine_samples};

/// One model's figures on one cluster's page.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Requests waiting.
    pub queued: f64,
    /// Requests running.
    pub running: f64,
    /// KV-cache use, 0 to 1 (the highest engine's).
    pub kv_cache: Option<f64>,
}

/// The `model_name` label's value in a sample's label set, if any.
fn model_label(labels: &str) -> Option<&str> {
    let start = labels.find("model_name=\"")? + "model_name=\"".len();
    let rest = &labels[start..];
    rest.find('"').map(|end| &rest[..end])
}

/// Per model (`model_name`; samples without it under `""`), what a Prometheus text page says.
pub fn parse(text: &str) -> HashMap<String, Sample> {
    let mut out: HashMap<String, Sample> = HashMap::new();
    for (measure, labels, value) in engine_samples(text) {
        let s = out.entry(model_label(labels).unwrap_or_default().to_string()).or_default();
        match measure {
            Measure::Waiting => s.queued += value.max(0.0),
            Measure::Running => s.running += value.max(0.0),
            Measure::KvCache => s.kv_cache = Some(s.kv_cache.unwrap_or(0.0).max(value.clamp(0.0, 1.0))),
        }
    }
    out
}

/// One cluster's last page: when it was read, and its samples by model.
type Page = (Instant, HashMap<String, Sample>);

/// The last page of every scraped cluster, by model.
#[derive(Debug, Default)]
pub struct DemandBook {
    pages: Mutex<HashMap<String, Page>>,
}

impl DemandBook {
    /// Keep what `cluster`'s page said at `at`.
    pub fn record(&self, cluster: &str, text: &str, at: Instant) {
        let parsed = parse(text);
        lock(&self.pages).insert(cluster.to_string(), (at, parsed));
    }

    /// Forget clusters that are no longer in the table.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        lock(&self.pages).retain(|c, _| keep(c));
    }

    /// The demand of `names` (a model and its adapters; the model first) summed over the
    /// clusters whose page is younger than `fresh`, and how many reported it; `None` when none
    /// did. A page whose samples carry no `model_name` counts for the model when it is the only
    /// model `only` says that cluster serves.
    pub fn signal(
        &self,
        names: &[&str],
        fresh: Duration,
        now: Instant,
        only: impl Fn(&str) -> bool,
    ) -> Option<(Signal, i32)> {
        let pages = lock(&self.pages);
        let mut total = Signal::default();
        let (mut kv_sum, mut kv_n, mut clusters) = (0.0, 0u32, 0i32);
        for (cluster, (at, models)) in pages.iter() {
            if now.saturating_duration_since(*at) > fresh {
                continue;
            }
            let mut found: Vec<&Sample> = names.iter().filter_map(|n| models.get(*n)).collect();
            if found.is_empty() {
                found.extend(models.get("").filter(|_| only(cluster)));
            }
            if found.is_empty() {
                continue;
            }
            // The adapters share the model's engines: one KV cache per cluster, the highest.
            let mut kv: Option<f64> = None;
            for s in found {
                total.queued += s.queued;
                total.running += s.running;
                kv = s.kv_cache.map(|k| kv.map_or(k, |m: f64| m.max(k))).or(kv);
            }
            if let Some(k) = kv {
                kv_sum += k;
                kv_n += 1;
            }
            clusters += 1;
        }
        if clusters == 0 {
            return None;
        }
        total.kv_cache = (kv_n > 0).then(|| kv_sum / f64::from(kv_n));
        Some((total, clusters))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"llama\"} 3.0\n\
vllm:num_requests_waiting{engine=\"1\",model_name=\"llama\"} 2\n\
vllm:num_requests_running{engine=\"0\",model_name=\"llama\"} 7\n\
vllm:num_requests_running{model_name=\"qwen\"} 1\n\
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"llama\"} 0.25\n\
vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"llama\"} 0.5\n\
vllm:num_requests_waiting_other{model_name=\"llama\"} 99\n\
vllm:num_requests_running NaN\n";

    #[test]
    fn a_page_is_split_by_model() {
        let p = parse(PAGE);
        assert_eq!(p["llama"], Sample { queued: 5.0, running: 7.0, kv_cache: Some(0.5) });
        assert_eq!(p["qwen"], Sample { queued: 0.0, running: 1.0, kv_cache: None });
        assert!(!p.contains_key(""), "a NaN is no sample");
        let bare = parse("vllm:num_requests_running 4\nvllm:gpu_cache_usage_perc 0.3\n");
        assert_eq!(bare[""], Sample { queued: 0.0, running: 4.0, kv_cache: Some(0.3) });
    }

    #[test]
    fn other_engines_pages_give_the_same_demand() {
        let llama = parse("llamacpp:requests_deferred 2\nllamacpp:requests_processing 1\n");
        assert_eq!(llama[""], Sample { queued: 2.0, running: 1.0, kv_cache: None }, "one model, no label");
        let sglang = parse(
            "sglang:num_queue_reqs{model_name=\"qwen\"} 4\nsglang:num_running_reqs{model_name=\"qwen\"} 6\nsglang:token_usage{model_name=\"qwen\"} 0.7\n",
        );
        assert_eq!(sglang["qwen"], Sample { queued: 4.0, running: 6.0, kv_cache: Some(0.7) });
        assert_eq!(parse("tgi_queue_size 3\ntgi_batch_current_size 9\n")[""].queued, 3.0);
    }

    #[test]
    fn demand_sums_fresh_pages_over_the_fleet() {
        let book = DemandBook::default();
        let t = Instant::now();
        book.record("eu1", PAGE, t);
        book.record("eu2", "vllm:num_requests_waiting{model_name=\"llama\"} 4\n", t + Duration::from_secs(5));
        book.record("us1", "vllm:num_requests_running 6\n", t + Duration::from_secs(5));
        let fresh = Duration::from_secs(10);
        let (s, n) = book.signal(&["llama"], fresh, t + Duration::from_secs(6), |_| false).unwrap();
        assert_eq!((s.queued, s.running, s.kv_cache, n), (9.0, 7.0, Some(0.5), 2));
        // An unlabelled page counts only where the cluster serves that model alone.
        let (s, n) = book.signal(&["llama"], fresh, t + Duration::from_secs(6), |c| c == "us1").unwrap();
        assert_eq!((s.running, n), (13.0, 3));
        // eu1's page is too old now.
        let (s, n) = book.signal(&["llama"], fresh, t + Duration::from_secs(12), |_| false).unwrap();
        assert_eq!((s.queued, n), (4.0, 1));
        assert_eq!(book.signal(&["mistral"], fresh, t, |_| false), None);
        // A model's adapters add up with it, each cluster counted once; another model's do not.
        book.record("eu3", "vllm:num_requests_waiting{model_name=\"llama\"} 1\nvllm:num_requests_waiting{model_name=\"sql-lora\"} 2\nvllm:num_requests_running{model_name=\"qwen-lora\"} 8\n", t + Duration::from_secs(6));
        book.record("eu4", "vllm:num_requests_running{model_name=\"sql-lora\"} 5\n", t + Duration::from_secs(6));
        let at = t + Duration::from_secs(6);
        let (s, n) = book.signal(&["llama", "sql-lora"], fresh, at, |_| false).unwrap();
        assert_eq!((s.queued, s.running, n), (12.0, 12.0, 4), "eu1 5+0/7, eu2 4, eu3 1+2, eu4 5 running");
        let (s, n) = book.signal(&["llama"], fresh, at, |_| false).unwrap();
        assert_eq!((s.queued, s.running, n), (10.0, 7.0, 3), "without its adapters: eu4 is not counted");
        book.retain(|c| c != "eu2" && c != "eu3" && c != "eu4");
        assert_eq!(book.signal(&["llama"], fresh, t + Duration::from_secs(12), |_| false), None);
    }
}
