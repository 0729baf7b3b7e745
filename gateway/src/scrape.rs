//! The scrape loop: each cluster's `/metrics` is read every `--scrape-interval-ms` for vLLM's
//! queue depth and KV-cache use, which `pick` adds to the cluster's load. An entry point that
//! answers without vLLM metrics (a 404, another server's page) is not scraped every interval
//! for ever: after `--scrape-quiet-after` such answers in a row it is scraped at doubling
//! intervals up to `--scrape-max-interval-ms`, logged once, and shown by the
//! `scrape_quiet{cluster}` gauge; vLLM metrics seen again bring it back to the normal interval.
//! When to scrape next is [`next`], a pure function of what the last scrape found.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header;
use http_body_util::{BodyExt, Full, Limited};

use crate::AppState;
use crate::config::ms;
use crate::table::Cluster;

/// The values of a metric's samples in a Prometheus text page (`name` exactly, with or without
/// labels; non-finite values skipped).
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = f64> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            return None;
        }
        rest.rsplit(' ').next()?.parse::<f64>().ok().filter(|v| v.is_finite())
    })
}

/// The sum of `vllm:num_requests_waiting` samples in a Prometheus text page.
pub fn waiting_from_metrics(text: &str) -> Option<u64> {
    samples(text, "vllm:num_requests_waiting").map(|v| v.max(0.0)).reduce(|a, b| a + b).map(|v| v as u64)
}

/// KV-cache use (0 to 1): vLLM's `vllm:kv_cache_usage_perc` (V1) or `vllm:gpu_cache_usage_perc`,
/// the highest sample when an entry serves several engines.
pub fn kv_cache_from_metrics(text: &str) -> Option<f64> {
    ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]
        .into_iter()
        .flat_map(|name| samples(text, name))
        .reduce(f64::max)
        .map(|v| v.clamp(0.0, 1.0))
}

/// What one scrape found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scraped {
    /// A page with vLLM metrics.
    Vllm,
    /// An answer without vLLM metrics (a 404, a page of other metrics).
    NotVllm,
    /// No answer (down, timeout): says nothing about what the entry point is.
    NoAnswer,
}

/// A cluster's scrape schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Answers without vLLM metrics in a row.
    pub misses: u32,
    /// When to scrape next.
    pub at: Instant,
}

/// The scrape settings `next` needs.
#[derive(Clone, Copy, Debug)]
pub struct Cadence {
    /// The normal interval.
    pub interval: Duration,
    /// Answers without vLLM metrics in a row after which the cluster is scraped rarely.
    pub quiet_after: u32,
    /// The longest interval of a quiet cluster.
    pub max: Duration,
}

impl Schedule {
    /// Whether the cluster is scraped rarely now.
    pub fn quiet(&self, c: &Cadence) -> bool {
        c.quiet_after > 0 && self.misses >= c.quiet_after
    }
}

/// The schedule after a scrape at `now` found `got`: the normal interval, or for a cluster
/// that answered `quiet_after` times or more in a row without vLLM metrics, twice the interval
/// for each further miss (capped at `max`).
pub fn next(s: Schedule, got: Scraped, now: Instant, c: &Cadence) -> Schedule {
    let misses = match got {
        Scraped::Vllm => 0,
        Scraped::NotVllm => s.misses.saturating_add(1),
        Scraped::NoAnswer => s.misses,
    };
    let quiet = Schedule { misses, at: now }.quiet(c);
    let wait = if quiet {
        let doublings = (misses - c.quiet_after + 1).min(20);
        c.interval.saturating_mul(1 << doublings).min(c.max.max(c.interval))
    } else {
        c.interval
    };
    Schedule { misses, at: now + wait }
}

