//! `flotilla-member-router`: a small reverse proxy inside a member cluster that serves the
//! Gateway API HTTPRoutes Flotilla renders there (docs/member-router.md). `watch` fills
//! reflectors of HTTPRoutes, Services and EndpointSlices; `table::build` (pure) turns them into
//! header value → ready endpoints; the result is bound to outstanding-request counters (`pick`)
//! and swapped in atomically. Requests enter through `front` (routing header, health, models,
//! metrics) and go out through `proxy` (one endpoint per attempt, retried only when the
//! connection could not be made, the answer streamed back as it arrives); `serve` runs the
//! listener and drains on shutdown. A request for a LoRA adapter a route lists is placed by
//! `affinity` (pure) on the record `adapters` keeps of what each endpoint holds, loading it there
//! first through `engine` when needed.

pub mod adapters;
pub mod affinity;
pub mod config;
pub mod engine;
pub mod front;
pub mod metrics;
pub mod pick;
pub mod proxy;
pub mod route;
pub mod serve;
pub mod table;
pub mod watch;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub use config::{GatewayName, RouterConfig};
pub use front::app;
pub use serve::serve;
pub use table::{Route, Table};

use crate::member_router::adapters::{Book, Loader};
use crate::member_router::metrics::RouterMetrics;
use crate::member_router::pick::{Live, Outstanding};

/// The client that reaches endpoints.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// The three watches the table is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    /// `httproutes.gateway.networking.k8s.io`.
    HttpRoutes,
    /// `services`.
    Services,
    /// `endpointslices.discovery.k8s.io`.
    EndpointSlices,
}

impl Watched {
    /// All three.
    pub const ALL: [Watched; 3] = [Watched::HttpRoutes, Watched::Services, Watched::EndpointSlices];

    /// For messages.
    pub fn name(self) -> &'static str {
        match self {
            Watched::HttpRoutes => "HTTPRoutes (gateway.networking.k8s.io/v1)",
            Watched::Services => "Services",
            Watched::EndpointSlices => "EndpointSlices (discovery.k8s.io/v1)",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Default)]
struct SyncState {
    synced: [bool; 3],
    failing: [Option<String>; 3],
    built: bool,
}

/// Whether the table reflects the cluster: a given table always does; a watched one once every
/// watch has listed and the first table was built, and not while a watch is failing.
#[derive(Debug)]
pub struct SyncStatus {
    watching: bool,
    state: Mutex<SyncState>,
}

impl SyncStatus {
    fn lock(&self) -> MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `w` listed everything (or resumed after a failure).
    pub fn listed(&self, w: Watched) {
        let mut s = self.lock();
        s.synced[w.index()] = true;
        s.failing[w.index()] = None;
    }

    /// `w` answered again after failing.
    pub fn recovered(&self, w: Watched) {
        self.lock().failing[w.index()] = None;
    }

    /// `w` is failing with `error`.
    pub fn failing(&self, w: Watched, error: String) {
        self.lock().failing[w.index()] = Some(error);
    }

    /// Whether `w` is failing now.
    pub fn is_failing(&self, w: Watched) -> bool {
        self.lock().failing[w.index()].is_some()
    }

    /// Whether every watch has listed once.
    pub fn all_listed(&self) -> bool {
        self.lock().synced.iter().all(|s| *s)
    }

    /// A table built from all three watches is in force.
    pub fn built(&self) {
        self.lock().built = true;
    }

    /// Whether the table in force reflects the cluster at all: given, or built once from the
    /// watches (a later watch failure leaves the last one serving).
    pub fn has_table(&self) -> bool {
        !self.watching || self.lock().built
    }

    /// `Ok(what)` when ready, else `Err(why not)`.
    pub fn readiness(&self) -> Result<String, String> {
        if !self.watching {
            return Ok("ready: serving a given routing table".into());
        }
        let s = self.lock();
        let mut why: Vec<String> = Vec::new();
        for w in Watched::ALL {
            if let Some(e) = &s.failing[w.index()] {
                why.push(format!("watching {} fails: {e}", w.name()));
            } else if !s.synced[w.index()] {
                why.push(format!("{} not listed yet", w.name()));
            }
        }
        if why.is_empty() && !s.built {
            why.push("routing table not built yet".into());
        }
        if why.is_empty() { Ok("ready: routing table in sync with the cluster".into()) } else { Err(why.join("; ")) }
    }
}

/// Everything a request needs.
#[derive(Debug)]
pub struct MemberRouter {
    /// Configuration.
    pub cfg: RouterConfig,
    /// The table in force; a request keeps the one it started with.
    live: ArcSwap<Live>,
    outstanding: Outstanding,
    /// Metrics.
    pub metrics: RouterMetrics,
    /// The upstream client (pooled; `--connect-timeout-ms`).
    pub client: UpstreamClient,
    /// Readiness.
    pub sync: SyncStatus,
    /// Which adapters each endpoint holds, by URL (kept across table swaps).
    pub adapters: Arc<Book>,
}

impl MemberRouter {
    /// A router whose table the watches (`watch::run`) fill; not ready until they have synced.
    pub fn new(cfg: RouterConfig) -> Arc<Self> {
        Self::make(cfg, Table::default(), true)
    }

    /// A router serving `table` as given, ready at once (tests, and embedding without an API
    /// server); `set_table` replaces it.
    pub fn with_table(cfg: RouterConfig, table: Table) -> Arc<Self> {
        Self::make(cfg, table, false)
    }

    fn make(cfg: RouterConfig, table: Table, watching: bool) -> Arc<Self> {
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(cfg.connect_timeout()));
        conn.set_nodelay(true);
        let client =
            Client::builder(TokioExecutor::new()).pool_idle_timeout(std::time::Duration::from_secs(30)).build(conn);
        let outstanding = Outstanding::default();
        let metrics = RouterMetrics::default();
        metrics.set_routes(table.routes.len());
        let live = ArcSwap::from_pointee(Live::bind(table, &outstanding));
        let sync = SyncStatus { watching, state: Mutex::new(SyncState::default()) };
        let adapters = Arc::new(Book::default());
        Arc::new(MemberRouter { cfg, live, outstanding, metrics, client, sync, adapters })
    }

    /// Put `table` in force (requests in flight finish on the one they started with).
    pub fn set_table(&self, table: Table) {
        self.metrics.set_routes(table.routes.len());
        let urls: HashSet<&str> =
            table.routes.values().flat_map(|r| r.endpoints.iter().map(|e| e.url.as_str())).collect();
        self.adapters.retain(&urls);
        self.live.store(Arc::new(Live::bind(table, &self.outstanding)));
    }

    /// What a task loading an adapter needs.
    pub fn loader(&self) -> Loader {
        Loader {
            book: self.adapters.clone(),
            client: self.client.clone(),
            counters: self.metrics.adapters.clone(),
            timeout: self.cfg.adapter_load_timeout(),
            backoff: self.cfg.adapter_backoff(),
        }
    }

    /// The table in force.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }
}
