//! LoRA adapters as vLLM serves them. An adapter is loaded at start (`--lora NAME=BASE`) or by
//! `POST /v1/load_lora_adapter`; it counts against `--max-loras` from the moment its load begins
//! and, once loaded, serves requests whose `model` is its name (`--lora-ttft-ms` later to first
//! token) until `POST /v1/unload_lora_adapter`. `/v1/models` lists it with its base model as
//! `parent`, `/metrics` names the adapters of running and waiting requests in
//! `vllm:lora_requests_info`, and its counters go to `/sim/stats`. Loads fail on demand
//! (`--lora-load-fail`, `POST /sim/loras`).
//!
//! Unlike vLLM, which registers any number of adapters and keeps `--max-cpu-loras` of them in
//! memory (least recently used out, reloaded on the next request that names one), the simulator
//! refuses a load beyond `--max-loras` with a 400, as SGLang does at `--max-loaded-loras`: the
//! adapters a test loaded are the ones served, with no hidden reload, and a caller placing
//! adapters sees a full engine.

mod http;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::config::LoadFailure;
use crate::{SimConfig, SimState, lock};
pub use http::routes;
use http::{LoadRequest, Refusal};

/// A loaded adapter, as `/v1/models` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedLora {
    /// Its name (the `model` its requests give).
    pub name: String,
    /// The `lora_path` it was loaded from (its name, for a `--lora` adapter).
    pub path: String,
    /// The base model it is attached to.
    pub base: String,
}

/// What happened to one adapter so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoraCounters {
    /// Successful loads (a `--lora` adapter counts one at start; an in-place reload counts).
    pub loads: u64,
    /// Successful unloads.
    pub unloads: u64,
    /// Loads that failed (`--lora-load-fail`, `POST /sim/loras`).
    pub load_failures: u64,
    /// Loads refused with a 400 before loading: already loaded, or `--max-loras` reached.
    pub load_refused: u64,
    /// Inference requests served by the adapter (past the model check).
    pub requests: u64,
}

#[derive(Debug)]
struct Entry {
    path: String,
    base: String,
    /// `false` while its first load runs: it holds a slot but serves nothing yet.
    ready: bool,
}

#[derive(Debug, Default)]
struct Inner {
    adapters: BTreeMap<String, Entry>,
    failures: BTreeMap<String, (LoadFailure, Option<u32>)>,
    counters: BTreeMap<String, LoraCounters>,
    waiting: BTreeMap<String, u64>,
    running: BTreeMap<String, u64>,
}

impl Inner {
    fn counters(&mut self, name: &str) -> &mut LoraCounters {
        self.counters.entry(name.to_string()).or_default()
    }

    /// The failure a load of `name` meets now, consuming one use of it.
    fn take_failure(&mut self, name: &str) -> Option<LoadFailure> {
        let (failure, count) = *self.failures.get(name)?;
        match count {
            None => Some(failure),
            Some(n) => {
                if n <= 1 {
                    self.failures.remove(name);
                } else {
                    self.failures.insert(name.to_string(), (failure, Some(n - 1)));
                }
                (n > 0).then_some(failure)
            }
        }
    }
}

/// The adapters of one engine, their injected load failures, counters and activity.
#[derive(Debug, Default)]
pub struct Adapters(Mutex<Inner>);

impl Adapters {
    /// The `--lora` adapters loaded and the `--lora-load-fail` failures set.
    pub(crate) fn new(config: &SimConfig) -> Adapters {
        let mut inner = Inner::default();
        for l in &config.lora.loras {
            inner.adapters.insert(l.name.clone(), Entry { path: l.name.clone(), base: l.base.clone(), ready: true });
            inner.counters(&l.name).loads += 1;
        }
        for f in &config.lora.lora_load_fail {
            inner.failures.insert(f.name.clone(), (f.failure, None));
        }
        Adapters(Mutex::new(inner))
    }

