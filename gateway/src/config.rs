//! The gateway's knobs: command-line flags with environment fallbacks, turned into durations
//! and limits that the proxy, the health tracker and the server read.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

pub use crate::limits::{StoreUnavailable, StoreUrl};
pub use crate::table::Continuation;

/// How a cluster is chosen among the allowed, healthy ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RoutingMode {
    /// Prefix affinity with bounded load, least load otherwise (the default).
    Prefix,
    /// The least loaded cluster (in-flight plus scraped queue), latency as tie-break.
    LeastLoad,
    /// Round robin (for comparison in benchmarks).
    RoundRobin,
}

/// `flotilla-gateway`: one OpenAI-compatible URL for every model in the fleet.
#[derive(Parser, Clone, Debug)]
#[command(
    name = "flotilla-gateway",
    version,
    about = "One OpenAI-compatible URL for every model in the fleet",
    after_help = "Examples:\n  flotilla-gateway --config gateway/examples/routing.yaml --listen 127.0.0.1:8080\n  flotilla-gateway --control-cluster --keys-namespace flotilla-system --listen 0.0.0.0:8080"
)]
pub struct GatewayConfig {
    /// Address to listen on.
    #[arg(long, env = "FLOTILLA_GATEWAY_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: String,
    /// The routing table (YAML) for standalone use; re-read when it changes and on SIGHUP.
    #[arg(long, env = "FLOTILLA_GATEWAY_CONFIG", required_unless_present = "control_cluster")]
    pub config: Option<PathBuf>,
    /// Build the routing table from the control cluster's InferenceClusters and ModelDeployments
    /// (watched; swapped on change) and write the `Serving` condition back.
    #[arg(long, env = "FLOTILLA_GATEWAY_CONTROL_CLUSTER", conflicts_with = "config")]
    pub control_cluster: bool,
    /// Kubeconfig of the control cluster (default: in-cluster config, then $KUBECONFIG or ~/.kube/config).
    #[arg(long, env = "FLOTILLA_GATEWAY_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// API keys as YAML (`keys:` with each key's sha256, models, jurisdictions and limits); re-read on change.
    #[arg(long, env = "FLOTILLA_GATEWAY_KEYS_FILE")]
    pub keys_file: Option<PathBuf>,
    /// Namespace whose Secrets labelled `flotilla.dev/api-keys=true` hold API keys (data key `keys.yaml`).
    #[arg(long, env = "FLOTILLA_GATEWAY_KEYS_NAMESPACE", requires = "control_cluster")]
    pub keys_namespace: Option<String>,
    /// Namespace whose Secrets hold the upstream tokens and certificates that InferenceClusters'
    /// `spec.endpointAuth` names (watched; a reference to another namespace is refused).
    #[arg(long, env = "FLOTILLA_GATEWAY_UPSTREAM_SECRETS_NAMESPACE", requires = "control_cluster")]
    pub upstream_secrets_namespace: Option<String>,
    /// Namespace of the Lease electing the one replica that writes `Serving` conditions.
    #[arg(long, default_value = "flotilla-system")]
    pub lease_namespace: String,
    /// Name of that Lease.
    #[arg(long, default_value = "flotilla-gateway")]
    pub lease_name: String,
    /// This replica's identity in the Lease (default: hostname and pid).
    #[arg(long)]
    pub identity: Option<String>,
    /// Lease duration, in seconds.
    #[arg(long, default_value_t = 15)]
    pub lease_duration: u64,
    /// Least time between two `Serving` writes to one ModelDeployment whose status and reason did
    /// not change, in milliseconds (0: never write `Serving`).
    #[arg(long, default_value_t = 10_000)]
    pub feedback_interval_ms: u64,
    /// Error rate over the last minute from which a cluster counts as degraded in `Serving`.
    #[arg(long, default_value_t = 0.05)]
    pub degraded_error_rate: f64,
    /// Queue-length equivalent of a full KV cache (scraped `vllm:gpu_cache_usage_perc` /
    /// `vllm:kv_cache_usage_perc`) added to a cluster's load when choosing.
    #[arg(long, default_value_t = 8.0)]
    pub kv_cache_weight: f64,
    /// How often the routing table file is checked for changes, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub reload_interval_ms: u64,
    /// API keys clients must send as `Authorization: Bearer` (comma-separated). Full-access
    /// keys in plain text; prefer --keys-file or --keys-namespace, which store digests.
    #[arg(long, env = "FLOTILLA_GATEWAY_API_KEYS", value_delimiter = ',')]
    pub api_keys: Vec<String>,
    /// Serve without authentication when no key source (--api-keys, --keys-file,
    /// --keys-namespace) is given: anyone who can reach the listener may use every model.
    /// Without it, starting with no key source is refused; with a key source it changes nothing.
    #[arg(long, env = "FLOTILLA_GATEWAY_ALLOW_ANONYMOUS")]
    pub allow_anonymous: bool,
    /// Keep per-key limits in a Redis (or Valkey) server shared by every gateway replica:
    /// `redis://[user:password@]host:6379[/db]`, or `rediss://` for TLS (verified against the
    /// system's roots). Unset: in this process, so N replicas give each key N times its limits.
    /// Prefer the environment variable when the URL carries a password.
    #[arg(long, env = "FLOTILLA_GATEWAY_LIMITS_STORE", hide_env_values = true)]
    pub limits_store: Option<StoreUrl>,
    /// Longest time one call to the limits store may take before it counts as unreachable, in
    /// milliseconds (a request of a limited key waits at most this long for it).
    #[arg(long, env = "FLOTILLA_GATEWAY_LIMITS_STORE_TIMEOUT_MS", default_value_t = 100)]
    pub limits_store_timeout_ms: u64,
    /// What requests of limited keys get while the limits store is unreachable: `local`
    /// (checked in this process against the limit divided by --limits-store-replicas: 429 over
    /// it), `open` (admitted unchecked, counted and logged) or `closed` (503
    /// `limits_store_unavailable` with `Retry-After`). Keys without limits are served either way.
    #[arg(long, value_enum, env = "FLOTILLA_GATEWAY_LIMITS_STORE_UNAVAILABLE", default_value_t = StoreUnavailable::Local)]
    pub limits_store_unavailable: StoreUnavailable,
    /// Gateway replicas sharing the limits store: while it is unreachable each replica checks
    /// every limit divided by this many (rounded up), so the fleet admits about the limit.
    #[arg(long, env = "FLOTILLA_GATEWAY_LIMITS_STORE_REPLICAS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub limits_store_replicas: u32,
    /// Calls to the limits store failed in a row (timed out, refused, an error answer) that mark
    /// it unreachable until a background probe answers; a failed call's own request is decided
    /// as if it were unreachable.
    #[arg(long, env = "FLOTILLA_GATEWAY_LIMITS_STORE_FAILURES", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub limits_store_failures: u32,
    /// Prefix of the limits store's keys: one hash per API key, `<prefix>:<key id>`.
    #[arg(long, env = "FLOTILLA_GATEWAY_LIMITS_STORE_PREFIX", default_value = "flotilla:limits")]
    pub limits_store_prefix: String,
    /// Upstream attempts per model (first try plus retries).
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// Total time for all attempts of one request until the first response byte, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    pub deadline_ms: u64,
    /// TCP connect timeout, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub connect_timeout_ms: u64,
    /// Time to first token of a streamed answer before failing over, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub ttft_timeout_ms: u64,
    /// Time for a whole non-streamed answer before failing over, in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    pub request_timeout_ms: u64,
    /// Longest gap between stream chunks before the stream is declared stalled, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub idle_timeout_ms: u64,
    /// First retry backoff, in milliseconds (doubles per retry, equal jitter).
    #[arg(long, default_value_t = 50)]
    pub backoff_base_ms: u64,
    /// Largest retry backoff, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub backoff_max_ms: u64,
    /// Longest upstream `Retry-After` the gateway waits for itself, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub max_retry_after_ms: u64,
    /// Longest `Retry-After` passed on to a client when every route is rate limited, in seconds.
    #[arg(long, default_value_t = 120)]
    pub retry_after_cap_s: u64,
    /// Consecutive failures that open a circuit (a cluster's for transport failures, a
    /// model's on a cluster for its engine's 5xx).
    #[arg(long, default_value_t = 5)]
    pub breaker_failures: u32,
    /// How long a circuit stays open before a half-open probe, in milliseconds (doubles on a failed probe).
    #[arg(long, default_value_t = 5000)]
    pub breaker_open_ms: u64,
    /// Longest open period, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    pub breaker_max_open_ms: u64,
    /// How often an ejected route's cluster is probed (`GET /v1/models`, jittered by ±25%),
    /// in milliseconds (0: never; circuits then reopen only when their period ends).
    #[arg(long, default_value_t = 2000)]
    pub probe_interval_ms: u64,
    /// Time a probe may take, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub probe_timeout_ms: u64,
    /// Time the probe's real request may take, in milliseconds: when a cluster's model list
    /// cannot tell whether an ejected model serves (the list does not name it, or is no list),
    /// the probe asks the model for one token (`probe.rs`).
    #[arg(long, default_value_t = 3000)]
    pub probe_request_timeout_ms: u64,
    /// How a cluster is chosen.
    #[arg(long, value_enum, default_value_t = RoutingMode::Prefix)]
    pub routing: RoutingMode,
    /// Prompt bytes hashed for prefix affinity.
    #[arg(long, default_value_t = 256)]
    pub prefix_bytes: usize,
    /// Bounded-load factor: an affine cluster is skipped above this multiple of the mean load.
    #[arg(long, default_value_t = 1.25)]
    pub load_factor: f64,
    /// How often each cluster's `/metrics` is scraped for vLLM's queue depth and KV-cache use,
    /// in milliseconds (0: never, for entry points that are not vLLM engines).
    #[arg(long, default_value_t = 2000)]
    pub scrape_interval_ms: u64,
    /// Answers without vLLM metrics in a row (a 404, another server's page) after which a
    /// cluster is scraped at doubling intervals, logged once (0: never back off).
    #[arg(long, default_value_t = 3)]
    pub scrape_quiet_after: u32,
    /// Longest interval between scrapes of a cluster without vLLM metrics, in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    pub scrape_max_interval_ms: u64,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Time a client has to send its whole request body once the head has arrived, in
    /// milliseconds; slower bodies get 408. No concurrency slot is held while a body arrives.
    #[arg(long, default_value_t = 30_000)]
    pub body_timeout_ms: u64,
    /// Largest upstream server-sent event, in bytes; a longer one (or one that never ends)
    /// ends the stream with an error event (502 before the first byte).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_event_bytes: usize,
    /// Largest request head (request line and headers), in bytes.
    #[arg(long, default_value_t = 64 << 10)]
    pub max_header_bytes: usize,
    /// Most request header fields accepted (each repeated field counts); more get 431.
    #[arg(long, default_value_t = 100)]
    pub max_headers: usize,
    /// Requests served at once (counted once their body has arrived); more get 503 with `Retry-After`.
    #[arg(long, default_value_t = 1024)]
    pub max_concurrency: usize,
    /// `Retry-After` seconds sent with 503 when no allowed cluster can serve.
    #[arg(long, default_value_t = 1)]
    pub unavailable_retry_after_s: u64,
    /// How often the elected replica decides the replica count of every ModelDeployment with
    /// `spec.autoscaling`, in milliseconds (0: never; KEDA or an HPA may then scale them).
    #[arg(long, env = "FLOTILLA_GATEWAY_AUTOSCALE_INTERVAL_MS", default_value_t = 15_000)]
    pub autoscale_interval_ms: u64,
    /// How long a request for a model scaled to zero is held for a replica to become Ready,
    /// in milliseconds; then 503 with `Retry-After`.
    #[arg(long, env = "FLOTILLA_GATEWAY_ACTIVATION_TIMEOUT_MS", default_value_t = 300_000)]
    pub activation_timeout_ms: u64,
    /// Requests held at once per model scaled to zero, on each replica; more get 503
    /// `activation_queue_full` at once. A held request holds no concurrency slot.
    #[arg(long, env = "FLOTILLA_GATEWAY_ACTIVATION_QUEUE", default_value_t = 256)]
    pub activation_queue: usize,
    /// Body bytes held at once per model scaled to zero, on each replica; a request that would
    /// cross it gets 503 `activation_queue_full` at once.
    #[arg(long, env = "FLOTILLA_GATEWAY_ACTIVATION_QUEUE_BYTES", default_value_t = 64 << 20)]
    pub activation_queue_bytes: usize,
    /// Requests held at once for every model scaled to zero together, on each replica; more get
    /// 503 `activation_queue_full` at once.
    #[arg(long, env = "FLOTILLA_GATEWAY_ACTIVATION_QUEUE_TOTAL", default_value_t = 1024)]
    pub activation_queue_total: usize,
    /// Body bytes held at once for every model scaled to zero together, on each replica; a
    /// request that would cross it gets 503 `activation_queue_full` at once.
    #[arg(long, env = "FLOTILLA_GATEWAY_ACTIVATION_QUEUE_TOTAL_BYTES", default_value_t = 256 << 20)]
    pub activation_queue_total_bytes: usize,
    /// `Retry-After` seconds of the 503 for a held request that expired or found the queue full.
    #[arg(long, default_value_t = 30)]
    pub activation_retry_after_s: u64,
    /// How long shutdown waits for in-flight requests, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub drain_ms: u64,
    /// Event loops serving requests, each a single-threaded runtime on its own thread that
    /// accepts its connections and proxies them start to end with its own upstream connections
    /// (0: one per CPU the process may use).
    #[arg(long, env = "FLOTILLA_GATEWAY_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
    /// Continue a stream that breaks after its first byte (cut, stalled, malformed) on another
    /// allowed route and splice the rest into the client's stream (`--continuation false`: end
    /// it with an error event).
    #[arg(long, env = "FLOTILLA_GATEWAY_CONTINUATION", default_value_t = true, action = clap::ArgAction::Set)]
    pub continuation: bool,
    /// How routes that do not declare `continuation` in the table continue a stream. The
    /// default regenerates and verifies: an engine that silently ignores a prefill cannot be
    /// told from one that honours it in general, so prefill is for routes whose engine is
    /// known to continue (declared `continuation: prefill`, or this flag).
    #[arg(long, value_enum, default_value_t = Continuation::Regenerate)]
    pub continuation_default: Continuation,
    /// Most continuations of one stream; the next break ends it with an error event.
    #[arg(long, default_value_t = 2)]
    pub max_continuations: u32,
    /// Malformed events skipped (counted and logged) per upstream stream; one more ends that
    /// stream as broken (0: the first one does).
    #[arg(long, default_value_t = 1)]
    pub max_malformed_events: u32,
    /// Seed for retry jitter.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl GatewayConfig {
    /// A configuration with every default, reading the table from `config`.
    pub fn with_table(config: impl Into<PathBuf>) -> Self {
        let path = config.into();
        let mut c = GatewayConfig::parse_from(["flotilla-gateway", "--config", "x"]);
        c.config = Some(path);
        c
    }

