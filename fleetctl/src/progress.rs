//! A progress indicator on stderr for work that may take a while (reading the live fleet,
//! solving a large plan). It appears only after a second, only when stderr is a terminal, and
//! erases itself when the work is done, so stdout (tables, JSON, YAML) never carries it and a
//! piped or scripted run sees nothing at all.

use std::io::{IsTerminal, Write};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long work runs before the indicator shows.
pub const DELAY: Duration = Duration::from_secs(1);

const FRAMES: [char; 4] = ['|', '/', '-', '\\'];

enum Msg {
    Set(String),
    Done,
}

/// A running indicator; dropping it (or [`Progress::finish`]) erases it.
pub struct Progress {
    tx: Option<Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts an indicator with a message, if stderr is a terminal.
    pub fn start(message: impl Into<String>) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self { tx: None, thread: None };
        }
        Self::start_on(message.into(), DELAY)
    }

    fn start_on(message: String, delay: Duration) -> Self {
        let (tx, rx) = mpsc::channel::<Msg>();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut message = message;
            let mut shown = false;
            let mut frame = 0usize;
            loop {
                let wait = if shown { Duration::from_millis(120) } else { delay.saturating_sub(started.elapsed()) };
                match rx.recv_timeout(wait) {
                    Ok(Msg::Set(m)) => message = m,
                    Ok(Msg::Done) | Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => {}
                }
                if started.elapsed() >= delay {
                    shown = true;
                    frame = (frame + 1) % FRAMES.len();
                    let mut err = std::io::stderr().lock();
                    let _ =
                        write!(err, "\r\x1b[2K{} {message} ({:.1}s)", FRAMES[frame], started.elapsed().as_secs_f64());
                    let _ = err.flush();
                }
            }
            if shown {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K");
                let _ = err.flush();
            }
        });
        Self { tx: Some(tx), thread: Some(thread) }
    }

    /// Changes the message (the work moved to its next step).
    pub fn set(&self, message: impl Into<String>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Set(message.into()));
        }
    }

    /// Stops and erases the indicator; waits until it is erased.
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Msg::Done);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop();
    }
}
