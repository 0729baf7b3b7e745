//! `/metrics` for the simulator: the engine's counters rendered in the Prometheus text format
//! under vLLM's metric names, so the gateway scrapes it exactly as it would scrape vLLM (LoRA
//! adapters' `vllm:lora_requests_info` comes from [`crate::lora`]).

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
    // Reported load (`set_reported_load`): added to the first model's samples, or samples of
    // their own for other models.
    let reported = lock(&state.reported).clone();
    let (extra_waiting, extra_running) = reported.get(&model).copied().unwrap_or_default();
    for (name, v) in gauges {
        let extra = match name {
            "vllm:num_requests_running" => extra_running,
            "vllm:num_requests_waiting" => extra_waiting,
            _ => 0,
        };
        let _ = writeln!(out, "# TYPE {name} gauge\n{name}{{{l}}} {}", v + extra as f64);
        for (other, (waiting, running)) in reported.iter().filter(|(m, _)| **m != model) {
            let n = match name {
                "vllm:num_requests_running" => *running,
                "vllm:num_requests_waiting" => *waiting,
                _ => continue,
            };
            let _ = writeln!(out, "{name}{{model_name=\"{other}\"}} {n}");
        }
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
    drop(h);
    crate::lora::render_metric(state, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_load_is_added_to_the_first_model_and_given_its_own_samples_for_others() {
        let config = crate::SimConfig { models: vec!["a".into(), "b".into()], ..Default::default() };
        let st = crate::SimState::new(config);
        st.set_reported_load("a", 2, 3);
        st.set_reported_load("c", 5, 1);
        let text = render(&st);
        assert!(text.contains("vllm:num_requests_waiting{model_name=\"a\"} 2\n"), "{text}");
        assert!(text.contains("vllm:num_requests_running{model_name=\"a\"} 3\n"), "{text}");
        assert!(text.contains("vllm:num_requests_waiting{model_name=\"c\"} 5\n"), "{text}");
        assert!(text.contains("vllm:num_requests_running{model_name=\"c\"} 1\n"), "{text}");
        st.set_reported_load("c", 0, 0);
        st.set_reported_load("a", 0, 0);
        let quiet = render(&st);
        assert!(quiet.contains("vllm:num_requests_waiting{model_name=\"c\"} 0\n"), "an idle engine of c: {quiet}");
        assert!(quiet.contains("vllm:num_requests_waiting{model_name=\"a\"} 0\n"), "{quiet}");
        assert!(!quiet.contains("\"b\""), "b was never reported: {quiet}");
    }
}
