//! Running the gateway: the event loops (`--worker-threads` single-threaded runtimes sharing the
//! listener, each accepting HTTP/1 with header limits and a header read timeout), graceful shutdown that stops probing and drains in-flight requests, the
//! routing-table reload loop (file changes and SIGHUP), the probe loop (`probe`), and the
//! scrape loop (`scrape`).

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::ms;
use crate::{AppState, GatewayError};

thread_local! {
    /// The event loop this thread runs (0: the caller's runtime and any thread not a worker).
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The event loop the current thread serves requests on (`AppState::conn` picks its client).
pub fn worker() -> usize {
    WORKER.with(std::cell::Cell::get)
}

/// Serve on `listener` until `shutdown` resolves, then drain for up to `--drain-ms`.
///
/// The listener is served by `--worker-threads` event loops: this task's runtime and one thread
/// per further loop, each running a single-threaded Tokio runtime. A loop accepts a connection
/// and parses, routes and proxies its requests start to end, with upstream connections pooled
/// per loop, so a request never hands work to another thread: with one shared multi-threaded
/// runtime, waking the other worker for the upstream connection's task and back was the largest
/// cost of a proxied request (docs/benchmarks.md, "Gateway beside nginx"). The reload, scrape and
/// probe loops run on the caller's runtime.
pub async fn run(
    listener: TcpListener,
    st: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GatewayError> {
    let background = [tokio::spawn(reload_loop(st.clone())), tokio::spawn(crate::scrape::scrape_loop(st.clone()))];
    let probes = tokio::spawn(crate::probe::probe_loop(st.clone()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut threads = Vec::new();
    // One loop per upstream client the state made (`AppState::worker_clients`, from `--worker-threads`).
    let loops = 1 + st.worker_clients.len();
    let listener = if loops > 1 {
        let shared = listener.into_std().map_err(GatewayError::Io)?;
        for i in 1..loops {
            let (copy, st, stopped) = (shared.try_clone().map_err(GatewayError::Io)?, st.clone(), stopped.clone());
            let thread = std::thread::Builder::new()
                .name(format!("gateway-loop-{i}"))
                .spawn(move || {
                    WORKER.with(|w| w.set(i));
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                    rt.block_on(async move { accept_loop(TcpListener::from_std(copy)?, st, stopped).await })
                })
                .map_err(GatewayError::Io)?;
            threads.push(thread);
        }
        TcpListener::from_std(shared).map_err(GatewayError::Io)?
    } else {
        listener
    };
    let here = tokio::spawn(accept_loop(listener, st.clone(), stopped));
    shutdown.await;
    probes.abort();
    let _ = stop.send(true);
    let _ = here.await;
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            if let Ok(Err(e)) = t.join() {
                tracing::warn!(error = %e, "a gateway event loop ended with an error");
            }
        }
    })
    .await;
    for task in background {
        task.abort();
    }
    Ok(())
}

/// One event loop: accepts until `stopped`, then drains its connections for up to `--drain-ms`.
async fn accept_loop(
    listener: TcpListener,
    st: Arc<AppState>,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .max_buf_size(st.cfg.max_header_bytes.max(8192))
        // Parse room beyond the limit, so that the edge (`edge.rs`) answers an over-limit
        // request with an OpenAI-shaped 431 instead of the parser's bare one (twice the limit:
        // the parser readies room for all of them on every request head).
        .max_headers(st.cfg.max_headers.saturating_mul(2).max(st.cfg.max_headers + 1));
    let front = crate::edge::Front::new(st.clone());
    crate::process::accept_loop(listener, front, builder, until_stopped(stopped), ms(st.cfg.drain_ms)).await;
    Ok(())
}

/// Resolves once `stopped` says true (or its sender is gone).
async fn until_stopped(mut stopped: tokio::sync::watch::Receiver<bool>) {
    while !*stopped.borrow_and_update() {
        if stopped.changed().await.is_err() {
            return;
        }
    }
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
