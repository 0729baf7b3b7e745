//! The control-cluster feed when the control cluster refuses every connection (its API server
//! gone, or a load balancer in front of nothing): each watch backs off between attempts instead
//! of retrying in a loop that never yields. Such a loop burnt a core, flooded the log, and —
//! because the task never returned to its runtime — made the task impossible to cancel: it hung
//! the process that held it (a CI run of the member data-path e2e test waited for it for an hour).
//!
//! The "API server" here accepts each connection and closes it at once, counting them (or nothing
//! listens on its port). The feed runs on its own runtime on a thread the test never joins, so a
//! feed that spins makes the test fail, not hang.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use flotilla_gateway::{AppState, GatewayConfig, feed};

/// A listener that closes every connection it accepts; returns its port and the count.
fn refusing_api_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            seen.fetch_add(1, Ordering::Relaxed);
            drop(conn);
        }
    });
    (port, count)
}

fn kubeconfig(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\n\
         users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
         current-context: x\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs the feed against the API server at `port` for 3 s on a runtime of its own, then stops
/// it. Returns whether it stopped within 20 s, and the gateway's state.
fn feed_for_three_seconds(port: u16) -> (bool, Arc<AppState>) {
    let dir = std::env::temp_dir().join(format!("flotilla-feed-outage-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = GatewayConfig::with_table("unused");
    cfg.config = None;
    cfg.control_cluster = true;
    cfg.kubeconfig = Some(kubeconfig(&dir, port));
    cfg.allow_anonymous = true;
    // Four watches: InferenceClusters, ModelDeployments, API-key Secrets, upstream Secrets.
    cfg.keys_namespace = Some("flotilla-system".into());
    cfg.upstream_secrets_namespace = Some("flotilla-system".into());
    let st = AppState::load(cfg).unwrap();
    let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
    let feed_state = st.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let client = feed::client(&feed_state).await.unwrap();
            let (_store, task) = feed::start(feed_state, client);
            tokio::time::sleep(Duration::from_secs(3)).await;
            task.abort();
            let _ = task.await;
            let _ = stopped_tx.send(());
        });
    });
    // The sleep above can only end if the feed's task yields to its (single-threaded) runtime.
    let stopped = stopped_rx.recv_timeout(Duration::from_secs(20)).is_ok();
    let _ = std::fs::remove_dir_all(&dir);
    (stopped, st)
}

#[test]
fn a_control_cluster_that_closes_every_connection_is_retried_with_back_off_and_the_feed_can_be_stopped() {
    let (port, connections) = refusing_api_server();
    let (stopped, st) = feed_for_three_seconds(port);
    let attempts = connections.load(Ordering::Relaxed);
    assert!(stopped, "the feed never yielded to its runtime: {attempts} connection attempts");
    // With back-off, each of the 4 watches tries at about 0 s, 0.8 s and 2.4 s (with jitter);
    // without, thousands of attempts in 3 s.
    assert!(attempts >= 4, "every watch tried at least once: {attempts}");
    assert!(attempts <= 40, "{attempts} connection attempts in 3 s: the watches do not back off");
    assert!(st.feed.stale(), "the failing watches mark the feed stale (`/readyz`, feed_stale)");
    assert!(!st.feed.synced(), "nothing was ever listed");
}

#[test]
fn a_control_cluster_with_nothing_listening_leaves_the_feed_stale_and_stoppable() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (stopped, st) = feed_for_three_seconds(port);
    assert!(stopped, "the feed never yielded to its runtime");
    assert!(st.feed.stale(), "the failing watches mark the feed stale (`/readyz`, feed_stale)");
}
