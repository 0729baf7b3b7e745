//! Per-model stream behaviour, set by the simulator's configuration (flags, [`SimState`] methods
//! or `POST /sim/streams`), never by the client's body: a script of mid-stream faults consumed
//! one per streamed chat/completions request (cut after N tokens, stall for T after N, one
//! malformed event after N, no `[DONE]`), whether the model refuses prefill continuation, and
//! whether it regenerates answers non-deterministically. Each request for a model is planned
//! here ([`turn`]) and counted; tests read the counters with [`SimState::model_counters`].

use std::collections::{BTreeMap, VecDeque};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::canonical::{self, Continued};
use crate::generate::Kind;
use crate::{Fault, SimError, SimState, lock};

/// A fault in the middle of a streamed answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamFault {
    /// `cut:N`: N tokens, then the connection is closed (no finish chunk, no usage, no `[DONE]`).
    Cut(u32),
    /// `stall:N:MS`: N tokens, then nothing for MS milliseconds, then the rest as usual.
    Stall(u32, Duration),
    /// `malformed:N`: N tokens, one event that is not valid JSON, then the rest as usual.
    Malformed(u32),
    /// `no-done`: the whole answer and usage, but no `data: [DONE]`.
    NoDone,
}

impl StreamFault {
    /// The generator's fault and how long a stall lasts.
    pub(crate) fn plan(self) -> (Fault, Option<Duration>) {
        match self {
            StreamFault::Cut(n) => (Fault::Cut(n), None),
            StreamFault::Stall(n, d) => (Fault::Stall(n), Some(d)),
            StreamFault::Malformed(n) => (Fault::Malformed(n), None),
            StreamFault::NoDone => (Fault::NoDone, None),
        }
    }
}

impl FromStr for StreamFault {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        let bad = || SimError::BadFault(s.to_string());
        let mut parts = s.split(':');
        let kind = parts.next().unwrap_or_default();
        let mut num = || parts.next().ok_or_else(bad)?.parse::<u32>().map_err(|_| bad());
        let fault = match kind {
            "cut" => StreamFault::Cut(num()?),
            "stall" => {
                let after = num()?;
                StreamFault::Stall(after, Duration::from_millis(u64::from(num()?)))
            }
            "malformed" => StreamFault::Malformed(num()?),
            "no-done" => StreamFault::NoDone,
            _ => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(fault)
    }
}

/// The stream faults of one model's next streamed requests, in order (`None`: a clean stream);
/// with `repeat_last`, the last entry applies to every request after the script ran out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Script {
    /// One entry per streamed request.
    pub faults: VecDeque<Option<StreamFault>>,
    /// Keep applying the last entry.
    pub repeat_last: bool,
}

impl FromStr for Script {
    type Err = SimError;
    /// `FAULT[,FAULT…][*]`, each `cut:N`, `stall:N:MS`, `malformed:N`, `no-done` or `none`;
    /// a trailing `*` repeats the last one.
    fn from_str(s: &str) -> Result<Self, SimError> {
        let (list, repeat_last) = match s.strip_suffix('*') {
            Some(l) => (l, true),
            None => (s, false),
        };
        let faults = list
            .split(',')
            .map(|f| if f == "none" { Ok(None) } else { f.parse().map(Some) })
            .collect::<Result<_, _>>()?;
        Ok(Script { faults, repeat_last })
    }
}

fn parse_model_script(s: &str) -> Result<(String, Script), SimError> {
    let (model, script) = s.split_once('=').ok_or_else(|| SimError::BadFault(s.to_string()))?;
    Ok((model.to_string(), script.parse()?))
}

/// The flags of this module (flattened into [`crate::SimConfig`]).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct StreamArgs {
    /// Mid-stream faults of one model's next streamed requests, one per request, e.g.
    /// `llama=cut:3,none` (the first stream is cut after 3 tokens, the second is clean, later
    /// ones too) or `llama=stall:2:500*` (every stream stalls 500 ms after 2 tokens). Faults:
    /// cut:N, stall:N:MS, malformed:N, no-done, none. Repeat the flag for several models.
    #[arg(long = "stream-fault", value_name = "MODEL=FAULT[,FAULT...][*]", value_parser = parse_model_script)]
    pub stream_faults: Vec<(String, Script)>,
    /// Answer `continue_final_message` for this model with a 400, as an engine without prefill
    /// continuation does (repeatable).
    #[arg(long = "refuse-prefill", value_name = "MODEL")]
    pub refuse_prefill: Vec<String>,
    /// Silently ignore `continue_final_message` for this model: the final assistant message is
    /// dropped and the conversation answered from the start, as an engine (or chat template)
    /// that does not honour the option does, with a 200 (repeatable).
    #[arg(long = "ignore-prefill", value_name = "MODEL")]
    pub ignore_prefill: Vec<String>,
    /// Generate a different answer on every attempt for this model, as sampling without a seed
    /// does; continuations then never match (repeatable).
    #[arg(long = "nondeterministic", value_name = "MODEL")]
    pub nondeterministic: Vec<String>,
}