    /// The event loops to run: `--worker-threads`, or one per CPU the process may use.
    pub fn workers(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            n => n,
        }
    }

    /// Whether clients must present an API key.
    pub fn auth_required(&self) -> bool {
        !self.api_keys.is_empty() || self.keys_file.is_some() || self.keys_namespace.is_some()
    }

    /// Refuse to serve anonymously unless asked to: with no key source, `--allow-anonymous`.
    pub fn check_auth(&self) -> Result<(), String> {
        if self.auth_required() || self.allow_anonymous {
            return Ok(());
        }
        Err(format!(
            "no API key source: clients would not be authenticated and anyone reaching {} could use every model. Give --keys-file, --keys-namespace or --api-keys, or --allow-anonymous to serve without authentication on purpose",
            self.listen
        ))
    }
}

/// Milliseconds as a duration.
pub fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        GatewayConfig::command().debug_assert();
        assert_eq!(GatewayConfig::with_table("t.yaml").max_attempts, 3);
    }

    #[test]
    fn no_key_source_needs_allow_anonymous() {
        let c = GatewayConfig::with_table("t.yaml");
        let e = c.check_auth().unwrap_err();
        assert!(e.contains("--allow-anonymous") && e.contains("0.0.0.0:8080"), "{e}");
        let anon = GatewayConfig::parse_from(["gw", "--config", "t", "--allow-anonymous"]);
        assert!(anon.check_auth().is_ok() && !anon.auth_required());
        let keyed = GatewayConfig::parse_from(["gw", "--config", "t", "--api-keys", "k"]);
        assert!(keyed.check_auth().is_ok() && keyed.auth_required());
        let both = GatewayConfig::parse_from(["gw", "--config", "t", "--api-keys", "k", "--allow-anonymous"]);
        assert!(both.auth_required(), "a key source wins: keys are still checked");
    }

    #[test]
    fn the_limits_store_is_in_process_unless_given_and_falls_back_to_local_shares_by_default() {
        let c = GatewayConfig::with_table("t.yaml");
        assert!(c.limits_store.is_none());
        assert_eq!(c.limits_store_unavailable, StoreUnavailable::Local);
        assert_eq!((c.limits_store_replicas, c.limits_store_failures), (1, 3));
        assert_eq!(c.limits_store_timeout_ms, 100);
        let zero = GatewayConfig::try_parse_from(["gw", "--config", "t", "--limits-store-replicas", "0"]);
        assert!(zero.unwrap_err().to_string().contains("--limits-store-replicas"));
        let shared = GatewayConfig::parse_from([
            "gw",
            "--config",
            "t",
            "--limits-store",
            "redis://:pw@redis:6379/1",
            "--limits-store-unavailable",
            "closed",
        ]);
        assert_eq!(shared.limits_store.unwrap().to_string(), "redis://redis:6379/1");
        assert_eq!(shared.limits_store_unavailable, StoreUnavailable::Closed);
        let bad = GatewayConfig::try_parse_from(["gw", "--config", "t", "--limits-store", "memcached://x:1"]);
        assert!(bad.unwrap_err().to_string().contains("use redis://host:6379"));
    }

    #[test]
    fn defaults_bound_failover_and_recovery_to_ten_seconds() {
        let c = GatewayConfig::with_table("t.yaml");
        assert!(c.ttft_timeout_ms <= 10_000, "a silent route fails over within 10 s");
        // The first probe comes at most 1.25 intervals (plus a tick of a quarter) after the
        // route was ejected, and takes at most the probe timeout.
        // and takes at most the probe timeout, plus the real request's when the list is inconclusive.
        let recovery =
            c.probe_interval_ms * 5 / 4 + c.probe_interval_ms / 4 + c.probe_timeout_ms + c.probe_request_timeout_ms;
        assert!(c.probe_interval_ms > 0 && recovery <= 10_000, "recovery within {recovery} ms");
    }
}
