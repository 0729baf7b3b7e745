//! The port a moto server started with `-p 0` chose, read from its stderr (werkzeug's
//! ` * Running on http://127.0.0.1:PORT` line). Shared by this crate's moto and stage's
//! (`stage/tests/common/moto.rs`, by path).

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc::{Receiver, channel};

/// Reads `stderr` to its end on a thread of its own (moto logs every request there, and a full
/// pipe would stall it) and sends the announced port once.
pub fn announced(stderr: impl Read + Send + 'static) -> Receiver<u16> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(port) = listening_port(&line)
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(port);
            }
        }
    });
    rx
}

fn listening_port(line: &str) -> Option<u16> {
    let rest = line.split("Running on http://127.0.0.1:").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|p| *p != 0)
}
