//! `flotilla-gateway`: parses flags, loads the routing table, binds the listener and serves
//! until SIGINT/SIGTERM, then drains. Memory comes from mimalloc: a proxied request makes
//! about 90 small allocations (hyper, axum, serde), and with glibc's malloc they cost the
//! gateway about a tenth more CPU per request (docs/benchmarks.md, "Gateway beside nginx").

use anyhow::Context;
use clap::Parser;
use flotilla_gateway::{AppState, GatewayConfig, feed, serve};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn shutdown_signal() {
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

// The caller's runtime is one of the event loops (`serve::run`) and runs the background loops;
// the other loops get threads of their own.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cfg = GatewayConfig::parse();
    let state = AppState::load(cfg.clone())?;
    let control = if cfg.control_cluster {
        let client = feed::client(&state).await?;
        Some(feed::start_control(state.clone(), client).await.context("starting control-cluster mode")?)
    } else {
        None
    };
    let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let source = cfg.config.as_ref().map_or("the control cluster".to_string(), |p| p.display().to_string());
    tracing::info!(%addr, table = %source, "flotilla-gateway started");
    serve::run(listener, state, shutdown_signal()).await?;
    if let Some(control) = control {
        control.stop().await;
    }
    Ok(())
}
