//! Starting `moto` (the AWS emulator, installed into the cache venv by scripts/setup-moto.sh;
//! `FLOTILLA_MOTO_SERVER` overrides the path) in server mode on a free loopback port, for the
//! AWS tests of this crate and of the controllers (which include this file by path).

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts moto and waits until it listens; returns its URL and the watchdog shell that stops
/// it when this test process exits. Fails (never skips) when moto is missing.
pub fn start() -> (String, Child) {
    let bin = std::env::var("FLOTILLA_MOTO_SERVER").unwrap_or_else(|_| {
        let cache = std::env::var("FLOTILLA_CACHE")
            .unwrap_or_else(|_| format!("{}/.cache/flotilla", std::env::var("HOME").unwrap_or_default()));
        format!("{cache}/venv/bin/moto_server")
    });
    assert!(
        std::path::Path::new(&bin).exists(),
        "moto server not found at {bin}: run scripts/setup.sh (or scripts/setup-moto.sh), or set FLOTILLA_MOTO_SERVER"
    );
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = format!(
        "\"$0\" -H 127.0.0.1 -p {port} >/dev/null 2>&1 & m=$!; while kill -0 {pid} 2>/dev/null; do sleep 1; done; kill $m",
        pid = std::process::id()
    );
    let watchdog = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(&bin)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto");
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto did not listen on port {port} within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    (format!("http://127.0.0.1:{port}"), watchdog)
}
