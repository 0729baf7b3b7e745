//! The shared store: per-key buckets in a Redis (or Valkey) server that every gateway replica
//! asks. Each admission and each charge is one call of `limits.lua` (EVALSHA, loaded again
//! after a server restart) on the hash `<prefix>:<key id>`, atomic on the server and timed by
//! the server's clock. Every call is bounded by `--limits-store-timeout-ms`; the request of a
//! call that fails is decided as if the store were down, and `--limits-store-failures` failed
//! calls in a row (any answer resets the count) mark it down, so one slow call does not. While
//! it is down no request waits for it: each is checked against this replica's share in this
//! process, or admitted, or refused, at once (`--limits-store-unavailable`), counted and
//! logged at most every 10 s, until a background probe (every 500 ms, reconnecting as needed)
//! finds it answering again.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisError, Script};

use super::{Outage, Refused, StoreFault, StoreKind, StoreOutcome, StoreUnavailable, StoreUrl, share};
use crate::error::GatewayError;
use crate::health::lock;
use crate::keys::{ApiKey, Limit, Limiter};
use crate::metrics::Metrics;

const SCRIPT: &str = include_str!("limits.lua");
/// How often an unreachable store is asked again; refused clients are told to wait a second.
const PROBE: Duration = Duration::from_millis(500);
/// Time a background probe may take to connect (a TLS handshake included) and load the script.
const CONNECT: Duration = Duration::from_secs(2);
/// Least time between two log lines about requests served while the store is unreachable.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// Failed probes in a row after which the connection is dropped and a new one made (a
/// connection to a vanished host may hang rather than fail).
const FRESH_AFTER: u32 = 3;

/// Buckets in a Redis server shared by every replica.
pub struct SharedStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    conn: ArcSwap<ConnectionManager>,
    script: Script,
    prefix: String,
    timeout: Duration,
    outage: Outage,
    url: StoreUrl,
    /// Not marked down: the last probe answered and fewer than `outage.failures` calls in a
    /// row have failed since.
    up: AtomicBool,
    /// Calls failed in a row.
    failed: AtomicU32,
    /// This replica's shares of the limits, checked while the store is down (`Local`).
    fallback: Limiter,
    metrics: Arc<Metrics>,
    log: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    last: Option<Instant>,
    unlogged: u64,
}

