//! The router's listener: HTTP/1 connections served by `front::app` (with a header read
//! timeout, so a slow client holds only its own connection) until `shutdown` resolves; then no
//! new connection is accepted and those in flight get `--drain-ms` to finish.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

use super::MemberRouter;

/// Serve on `listener` until `shutdown` resolves, then drain.
pub async fn serve(listener: TcpListener, st: Arc<MemberRouter>, shutdown: impl Future<Output = ()>) {
    let app = super::app(st.clone());
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(Some(Duration::from_secs(30)));
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
    tracing::info!("shutting down: draining requests in flight");
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(st.cfg.drain()) => tracing::warn!("drain timeout: closing the remaining connections"),
    }
}
