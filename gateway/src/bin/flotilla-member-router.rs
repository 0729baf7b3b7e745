//! `flotilla-member-router`: parses flags, connects to the cluster it runs in (in-cluster
//! ServiceAccount, else `$KUBECONFIG`), starts the watches that keep the routing table in step
//! with the HTTPRoutes parented to `--gateway`, and serves until SIGINT/SIGTERM, then drains.

use anyhow::Context;
use clap::Parser;
use flotilla_gateway::member_router::{MemberRouter, RouterConfig, serve, watch};

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
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cfg = RouterConfig::parse();
    flotilla_gateway::feed::install_crypto();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the cluster (in-cluster ServiceAccount, else $KUBECONFIG or ~/.kube/config)")?;
    let listener =
        tokio::net::TcpListener::bind(&cfg.listen).await.with_context(|| format!("listening on {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let st = MemberRouter::new(cfg.clone());
    let watches = tokio::spawn(watch::run(st.clone(), client));
    println!("listening on http://{addr}");
    tracing::info!(%addr, gateway = %cfg.gateway, header = %cfg.header, "flotilla-member-router started");
    serve(listener, st, shutdown_signal()).await;
    watches.abort();
    Ok(())
}
