//! `flotilla-enginesim`: runs one simulated vLLM engine on the given address until Ctrl-C,
//! printing the bound address first so scripts can use port 0.

use clap::Parser;
use flotilla_enginesim::{SimConfig, SimState, server};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let config = SimConfig::parse();
    config.validate()?;
    let listener = tokio::net::TcpListener::bind(&config.listen).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let state = SimState::new(config);
    server::serve(listener, state, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    Ok(())
}
