//! Splicing a continued stream into the client's, as pure functions. While the first upstream
//! stream is relayed, [`Splice`] keeps what the client was sent (the text, its token count and
//! the first chunk, whose `id`/`model`/`created` the client knows); [`prefill_body`] turns the
//! request into one that continues that text. Events of a continuation pass through
//! [`Splice::data`], which rewrites them to the first chunk's identity, shifts a prefill
//! continuation's `usage` back onto the original prompt, and, for a regenerated answer, drops
//! the text the client already has, relaying only what follows it, or reports that the new
//! answer does not begin with exactly that text. A prefill continuation is checked too: an
//! engine that ignores the prefill (or echoes it) starts its answer with the text the client
//! already has; that start is held back until it either covers the whole text sent (dropped:
//! what follows continues it) or departs from it — after [`RESTART_BYTES`] repeated bytes the
//! engine is taken to have restarted with a different answer and the stream ends, never a
//! second answer spliced after the first. Unless the client asked for `usage`, the usage the
//! gateway asked of the engine is taken out of the events.

use bytes::Bytes;
use serde_json::Value;

/// What becomes of one upstream data event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send these bytes to the client.
    Send(Bytes),
    /// Nothing to send (a regenerated event the client already has).
    Skip,
    /// The regenerated answer does not begin with the text the client already has.
    Diverged,
}

/// A prefill continuation that repeats at least this many bytes of the start of the text sent
/// (but not all of it) before departing from it restarted the answer: the stream ends.
pub const RESTART_BYTES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The first stream: relayed as is.
    Relay,
    /// A continuation: `shift` tokens of the prompt were the partial answer; the first `sent`
    /// bytes of the text are the client's already, `matched` of them were seen again.
    Continue { shift: u64, sent: usize, matched: usize },
    /// A prefill continuation whose start is still checked against the text sent (`held`).
    Check { shift: u64 },
}

/// The state of one client stream across its upstream streams.
#[derive(Debug)]
pub struct Splice {
    record: bool,
    resumable: bool,
    text: String,
    tokens: u64,
    first: Option<Bytes>,
    identity: Option<[Value; 3]>,
    mode: Mode,
    held: String,
    usage: bool,
}

impl Splice {
    /// A splice for a stream; `record`: keep what is relayed so the stream can be continued.
    pub fn new(record: bool) -> Self {
        Splice {
            record,
            resumable: record,
            text: String::new(),
            tokens: 0,
            first: None,
            identity: None,
            mode: Mode::Relay,
            held: String::new(),
            usage: true,
        }
    }

    /// `false`: the client did not ask for `usage` (the gateway did, of the engine): usage
    /// chunks are dropped and `usage` fields taken out of the events relayed.
    pub fn client_usage(mut self, asked: bool) -> Self {
        self.usage = asked;
        self
    }

    /// Whether the stream can be continued: recorded, with one plain-text choice so far.
    pub fn resumable(&self) -> bool {
        self.resumable
    }

