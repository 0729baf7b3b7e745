//! Active recovery: ejected routes are probed in the background so that a recovered cluster
//! or model takes traffic again without a user request being spent to find out. Every
//! `--probe-interval-ms` (jittered ±25% per cluster), each cluster with an ejected route gets
//! one `GET /v1/models` bounded by `--probe-timeout-ms`. An answer with the model list lets
//! the cluster's open circuit, and the open circuit of every model it lists, admit their one
//! half-open request now; no answer or a 5xx keeps them open for another period (so their
//! period never runs out onto a user request while the cluster is down). When the list cannot
//! tell — it does not name an ejected model (engines list a file path, a served name of their
//! own), or the answer is no model list — the probe asks that model for one token
//! (`POST /v1/chat/completions`, `max_tokens` 1, bounded by `--probe-request-timeout-ms`): an
//! answer with `choices` proves the route (and the cluster) healthy; a 5xx, a 404, a malformed
//! answer or none keeps the model's circuit open; any other 4xx (the engine serves no chat, is
//! busy) leaves it to its own period. A wrong path or a refused credential marks the
//! cluster misconfigured (a health reason, `member::config_fault`); every cluster is checked
//! so once when it enters the table, so a bad URL is reported before a user request meets it.
//! The loop runs beside the server and is cancelled when shutdown begins.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use flotilla_apis::constants::DEPLOYMENT_HEADER;
use http::{HeaderValue, header};
use http_body_util::{BodyExt, Full, Limited};

use crate::AppState;
use crate::config::ms;
use crate::health::{ClusterHealth, RouteHealth};
use crate::member::{ConfigReason, config_fault};
use crate::metrics::{ProbeKind, ProbeResult};
use crate::table::Cluster;
use crate::tls::tls_fault;

/// A cluster to probe and its ejected routes.
struct Target {
    spec: Arc<Cluster>,
    cluster: Arc<ClusterHealth>,
    /// (model, route health, the route's `x-flotilla-deployment`).
    routes: Vec<(String, Arc<RouteHealth>, Option<HeaderValue>)>,
}

/// What one probe found.
enum Found {
    /// The model list.
    Listed(HashSet<String>),
    /// No answer, or a 5xx.
    Down,
    /// An answer that says nothing either way.
    Inconclusive,
    /// A configuration fault (wrong path, refused credential, failed TLS handshake) and what
    /// was seen.
    Misconfigured(ConfigReason, String),
}