    /// Whether `name` is a loaded adapter; when it is, a request for it is counted.
    pub(crate) fn count_request(&self, name: &str) -> bool {
        let mut g = lock(&self.0);
        if !g.adapters.get(name).is_some_and(|e| e.ready) {
            return false;
        }
        g.counters(name).requests += 1;
        true
    }

    /// Refuses a load that cannot start, else takes a slot for a new adapter (`--max-loras`).
    fn begin(&self, req: &LoadRequest, max: usize) -> Result<(), Refusal> {
        let mut g = lock(&self.0);
        let refused = match g.adapters.get(&req.name) {
            Some(e) if e.ready && req.inplace => None,
            Some(_) => Some(Refusal::AlreadyLoaded(req.name.clone())),
            None if g.adapters.len() >= max => Some(req.full(max)),
            None => {
                let entry = Entry { path: req.path.clone(), base: req.base.clone(), ready: false };
                g.adapters.insert(req.name.clone(), entry);
                None
            }
        };
        match refused {
            Some(r) => {
                g.counters(&req.name).load_refused += 1;
                Err(r)
            }
            None => Ok(()),
        }
    }

    /// Ends a load begun by [`Adapters::begin`]: the injected failure, if any (a new adapter
    /// gives its slot back, one reloaded in place stays as it was), else the adapter is loaded.
    fn finish(&self, req: &LoadRequest, max: usize) -> Result<String, Refusal> {
        let mut g = lock(&self.0);
        if let Some(failure) = g.take_failure(&req.name) {
            g.counters(&req.name).load_failures += 1;
            if g.adapters.get(&req.name).is_some_and(|e| !e.ready) {
                g.adapters.remove(&req.name);
            }
            return Err(match failure {
                LoadFailure::Error => Refusal::LoadFailed(req.path.clone()),
                LoadFailure::NotFound => Refusal::NoAdapter(req.name.clone(), req.path.clone()),
            });
        }
        let (present, len) = (g.adapters.contains_key(&req.name), g.adapters.len());
        // Reloaded in place after an unload took it away: a fresh load that ends now.
        if !present && len >= max {
            g.counters(&req.name).load_refused += 1;
            return Err(req.full(max));
        }
        g.adapters.insert(req.name.clone(), Entry { path: req.path.clone(), base: req.base.clone(), ready: true });
        g.counters(&req.name).loads += 1;
        Ok(format!("Success: LoRA adapter '{}' added successfully.", req.name))
    }

    fn unload(&self, name: &str) -> Result<String, Refusal> {
        let mut g = lock(&self.0);
        if !g.adapters.get(name).is_some_and(|e| e.ready) {
            return Err(Refusal::NotLoaded(name.to_string()));
        }
        g.adapters.remove(name);
        g.counters(name).unloads += 1;
        Ok(format!("Success: LoRA adapter '{name}' removed successfully."))
    }
}

impl SimState {
    /// The loaded adapters, by name (an adapter whose first load is still running is not one).
    pub fn loaded_loras(&self) -> Vec<LoadedLora> {
        let g = lock(&self.loras.0);
        g.adapters
            .iter()
            .filter(|(_, e)| e.ready)
            .map(|(name, e)| LoadedLora { name: name.clone(), path: e.path.clone(), base: e.base.clone() })
            .collect()
    }

    /// `name`'s counters.
    pub fn lora_counters(&self, name: &str) -> LoraCounters {
        lock(&self.loras.0).counters.get(name).copied().unwrap_or_default()
    }

    /// Makes the next `count` loads of adapter `name` fail (`None`: every one until cleared;
    /// `failure` `None` clears it).
    pub fn set_lora_load_failure(&self, name: &str, failure: Option<LoadFailure>, count: Option<u32>) {
        let mut g = lock(&self.loras.0);
        match failure {
            Some(f) => g.failures.insert(name.to_string(), (f, count)),
            None => g.failures.remove(name),
        };
    }