impl fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedStore")
            .field("url", &self.inner.url)
            .field("prefix", &self.inner.prefix)
            .field("up", &self.inner.up.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn manager(client: &Client) -> Result<ConnectionManager, RedisError> {
    // Calls carry their own timeout; the manager only (re)connects, in the background.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(100))
        .set_max_delay(PROBE);
    ConnectionManager::new_lazy_with_config(client.clone(), config)
}

fn classify(e: &RedisError) -> StoreFault {
    if e.is_timeout() {
        StoreFault::timeout
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        StoreFault::connection
    } else {
        StoreFault::server
    }
}

impl SharedStore {
    /// A store on `url` that connects in the background; it counts as down until its first
    /// answer. Must be called inside a Tokio runtime.
    pub fn start(
        url: &StoreUrl,
        prefix: String,
        timeout: Duration,
        outage: Outage,
        metrics: Arc<Metrics>,
    ) -> Result<Self, GatewayError> {
        let config = |m: String| GatewayError::Config(format!("--limits-store {url}: {m}"));
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(config("the shared limits store must be started inside a Tokio runtime".into()));
        }
        if url.tls() {
            // rustls takes the process's provider; the gateway's TLS is ring throughout.
            flotilla_apis::crypto::install_crypto();
        }
        let client = Client::open(url.secret()).map_err(|e| config(e.to_string()))?;
        let conn = manager(&client).map_err(|e| config(e.to_string()))?;
        metrics.set_store_up(StoreKind::redis, false);
        let inner = Arc::new(Inner {
            client,
            conn: ArcSwap::from_pointee(conn),
            script: Script::new(SCRIPT),
            prefix,
            timeout,
            outage,
            url: url.clone(),
            up: AtomicBool::new(false),
            failed: AtomicU32::new(0),
            fallback: Limiter::default(),
            metrics,
            log: Mutex::new(LogState::default()),
        });
        tokio::spawn(watch(Arc::downgrade(&inner)));
        Ok(SharedStore { inner })
    }

    /// Admit one request of `key` (both budgets checked, one request taken), or say why not.
    pub async fn admit(&self, key: &ApiKey) -> Result<(), Refused> {
        let i = &self.inner;
        if !i.up.load(Ordering::Relaxed) {
            return i.unavailable(key);
        }
        match i.call("admit", key, 0).await {
            Ok(v) => match v.as_slice() {
                [1, _, _] => Ok(()),
                [0, kind, wait_ms] => {
                    let limit = if *kind == 2 { Limit::Tokens } else { Limit::Requests };
                    Err(Refused::Limit(limit, Duration::from_millis(u64::try_from(*wait_ms).unwrap_or(0))))
                }
                other => {
                    i.failed(StoreFault::server, &format!("unexpected answer from the limits script: {other:?}"));
                    i.unavailable(key)
                }
            },
            Err((fault, detail)) => {
                i.failed(fault, &detail);
                i.unavailable(key)
            }
        }
    }

    /// Charge `tokens` used by an answer to `key`; lost (counted) while the store is down.
    pub async fn charge(&self, key: &ApiKey, tokens: u64) {
        let i = &self.inner;
        if !i.up.load(Ordering::Relaxed) {
            i.uncharged(key, tokens);
            return;
        }
        if let Err((fault, detail)) = i.call("charge", key, tokens).await {
            i.failed(fault, &detail);
            i.uncharged(key, tokens);
        }
    }

    /// Where budgets are kept, for the startup log.
    pub fn describe(&self) -> String {
        let i = &self.inner;
        format!(
            "{} (shared by every replica; hashes {}:<key id>; {} ms per call; down after {} failed calls in a row; while down: {})",
            i.url,
            i.prefix,
            i.timeout.as_millis(),
            i.outage.failures,
            match i.outage.mode {
                StoreUnavailable::Local =>
                    format!("check each limit divided by {} replicas in this process", i.outage.replicas),
                StoreUnavailable::Open => "admit unchecked".into(),
                StoreUnavailable::Closed => "refuse with 503".into(),
            }
        )
    }
}

impl Inner {
    /// One call of the script, bounded by the timeout.
    async fn call(&self, op: &str, key: &ApiKey, tokens: u64) -> Result<Vec<i64>, (StoreFault, String)> {
        let mut conn = ConnectionManager::clone(&self.conn.load());
        let mut inv = self.script.key(format!("{}:{}", self.prefix, key.id));
        inv.arg(op).arg(key.requests_per_minute.unwrap_or(0)).arg(key.tokens_per_minute.unwrap_or(0)).arg(tokens);
        match tokio::time::timeout(self.timeout, inv.invoke_async::<Vec<i64>>(&mut conn)).await {
            Ok(Ok(v)) => {
                self.failed.store(0, Ordering::Relaxed);
                Ok(v)
            }
            Ok(Err(e)) => Err((classify(&e), e.to_string())),
            Err(_) => Err((StoreFault::timeout, format!("no answer within {} ms", self.timeout.as_millis()))),
        }
    }

