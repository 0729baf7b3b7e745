//! The fleet gateway: one OpenAI-compatible endpoint that routes each request to a healthy cluster
//! its model is allowed in. Requests flow `edge` (request id, header count) → `http` (validation) →
//! `proxy` (fallback chain and attempt loop, decided by `attempts`, choosing with `pick` over
//! `health`) → `upstream` (one attempt) → `sse` (stream relay through a `splice`; `continuation`
//! finishes a stream that breaks on another route); the routing `table` is swapped atomically, from a file by `serve`'s reload loop or from
//! the control cluster by `feed` (built by `fleet`). API `keys` are checked in `http` and their
//! budgets in `limits` (this process, or a Redis server shared by every replica); what the gateway
//! sees is kept by `feedback` and written back by `feed`; `probe` brings ejected routes back
//! without spending user requests on them. `autoscale` holds requests for models scaled to zero
//! and, on the elected replica, decides replica counts.

mod adapters;
mod attempts;
pub mod autoscale;
pub mod breaker;
pub mod config;
pub mod continuation;
pub mod edge;
pub mod error;
pub mod feed;
pub mod feedback;
pub mod fleet;
pub mod health;
pub mod http;
pub mod keys;
pub mod limits;
pub mod member;
pub mod member_router;
pub mod metrics;
pub mod pick;
pub mod probe;
pub mod process;
pub mod proxy;
pub mod scrape;
pub mod serve;
pub mod splice;
pub mod split;
pub mod sse;
pub mod table;
pub mod tls;
pub mod upstream;
pub mod validate;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
pub use config::GatewayConfig;
pub use error::GatewayError;
pub use http::app;
pub use table::RoutingTable;
use tokio::sync::Semaphore;

use crate::config::ms;
use crate::feed::FeedStatus;
use crate::feedback::Stats;
use crate::health::{BreakerConfig, HealthRegistry, lock};
use crate::keys::KeySet;
use crate::limits::LimitStore;
use crate::metrics::{Metrics, ReloadResult};

/// Everything a request needs: configuration, the current table, cluster health, metrics,
/// the upstream client and the concurrency limit.
#[derive(Debug)]
pub struct AppState {
    /// Configuration.
    pub cfg: GatewayConfig,
    /// The routing table in force; in-flight requests keep the one they started with.
    pub table: ArcSwap<RoutingTable>,
    /// Per-cluster and per-route health.
    pub health: HealthRegistry,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Upstream client of the first event loop (the caller's runtime, `serve::run`).
    pub client: upstream::Client,
    /// Those of the other event loops, one each: a loop's pooled connections live on its thread.
    pub worker_clients: Vec<upstream::Client>,
    /// Concurrency limit.
    pub limit: Arc<Semaphore>,
    /// API keys in force.
    pub keys: ArcSwap<KeySet>,
    /// Per-key limits: in this process, or shared by every replica.
    pub limiter: LimitStore,
    /// What the gateway saw, per model and cluster.
    pub stats: Stats,
    /// Answers per model and deployment, for models split by weight (`split`).
    pub shares: Stats,
    /// The control-cluster feed's state (`/readyz`).
    pub feed: FeedStatus,
    /// Fleet demand per model and the requests held for models scaled to zero.
    pub autoscale: autoscale::Autoscale,
    keys_text: Mutex<Option<String>>,
    rr: AtomicU64,
    jitter: Mutex<u64>,
    table_text: Mutex<String>,
}

impl AppState {
    /// State with `table` in force and per-key limits kept in this process.
    pub fn new(cfg: GatewayConfig, table: RoutingTable) -> Arc<Self> {
        Self::with_limits(cfg, table, Arc::new(Metrics::default()), LimitStore::default())
    }

    fn with_limits(
        cfg: GatewayConfig,
        mut table: RoutingTable,
        metrics: Arc<Metrics>,
        limiter: LimitStore,
    ) -> Arc<Self> {
        let breaker = BreakerConfig {
            failures: cfg.breaker_failures.max(1),
            open: ms(cfg.breaker_open_ms),
            max_open: ms(cfg.breaker_max_open_ms.max(cfg.breaker_open_ms)),
        };
        let health = HealthRegistry::new(breaker, metrics.clone());
        health.bind(&mut table);
        Arc::new(AppState {
            health,
            client: upstream::client(ms(cfg.connect_timeout_ms)),
            worker_clients: (1..cfg.workers()).map(|_| upstream::client(ms(cfg.connect_timeout_ms))).collect(),
            limit: Arc::new(Semaphore::new(cfg.max_concurrency.max(1))),
            jitter: Mutex::new(cfg.seed),
            rr: AtomicU64::new(0),
            table: ArcSwap::from_pointee(table),
            table_text: Mutex::new(String::new()),
            keys: ArcSwap::from_pointee(plain_keys(&cfg)),
            limiter,
            stats: Stats::default(),
            shares: Stats::default(),
            feed: FeedStatus::new(cfg.control_cluster),
            autoscale: autoscale::Autoscale::default(),
            keys_text: Mutex::new(None),
            metrics,
            cfg,
        })
    }

