//! Server-sent events from an upstream engine to the client, event by event, never a whole
//! response buffered. The parser turns upstream bytes into checked events (a chunk that does
//! not parse is caught here, never forwarded; a few are skipped, see `--max-malformed-events`);
//! the relay forwards them through the stream's [`Splice`], watches the gap between chunks and
//! finalises a clean stream that lacks `[DONE]`. A broken stream is reported to the caller,
//! which continues it elsewhere or ends it with [`broken_event`], an OpenAI-style error event,
//! so a truncated answer never looks like success.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::metrics::StreamEnd;
use crate::splice::{Splice, Step};

/// One parsed upstream event.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A JSON data event, re-framed for the client.
    Data {
        /// `data: …\n\n`.
        raw: Bytes,
        /// A choice carried a `finish_reason`.
        finished: bool,
        /// The event is an error object.
        error: bool,
        /// Prompt plus completion tokens, when the event carries `usage`.
        usage: Option<u64>,
        /// A choice carried text.
        content: bool,
        /// The choice's text, when the parser collects it (for a stream that may be continued).
        text: String,
        /// Collected and carrying more than one choice's plain text (tool calls, another choice).
        odd: bool,
    },
    /// `data: [DONE]`.
    Done,
    /// A data event that is not JSON.
    Malformed,
    /// An event longer than the cap; nothing after it is parsed.
    Oversized,
}

/// Splits a byte stream into SSE events in linear time: each byte is scanned for the end of
/// its event once (give or take the three bytes a separator split across reads may span),
/// and an event longer than the cap ends the parse with [`Event::Oversized`] instead of
/// growing the buffer.
#[derive(Debug)]
pub struct Parser {
    buf: Vec<u8>,
    /// Where the search for the pending event's end resumes.
    scan: usize,
    max_event: usize,
    examined: u64,
    over: bool,
    collect: bool,
}

/// The default cap on one event (`--max-event-bytes`).
pub const DEFAULT_MAX_EVENT: usize = 1 << 20;

impl Default for Parser {
    fn default() -> Self {
        Parser::new(DEFAULT_MAX_EVENT)
    }
}

fn parse_event(text: &str, collect: bool) -> Option<Event> {
    let data: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.strip_prefix(' ').unwrap_or(d)).collect();
    if data.is_empty() {
        return None; // comments and keep-alives
    }
    let data = data.join("\n");
    if data.trim() == "[DONE]" {
        return Some(Event::Done);
    }
    match serde_json::from_str::<Value>(&data) {
        Ok(v) if v.is_object() => {
            let finished = v["choices"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c.get("finish_reason").is_some_and(|f| !f.is_null())));
            let error = v.get("error").is_some_and(|e| !e.is_null());
            let usage = crate::keys::usage_tokens(&v);
            let content = v["choices"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| c["delta"]["content"].as_str().or(c["text"].as_str()).is_some_and(|t| !t.is_empty()))
            });
            let (text, odd) = if collect { choice_text(&v) } else { (String::new(), false) };
            let raw = Bytes::from(format!("data: {data}\n\n"));
            Some(Event::Data { raw, finished, error, usage, content, text, odd })
        }
        _ => Some(Event::Malformed),
    }
}

/// The text of the one choice of a chunk, and whether the chunk carries anything else a splice
/// cannot handle (a second choice, tool or function calls, reasoning: a continuation would
/// begin the reasoning again or lose it, so a stream that reasoned is not continued).
fn choice_text(v: &Value) -> (String, bool) {
    let Some(choices) = v["choices"].as_array() else { return (String::new(), false) };
    let mut odd = choices.len() > 1;
    let mut text = String::new();
    for c in choices {
        let delta = &c["delta"];
        odd |= c["index"].as_u64().is_some_and(|i| i > 0)
            || ["tool_calls", "function_call"].iter().any(|k| delta.get(k).is_some_and(|x| !x.is_null()))
            || ["reasoning_content", "reasoning"]
                .iter()
                .any(|k| delta.get(k).and_then(Value::as_str).is_some_and(|r| !r.is_empty()));
        text.push_str(delta["content"].as_str().or(c["text"].as_str()).unwrap_or_default());
    }
    (text, odd)
}