/// What happened to one model's requests so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelCounters {
    /// Inference requests (attempts) naming the model, whatever became of them.
    pub requests: u64,
    /// Chat/completions requests that got as far as being planned (past injected HTTP faults).
    pub planned: u64,
    /// Continuations served as the rest of the canonical answer.
    pub continuations: u64,
    /// Continuations whose partial text was not a prefix of the answer (a fresh answer).
    pub diverged: u64,
    /// Continuations refused with a 400.
    pub prefill_refused: u64,
    /// Continuations answered from the start instead (`--ignore-prefill`).
    pub prefill_ignored: u64,
    /// Streams given a fault from the model's script.
    pub stream_faults: u64,
}

#[derive(Debug, Default)]
struct Model {
    script: Script,
    refuse_prefill: bool,
    ignore_prefill: bool,
    nondeterministic: bool,
    counters: ModelCounters,
}

/// Every model's settings and counters.
#[derive(Debug, Default)]
pub struct Registry(Mutex<BTreeMap<String, Model>>);

impl Registry {
    /// The settings the flags give.
    pub fn new(args: &StreamArgs) -> Registry {
        let r = Registry::default();
        for (model, script) in &args.stream_faults {
            r.with(model, |m| m.script = script.clone());
        }
        for model in &args.refuse_prefill {
            r.with(model, |m| m.refuse_prefill = true);
        }
        for model in &args.ignore_prefill {
            r.with(model, |m| m.ignore_prefill = true);
        }
        for model in &args.nondeterministic {
            r.with(model, |m| m.nondeterministic = true);
        }
        r
    }

    fn with<T>(&self, model: &str, f: impl FnOnce(&mut Model) -> T) -> T {
        f(lock(&self.0).entry(model.to_string()).or_default())
    }
}

impl SimState {
    /// Replaces `model`'s stream-fault script.
    pub fn set_stream_script(&self, model: &str, script: Script) {
        self.streams.with(model, |m| m.script = script);
    }

    /// Makes `model` refuse (or accept) prefill continuation.
    pub fn set_refuse_prefill(&self, model: &str, refuse: bool) {
        self.streams.with(model, |m| m.refuse_prefill = refuse);
    }

    /// Makes `model` silently ignore (or honour again) prefill continuation.
    pub fn set_ignore_prefill(&self, model: &str, ignore: bool) {
        self.streams.with(model, |m| m.ignore_prefill = ignore);
    }

    /// Makes `model` regenerate non-deterministically (or deterministically again).
    pub fn set_nondeterministic(&self, model: &str, on: bool) {
        self.streams.with(model, |m| m.nondeterministic = on);
    }

    /// `model`'s counters.
    pub fn model_counters(&self, model: &str) -> ModelCounters {
        let requests = self.requests().iter().filter(|r| r.model == model).count() as u64;
        ModelCounters { requests, ..self.streams.with(model, |m| m.counters) }
    }
}

/// The planned answer of one chat/completions request and its stream fault.
#[derive(Debug)]
pub struct Planned {
    /// Output tokens and whether they continue a partial answer.
    pub turn: canonical::Turn,
    /// The fault from the model's script (streamed requests only).
    pub fault: Option<StreamFault>,
}

