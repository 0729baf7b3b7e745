//! `flotilla-gateway`: parses flags, loads the routing table, binds the listener and serves
//! until SIGINT/SIGTERM, then drains. Memory comes from mimalloc: a proxied request makes
//! about 90 small allocations (hyper, axum, serde), and with glibc's malloc they cost the
//! gateway about a tenth more CPU per request (docs/benchmarks.md, "Gateway beside nginx").

use anyhow::Context;
use clap::Parser;
use flotilla_gateway::{AppState, GatewayConfig, feed, serve};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    flotilla_gateway::process::init_tracing();
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
    serve::run(listener, state, flotilla_gateway::process::shutdown_signal()).await?;
    if let Some(control) = control {
        control.stop().await;
    }
    Ok(())
}