impl Parser {
    /// A parser that refuses events longer than `max_event` bytes.
    pub fn new(max_event: usize) -> Self {
        Parser { buf: Vec::new(), scan: 0, max_event: max_event.max(1), examined: 0, over: false, collect: false }
    }

    /// Also hand out each data event's text ([`Event::Data`]`::text`), for a stream that may be continued.
    pub fn collecting(mut self, collect: bool) -> Self {
        self.collect = collect;
        self
    }

    /// Feed bytes; complete events come out.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        if self.over {
            return out;
        }
        self.buf.extend_from_slice(chunk);
        let mut start = 0;
        while let Some((end, sep)) = self.next_end(start) {
            if end - start > self.max_event {
                break;
            }
            match std::str::from_utf8(&self.buf[start..end]) {
                Ok(text) if text.contains('\r') => out.extend(parse_event(&text.replace('\r', ""), self.collect)),
                Ok(text) => out.extend(parse_event(text, self.collect)),
                Err(_) => out.push(Event::Malformed),
            }
            start = end + sep;
            self.scan = start;
        }
        self.buf.drain(..start);
        self.scan -= start;
        if self.buf.len() > self.max_event {
            self.over = true;
            self.buf = Vec::new();
            self.scan = 0;
            out.push(Event::Oversized);
        }
        out
    }

    /// The end of the event starting at `start` and its separator's length (`\n\n` or
    /// `\r\n\r\n`), searching only bytes not searched before.
    fn next_end(&mut self, start: usize) -> Option<(usize, usize)> {
        let from = self.scan.max(start);
        let b = &self.buf;
        for i in from..b.len() {
            let sep = match b[i] {
                b'\n' if b.get(i + 1) == Some(&b'\n') => 2,
                b'\r' if b[i..].starts_with(b"\r\n\r\n") => 4,
                _ => continue,
            };
            self.examined += (i + 1 - from) as u64;
            return Some((i, sep));
        }
        self.examined += (b.len() - from) as u64;
        // A separator may begin in the last three bytes and end in the next read.
        self.scan = b.len().saturating_sub(3).max(start);
        None
    }

    /// Bytes left that do not form a complete event.
    pub fn pending(&self) -> bool {
        !self.buf.iter().all(u8::is_ascii_whitespace)
    }

    /// Bytes examined so far while looking for event ends (linear in the bytes pushed).
    pub fn examined(&self) -> u64 {
        self.examined
    }
}

/// The error event that ends a broken stream.
pub fn error_event(message: &str, code: &str) -> Bytes {
    let e = json!({"error": {"message": message, "type": "upstream_error", "param": null, "code": code}});
    Bytes::from(format!("data: {e}\n\n"))
}

/// The error event that ends a stream broken this way (`None`: the stream is not broken).
pub fn broken_event(end: StreamEnd) -> Option<Bytes> {
    let (message, code) = match end {
        StreamEnd::cut => ("the upstream connection broke mid-answer; the answer is incomplete", "upstream_cut"),
        StreamEnd::stalled => ("the upstream engine stalled mid-answer; the answer is incomplete", "upstream_stalled"),
        StreamEnd::malformed => {
            ("the upstream engine sent a malformed chunk; the answer is incomplete", "upstream_malformed")
        }
        StreamEnd::truncated => ("the upstream stream ended before the answer was complete", "upstream_truncated"),
        StreamEnd::oversized => (
            "the upstream engine sent an event larger than the gateway accepts (--max-event-bytes); the answer is incomplete",
            "upstream_event_too_large",
        ),
        StreamEnd::diverged => (
            "the answer broke mid-stream and the engine that took over did not continue the text already sent (it began a different answer; regeneration needs deterministic output, e.g. temperature 0 or a seed); the answer is incomplete",
            "continuation_diverged",
        ),
        _ => return None,
    };
    Some(error_event(message, code))
}

/// Where a relay stands after some events.
#[derive(Debug, Default)]
pub struct Progress {
    /// A choice of the current upstream stream finished.
    pub finished: bool,
    /// Malformed events of the current upstream stream skipped.
    pub skipped: u32,
    /// Tokens seen so far, across upstream streams.
    pub tokens: Tokens,
}

/// The tokens of a relayed stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    /// From a `usage` chunk, when the stream had one.
    pub total: Option<u64>,
    /// Chunks that carried text.
    pub chunks: u64,
}

