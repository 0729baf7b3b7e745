//! Active recovery: ejected routes are probed in the background so that a recovered cluster
//! or model takes traffic again without a user request being spent to find out. Every
//! `--probe-interval-ms` (jittered ±25% per cluster), each cluster with an ejected route gets
//! one `GET /v1/models` bounded by `--probe-timeout-ms`. An answer with the model list lets
//! the cluster's open circuit, and the open circuit of every model it lists, admit their one
//! half-open request now; no answer or a 5xx keeps them open for another period (so their
//! period never runs out onto a user request while the cluster is down); any other answer
//! leaves the circuits to their own periods. The loop runs beside the server and is
//! cancelled when shutdown begins.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};

use crate::AppState;
use crate::config::ms;
use crate::health::{ClusterHealth, RouteHealth};
use crate::metrics::ProbeResult;

/// A cluster to probe and its ejected routes.
struct Target {
    url: String,
    cluster: Arc<ClusterHealth>,
    routes: Vec<(String, Arc<RouteHealth>)>,
}

/// What one probe found: `Ok(models listed)`, `Err(true)` no answer or a 5xx, `Err(false)`
/// an answer that says nothing either way.
async fn fetch(st: &AppState, url: &str) -> Result<HashSet<String>, bool> {
    let req = hyper::Request::get(format!("{url}/v1/models")).body(Full::new(Bytes::new())).map_err(|_| false)?;
    let ask = async {
        let resp = st.client.request(req).await.map_err(|_| true)?;
        let status = resp.status();
        if status.is_server_error() {
            return Err(true);
        }
        let body = Limited::new(resp.into_body(), 1 << 20).collect().await.map_err(|_| true)?.to_bytes();
        if !status.is_success() {
            return Err(false);
        }
        let v: serde_json::Value = serde_json::from_slice(&body).map_err(|_| false)?;
        let data = v["data"].as_array().ok_or(false)?;
        Ok(data.iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect())
    };
    tokio::time::timeout(ms(st.cfg.probe_timeout_ms.max(1)), ask).await.unwrap_or(Err(true))
}

async fn probe(st: &AppState, name: &str, t: Target) {
    let found = fetch(st, &t.url).await;
    let now = Instant::now();
    let result = match &found {
        Ok(listed) => {
            t.cluster.probed(true, now);
            for (model, route) in &t.routes {
                if route.model_circuit_open() {
                    route.probed(listed.contains(model), now);
                }
            }
            ProbeResult::ok
        }
        Err(true) => {
            t.cluster.probed(false, now);
            for (_, route) in &t.routes {
                route.probed(false, now);
            }
            ProbeResult::failed
        }
        Err(false) => ProbeResult::inconclusive,
    };
    tracing::debug!(cluster = name, result = ?result, "probed an ejected route's cluster");
    st.metrics.probe(name, result);
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
    loop {
        tick.tick().await;
        let table = st.table.load_full();
        let now = Instant::now();
        let mut due: BTreeMap<&str, Target> = BTreeMap::new();
        for m in table.models() {
            for r in m.routes.iter().filter(|r| r.ready && r.health.ejected()) {
                let name = r.cluster.name.as_str();
                let t = due.entry(name).or_insert_with(|| Target {
                    url: r.cluster.url.clone(),
                    cluster: r.health.cluster().clone(),
                    routes: Vec::new(),
                });
                t.routes.push((m.name.clone(), r.health.clone()));
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
