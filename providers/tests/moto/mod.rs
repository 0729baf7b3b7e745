//! Starting `moto` (the AWS emulator, installed into the cache venv by scripts/setup-moto.sh;
//! `FLOTILLA_MOTO_SERVER` overrides the path) in server mode on a loopback port of its own choosing, for the
//! AWS tests of this crate and of the controllers (which include this file by path).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[path = "port.rs"]
mod port;

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
    // moto binds a port of its own choosing (`-p 0`) and names it on stderr: a port picked
    // here and released could be taken by another listener of this process before moto binds
    // it, and the tests would then talk to that one (and find it gone when its test ends).
    let script = format!(
        "\"$0\" -H 127.0.0.1 -p 0 >/dev/null & m=$!; while kill -0 {pid} 2>/dev/null; do sleep 1; done; kill $m",
        pid = std::process::id()
    );
    let mut watchdog = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(&bin)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start moto");
    let rx = port::announced(watchdog.stderr.take().expect("moto's stderr"));
    let port = rx.recv_timeout(Duration::from_secs(60)).expect("moto did not say which port it listens on within 60 s");
    (format!("http://127.0.0.1:{port}"), watchdog)
}