/// How events go to the client.
#[derive(Debug)]
pub struct Relay<'a> {
    /// The client's side.
    pub tx: &'a mpsc::Sender<Bytes>,
    /// Longest gap between upstream chunks.
    pub idle: Duration,
    /// Malformed events skipped per upstream stream before it counts as broken.
    pub max_malformed: u32,
}

/// Forward `events`; `Some(end)` when the stream is over.
async fn forward(events: Vec<Event>, r: &Relay<'_>, splice: &mut Splice, p: &mut Progress) -> Option<StreamEnd> {
    for ev in events {
        let (bytes, end) = match ev {
            Event::Done => (Bytes::from_static(b"data: [DONE]\n\n"), Some(StreamEnd::complete)),
            Event::Malformed if p.skipped < r.max_malformed => {
                p.skipped += 1;
                tracing::warn!("skipped a malformed event from the upstream engine");
                continue;
            }
            Event::Malformed => return Some(StreamEnd::malformed),
            Event::Oversized => return Some(StreamEnd::oversized),
            Event::Data { raw, finished, error, usage, content, text, odd } => {
                // The engine's own count, whether or not the client sees it.
                p.tokens.total = usage.or(p.tokens.total);
                let bytes = match splice.data(raw, &text, odd, finished) {
                    Step::Send(b) => b,
                    Step::Skip => continue,
                    Step::Diverged => return Some(StreamEnd::diverged),
                };
                p.finished |= finished;
                p.tokens.chunks += u64::from(content);
                (bytes, error.then_some(StreamEnd::upstream_error))
            }
        };
        if r.tx.send(bytes).await.is_err() {
            return Some(StreamEnd::client_gone);
        }
        if end.is_some() {
            return end;
        }
    }
    None
}

