//! The engine simulator: a stand-in for a vLLM server that the gateway's tests and demos run
//! on loopback. Requests come in over the vLLM OpenAI API, pass the injected fault (if any), are
//! planned for their model ([`streams`]: the canonical answer or the rest of a partial one, see
//! [`canonical`], and the model's scripted stream fault), wait for a sequence slot, consult the
//! prefix cache for their prefill time, and stream generated tokens back; counters and the
//! request log flow out through `/metrics` and [`SimHandle`]. A request may name a LoRA adapter
//! loaded on the engine instead of a base model ([`lora`]).

pub mod api;
pub mod cache;
pub mod canonical;
pub mod config;
pub mod generate;
pub mod lora;
pub mod metrics;
pub mod models;
pub mod server;
pub mod streams;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

pub use config::{Fault, SimConfig};
use tokio::sync::Semaphore;

/// What can go wrong in the simulator itself.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A fault specification that does not parse.
    #[error("unknown fault `{0}`: see --help for the list (e.g. `error-500`, `rate-limit:2`, `cut:3`)")]
    BadFault(String),
    /// A LoRA flag that does not parse or does not fit the served models.
    #[error("{0}")]
    BadLora(String),
    /// The listener could not be bound or accepted from.
    #[error("listening failed: {0}")]
    Io(#[from] std::io::Error),
}

/// One request the simulator received.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// The model the request named (empty if none).
    pub model: String,
    /// When it arrived.
    pub at: Instant,
    /// The first prompt words (for prefix-affinity tests).
    pub prompt_head: String,
    /// The request headers as received, lower-case names in arrival order.
    pub headers: Vec<(String, String)>,
}

/// Shared state of one simulated engine.
#[derive(Debug)]
pub struct SimState {
    /// The configuration it was started with.
    pub config: SimConfig,
    fault: Mutex<Option<(Fault, Option<u32>)>>,
    log: Mutex<Vec<RequestRecord>>,
    pub(crate) cache: Mutex<cache::PrefixCache>,
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) running: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) prefix_queries: AtomicU64,
    pub(crate) prefix_hits: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    unauthorized: AtomicU64,
    pub(crate) ttft: Mutex<metrics::Histogram>,
    pub(crate) outages: models::Outages,
    pub(crate) streams: streams::Registry,
    pub(crate) loras: lora::Adapters,
    /// Load reported in `/metrics` per model beyond what is really running (`set_reported_load`).
    pub(crate) reported: Mutex<std::collections::BTreeMap<String, (u64, u64)>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SimState {
    /// Fresh state for `config`, its `--lora` adapters loaded. The configuration is taken as
    /// given: [`spawn`] and the binary check it first ([`SimConfig::validate`]).
    pub fn new(config: SimConfig) -> Arc<Self> {
        let fault = config.fault.map(|f| (f, config.fault_count));
        Arc::new(SimState {
            cache: Mutex::new(cache::PrefixCache::new(config.block_size, config.cache_blocks)),
            slots: Arc::new(Semaphore::new(config.max_num_seqs.max(1))),
            fault: Mutex::new(fault),
            log: Mutex::new(Vec::new()),
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            unauthorized: AtomicU64::new(0),
            ttft: Mutex::new(metrics::Histogram::default()),
            reported: Mutex::new(std::collections::BTreeMap::new()),
            outages: models::Outages::new(&config.model_faults, &config.model_down),
            streams: streams::Registry::new(&config.streams),
            loras: lora::Adapters::new(&config),
            config,
        })
    }

    /// Inject `fault` for the next `count` requests (`None`: until cleared).
    pub fn set_fault(&self, fault: Option<Fault>, count: Option<u32>) {
        *lock(&self.fault) = fault.map(|f| (f, count));
    }

    /// The fault for the request arriving now, consuming one use of it.
    pub(crate) fn take_fault(&self) -> Option<Fault> {
        let mut slot = lock(&self.fault);
        let (fault, count) = (*slot)?;
        match count {
            None => Some(fault),
            Some(0) => {
                *slot = None;
                None
            }
            Some(n) => {
                *slot = if n <= 1 { None } else { Some((fault, Some(n - 1))) };
                Some(fault)
            }
        }
    }

    pub(crate) fn record(&self, path: &str, model: &str, prompt_head: String, headers: Vec<(String, String)>) {
        let r = RequestRecord { path: path.into(), model: model.into(), at: Instant::now(), prompt_head, headers };
        lock(&self.log).push(r);
    }

    /// Every inference request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.log).clone()
    }

    /// Number of inference requests received so far.
    pub fn request_count(&self) -> usize {
        lock(&self.log).len()
    }

    /// Requests that ran to completion.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }

    /// Requests whose client went away before the answer was complete.
    pub fn cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Requests refused with 401 for a missing or wrong `Authorization` (`--api-key`).
    pub fn unauthorized(&self) -> u64 {
        self.unauthorized.load(Ordering::Relaxed)
    }

    pub(crate) fn count_unauthorized(&self) {
        self.unauthorized.fetch_add(1, Ordering::Relaxed);
    }

    /// Sequences running now.
    pub fn running(&self) -> u64 {
        self.running.load(Ordering::Relaxed)
    }

    /// Report `waiting` queued and `running` running requests of `model` in `/metrics` on top
    /// of the real ones, as a busy engine would (an autoscaler's load without the traffic); a
    /// model other than the first gets samples of its own from then on (`(0, 0)`: an idle one).
    pub fn set_reported_load(&self, model: &str, waiting: u64, running: u64) {
        lock(&self.reported).insert(model.to_string(), (waiting, running));
    }
}

/// A simulator running on a loopback port; stops when dropped.
#[derive(Debug)]
pub struct SimHandle {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    /// Its state, for assertions and fault injection.
    pub state: Arc<SimState>,
    task: tokio::task::JoinHandle<()>,
}

impl SimHandle {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Start a simulator on `config.listen` (use port 0 for a free one), once the configuration
/// passes [`SimConfig::validate`].
pub async fn spawn(config: SimConfig) -> Result<SimHandle, SimError> {
    config.validate()?;
    let listener = tokio::net::TcpListener::bind(&config.listen).await?;
    let addr = listener.local_addr()?;
    let state = SimState::new(config);
    let task = tokio::spawn(server::serve(listener, state.clone(), std::future::pending()));
    Ok(SimHandle { addr, state, task })
}