    /// Every adapter's counters for `/sim/stats`, with whether it is loaded now.
    pub(crate) fn lora_stats(&self) -> Value {
        let g = lock(&self.loras.0);
        let stats: Map<String, Value> = g
            .counters
            .iter()
            .map(|(name, c)| {
                let loaded = g.adapters.get(name).is_some_and(|e| e.ready);
                let v = json!({
                    "loaded": loaded, "loads": c.loads, "unloads": c.unloads, "load_failures": c.load_failures,
                    "load_refused": c.load_refused, "requests": c.requests,
                });
                (name.clone(), v)
            })
            .collect();
        Value::Object(stats)
    }
}

/// One request to an adapter, counted as waiting and then as running while it lives, for
/// `vllm:lora_requests_info`.
#[derive(Debug)]
pub(crate) struct Active {
    state: Arc<SimState>,
    name: String,
    running: bool,
}

fn bump(counts: &mut BTreeMap<String, u64>, name: &str, up: bool) {
    let n = counts.entry(name.to_string()).or_default();
    if up {
        *n += 1;
    } else {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(name);
        }
    }
}

impl Active {
    /// A request for adapter `name` starts waiting for a sequence slot.
    pub(crate) fn waiting(state: &Arc<SimState>, name: &str) -> Active {
        bump(&mut lock(&state.loras.0).waiting, name, true);
        Active { state: state.clone(), name: name.to_string(), running: false }
    }

    /// It got its slot.
    pub(crate) fn run(mut self) -> Active {
        let mut g = lock(&self.state.loras.0);
        bump(&mut g.waiting, &self.name, false);
        bump(&mut g.running, &self.name, true);
        drop(g);
        self.running = true;
        self
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let mut g = lock(&self.state.loras.0);
        let counts = if self.running { &mut g.running } else { &mut g.waiting };
        bump(counts, &self.name, false);
    }
}

/// Appends `vllm:lora_requests_info` as vLLM exports it (unless `--max-loras 0`): one sample
/// whose value is the current Unix time, labelled with `max_lora` and the comma-separated
/// adapters of running and of waiting requests. The names are adapters an operator loaded,
/// never a name an inference request made up (a request for anything else is a 404).
pub(crate) fn render_metric(state: &SimState, out: &mut String) {
    use std::fmt::Write;
    let max = state.config.lora.max_loras;
    if max == 0 {
        return;
    }
    let (running, waiting) = {
        let g = lock(&state.loras.0);
        (
            g.running.keys().cloned().collect::<Vec<_>>().join(","),
            g.waiting.keys().cloned().collect::<Vec<_>>().join(","),
        )
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default();
    let name = "vllm:lora_requests_info";
    let _ = writeln!(
        out,
        "# TYPE {name} gauge\n{name}{{max_lora=\"{max}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {now}",
        escape(&running),
        escape(&waiting)
    );
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counted_failure_runs_out_and_activity_follows_the_guards() {
        let config = SimConfig {
            models: vec!["base".into()],
            lora: crate::config::LoraArgs { loras: vec!["a=base".parse().unwrap()], ..Default::default() },
            ..SimConfig::default()
        };
        let s = SimState::new(config);
        s.set_lora_load_failure("b", Some(LoadFailure::NotFound), Some(2));
        let mut g = lock(&s.loras.0);
        assert_eq!(g.take_failure("b"), Some(LoadFailure::NotFound));
        assert_eq!(g.take_failure("b"), Some(LoadFailure::NotFound));
        assert_eq!(g.take_failure("b"), None, "used up");
        drop(g);

        let waiting = Active::waiting(&s, "a");
        let other = Active::waiting(&s, "a");
        assert_eq!(lock(&s.loras.0).waiting.get("a"), Some(&2));
        let running = waiting.run();
        let g = lock(&s.loras.0);
        assert_eq!((g.waiting.get("a"), g.running.get("a")), (Some(&1), Some(&1)));
        drop(g);
        drop((running, other));
        let g = lock(&s.loras.0);
        assert!(g.waiting.is_empty() && g.running.is_empty(), "no names left behind: {g:?}");
        drop(g);
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }
}