/// Plans `body` for its model: consumes a script entry when `streamed`, counts the request, and
/// gives `Err(message)` for a continuation the model (or vLLM's rules) refuses with a 400.
pub fn turn(s: &SimState, kind: Kind, body: &Value, streamed: bool) -> Result<Planned, String> {
    let model = body["model"].as_str().unwrap_or_default();
    let prefill = kind == Kind::Chat && body["continue_final_message"].as_bool() == Some(true);
    let (nonce, refuse, ignore, fault) = s.streams.with(model, |m| {
        m.counters.planned += 1;
        let fault = if streamed { next_fault(&mut m.script) } else { None };
        let nonce = if m.nondeterministic { m.counters.planned } else { 0 };
        let ignore = prefill && m.ignore_prefill && !m.refuse_prefill;
        m.counters.prefill_ignored += u64::from(ignore);
        (nonce, m.refuse_prefill, ignore, fault)
    });
    let planned = if ignore {
        canonical::plan(&s.config, kind, &without_prefill(body), nonce, refuse)
    } else {
        canonical::plan(&s.config, kind, body, nonce, refuse)
    };
    s.streams.with(model, |m| {
        let c = &mut m.counters;
        match &planned {
            Err(_) => c.prefill_refused += 1,
            Ok(t) if t.continued == Continued::Matched => c.continuations += 1,
            Ok(t) if t.continued == Continued::Diverged => c.diverged += 1,
            Ok(_) => {}
        }
        if planned.is_ok() && fault.is_some() {
            c.stream_faults += 1;
        }
    });
    Ok(Planned { turn: planned?, fault })
}

/// `body` as an engine that ignores prefill reads it: no `continue_final_message`, no final
/// assistant message.
fn without_prefill(body: &Value) -> Value {
    let mut v = body.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("continue_final_message");
        o.remove("add_generation_prompt");
    }
    if let Some(m) = v["messages"].as_array_mut()
        && m.last().is_some_and(|l| l["role"] == "assistant")
    {
        m.pop();
    }
    v
}

fn next_fault(script: &mut Script) -> Option<StreamFault> {
    if script.repeat_last && script.faults.len() == 1 {
        return script.faults.front().copied().flatten();
    }
    script.faults.pop_front().flatten()
}

/// `POST /sim/streams {"model", "faults": ["cut:3", null, …], "repeat_last", "refuse_prefill",
/// "ignore_prefill", "nondeterministic"}` (absent fields stay as they are) and `GET /sim/streams/{model}`.
pub fn routes() -> axum::Router<Arc<SimState>> {
    axum::Router::new().route("/sim/streams", post(configure)).route("/sim/streams/{model}", get(counters))
}

async fn configure(State(s): State<Arc<SimState>>, Json(v): Json<Value>) -> Response {
    let Some(model) = v["model"].as_str() else {
        return (StatusCode::BAD_REQUEST, "`model` is required").into_response();
    };
    if let Some(faults) = v["faults"].as_array() {
        let parsed: Result<VecDeque<_>, _> =
            faults.iter().map(|f| f.as_str().map(str::parse::<StreamFault>).transpose()).collect();
        match parsed {
            Ok(faults) => {
                let repeat_last = v["repeat_last"].as_bool() == Some(true);
                s.set_stream_script(model, Script { faults, repeat_last });
            }
            Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        }
    }
    if let Some(on) = v["refuse_prefill"].as_bool() {
        s.set_refuse_prefill(model, on);
    }
    if let Some(on) = v["ignore_prefill"].as_bool() {
        s.set_ignore_prefill(model, on);
    }
    if let Some(on) = v["nondeterministic"].as_bool() {
        s.set_nondeterministic(model, on);
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn counters(State(s): State<Arc<SimState>>, Path(model): Path<String>) -> Json<Value> {
    let c = s.model_counters(&model);
    Json(json!({
        "requests": c.requests, "planned": c.planned, "continuations": c.continuations,
        "diverged": c.diverged, "prefill_refused": c.prefill_refused, "prefill_ignored": c.prefill_ignored,
        "stream_faults": c.stream_faults,
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn scripts_parse_and_run_out_or_repeat() {
        let mut s: Script = "cut:3,none,stall:2:500,malformed:1,no-done".parse().unwrap();
        let got: Vec<_> = (0..6).map(|_| next_fault(&mut s)).collect();
        assert_eq!(
            got,
            vec![
                Some(StreamFault::Cut(3)),
                None,
                Some(StreamFault::Stall(2, Duration::from_millis(500))),
                Some(StreamFault::Malformed(1)),
                Some(StreamFault::NoDone),
                None
            ]
        );
        let mut r: Script = "none,cut:1*".parse().unwrap();
        let got: Vec<_> = (0..4).map(|_| next_fault(&mut r)).collect();
        assert_eq!(got, vec![None, Some(StreamFault::Cut(1)), Some(StreamFault::Cut(1)), Some(StreamFault::Cut(1))]);
        for bad in ["cut", "cut:x", "stall:1", "cut:1:2", "boom", ""] {
            assert!(bad.parse::<Script>().is_err(), "{bad}");
        }
        assert_eq!(parse_model_script("m=no-done").unwrap().0, "m");
        assert!(parse_model_script("no-model").is_err());
    }
}
