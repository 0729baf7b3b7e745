//! What the gateway's two programs (`flotilla-gateway`, `flotilla-member-router`) share around
//! their servers: logging set up from `RUST_LOG` (default `info`) to stderr, the signal that
//! starts a graceful shutdown (SIGINT or SIGTERM), and one HTTP/1 accept loop that serves an
//! axum app until told to stop, then drains its connections for a bounded time.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = term => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// Serves `app` (an axum `Router`, or a service in front of one) on `listener` (HTTP/1,
/// `TCP_NODELAY`, a 30 s header read timeout, so a slow client holds only its own connection)
/// until `stop` resolves; then accepts nothing more and gives the connections in flight up to
/// `drain` to finish. `builder` sets what else the caller bounds (header count, buffer size).
pub async fn accept_loop<S>(
    listener: TcpListener,
    app: S,
    mut builder: hyper::server::conn::http1::Builder,
    stop: impl Future<Output = ()>,
    drain: Duration,
) where
    S: tower::Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    builder.timer(TokioTimer::new()).header_read_timeout(Some(Duration::from_secs(30)));
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
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
            () = &mut stop => break,
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
    tracing::info!("shutting down: draining requests in flight");
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(drain) => tracing::warn!("drain timeout: closing the remaining connections"),
    }
}
