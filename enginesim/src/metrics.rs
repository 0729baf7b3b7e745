//! `/metrics` for the simulator: the engine's counters rendered in the Prometheus text format
//! under vLLM's metric names, so the gateway scrapes it exactly as it would scrape vLLM.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::{SimState, lock};

const BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 2.56];

/// A cumulative TTFT histogram in seconds.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    /// Record one observation.
    pub fn observe(&mut self, secs: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }
}

/// The Prometheus text exposition of `state`.
pub fn render(state: &SimState) -> String {
    let mut out = String::new();
    let model = state.config.models.first().cloned().unwrap_or_default();
    let l = format!("model_name=\"{model}\"");
    let usage = {
        let c = lock(&state.cache);
        if c.capacity() == 0 { 0.0 } else { c.len() as f64 / c.capacity() as f64 }
    };
    let gauges = [
        ("vllm:num_requests_running", state.running.load(Ordering::Relaxed) as f64),
        ("vllm:num_requests_waiting", state.waiting.load(Ordering::Relaxed) as f64),
        ("vllm:kv_cache_usage_perc", usage),
    ];
    for (name, v) in gauges {
        let _ = writeln!(out, "# TYPE {name} gauge\n{name}{{{l}}} {v}");
    }
    let counters = [
        ("vllm:prefix_cache_queries", state.prefix_queries.load(Ordering::Relaxed)),
        ("vllm:prefix_cache_hits", state.prefix_hits.load(Ordering::Relaxed)),
        ("vllm:request_success", state.completed.load(Ordering::Relaxed)),
    ];
    for (name, v) in counters {
        let _ = writeln!(out, "# TYPE {name} counter\n{name}_total{{{l}}} {v}");
    }
    let h = lock(&state.ttft);
    let name = "vllm:time_to_first_token_seconds";
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (b, c) in BUCKETS.iter().zip(h.counts.iter()) {
        let _ = writeln!(out, "{name}_bucket{{{l},le=\"{b}\"}} {c}");
    }
    let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum{{{l}}} {}\n{name}_count{{{l}}} {}", h.sum, h.count);
    out
}
