//! Running the gateway: the accept loop (HTTP/1 with header limits and a header read
//! timeout), graceful shutdown that stops probing and drains in-flight requests, the
//! routing-table reload loop (file changes and SIGHUP), the probe loop (`probe`), and the
//! scrape loop (`scrape`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
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
    let background = [tokio::spawn(reload_loop(st.clone())), tokio::spawn(crate::scrape::scrape_loop(st.clone()))];
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
