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
        Self::start_to(message.into(), DELAY, Box::new(std::io::stderr()))
    }

    /// Starts an indicator that draws on `out` once `delay` has passed.
    pub fn start_to(message: String, delay: Duration, mut out: Box<dyn Write + Send>) -> Self {
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
                    let _ =
                        write!(out, "\r\x1b[2K{} {message} ({:.1}s)", FRAMES[frame], started.elapsed().as_secs_f64());
                    let _ = out.flush();
                }
            }
            if shown {
                let _ = write!(out, "\r\x1b[2K");
                let _ = out.flush();
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

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::Progress;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).to_string()
        }
    }

    #[test]
    fn quick_work_draws_nothing() {
        let out = Shared::default();
        let p = Progress::start_to("reading".into(), Duration::from_secs(60), Box::new(out.clone()));
        p.finish();
        assert_eq!(out.text(), "");
    }

    #[test]
    fn slow_work_draws_then_erases_itself() {
        let out = Shared::default();
        let p = Progress::start_to("reading the live fleet".into(), Duration::from_millis(10), Box::new(out.clone()));
        std::thread::sleep(Duration::from_millis(300));
        p.set("solving");
        std::thread::sleep(Duration::from_millis(300));
        p.finish();
        let text = out.text();
        assert!(text.contains("reading the live fleet ("), "{text:?}");
        assert!(text.contains("solving ("), "{text:?}");
        assert!(text.ends_with("\r\x1b[2K"), "the line is erased at the end: {text:?}");
        assert!(!text.contains('\n'), "never a new line: {text:?}");
    }
}
