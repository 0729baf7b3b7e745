//! `flotilla-member-router`: parses flags, connects to the cluster it runs in (in-cluster
//! ServiceAccount, else `$KUBECONFIG`), starts the watches that keep the routing table in step
//! with the HTTPRoutes parented to `--gateway`, and serves until SIGINT/SIGTERM, then drains.

use anyhow::Context;
use clap::Parser;
use flotilla_gateway::member_router::{MemberRouter, RouterConfig, serve, watch};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    flotilla_gateway::process::init_tracing();
    let cfg = RouterConfig::parse();
    flotilla_apis::crypto::install_crypto();
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
    serve(listener, st, flotilla_gateway::process::shutdown_signal()).await;
    watches.abort();
    Ok(())
}
