//! Generated answers: deterministic tokens from the seed and prompt, rendered as one JSON
//! response or as an SSE stream whose timing (TTFT, inter-token latency) and failures (cut,
//! stall, malformed chunk, missing `[DONE]`) follow the simulator's configuration.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;

use crate::cache::{Rng, fnv};
use crate::{Fault, SimState, lock};

pub(crate) const VOCAB: [&str; 16] = [
    "the", "fleet", "routes", "tokens", "across", "clusters", "while", "engines", "stream", "answers", "quickly",
    "and", "models", "stay", "within", "borders",
];

/// Which API shape an answer takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// `n` words chosen deterministically from `seed` and the prompt.
pub fn words(seed: u64, prompt: &str, n: u64) -> Vec<String> {
    let mut rng = Rng::new(fnv(seed, prompt.as_bytes()));
    (0..n).map(|_| format!("{} ", VOCAB[(rng.next_u64() % VOCAB.len() as u64) as usize])).collect()
}

/// One answer, ready to render.
#[derive(Debug)]
pub struct Answer {
    /// Response id.
    pub id: String,
    /// The served model name.
    pub model: String,
    /// Chat or completion.
    pub kind: Kind,
    /// Output tokens.
    pub tokens: Vec<String>,
    /// Prompt tokens (words).
    pub prompt_tokens: u64,
    /// `stop` or `length`.
    pub finish: &'static str,
    /// Unix seconds.
    pub created: u64,
}

impl Answer {
    fn usage(&self) -> Value {
        let c = self.tokens.len() as u64;
        json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": c, "total_tokens": self.prompt_tokens + c})
    }

    /// The non-streaming response body.
    pub fn full(&self) -> Value {
        let text: String = self.tokens.concat();
        let choice = match self.kind {
            Kind::Chat => {
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": self.finish})
            }
            Kind::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": self.finish}),
        };
        let object = if self.kind == Kind::Chat { "chat.completion" } else { "text_completion" };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [choice], "usage": self.usage()})
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let object = if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
        let mut v =
            json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        Bytes::from(format!("data: {v}\n\n"))
    }

    fn token_chunk(&self, i: usize) -> Bytes {
        let tok = self.tokens.get(i).cloned().unwrap_or_default();
        let choice = match self.kind {
            Kind::Chat if i == 0 => {
                json!({"index": 0, "delta": {"role": "assistant", "content": tok}, "logprobs": null, "finish_reason": null})
            }
            Kind::Chat => json!({"index": 0, "delta": {"content": tok}, "logprobs": null, "finish_reason": null}),
            Kind::Completion => json!({"index": 0, "text": tok, "logprobs": null, "finish_reason": null}),
        };
        self.chunk(json!([choice]), None)
    }

    fn finish_chunk(&self) -> Bytes {
        let choice = match self.kind {
            Kind::Chat => json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": self.finish}),
            Kind::Completion => json!({"index": 0, "text": "", "logprobs": null, "finish_reason": self.finish}),
        };
        self.chunk(json!([choice]), None)
    }
}

/// A sequence slot: counted as running while held; a drop before [`Inflight::finish`] counts
/// as a cancellation (the client went away).
#[derive(Debug)]
pub struct Inflight {
    state: Arc<SimState>,
    _permit: OwnedSemaphorePermit,
    done: bool,
    /// The adapter the request runs on, counted as running while the slot is held.
    _adapter: Option<crate::lora::Active>,
}

struct Waiting(Arc<SimState>);
impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Inflight {
    /// Wait in the queue for a slot.
    pub async fn start(state: &Arc<SimState>) -> Option<Self> {
        state.waiting.fetch_add(1, Ordering::Relaxed);
        let w = Waiting(state.clone());
        let permit = state.slots.clone().acquire_owned().await.ok()?;
        drop(w);
        state.running.fetch_add(1, Ordering::Relaxed);
        Some(Inflight { state: state.clone(), _permit: permit, done: false, _adapter: None })
    }

    /// The request runs on this adapter (its waiting mark, now running).
    pub(crate) fn on_adapter(mut self, adapter: Option<crate::lora::Active>) -> Self {
        self._adapter = adapter.map(crate::lora::Active::run);
        self
    }

    /// The answer was delivered completely.
    pub fn finish(mut self) {
        self.done = true;
        self.state.completed.fetch_add(1, Ordering::Relaxed);
    }

    fn observe_ttft(&self, d: Duration) {
        lock(&self.state.ttft).observe(d.as_secs_f64());
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.state.running.fetch_sub(1, Ordering::Relaxed);
        if !self.done {
            self.state.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sleep for `d`; zero means no timer at all (tokio timers have millisecond granularity).
async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// Produce the non-streaming answer after the simulated generation time.
pub async fn complete(answer: &Answer, slot: Inflight, ttft: Duration, itl: Duration) -> Value {
    pause(ttft).await;
    slot.observe_ttft(ttft);
    pause(itl * (answer.tokens.len().saturating_sub(1) as u32)).await;
    slot.finish();
    answer.full()
}

/// How a stream is timed and broken.
#[derive(Debug)]
pub struct StreamPlan {
    /// Time to first token.
    pub ttft: Duration,
    /// Inter-token latency.
    pub itl: Duration,
    /// A mid-stream fault, if any.
    pub fault: Option<Fault>,
    /// How long a [`Fault::Stall`] lasts.
    pub stall: Duration,
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
}

struct Gen {
    answer: Answer,
    plan: StreamPlan,
    slot: Option<Inflight>,
    pos: usize,
    malformed_sent: bool,
}

impl Gen {
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        let n = self.answer.tokens.len();
        let i = self.pos;
        // A cut after as many tokens as the answer has (or more) comes before its finish chunk.
        if let Some(Fault::Cut(k)) = self.plan.fault
            && i == n.min(k as usize)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
            return Some(Err(std::io::Error::other("simulated connection cut")));
        }
        if i < n {
            match self.plan.fault {
                Some(Fault::Stall(k)) if i == k as usize => tokio::time::sleep(self.plan.stall).await,
                Some(Fault::Malformed(k)) if i == k as usize && !self.malformed_sent => {
                    self.malformed_sent = true;
                    return Some(Ok(Bytes::from_static(b"data: {\"id\": \"oops\", \"choices\": [{\"delta\n\n")));
                }
                _ => {}
            }
            let delay = if i == 0 { self.plan.ttft } else { self.plan.itl };
            pause(delay).await;
            if i == 0
                && let Some(s) = &self.slot
            {
                s.observe_ttft(self.plan.ttft);
            }
            self.pos += 1;
            return Some(Ok(self.answer.token_chunk(i)));
        }
        self.pos += 1;
        match i - n {
            0 => Some(Ok(self.answer.finish_chunk())),
            1 if self.plan.include_usage => Some(Ok(self.answer.chunk(json!([]), Some(self.answer.usage())))),
            1 | 2 => {
                if let Some(s) = self.slot.take() {
                    s.finish();
                }
                if self.plan.fault == Some(Fault::NoDone) {
                    return None;
                }
                self.pos = n + 3;
                Some(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
            }
            _ => None,
        }
    }
}

/// The SSE body of a streamed answer.
pub fn stream(answer: Answer, slot: Inflight, plan: StreamPlan) -> axum::body::Body {
    let g = Gen { answer, plan, slot: Some(slot), pos: 0, malformed_sent: false };
    let s = futures_util::stream::unfold(g, |mut g| async move {
        let item = g.next().await?;
        Some((item, g))
    });
    axum::body::Body::from_stream(s)
}