    /// The text the client was sent.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Content events the client was sent (a token each, as engines stream them).
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Switch to relaying a continuation: `prefill` (the engine continues the text, its usage
    /// counts the text as prompt) or a regeneration from the start.
    pub fn resume(&mut self, prefill: bool) {
        self.held.clear();
        self.mode = if prefill {
            Mode::Check { shift: self.tokens }
        } else {
            Mode::Continue { shift: 0, sent: self.text.len(), matched: 0 }
        };
    }

    /// One upstream data event (`raw` is `data: …\n\n`) with its choice's `text`; `odd`: the
    /// event carries something other than one choice's text (tool calls, a second choice).
    pub fn data(&mut self, raw: Bytes, text: &str, odd: bool, finished: bool) -> Step {
        if !self.usage && text.is_empty() && !finished && has_usage(&raw) {
            return Step::Skip; // the usage chunk the gateway asked for, not the client
        }
        let (shift, sent, matched) = match self.mode {
            Mode::Relay => {
                if self.record {
                    self.keep(text, odd);
                    self.first.get_or_insert_with(|| raw.clone());
                }
                if !self.usage && has_usage(&raw) {
                    return Step::Send(self.rewrite(&raw, None, 0, false));
                }
                return Step::Send(raw);
            }
            _ if odd => return Step::Diverged,
            Mode::Check { shift } => return self.check(raw, text, finished, shift),
            Mode::Continue { shift, sent, matched } => (shift, sent, matched),
        };
        let mut replace = None;
        if matched < sent {
            let want = &self.text.as_bytes()[matched..sent];
            let got = text.as_bytes();
            if got.len() <= want.len() {
                if !want.starts_with(got) {
                    return Step::Diverged;
                }
                let matched = matched + got.len();
                self.mode = Mode::Continue { shift, sent, matched };
                if matched < sent && finished {
                    return Step::Diverged;
                }
                if !finished {
                    return Step::Skip;
                }
                replace = Some("");
            } else {
                let Some(tail) = text.get(want.len()..).filter(|_| got.starts_with(want)) else {
                    return Step::Diverged;
                };
                self.mode = Mode::Continue { shift, sent, matched: sent };
                replace = Some(tail);
            }
        }
        let relayed = replace.unwrap_or(text);
        let bytes = self.rewrite(&raw, replace, shift, true);
        self.keep(relayed, false);
        Step::Send(bytes)
    }

    /// A prefill continuation's event while its start may still repeat the text sent.
    fn check(&mut self, raw: Bytes, text: &str, finished: bool, shift: u64) -> Step {
        if text.is_empty() && !finished {
            // A role-only chunk: nothing to check yet, one assistant turn already began.
            return Step::Skip;
        }
        self.held.push_str(text);
        let (held, sent) = (self.held.as_bytes(), self.text.as_bytes());
        let common = held.iter().zip(sent).take_while(|(a, b)| a == b).count();
        let relay = if common == sent.len() {
            // The whole text again (echoed, or the answer restarted and reached it): what
            // follows it continues the text sent.
            self.held.get(sent.len()..).unwrap_or_default().to_string()
        } else if common == held.len() && !finished {
            return Step::Skip; // still repeating the start of the text sent
        } else if common >= RESTART_BYTES {
            return Step::Diverged; // restarted, then departed from the text sent
        } else {
            std::mem::take(&mut self.held)
        };
        self.held.clear();
        self.mode = Mode::Continue { shift, sent: 0, matched: 0 };
        let bytes = self.rewrite(&raw, Some(&relay), shift, true);
        self.keep(&relay, false);
        Step::Send(bytes)
    }

    fn keep(&mut self, text: &str, odd: bool) {
        self.resumable &= !odd;
        self.text.push_str(text);
        self.tokens += u64::from(!text.is_empty());
    }

    /// `raw` with the first chunk's identity, no repeated `role`, the text replaced when asked,
    /// and `usage` shifted by the `shift` prompt tokens that were the client's answer.
    fn rewrite(&mut self, raw: &Bytes, text: Option<&str>, shift: u64, identity: bool) -> Bytes {
        let Some(mut v) = json_of(raw) else { return raw.clone() };
        if !self.usage
            && let Some(o) = v.as_object_mut()
        {
            o.remove("usage");
        }
        if !identity {
            return Bytes::from(format!("data: {v}\n\n"));
        }
        if self.identity.is_none() {
            self.identity = self
                .first
                .as_ref()
                .and_then(json_of)
                .map(|f| [f["id"].clone(), f["model"].clone(), f["created"].clone()]);
        }
        if let (Some([id, model, created]), Some(o)) = (&self.identity, v.as_object_mut()) {
            for (k, x) in [("id", id), ("model", model), ("created", created)] {
                if !x.is_null() {
                    o.insert(k.into(), x.clone());
                }
            }
        }
        if let Some(choices) = v["choices"].as_array_mut() {
            for c in choices {
                if let Some(delta) = c.get_mut("delta").and_then(Value::as_object_mut) {
                    delta.remove("role");
                    if let Some(t) = text {
                        delta.insert("content".into(), t.into());
                    }
                } else if let (Some(t), Some(o)) = (text, c.as_object_mut()) {
                    o.insert("text".into(), t.into());
                }
            }
        }
        if shift > 0 && v["usage"].is_object() {
            let (p, c) = (v["usage"]["prompt_tokens"].as_u64(), v["usage"]["completion_tokens"].as_u64());
            if let (Some(p), Some(c)) = (p, c) {
                v["usage"]["prompt_tokens"] = p.saturating_sub(shift).into();
                v["usage"]["completion_tokens"] = (c + shift.min(p)).into();
            }
        }
        Bytes::from(format!("data: {v}\n\n"))
    }
}

/// Whether an event carries a `usage` object (cheap test first: most events do not).
fn has_usage(raw: &Bytes) -> bool {
    raw.windows(7).any(|w| w == b"\"usage\"") && json_of(raw).is_some_and(|v| v["usage"].is_object())
}

fn json_of(raw: &Bytes) -> Option<Value> {
    let text = std::str::from_utf8(raw).ok()?;
    serde_json::from_str(text.strip_prefix("data: ")?.trim_end()).ok()
}

/// The request that asks an engine to continue `partial` (`tokens` of them already
/// generated): chat as vLLM takes it (the partial answer as a final assistant message,
/// `continue_final_message: true`, `add_generation_prompt: false`), a completion with the
/// partial answer appended to its prompt; `max_tokens` becomes what is left of it. `None` when
/// the request cannot be continued so (a prompt that is not one string, no tokens left).
pub fn prefill_body(chat: bool, body: &Value, model: &str, partial: &str, tokens: u64) -> Option<Value> {
    let mut v = body.clone();
    v["model"] = model.into();
    for k in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = body[k].as_u64() {
            let left = n.checked_sub(tokens).filter(|l| *l > 0)?;
            v[k] = left.into();
        }
    }
    if chat {
        let messages = v["messages"].as_array_mut()?;
        messages.push(serde_json::json!({"role": "assistant", "content": partial}));
        v["continue_final_message"] = true.into();
        v["add_generation_prompt"] = false.into();
    } else {
        let prompt = body["prompt"].as_str()?;
        v["prompt"] = format!("{prompt}{partial}").into();
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chunk(id: &str, text: &str, finish: Option<&str>) -> (Bytes, String, bool) {
        let v = json!({"id": id, "model": id, "created": id.len(), "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": finish}]});
        (Bytes::from(format!("data: {v}\n\n")), text.to_string(), finish.is_some())
    }

    fn feed(s: &mut Splice, id: &str, texts: &[&str]) -> Vec<Step> {
        texts
            .iter()
            .map(|t| {
                let (raw, text, fin) = chunk(id, t, None);
                s.data(raw, &text, false, fin)
            })
            .collect()
    }

    fn sent(step: &Step) -> Value {
        let Step::Send(b) = step else { panic!("{step:?}") };
        json_of(b).unwrap()
    }

    #[test]
    fn the_first_stream_passes_untouched_and_is_recorded_only_when_asked() {
        let (raw, text, _) = chunk("a", "the ", None);
        let mut off = Splice::new(false);
        assert_eq!(off.data(raw.clone(), &text, false, false), Step::Send(raw.clone()));
        assert!(off.text().is_empty() && !off.resumable(), "nothing kept for a stream that is not continued");
        let mut on = Splice::new(true);
        assert_eq!(on.data(raw.clone(), &text, false, false), Step::Send(raw));
        assert_eq!((on.text(), on.tokens(), on.resumable()), ("the ", 1, true));
        on.data(Bytes::from_static(b"data: {}\n\n"), "", true, false);
        assert!(!on.resumable(), "tool calls or a second choice cannot be spliced");
    }

    #[test]
    fn a_prefill_continuation_takes_the_first_identity_and_shifts_usage() {
        let mut s = Splice::new(true);
        feed(&mut s, "first", &["the ", "fleet "]);
        s.resume(true);
        let steps = feed(&mut s, "second", &["routes "]);
        let v = sent(&steps[0]);
        assert_eq!(
            (v["id"].as_str(), v["model"].as_str(), v["created"].as_u64()),
            (Some("first"), Some("first"), Some(5))
        );
        assert!(v["choices"][0]["delta"].get("role").is_none(), "one assistant turn, one role");
        assert_eq!(v["choices"][0]["delta"]["content"], "routes ");
        let usage = json!({"id": "second", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}});
        let step = s.data(Bytes::from(format!("data: {usage}\n\n")), "", false, false);
        assert_eq!(sent(&step)["usage"], json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}));
        assert_eq!(s.text(), "the fleet routes ");
    }

    #[test]
    fn a_prefill_continuation_that_repeats_the_text_sent_is_stripped_or_ended() {
        // Echoed or restarted deterministically: the repeated text is dropped.
        let mut s = Splice::new(true);
        feed(&mut s, "first", &["the ", "fleet "]);
        s.resume(true);
        let steps = feed(&mut s, "again", &["", "the ", "fleet rou", "tes "]);
        assert_eq!(steps[..2], [Step::Skip, Step::Skip]);
        assert_eq!(sent(&steps[2])["choices"][0]["delta"]["content"], "rou");
        assert_eq!(sent(&steps[3])["choices"][0]["delta"]["content"], "tes ");
        assert_eq!(s.text(), "the fleet routes ");
        // A true continuation that happens to begin like the text: held, then relayed whole.
        let mut s = Splice::new(true);
        feed(&mut s, "first", &["the ", "fleet "]);
        s.resume(true);
        let steps = feed(&mut s, "next", &["the", "ir ships "]);
        assert_eq!(steps[0], Step::Skip);
        assert_eq!(sent(&steps[1])["choices"][0]["delta"]["content"], "their ships ");
        assert_eq!(s.text(), "the fleet their ships ");
        // Restarted with another answer: RESTART_BYTES repeated, then different.
        let mut s = Splice::new(true);
        feed(&mut s, "first", &["the fleet routes ", "requests "]);
        s.resume(true);
        let steps = feed(&mut s, "other", &["the fleet routes ", "answers "]);
        assert_eq!(steps, [Step::Skip, Step::Diverged]);
        let mut s = Splice::new(true);
        feed(&mut s, "first", &["the fleet routes ", "requests "]);
        s.resume(true);
        let (raw, text, fin) = chunk("other", "the fleet routes ", Some("length"));
        assert_eq!(s.data(raw, &text, false, fin), Step::Diverged, "ended inside the repeated start");
    }

    #[test]
    fn usage_the_client_did_not_ask_for_is_taken_out() {
        let mut s = Splice::new(true).client_usage(false);
        let with = json!({"id": "a", "choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}});
        let step = s.data(Bytes::from(format!("data: {with}\n\n")), "x", false, false);
        assert!(sent(&step).get("usage").is_none(), "{step:?}");
        let only = json!({"id": "a", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}});
        assert_eq!(s.data(Bytes::from(format!("data: {only}\n\n")), "", false, false), Step::Skip);
        let mut asked = Splice::new(true).client_usage(true);
        let raw = Bytes::from(format!("data: {only}\n\n"));
        assert_eq!(asked.data(raw.clone(), "", false, false), Step::Send(raw), "asked: untouched");
    }

    #[test]
    fn a_regeneration_relays_only_what_follows_the_text_already_sent() {
        let mut s = Splice::new(true);
        feed(&mut s, "first", &["the ", "fleet "]);
        s.resume(false);
        // Re-chunked differently: the boundary falls inside an event.
        let steps = feed(&mut s, "again", &["", "the", " fle", "et rou", "tes "]);
        assert_eq!(steps[..3], [Step::Skip, Step::Skip, Step::Skip]);
        assert_eq!(sent(&steps[3])["choices"][0]["delta"]["content"], "rou");
        assert_eq!(sent(&steps[4])["choices"][0]["delta"]["content"], "tes ");
        assert_eq!(s.text(), "the fleet routes ");
        let (raw, _, _) = chunk("again", "", Some("stop"));
        assert_eq!(sent(&s.data(raw, "", false, true))["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn a_regeneration_that_differs_or_ends_early_diverges() {
        let mut s = Splice::new(true);
        feed(&mut s, "first", &["the ", "fleet "]);
        let mut other = Splice::new(true);
        feed(&mut other, "first", &["the ", "fleet "]);
        s.resume(false);
        assert_eq!(feed(&mut s, "x", &["the ", "flock "])[1], Step::Diverged);
        other.resume(false);
        feed(&mut other, "x", &["the "]);
        let (raw, _, _) = chunk("x", "", Some("stop"));
        assert_eq!(other.data(raw, "", false, true), Step::Diverged, "shorter than what was sent");
        let mut exact = Splice::new(true);
        feed(&mut exact, "first", &["the "]);
        exact.resume(false);
        let (raw, text, _) = chunk("x", "the ", Some("stop"));
        assert_eq!(sent(&exact.data(raw, &text, false, true))["choices"][0]["delta"]["content"], "");
    }

    #[test]
    fn prefill_bodies_append_the_partial_answer_and_what_is_left_of_max_tokens() {
        let chat =
            json!({"model": "alias", "messages": [{"role": "user", "content": "q"}], "max_tokens": 10, "stream": true});
        let v = prefill_body(true, &chat, "m", "the fleet ", 2).unwrap();
        assert_eq!(v["model"], "m");
        assert_eq!(v["messages"][1], json!({"role": "assistant", "content": "the fleet "}));
        assert_eq!(
            (v["continue_final_message"].as_bool(), v["add_generation_prompt"].as_bool()),
            (Some(true), Some(false))
        );
        assert_eq!(v["max_tokens"], 8);
        assert_eq!(prefill_body(true, &chat, "m", "x", 10), None, "nothing left to generate");
        let done = json!({"model": "m", "prompt": "Once ", "stream": true});
        assert_eq!(prefill_body(false, &done, "m", "the ", 1).unwrap()["prompt"], "Once the ");
        assert_eq!(prefill_body(false, &json!({"prompt": ["a", "b"]}), "m", "the ", 1), None);
    }
}
