//! The probe and metrics listener: `/healthz` (the process runs), `/readyz` (caches synced, or
//! standing by as a non-leader), `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;

/// Shared probe state.
#[derive(Clone, Default)]
pub struct Probes {
    /// Set once the replica can do its job (leader with synced caches, or standby).
    pub ready: Arc<AtomicBool>,
}

#[derive(Clone)]
struct AppState {
    probes: Probes,
    metrics: Metrics,
}

/// The router.
pub fn app(probes: Probes, metrics: Metrics) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<AppState>| async move {
                if s.probes.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .route("/metrics", get(|State(s): State<AppState>| async move { s.metrics.encode() }))
        .with_state(AppState { probes, metrics })
}

/// The probe and metrics listener on `addr`: bound before anything else starts, so an address
/// in use stops the controller with an error instead of leaving it running without health
/// checks or metrics.
pub async fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "probe and metrics listener up");
    Ok(listener)
}

/// Serves on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    probes: Probes,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(probes, metrics)).with_graceful_shutdown(shutdown).await
}