async fn scrape_once(st: &AppState, c: &Cluster) -> Scraped {
    let Ok(mut req) = hyper::Request::get(format!("{}/metrics", c.url)).body(Full::new(Bytes::new())) else {
        return Scraped::NoAnswer;
    };
    if let Some(a) = &c.auth {
        req.headers_mut().insert(header::AUTHORIZATION, a.clone());
    }
    let fetch = async {
        let resp = st.conn(c).request(req).await.ok()?;
        let ok = resp.status().is_success();
        let body = Limited::new(resp.into_body(), 4 << 20).collect().await.ok()?.to_bytes();
        if !ok {
            return Some(None);
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        // Per-model demand for the autoscaler, from the same page.
        st.autoscale.demand.record(&c.name, &text, Instant::now());
        Some(Some((waiting_from_metrics(&text), kv_cache_from_metrics(&text))))
    };
    match tokio::time::timeout(Duration::from_secs(1), fetch).await {
        Ok(Some(Some((depth, kv)))) if depth.is_some() || kv.is_some() => {
            let h = st.health.get(&c.name);
            if let Some(d) = depth {
                h.set_queue_depth(d);
            }
            if let Some(k) = kv {
                h.set_kv_cache(k);
            }
            Scraped::Vllm
        }
        Ok(Some(_)) => Scraped::NotVllm,
        Ok(None) | Err(_) => Scraped::NoAnswer,
    }
}

/// Scrape every cluster of the table in force on its schedule until cancelled
/// (`--scrape-interval-ms 0`: never).
pub async fn scrape_loop(st: Arc<AppState>) {
    if st.cfg.scrape_interval_ms == 0 {
        return;
    }
    let c = Cadence {
        interval: ms(st.cfg.scrape_interval_ms),
        quiet_after: st.cfg.scrape_quiet_after,
        max: ms(st.cfg.scrape_max_interval_ms),
    };
    let mut schedules: HashMap<String, Schedule> = HashMap::new();
    let mut tick = tokio::time::interval((c.interval / 4).max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let table = st.table.load_full();
        let now = Instant::now();
        schedules.retain(|name, _| table.clusters().any(|cl| &cl.name == name));
        st.autoscale.demand.retain(|name| table.clusters().any(|cl| cl.name == name));
        let due: Vec<Arc<Cluster>> =
            table.clusters().filter(|cl| schedules.get(&cl.name).is_none_or(|s| s.at <= now)).cloned().collect();
        let found = futures_util::future::join_all(due.iter().map(|c| scrape_once(&st, c))).await;
        let now = Instant::now();
        for (cl, got) in due.into_iter().zip(found) {
            let (name, url) = (cl.name.clone(), &cl.url);
            let old = schedules.get(&name).copied().unwrap_or(Schedule { misses: 0, at: now });
            let new = next(old, got, now, &c);
            match (old.quiet(&c), new.quiet(&c)) {
                (false, true) => {
                    tracing::info!(cluster = %name, %url, misses = new.misses, "no vLLM metrics at /metrics: scraping this cluster rarely from now on (up to every {} s)", c.max.as_secs());
                    st.metrics.set_scrape_quiet(&name, true);
                }
                (true, false) => {
                    tracing::info!(cluster = %name, "vLLM metrics at /metrics again: scraping at the normal interval");
                    st.metrics.set_scrape_quiet(&name, false);
                }
                _ => {}
            }
            schedules.insert(name, new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_queue_depth() {
        let text = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 3\nvllm:num_requests_waiting_other 9\nvllm:num_requests_waiting{model_name=\"n\"} 2.0\n";
        assert_eq!(waiting_from_metrics(text), Some(5));
        assert_eq!(waiting_from_metrics("nothing 1"), None);
        let kv = "vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\nvllm:gpu_cache_usage_perc{engine=\"1\"} 0.75\n";
        assert_eq!(kv_cache_from_metrics(kv), Some(0.75));
        assert_eq!(kv_cache_from_metrics("vllm:kv_cache_usage_perc_x 1\n"), None);
    }

    #[test]
    fn an_entry_without_vllm_metrics_is_scraped_at_doubling_intervals_and_comes_back() {
        let c = Cadence { interval: Duration::from_secs(2), quiet_after: 3, max: Duration::from_secs(300) };
        let t0 = Instant::now();
        let mut s = Schedule { misses: 0, at: t0 };
        let mut waits = Vec::new();
        for _ in 0..12 {
            let n = next(s, Scraped::NotVllm, s.at, &c);
            waits.push((n.at - s.at).as_secs());
            s = n;
        }
        assert_eq!(waits, [2, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert!(s.quiet(&c));
        // Being down says nothing: the schedule neither backs off further nor resets.
        let down = next(s, Scraped::NoAnswer, s.at, &c);
        assert_eq!((down.misses, (down.at - s.at).as_secs()), (s.misses, 300));
        let back = next(s, Scraped::Vllm, s.at, &c);
        assert!(!back.quiet(&c));
        assert_eq!((back.misses, (back.at - s.at).as_secs()), (0, 2));
        // An engine that answers is never backed off, and neither is an unreachable one.
        let mut e = Schedule { misses: 0, at: t0 };
        for got in [Scraped::Vllm, Scraped::NoAnswer, Scraped::NoAnswer, Scraped::NoAnswer, Scraped::NoAnswer] {
            let n = next(e, got, e.at, &c);
            assert_eq!((n.at - e.at).as_secs(), 2);
            e = n;
        }
        // quiet_after 0: never quiet.
        let never = Cadence { quiet_after: 0, ..c };
        let n = next(Schedule { misses: 50, at: t0 }, Scraped::NotVllm, t0, &never);
        assert_eq!((n.at - t0).as_secs(), 2);
    }
}
