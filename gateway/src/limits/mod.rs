//! Where per-key limits are kept. A request of a limited key flows `admit` (before it is
//! routed: both budgets checked, one request taken) and `charge` (after the answer: its
//! tokens); the rest of the gateway sees only this enum. `Local` keeps the buckets in this
//! process (`keys::Limiter`; each replica counts alone), `Shared` keeps them in a Redis server
//! that every replica asks (`shared`), with the same semantics; while that server cannot be
//! asked, each replica checks its own share of every limit (`share`) in this process, unless
//! told to admit or refuse instead. A key without limits never touches either store, so it is
//! served whatever becomes of the shared one.

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
    /// Checked in this process against this replica's share of each limit (the limit divided
    /// by `--limits-store-replicas`, rounded up; `share`): a key over its share gets 429, the
    /// others are served (counted in `limits_store_unavailable_total{outcome="local_admitted"
    /// |"local_refused"}`). With the replica count right, the fleet admits about the limit.
    Local,
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
    /// Admitted within this replica's share (`--limits-store-unavailable local`).
    local_admitted,
    /// Refused with 429: over this replica's share (`--limits-store-unavailable local`).
    local_refused,
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

/// What the shared store does about calls that fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outage {
    /// What requests of limited keys get while it is down.
    pub mode: StoreUnavailable,
    /// Gateway replicas sharing the limits (`--limits-store-replicas`): `Local` checks each
    /// limit divided by this many.
    pub replicas: u32,
    /// Failed calls in a row that mark the store down (`--limits-store-failures`).
    pub failures: u32,
}

/// `key` with each limit cut to one replica's share: divided by `replicas`, rounded up, at
/// least one, so the replicas together admit about the limit (a little more when it does not
/// divide evenly) and never nothing.
pub fn share(key: &ApiKey, replicas: u32) -> ApiKey {
    let n = replicas.max(1);
    ApiKey {
        requests_per_minute: key.requests_per_minute.map(|r| r.div_ceil(n).max(1)),
        tokens_per_minute: key.tokens_per_minute.map(|t| t.div_ceil(u64::from(n)).max(1)),
        ..key.clone()
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
        let outage = Outage {
            mode: cfg.limits_store_unavailable,
            replicas: cfg.limits_store_replicas.max(1),
            failures: cfg.limits_store_failures.max(1),
        };
        let store = SharedStore::start(
            url,
            cfg.limits_store_prefix.clone(),
            Duration::from_millis(cfg.limits_store_timeout_ms.max(1)),
            outage,
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
    fn a_replicas_share_is_the_limit_divided_rounded_up_and_never_nothing() {
        let k = ApiKey {
            id: "team".into(),
            models: vec!["m".into()],
            sovereignty: Default::default(),
            requests_per_minute: Some(60),
            tokens_per_minute: Some(1000),
        };
        let s = share(&k, 3);
        assert_eq!((s.requests_per_minute, s.tokens_per_minute), (Some(20), Some(334)));
        assert_eq!(
            (s.id.as_str(), s.models.as_slice()),
            ("team", ["m".to_string()].as_slice()),
            "only the limits change"
        );
        assert_eq!(share(&k, 1).requests_per_minute, Some(60));
        assert_eq!(share(&k, 0).requests_per_minute, Some(60), "zero replicas is read as one");
        assert_eq!(share(&k, 1000).requests_per_minute, Some(1), "at least one request");
        let free = ApiKey { requests_per_minute: None, tokens_per_minute: None, ..k };
        assert_eq!(share(&free, 3).requests_per_minute, None, "no limit stays no limit");
    }

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
