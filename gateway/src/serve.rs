//! Running the gateway: the accept loop (HTTP/1 with header limits and a header read
//! timeout), graceful shutdown that stops probing and drains in-flight requests, the
//! routing-table reload loop (file changes and SIGHUP), the probe loop (`probe`), and the
//! scrape loop that reads each cluster's queue depth from its vLLM `/metrics`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::config::ms;
use crate::{AppState, GatewayError};

/// Serve on `listener` until `shutdown` resolves, then drain for up to `--drain-ms`.
pub async fn run(
    listener: TcpListener,
    st: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GatewayError> {
    let app = crate::app(st.clone());
    let background = [tokio::spawn(reload_loop(st.clone())), tokio::spawn(scrape_loop(st.clone()))];
    let probes = tokio::spawn(crate::probe::probe_loop(st.clone()));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .max_buf_size(st.cfg.max_header_bytes.max(8192))
        // Parse room beyond the limit, so that `http::header_limit` answers an over-limit
        // request with an OpenAI-shaped 431 instead of the parser's bare one.
        .max_headers(st.cfg.max_headers.saturating_mul(4).max(st.cfg.max_headers + 1))
        .timer(TokioTimer::new())
        .header_read_timeout(Some(Duration::from_secs(30)));
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let svc =
            hyper::service::service_fn(move |req: hyper::Request<Incoming>| app.clone().oneshot(req.map(Body::new)));
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), svc));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    probes.abort();
    tracing::info!("shutting down: draining in-flight requests");
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(ms(st.cfg.drain_ms)) => tracing::warn!("drain timeout: closing remaining connections"),
    }
    for task in background {
        task.abort();
    }
    Ok(())
}

async fn reload_loop(st: Arc<AppState>) {
    let mut tick = tokio::time::interval(ms(st.cfg.reload_interval_ms.max(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        {
            let hup_recv = async {
                match hup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => {}
                () = hup_recv => {}
            }
        }
        #[cfg(not(unix))]
        tick.tick().await;
        match st.reload_keys() {
            Ok(true) => tracing::info!("API keys reloaded"),
            Ok(false) => {}
            Err(e) => tracing::error!(error = %e, "API keys not reloaded; the keys in force stay"),
        }
        match st.reload() {
            Ok(true) => tracing::info!("routing table reloaded"),
            Ok(false) => {}
            Err(e) => tracing::error!(error = %e, "routing table not reloaded; the previous table stays in force"),
        }
    }
}

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

async fn scrape_once(st: &AppState, name: String, url: String) {
    let Ok(req) = hyper::Request::get(format!("{url}/metrics")).body(Full::new(Bytes::new())) else { return };
    let fetch = async {
        let resp = st.client.request(req).await.ok()?;
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        let text = String::from_utf8_lossy(&body).into_owned();
        Some((waiting_from_metrics(&text), kv_cache_from_metrics(&text)))
    };
    if let Ok(Some((depth, kv))) = tokio::time::timeout(Duration::from_secs(1), fetch).await {
        let h = st.health.get(&name);
        if let Some(d) = depth {
            h.set_queue_depth(d);
        }
        if let Some(k) = kv {
            h.set_kv_cache(k);
        }
    }
}

async fn scrape_loop(st: Arc<AppState>) {
    if st.cfg.scrape_interval_ms == 0 {
        return;
    }
    let mut tick = tokio::time::interval(ms(st.cfg.scrape_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let clusters: Vec<(String, String)> =
            st.table.load().clusters().map(|c| (c.name.clone(), c.url.clone())).collect();
        futures_util::future::join_all(clusters.into_iter().map(|(n, u)| scrape_once(&st, n, u))).await;
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
}
