//! A member router on a real loopback listener with a table given directly (no API server).

use std::net::SocketAddr;
use std::sync::Arc;

use flotilla_gateway::member_router::{GatewayName, MemberRouter, RouterConfig, Table, serve};

/// A running router; stopped when dropped.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state (table, metrics).
    pub st: Arc<MemberRouter>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Running {
    /// `http://addr<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// A router of Gateway `flotilla-router/flotilla` serving `table`, its configuration tweaked.
pub async fn start(table: Table, tweak: impl FnOnce(&mut RouterConfig)) -> Running {
    let mut cfg = RouterConfig::new(GatewayName::new("flotilla-router", "flotilla"));
    cfg.connect_timeout_ms = 500;
    tweak(&mut cfg);
    let st = MemberRouter::with_table(cfg, table);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, st.clone(), async {
        let _ = rx.await;
    }));
    Running { addr, st, _stop: tx }
}