    /// A request of `key` while the store cannot be asked: checked against this replica's
    /// share, admitted or refused, as configured.
    fn unavailable(&self, key: &ApiKey) -> Result<(), Refused> {
        let decision = match self.outage.mode {
            StoreUnavailable::Local => self
                .fallback
                .admit(&share(key, self.outage.replicas), Instant::now())
                .map_err(|(limit, wait)| Refused::Limit(limit, wait)),
            StoreUnavailable::Open => Ok(()),
            StoreUnavailable::Closed => Err(Refused::StoreUnavailable(PROBE)),
        };
        let outcome = match (self.outage.mode, &decision) {
            (StoreUnavailable::Local, Ok(())) => StoreOutcome::local_admitted,
            (StoreUnavailable::Local, Err(_)) => StoreOutcome::local_refused,
            (StoreUnavailable::Open, _) => StoreOutcome::admitted,
            (StoreUnavailable::Closed, _) => StoreOutcome::refused,
        };
        self.metrics.store_unavailable(outcome);
        let mut l = lock(&self.log);
        l.unlogged += 1;
        let now = Instant::now();
        if l.last.is_none_or(|t| now.duration_since(t) >= LOG_EVERY) {
            let what = match self.outage.mode {
                StoreUnavailable::Local => "checked against this replica's share of each limit",
                StoreUnavailable::Open => "admitted unchecked",
                StoreUnavailable::Closed => "refused with 503",
            };
            tracing::warn!(
                store = %self.url,
                requests = l.unlogged,
                outcome = ?outcome,
                replicas = self.outage.replicas,
                "the limits store is unreachable: requests of limited keys are {what} (--limits-store-unavailable)"
            );
            l.last = Some(now);
            l.unlogged = 0;
        }
        decision
    }

    /// An answer's tokens the store cannot take: counted, and charged to this replica's share.
    fn uncharged(&self, key: &ApiKey, tokens: u64) {
        self.metrics.store_unavailable(StoreOutcome::uncharged);
        if self.outage.mode == StoreUnavailable::Local {
            self.fallback.charge(&share(key, self.outage.replicas), tokens, Instant::now());
        }
    }

    /// A call failed: count it, and after `outage.failures` in a row mark the store down
    /// (logged once per outage).
    fn failed(&self, fault: StoreFault, detail: &str) {
        self.metrics.store_fault(fault);
        let in_a_row = self.failed.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if in_a_row < self.outage.failures {
            tracing::info!(store = %self.url, reason = ?fault, error = %detail, failed = in_a_row, "a limits store call failed; its request was decided without the store");
            return;
        }
        if self.up.swap(false, Ordering::Relaxed) {
            self.metrics.set_store_up(StoreKind::redis, false);
            tracing::warn!(store = %self.url, reason = ?fault, error = %detail, failed = in_a_row, "limits store unreachable; asking it again in the background");
        }
    }

    /// Connect (within `CONNECT`), load the script, then PING within the call timeout: the
    /// store is up when it answers as fast as requests need.
    async fn probe(&self) -> Result<(), String> {
        let mut conn = ConnectionManager::clone(&self.conn.load());
        match tokio::time::timeout(CONNECT, self.script.load_async(&mut conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err(format!("no connection within {} ms", CONNECT.as_millis())),
        }
        let ping = redis::cmd("PING");
        match tokio::time::timeout(self.timeout, ping.query_async::<String>(&mut conn)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("PING took longer than {} ms", self.timeout.as_millis())),
        }
    }

    fn renew(&self) {
        match manager(&self.client) {
            Ok(m) => self.conn.store(Arc::new(m)),
            Err(e) => tracing::warn!(store = %self.url, error = %e, "could not make a new limits store connection"),
        }
    }
}

/// Ask a down store again every `PROBE` until it answers; ends when the store is dropped.
async fn watch(store: Weak<Inner>) {
    let mut failed = 0u32;
    let mut first = true;
    loop {
        let Some(i) = store.upgrade() else { return };
        if !i.up.load(Ordering::Relaxed) {
            match i.probe().await {
                Ok(()) => {
                    failed = 0;
                    i.failed.store(0, Ordering::Relaxed);
                    i.up.store(true, Ordering::Relaxed);
                    i.metrics.set_store_up(StoreKind::redis, true);
                    tracing::info!(store = %i.url, "limits store answering{}", if first { "" } else { " again" });
                    first = false;
                }
                Err(e) => {
                    failed += 1;
                    if failed == 1 && first {
                        tracing::warn!(store = %i.url, error = %e, "limits store not reachable yet");
                    }
                    if failed.is_multiple_of(FRESH_AFTER) {
                        i.renew();
                    }
                }
            }
        }
        drop(i);
        tokio::time::sleep(PROBE).await;
    }
}
