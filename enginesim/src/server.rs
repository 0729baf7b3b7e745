//! The simulator's accept loop: each TCP connection is served by hyper with the axum router,
//! and carries a kill switch in the request extensions so a handler can drop the connection
//! before any header is written (the `reset` fault).

use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tower::ServiceExt;

use crate::SimState;

/// Handlers notify this to close their connection without a response.
#[derive(Clone, Debug)]
pub struct ConnKill(pub Arc<Notify>);

/// Serve until `shutdown` resolves.
pub async fn serve(listener: TcpListener, state: Arc<SimState>, shutdown: impl Future<Output = ()>) {
    let router = crate::api::router(state.clone());
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let (router, state) = (router.clone(), state.clone());
        tokio::spawn(async move {
            let kill = Arc::new(Notify::new());
            let k = kill.clone();
            let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(ConnKill(k.clone()));
                let (router, state, k) = (router.clone(), state.clone(), k.clone());
                async move {
                    if crate::models::engine_down_hook(&state, req.uri().path(), &k) {
                        std::future::pending::<()>().await;
                    }
                    router.oneshot(req.map(Body::new)).await
                }
            });
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                () = kill.notified() => {}
            }
        });
    }
}
