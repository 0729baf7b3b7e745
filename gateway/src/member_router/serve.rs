//! The router's listener: HTTP/1 connections served by `front::app` (with a header read
//! timeout, so a slow client holds only its own connection) until `shutdown` resolves; then no
//! new connection is accepted and those in flight get `--drain-ms` to finish.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::MemberRouter;

/// Serve on `listener` until `shutdown` resolves, then drain.
pub async fn serve(listener: TcpListener, st: Arc<MemberRouter>, shutdown: impl Future<Output = ()>) {
    let app = super::app(st.clone());
    let builder = hyper::server::conn::http1::Builder::new();
    crate::process::accept_loop(listener, app, builder, shutdown, st.cfg.drain()).await;
}