    /// State with the table read from `cfg.config` (empty until the feed fills it in
    /// control-cluster mode), the keys from `cfg.keys_file` and the limits store of
    /// `--limits-store` (which connects in the background: call inside a Tokio runtime).
    /// Refused without a key source unless `--allow-anonymous`.
    pub fn load(cfg: GatewayConfig) -> Result<Arc<Self>, GatewayError> {
        cfg.check_auth().map_err(GatewayError::Config)?;
        if cfg.allow_anonymous && !cfg.auth_required() {
            tracing::warn!(listen = %cfg.listen, "serving WITHOUT authentication (--allow-anonymous): anyone reaching the listener may use every model");
        }
        let metrics = Arc::new(Metrics::default());
        let limiter = LimitStore::from_config(&cfg, metrics.clone())?;
        tracing::info!(store = %limiter.describe(), "per-key limits are kept in");
        let st = AppState::with_limits(cfg, RoutingTable::default(), metrics, limiter);
        st.reload()?;
        st.reload_keys()?;
        Ok(st)
    }

    /// Re-read the keys file; `Ok(true)` when changed keys were put in force. A file that does
    /// not parse leaves the keys in force untouched; a key with a bad field is left out.
    pub fn reload_keys(&self) -> Result<bool, GatewayError> {
        let Some(file) = &self.cfg.keys_file else { return Ok(false) };
        let path = file.display().to_string();
        let err = |message: String| GatewayError::Keys { origin: path.clone(), message };
        let text = std::fs::read_to_string(file).map_err(|e| err(e.to_string()))?;
        let mut last = lock(&self.keys_text);
        if last.as_deref() == Some(text.as_str()) {
            return Ok(false);
        }
        KeySet::parses(&text).map_err(err)?;
        let (mut set, problems) = KeySet::from_documents([(path.as_str(), text.as_str())]);
        *last = Some(text);
        for p in &problems {
            tracing::error!(problem = %p, "API key left out");
        }
        self.install_keys(&mut set);
        Ok(true)
    }

    /// Put `set` (plus the command line's plain keys) in force.
    pub fn install_keys(&self, set: &mut KeySet) {
        set.add_plain(&self.cfg.api_keys);
        self.limiter.retain(set);
        tracing::info!(keys = set.len(), "API keys in force");
        self.keys.store(Arc::new(std::mem::take(set)));
    }

    /// Re-read the table file; `Ok(true)` when a changed table was put in force. An invalid
    /// file leaves the table in force untouched. Without a file (control-cluster mode): nothing.
    pub fn reload(&self) -> Result<bool, GatewayError> {
        let Some(file) = &self.cfg.config else { return Ok(false) };
        let path = file.display().to_string();
        let text = std::fs::read_to_string(file)
            .map_err(|e| GatewayError::Table { path: path.clone(), message: e.to_string() })?;
        let mut last = lock(&self.table_text);
        if *last == text {
            return Ok(false);
        }
        let parsed = RoutingTable::from_yaml(&path, &text);
        *last = text;
        match parsed {
            Ok(t) => {
                self.set_table(t);
                self.metrics.reload(ReloadResult::applied);
                Ok(true)
            }
            Err(e) => {
                self.metrics.reload(ReloadResult::invalid);
                Err(e)
            }
        }
    }

    /// Put `t` in force, its routes bound to the health kept for them.
    pub fn set_table(&self, mut t: RoutingTable) {
        for n in t.notes() {
            tracing::warn!(note = %n, "routing table");
        }
        // A cluster whose URL or credential changed gets a fresh chance.
        let old = self.table.load();
        for c in t.clusters() {
            let same = old.clusters().any(|o| o.name == c.name && o.url == c.url && o.auth == c.auth && o.tls == c.tls);
            if !same && self.health.get(&c.name).clear_fault().is_some() {
                tracing::info!(cluster = %c.name, "cluster entry point changed; its configuration fault is cleared");
            }
        }
        self.health.bind(&mut t);
        self.table.store(Arc::new(t));
        self.autoscale.activation.table_changed();
    }

    /// The client for `cluster`: the shared plain one, or the cluster's own TLS one.
    pub fn conn<'a>(&'a self, cluster: &'a table::Cluster) -> upstream::Conn<'a> {
        match &cluster.tls {
            None => upstream::Conn::Plain(match serve::worker() {
                0 => &self.client,
                i => self.worker_clients.get(i - 1).unwrap_or(&self.client),
            }),
            Some(t) => upstream::Conn::Tls(t.client(ms(self.cfg.connect_timeout_ms))),
        }
    }

    pub(crate) fn next_rr(&self) -> u64 {
        self.rr.fetch_add(1, Ordering::Relaxed)
    }

    /// Backoff before retry `n` (1-based): half of `base·2^(n-1)` (capped) plus up to as much again.
    pub(crate) fn backoff(&self, n: u32) -> Duration {
        let full =
            self.cfg.backoff_base_ms.saturating_mul(1u64 << n.saturating_sub(1).min(20)).min(self.cfg.backoff_max_ms);
        let mut s = lock(&self.jitter);
        *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let r = pick::hash(*s, b"jitter");
        let half = full / 2;
        ms(half + if half == 0 { 0 } else { r % (half + 1) })
    }
}

fn plain_keys(cfg: &GatewayConfig) -> KeySet {
    let mut set = KeySet::default();
    set.add_plain(&cfg.api_keys);
    set
}
