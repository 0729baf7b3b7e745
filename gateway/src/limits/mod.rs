//! Where per-key limits are kept. A request of a limited key flows `admit` (before it is
//! routed: both budgets checked, one request taken) and `charge` (after the answer: its
//! tokens); the rest of the gateway sees only this enum. `Local` keeps the buckets in this
//! process (`keys::Limiter`; each replica counts alone), `Shared` keeps them in a Redis server
//! that every replica asks (`shared`), with the same semantics. A key without limits never
//! touches either store, so it is served whatever becomes of the shared one.

mod shared;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use prometheus_client::encoding::EncodeLabelValue;

use crate::GatewayConfig;
use crate::error::GatewayError;
use crate::keys::{ApiKey, KeySet, Limit, Limiter};
use crate::metrics::Metrics;
pub use shared::SharedStore;

/// What a request of a limited key gets while the shared store cannot be asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreUnavailable {
    /// Admitted unchecked (counted in `limits_store_unavailable_total{outcome="admitted"}`,
    /// logged at most every 10 s): an outage of the store is not an outage of the fleet.
    Open,
    /// Refused with 503 `limits_store_unavailable` and `Retry-After`: no request beyond a
    /// budget, at the price of refusing every limited key while the store is down.
    Closed,
}

/// Why a call to the shared limits store failed (`limits_store_errors_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StoreFault {
    /// No answer within `--limits-store-timeout-ms`.
    timeout,
    /// No connection (refused, reset, closed).
    connection,
    /// An error answer (authentication, the script, a read-only replica, an unexpected reply).
    server,
}

/// What became of a request or charge while the limits store was unreachable
/// (`limits_store_unavailable_total{outcome}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StoreOutcome {
    /// Admitted without a check (`--limits-store-unavailable open`).
    admitted,
    /// Refused with 503 (`--limits-store-unavailable closed`).
    refused,
    /// An answer's tokens could not be charged.
    uncharged,
}

/// The kind of shared limits store (`limits_store_up{store}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StoreKind {
    /// A Redis (or Valkey) server.
    redis,
}

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Over a limit; the honest wait until the bucket allows the next request.
    Limit(Limit, Duration),
    /// The shared store cannot be asked and `--limits-store-unavailable closed` is set.
    StoreUnavailable(Duration),
}

/// The URL of the shared store: `redis://` or `rediss://` (TLS, verified against the system's
/// roots), with an optional user, password and database. Shown (`Display`, `Debug`) without
/// its user and password.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl(String);

impl StoreUrl {
    /// The URL as given (with its password: for the client only).
    pub(crate) fn secret(&self) -> &str {
        &self.0
    }
    /// Whether it asks for TLS.
    pub fn tls(&self) -> bool {
        self.0.starts_with("rediss://")
    }
}

impl FromStr for StoreUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let Some((scheme, rest)) = s.split_once("://") else {
            return Err("the limits store must be a URL: redis://host:6379[/db] or rediss://host:6379[/db]".into());
        };
        if scheme != "redis" && scheme != "rediss" {
            return Err(format!(
                "limits store scheme `{scheme}` is not supported: use redis://host:6379[/db] or rediss:// for TLS"
            ));
        }
        if rest.contains('#') {
            return Err(
                "the limits store URL may not carry a fragment (`#insecure` would turn off certificate checks): give the server a certificate the system's roots trust"
                    .into(),
            );
        }
        let url = StoreUrl(s.to_string());
        redis::Client::open(s).map_err(|e| format!("limits store {url}: {e}"))?;
        Ok(url)
    }
}

impl fmt::Display for StoreUrl {
    /// `scheme://host:port/db`, without user and password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (scheme, rest) = self.0.split_once("://").unwrap_or(("", &self.0));
        let end = rest.find('/').unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        write!(f, "{scheme}://{host}{path}")
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

/// The store in force.
#[derive(Debug)]
pub enum LimitStore {
    /// Buckets in this process: each gateway replica counts alone.
    Local(Limiter),
    /// Buckets in a Redis server shared by every replica.
    Shared(SharedStore),
}

impl Default for LimitStore {
    fn default() -> Self {
        LimitStore::Local(Limiter::default())
    }
}

impl LimitStore {
    /// The store `cfg` asks for: `--limits-store`, or this process. The shared store connects
    /// in the background (it must be created inside a Tokio runtime).
    pub fn from_config(cfg: &GatewayConfig, metrics: Arc<Metrics>) -> Result<Self, GatewayError> {
        let Some(url) = &cfg.limits_store else { return Ok(LimitStore::default()) };
        let store = SharedStore::start(
            url,
            cfg.limits_store_prefix.clone(),
            Duration::from_millis(cfg.limits_store_timeout_ms.max(1)),
            cfg.limits_store_unavailable,
            metrics,
        )?;
        Ok(LimitStore::Shared(store))
    }

    /// Admit one request of `key` now, or say why not.
    pub async fn admit(&self, key: &ApiKey) -> Result<(), Refused> {
        if key.requests_per_minute.is_none() && key.tokens_per_minute.is_none() {
            return Ok(());
        }
        match self {
            LimitStore::Local(l) => l.admit(key, Instant::now()).map_err(|(limit, wait)| Refused::Limit(limit, wait)),
            LimitStore::Shared(s) => s.admit(key).await,
        }
    }

    /// Charge `tokens` used by an answer to `key`.
    pub async fn charge(&self, key: &ApiKey, tokens: u64) {
        if key.tokens_per_minute.is_none() {
            return;
        }
        match self {
            LimitStore::Local(l) => l.charge(key, tokens, Instant::now()),
            LimitStore::Shared(s) => s.charge(key, tokens).await,
        }
    }

    /// Forget keys that are no longer in force (the shared store's expire by themselves).
    pub fn retain(&self, set: &KeySet) {
        if let LimitStore::Local(l) = self {
            l.retain(set);
        }
    }

    /// For the startup log: where budgets are kept.
    pub fn describe(&self) -> String {
        match self {
            LimitStore::Local(_) => "this process (each replica counts alone)".into(),
            LimitStore::Shared(s) => s.describe(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_shown_without_credentials() {
        let u: StoreUrl = "redis://flotilla:s3cret@redis.example:6380/2".parse().unwrap();
        assert_eq!(u.to_string(), "redis://redis.example:6380/2");
        assert!(!format!("{u:?}").contains("s3cret"));
        assert_eq!(u.secret(), "redis://flotilla:s3cret@redis.example:6380/2");
        assert!(!u.tls());
        let t: StoreUrl = "rediss://:pw@cache.internal:6379".parse().unwrap();
        assert_eq!(t.to_string(), "rediss://cache.internal:6379");
        assert!(t.tls());
        let e = "http://redis:6379".parse::<StoreUrl>().unwrap_err();
        assert!(e.contains("`http` is not supported"), "{e}");
        let e = "rediss://redis:6379/#insecure".parse::<StoreUrl>().unwrap_err();
        assert!(e.contains("#insecure"), "{e}");
        assert!("redis-host:6379".parse::<StoreUrl>().unwrap_err().contains("must be a URL"));
    }
}