/// Relay the rest of an upstream stream whose first `events` were already read, through
/// `splice`. Returns how it ended; a broken end (see [`broken_event`]) is left to the caller
/// to continue or report. Dropping out of this function drops the upstream body, which
/// cancels the upstream request.
pub async fn relay(
    events: Vec<Event>,
    mut parser: Parser,
    mut body: Incoming,
    r: &Relay<'_>,
    splice: &mut Splice,
    p: &mut Progress,
) -> StreamEnd {
    if let Some(end) = forward(events, r, splice, p).await {
        return end;
    }
    loop {
        let frame = tokio::select! {
            () = r.tx.closed() => return StreamEnd::client_gone,
            f = tokio::time::timeout(r.idle, body.frame()) => f,
        };
        match frame {
            Err(_) => return StreamEnd::stalled,
            Ok(Some(Err(_))) => return StreamEnd::cut,
            Ok(None) if p.finished && !parser.pending() => {
                let done = Bytes::from_static(b"data: [DONE]\n\n");
                return if r.tx.send(done).await.is_err() { StreamEnd::client_gone } else { StreamEnd::finalised };
            }
            Ok(None) => return StreamEnd::truncated,
            Ok(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else { continue };
                if let Some(end) = forward(parser.push(&data), r, splice, p).await {
                    return end;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_splits_events_across_chunks_and_flags_garbage() {
        let mut p = Parser::default();
        assert!(p.push(b"data: {\"choices\":[{\"finish_reason\":null}]}\n").is_empty());
        let evs =
            p.push(b"\ndata: {\"choices\":[{\"finish_reason\":\"stop\"}]}\r\n\r\n: keep-alive\n\ndata: {oops\n\n");
        assert_eq!(evs.len(), 3);
        assert!(matches!(evs[0], Event::Data { finished: false, error: false, .. }));
        assert!(matches!(evs[1], Event::Data { finished: true, .. }));
        assert_eq!(evs[2], Event::Malformed);
        assert_eq!(p.push(b"data: [DONE]\n\n"), vec![Event::Done]);
        assert!(!p.pending());
        p.push(b"data: {\"x\"");
        assert!(p.pending());
        let err = p.push(b"\n\ndata: {\"error\": {\"message\": \"boom\"}}\n\n");
        assert!(matches!(err[1], Event::Data { error: true, .. }));
    }

    #[test]
    fn an_event_over_the_cap_ends_the_parse_and_frees_the_buffer() {
        let mut p = Parser::new(1000);
        assert_eq!(p.push(b"data: {\"a\":1}\n\n").len(), 1);
        let big = vec![b'x'; 600];
        assert!(p.push(b"data: ").is_empty());
        assert!(p.push(&big).is_empty(), "under the cap: still pending");
        assert_eq!(p.push(&big), vec![Event::Oversized], "over the cap without an end");
        assert!(!p.pending(), "the buffer was dropped");
        assert!(p.push(b"\n\ndata: {\"b\":2}\n\n").is_empty(), "nothing after an oversized event");
        // A complete event over the cap, in one read, is refused too.
        let mut p = Parser::new(100);
        let whole = format!("data: {{\"t\":\"{}\"}}\n\n", "y".repeat(200));
        assert_eq!(p.push(whole.as_bytes()), vec![Event::Oversized]);
    }

    #[test]
    fn parsing_examines_each_byte_about_once() {
        // A 20 KB event arriving a byte at a time: rescanning the buffer from its start on
        // every read would examine about 200 MB; scanning only new bytes examines about 20 KB.
        let mut p = Parser::new(1 << 20);
        let text = format!("data: {{\"t\":\"{}\"}}\r\n\r\n", "z".repeat(20_000));
        let mut events = Vec::new();
        for b in text.as_bytes() {
            events.extend(p.push(std::slice::from_ref(b)));
        }
        assert!(matches!(events.as_slice(), [Event::Data { .. }]), "{events:?}");
        let n = text.len() as u64;
        assert!(p.examined() <= 4 * n, "examined {} bytes for {n} pushed", p.examined());
        // Many events in one read are split without moving the rest of the buffer per event.
        let mut p = Parser::default();
        let many = "data: {\"k\":1}\n\n".repeat(10_000);
        assert_eq!(p.push(many.as_bytes()).len(), 10_000);
        assert!(p.examined() <= many.len() as u64);
    }

    #[test]
    fn text_is_collected_only_when_asked_and_odd_chunks_are_flagged() {
        let chunk = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"the \"}}]}\n\n";
        let quiet = Parser::default().push(chunk);
        assert!(matches!(&quiet[0], Event::Data { text, content: true, .. } if text.is_empty()));
        let mut p = Parser::default().collecting(true);
        assert!(matches!(&p.push(chunk)[0], Event::Data { text, odd: false, .. } if text == "the "));
        let completion = p.push(b"data: {\"choices\":[{\"index\":0,\"text\":\"fleet \"}]}\n\n");
        assert!(matches!(&completion[0], Event::Data { text, odd: false, .. } if text == "fleet "));
        let tool = p.push(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{}]}}]}\n\n");
        assert!(matches!(&tool[0], Event::Data { odd: true, .. }));
        let second = p.push(b"data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"x\"}}]}\n\n");
        assert!(matches!(&second[0], Event::Data { odd: true, .. }));
        for key in ["reasoning_content", "reasoning"] {
            let chunk = format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"{key}\":\"hmm\"}}}}]}}\n\n");
            assert!(matches!(&p.push(chunk.as_bytes())[0], Event::Data { odd: true, .. }), "{key}");
        }
        let empty =
            p.push(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"y\",\"reasoning_content\":null}}]}\n\n");
        assert!(matches!(&empty[0], Event::Data { odd: false, .. }), "no reasoning: continuable");
    }

    #[test]
    fn broken_ends_have_their_error_event_and_clean_ends_none() {
        for (end, code) in [
            (StreamEnd::cut, "upstream_cut"),
            (StreamEnd::stalled, "upstream_stalled"),
            (StreamEnd::malformed, "upstream_malformed"),
            (StreamEnd::diverged, "continuation_diverged"),
        ] {
            let e = broken_event(end).unwrap();
            assert!(std::str::from_utf8(&e).unwrap().contains(code), "{end:?}");
        }
        assert!(broken_event(StreamEnd::complete).is_none() && broken_event(StreamEnd::client_gone).is_none());
    }

    #[test]
    fn error_event_is_openai_shaped() {
        let e = error_event("broken", "upstream_cut");
        let text = std::str::from_utf8(&e).unwrap();
        let v: Value = serde_json::from_str(text.strip_prefix("data: ").unwrap().trim()).unwrap();
        assert_eq!(v["error"]["code"], "upstream_cut");
        assert_eq!(v["error"]["message"], "broken");
    }
}