/// `GET /v1/models` on the cluster with its credential, bounded by `--probe-timeout-ms`.
async fn fetch(st: &AppState, c: &Cluster) -> Found {
    let url = &c.url;
    let Ok(mut req) = hyper::Request::get(format!("{url}/v1/models")).body(Full::new(Bytes::new())) else {
        return Found::Inconclusive;
    };
    if let Some(a) = &c.auth {
        req.headers_mut().insert(header::AUTHORIZATION, a.clone());
    }
    let ask = async {
        let resp = match st.conn(c).request(req).await {
            Ok(r) => r,
            Err(e) => {
                return match tls_fault(&e) {
                    Some(t) => {
                        Found::Misconfigured(ConfigReason::UpstreamTls, format!("TLS handshake with {url} failed: {t}"))
                    }
                    None => Found::Down,
                };
            }
        };
        let status = resp.status();
        if status.is_server_error() {
            return Found::Down;
        }
        let Ok(body) = Limited::new(resp.into_body(), 1 << 20).collect().await.map(|c| c.to_bytes()) else {
            return Found::Down;
        };
        if let Some(reason) = config_fault(status, &body) {
            return Found::Misconfigured(reason, format!("answered {status} on {url}/v1/models"));
        }
        if !status.is_success() {
            return Found::Inconclusive;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else { return Found::Inconclusive };
        let Some(data) = v["data"].as_array() else { return Found::Inconclusive };
        Found::Listed(data.iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect())
    };
    tokio::time::timeout(ms(st.cfg.probe_timeout_ms.max(1)), ask).await.unwrap_or(Found::Down)
}

/// One token asked of `model` on the cluster: `Some(true)` an answer with `choices`,
/// `Some(false)` none (no answer in time, a 5xx, a 404, a malformed answer), `None` an answer
/// that says nothing of the model's health (another 4xx).
async fn ask(st: &AppState, c: &Cluster, model: &str, member_route: Option<&HeaderValue>) -> Option<bool> {
    let url = &c.url;
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
        "stream": false,
    });
    let mut req = hyper::Request::post(format!("{url}/v1/chat/completions"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .ok()?;
    if let Some(a) = &c.auth {
        req.headers_mut().insert(header::AUTHORIZATION, a.clone());
    }
    if let Some(r) = member_route {
        req.headers_mut().insert(DEPLOYMENT_HEADER, r.clone());
    }
    let answer = async {
        let Ok(resp) = st.conn(c).request(req).await else { return Some(false) };
        let status = resp.status();
        if status.is_server_error() || status == http::StatusCode::NOT_FOUND {
            return Some(false);
        }
        if !status.is_success() {
            return None;
        }
        let Ok(body) = Limited::new(resp.into_body(), 1 << 20).collect().await.map(|c| c.to_bytes()) else {
            return Some(false);
        };
        let v = serde_json::from_slice::<serde_json::Value>(&body).ok();
        Some(v.is_some_and(|v| v["choices"].as_array().is_some_and(|c| !c.is_empty())))
    };
    tokio::time::timeout(ms(st.cfg.probe_request_timeout_ms.max(1)), answer).await.unwrap_or(Some(false))
}

/// Ask each ejected model the list could not vouch for; whether any answered.
async fn ask_unlisted(st: &AppState, name: &str, t: &Target, listed: Option<&HashSet<String>>) -> bool {
    let unlisted: Vec<&(String, Arc<RouteHealth>, Option<HeaderValue>)> = t
        .routes
        .iter()
        .filter(|(model, route, _)| {
            listed.is_none_or(|l| !l.contains(model)) && (route.model_circuit_open() || listed.is_none())
        })
        .collect();
    let answers =
        futures_util::future::join_all(unlisted.iter().map(|(model, _, r)| ask(st, &t.spec, model, r.as_ref()))).await;
    let now = Instant::now();
    let mut any = false;
    for ((model, route, _), answer) in unlisted.into_iter().zip(answers) {
        let result = match answer {
            Some(true) => ProbeResult::ok,
            Some(false) => ProbeResult::failed,
            None => ProbeResult::inconclusive,
        };
        if let Some(ok) = answer
            && route.model_circuit_open()
        {
            route.probed(ok, now);
        }
        any |= answer == Some(true);
        tracing::debug!(cluster = name, model = %model, result = ?result, "asked an ejected model for one token");
        st.metrics.probe(name, ProbeKind::request, result);
    }
    any
}

/// Record a configuration fault found by a probe or check (logged when it is news).
fn misconfigured(name: &str, cluster: &ClusterHealth, reason: ConfigReason, what: &str) {
    let message = format!("cluster `{name}` {what}: {}", reason.advice());
    if cluster.set_fault(reason, message.clone()) {
        tracing::error!(cluster = name, reason = ?reason, %message, "cluster entry point misconfigured");
    }
}

/// Check a cluster new to the table (or whose URL or credentials changed) once: a
/// configuration fault is reported before a user request finds it. Anything else is left to
/// the requests and probes.
async fn check(st: &AppState, c: &Cluster) {
    let name = c.name.as_str();
    let cluster = st.health.get(name);
    match fetch(st, c).await {
        Found::Misconfigured(reason, what) => misconfigured(name, &cluster, reason, &what),
        Found::Listed(_) => {
            if cluster.clear_fault().is_some() {
                tracing::info!(cluster = name, "cluster entry point answers again; its configuration fault is cleared");
            }
        }
        Found::Down | Found::Inconclusive => {}
    }
}

async fn probe(st: &AppState, name: &str, t: Target) {
    let found = fetch(st, &t.spec).await;
    let now = Instant::now();
    let result = match &found {
        Found::Misconfigured(reason, what) => {
            misconfigured(name, &t.cluster, *reason, what);
            ProbeResult::misconfigured
        }
        Found::Listed(listed) => {
            if t.cluster.clear_fault().is_some() {
                tracing::info!(cluster = name, "cluster entry point answers again; its configuration fault is cleared");
            }
            t.cluster.probed(true, now);
            for (model, route, _) in &t.routes {
                if route.model_circuit_open() && listed.contains(model) {
                    route.probed(true, now);
                }
            }
            ask_unlisted(st, name, &t, Some(listed)).await;
            ProbeResult::ok
        }
        Found::Down => {
            t.cluster.probed(false, now);
            for (_, route, _) in &t.routes {
                route.probed(false, now);
            }
            ProbeResult::failed
        }
        Found::Inconclusive => {
            // The cluster answered, but not with a list: a model that answers proves it too.
            if ask_unlisted(st, name, &t, None).await {
                t.cluster.probed(true, Instant::now());
            }
            ProbeResult::inconclusive
        }
    };
    tracing::debug!(cluster = name, result = ?result, "probed an ejected route's cluster");
    st.metrics.probe(name, ProbeKind::list, result);
}

/// `interval` scaled by a factor in [0.75, 1.25) drawn from `seed`.
fn jittered(interval: Duration, seed: u64) -> Duration {
    let r = (crate::pick::hash(seed, b"probe") % 1000) as f64 / 1000.0;
    interval.mul_f64(0.75 + 0.5 * r)
}

/// Probe ejected routes until cancelled (`--probe-interval-ms` 0: never).
pub async fn probe_loop(st: Arc<AppState>) {
    if st.cfg.probe_interval_ms == 0 {
        return;
    }
    let interval = ms(st.cfg.probe_interval_ms);
    let mut next: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval((interval / 4).max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = st.cfg.seed;
    // Clusters (as loaded: name, URL, credential, TLS) checked once since they entered the table.
    let mut checked: Vec<Arc<Cluster>> = Vec::new();
    loop {
        tick.tick().await;
        let table = st.table.load_full();
        let now = Instant::now();
        checked.retain(|c| table.clusters().any(|t| **t == **c));
        let new: Vec<Arc<Cluster>> =
            table.clusters().filter(|t| !checked.iter().any(|c| **c == ***t)).cloned().collect();
        futures_util::future::join_all(new.iter().map(|c| check(&st, c))).await;
        checked.extend(new);
        let mut due: BTreeMap<&str, Target> = BTreeMap::new();
        for m in table.models() {
            for r in m.routes.iter().filter(|r| r.ready && r.health.ejected()) {
                let name = r.cluster.name.as_str();
                let t = due.entry(name).or_insert_with(|| Target {
                    spec: r.cluster.clone(),
                    cluster: r.health.cluster().clone(),
                    routes: Vec::new(),
                });
                t.routes.push((m.name.clone(), r.health.clone(), r.member_route.clone()));
            }
        }
        // A cluster newly ejected is first probed a jittered interval after it was seen.
        next.retain(|name, _| due.contains_key(name.as_str()));
        let mut batch = Vec::new();
        for (name, t) in due {
            seq = seq.wrapping_add(1);
            match next.get(name) {
                None => {
                    next.insert(name.to_string(), now + jittered(interval, seq));
                }
                Some(at) if *at <= now => {
                    next.insert(name.to_string(), now + jittered(interval, seq));
                    batch.push((name.to_string(), t));
                }
                Some(_) => {}
            }
        }
        futures_util::future::join_all(batch.into_iter().map(|(name, t)| {
            let st = &st;
            async move { probe(st, &name, t).await }
        }))
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_quarter_of_the_interval() {
        let base = Duration::from_millis(2000);
        let all: Vec<Duration> = (0..200).map(|s| jittered(base, s)).collect();
        assert!(all.iter().all(|d| *d >= Duration::from_millis(1500) && *d < Duration::from_millis(2500)));
        assert!(all.iter().collect::<HashSet<_>>().len() > 50, "spread, not one value");
    }
}
