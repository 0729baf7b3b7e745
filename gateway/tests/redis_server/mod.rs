//! Real parts for the shared-limits tests: a `redis-server` (Debian package, installed by
//! scripts/setup.sh) on a free loopback port with no persistence, which a test can pause
//! (SIGSTOP: a store that accepts and never answers), resume, kill and start again on the same
//! port; and `flotilla-gateway` processes (the binary this package builds) on their own
//! loopback ports, each with its own limits, sharing only what the store shares.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server of the test's own.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn(port: u16, dir: &PathBuf) -> Child {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no", "--loglevel", "warning", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "redis-server is not installed: run `bash scripts/setup.sh` (it installs Debian's redis-server package), then run the tests again"
        ),
        Err(e) => panic!("starting redis-server: {e}"),
    }
}

impl RedisServer {
    /// Start one and wait until it answers PING.
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("flotilla-redis-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        for _ in 0..5 {
            let port = free_port();
            let mut s = RedisServer { port, child: Some(spawn(port, &dir)), dir: dir.clone() };
            if s.wait_ready() {
                return s;
            }
            s.kill();
        }
        panic!("redis-server did not answer PING on a free loopback port after 5 tries");
    }

    fn wait_ready(&mut self) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Some(c) = &mut self.child
                && c.try_wait().unwrap().is_some()
            {
                return false;
            }
            if self.try_query(|c| redis::cmd("PING").query::<String>(c)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn try_query<T>(&self, f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>) -> redis::RedisResult<T> {
        let client = redis::Client::open(self.url())?;
        let mut c = client.get_connection_with_timeout(Duration::from_secs(2))?;
        c.set_read_timeout(Some(Duration::from_secs(2)))?;
        f(&mut c)
    }

    /// Run `f` on a fresh connection (the test's own view of the store).
    pub fn query<T>(&self, f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>) -> T {
        self.try_query(f).unwrap()
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// SIGSTOP: connections are still accepted (by the kernel), nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// SIGKILL and reap: connections are refused from now on.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port (empty: nothing was saved).
    pub fn restart(&mut self) {
        self.kill();
        self.child = Some(spawn(self.port, &self.dir));
        assert!(self.wait_ready(), "redis-server did not come back on port {}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A paused server would not die of SIGKILL any later, but be sure it is not left stopped.
            let _ = Command::new("kill").args(["-CONT", &c.id().to_string()]).status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `flotilla-gateway` process.
pub struct GatewayProcess {
    pub addr: SocketAddr,
    child: Child,
    pub log: PathBuf,
}

impl GatewayProcess {
    /// Start the binary with `args` (plus a loopback listener) and wait for its address.
    pub fn start(name: &str, args: &[String]) -> Self {
        let log = std::env::temp_dir().join(format!("flotilla-gw-{name}-{}-{}.log", std::process::id(), free_port()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla-gateway"))
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let Some(addr) = line.trim().strip_prefix("listening on http://") else {
            let _ = child.kill();
            panic!("gateway {name} did not start ({line:?}); its log:\n{}", std::fs::read_to_string(&log).unwrap());
        };
        GatewayProcess { addr: addr.parse().unwrap(), child, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// What the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The routing table (model `m` on the simulator at `sim_url`) and the keys every
/// shared-limits test uses: `sk-team` (id `team`) 60 requests a minute, `sk-tok` (`tok`) 20
/// tokens a minute, `sk-other` (`other`) 600 requests a minute, `sk-free` (`free`) no limits.
pub fn fleet_files(sim_url: String) -> (PathBuf, PathBuf) {
    use crate::common::{clusters_yaml, temp_path, write_atomic};
    use flotilla_gateway::keys::{hex, sha256};
    let table = temp_path("table");
    write_atomic(
        &table,
        &format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", sim_url, "EU")])),
    );
    let keys = temp_path("keys");
    let mut doc = String::from("keys:\n");
    for (id, extra) in [
        ("team", ", requestsPerMinute: 60"),
        ("tok", ", tokensPerMinute: 20"),
        ("other", ", requestsPerMinute: 600"),
        ("free", ""),
    ] {
        doc.push_str(&format!("  - {{id: {id}, sha256: {}{extra}}}\n", hex(&sha256(format!("sk-{id}").as_bytes()))));
    }
    write_atomic(&keys, &doc);
    (table, keys)
}

/// Flags for a gateway on `table` and `keys`, with the shared store at `store` (or none): its
/// URL and the timeout of one call, in milliseconds (generous where the timeout is not what is
/// tested, so a loaded machine does not mark the store down).
pub fn gateway_args(
    table: &std::path::Path,
    keys: &std::path::Path,
    store: Option<(&str, u64)>,
    extra: &[&str],
) -> Vec<String> {
    let mut a: Vec<String> = vec!["--config".into(), table.display().to_string(), "--keys-file".into()];
    a.push(keys.display().to_string());
    for f in ["--scrape-interval-ms=0", "--probe-interval-ms=0", "--routing=least-load", "--connect-timeout-ms=500"] {
        a.push(f.into());
    }
    if let Some((url, timeout_ms)) = store {
        a.extend(["--limits-store".into(), url.to_string(), format!("--limits-store-timeout-ms={timeout_ms}")]);
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// POST a chat request for `m` with `Authorization: Bearer <key>`.
pub async fn ask(gw: &GatewayProcess, key: &str, body: &serde_json::Value) -> crate::common::Answer {
    let bearer = format!("Bearer {key}");
    crate::common::post_with(&gw.url("/v1/chat/completions"), body, &[("authorization", bearer.as_str())]).await
}

/// The value of one series on the gateway's /metrics (0 when absent).
pub async fn metric(gw: &GatewayProcess, series: &str) -> f64 {
    let text = crate::common::get(&gw.url("/metrics")).await.text;
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

pub const STORE_UP: &str = "flotilla_gateway_limits_store_up{store=\"redis\"}";

/// Wait (at most 10 s) until the gateway's store gauge reads `up`.
pub async fn wait_store(gw: &GatewayProcess, up: bool) {
    let want = if up { 1.0 } else { 0.0 };
    for _ in 0..200 {
        if metric(gw, STORE_UP).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the limits store of {} never read up={up}; its log:\n{}", gw.addr, gw.log());
}
