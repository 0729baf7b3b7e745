//! `flotilla-gateway`: parses flags, loads the routing table, binds the listener and serves
//! until SIGINT/SIGTERM, then drains.

use clap::Parser;
use flotilla_gateway::{AppState, GatewayConfig, serve};

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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cfg = GatewayConfig::parse();
    let state = AppState::load(cfg.clone())?;
    let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    tracing::info!(%addr, table = %cfg.config.display(), "flotilla-gateway started");
    serve::run(listener, state, shutdown_signal()).await?;
    Ok(())
}
