//! `flotilla-gateway`: parses flags, loads the routing table, binds the listener and serves
//! until SIGINT/SIGTERM, then drains.

use anyhow::Context;
use clap::Parser;
use flotilla_gateway::{AppState, GatewayConfig, feed, serve};

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
    let mut background = Vec::new();
    let mut lease = None;
    if cfg.control_cluster {
        let client = feed::client(&state).await?;
        let (deployments, task) = feed::start(state.clone(), client.clone());
        background.push(task);
        if cfg.feedback_interval_ms > 0 {
            let id = cfg.identity.clone().unwrap_or_else(|| {
                format!("{}-{}", std::env::var("HOSTNAME").unwrap_or_else(|_| "gateway".into()), std::process::id())
            });
            let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &cfg.lease_name)
                .with_namespace(&cfg.lease_namespace)
                .with_identity(&id)
                .with_duration(cfg.lease_duration)
                .with_grace((cfg.lease_duration / 3).max(1))
                .build()
                .await
                .context("setting up the gateway's feedback lease")?;
            let (leader, lease_task) = manager.watch().await;
            tracing::info!(identity = %id, lease = %cfg.lease_name, "competing to write Serving conditions");
            background.push(tokio::spawn(feed::write_serving(state.clone(), client, deployments, leader)));
            lease = Some(lease_task);
        }
    }
    let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let source = cfg.config.as_ref().map_or("the control cluster".to_string(), |p| p.display().to_string());
    tracing::info!(%addr, table = %source, "flotilla-gateway started");
    serve::run(listener, state, shutdown_signal()).await?;
    // Stopping the writer drops the leader channel; the lease task then releases the lease.
    for task in background {
        task.abort();
        let _ = task.await;
    }
    if let Some(task) = lease
        && let Ok(Ok(Ok(manager))) = tokio::time::timeout(std::time::Duration::from_secs(5), task).await
    {
        let _ = manager.release().await;
    }
    Ok(())
}
