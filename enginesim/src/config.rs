//! The simulator's knobs: command-line flags (also built in code by tests), the failure modes
//! it can inject, parsed from strings such as `rate-limit:2` or `cut:3`, and the LoRA adapter
//! flags ([`LoraArgs`]), checked against the served models by [`SimConfig::validate`].

use std::str::FromStr;

use clap::Parser;

use crate::SimError;

/// How one simulated engine behaves. Every flag has a default that makes a fast, healthy engine.
#[derive(Parser, Clone, Debug)]
#[command(name = "flotilla-enginesim", about = "A vLLM-compatible engine simulator for testing the Flotilla gateway")]
pub struct SimConfig {
    /// Address to listen on (`127.0.0.1:0` picks a free port and prints it).
    #[arg(long, default_value = "127.0.0.1:8000", env = "ENGINESIM_LISTEN")]
    pub listen: String,
    /// A name for this engine, returned in the `x-sim-name` header (e.g. the cluster it plays).
    #[arg(long, default_value = "sim")]
    pub name: String,
    /// Served model names (repeat the flag for several); requests for others get 404.
    #[arg(long = "model", default_values_t = vec!["sim-model".to_string()])]
    pub models: Vec<String>,
    /// Base time to first token, in milliseconds (before any prefill cost).
    #[arg(long, default_value_t = 10)]
    pub ttft_ms: u64,
    /// Extra prefill time per prompt block that misses the prefix cache, in milliseconds.
    #[arg(long, default_value_t = 1)]
    pub prefill_ms_per_block: u64,
    /// Inter-token latency, in milliseconds.
    #[arg(long, default_value_t = 2)]
    pub itl_ms: u64,
    /// Output tokens when the request sets no `max_tokens`.
    #[arg(long, default_value_t = 8)]
    pub default_tokens: u32,
    /// Sequences processed at once; further requests wait in a queue (`vllm:num_requests_waiting`).
    #[arg(long, default_value_t = 16)]
    pub max_num_seqs: usize,
    /// Context length in tokens (whitespace-separated words); prompt + max_tokens above it gets a 400.
    #[arg(long, default_value_t = 4096)]
    pub max_model_len: u32,
    /// Tokens per prefix-cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Prefix-cache capacity in blocks (least recently used blocks are evicted).
    #[arg(long, default_value_t = 4096)]
    pub cache_blocks: usize,
    /// Seed for generated text and embeddings; the same seed and prompt give the same answer.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Failure to inject on inference endpoints. One of: rate-limit, rate-limit:SECS (with
    /// Retry-After), error-500, error-503, reset (connection closed before headers),
    /// no-response, slow-first-token:MS, cut:N (stream cut after N tokens), stall:N (stream
    /// stalls for a minute after N tokens), malformed:N (a malformed chunk after N tokens),
    /// no-done (stream ends without `[DONE]`), context-length, content-policy. Also settable at
    /// runtime: `POST /sim/fault {"fault": "error-500", "count": 1}`.
    #[arg(long)]
    pub fault: Option<Fault>,
    /// Inject the fault this many times, then behave (absent: every request).
    #[arg(long)]
    pub fault_count: Option<u32>,
    /// A header `NAME:VALUE` added to every inference response (repeat the flag for several),
    /// e.g. hop-by-hop headers that a proxy in front must not pass on.
    #[arg(long = "response-header", value_name = "NAME:VALUE")]
    pub response_headers: Vec<String>,
    /// Answer every inference request at once with a fixed one-token answer (streamed or not),
    /// skipping faults, queueing, the prefix cache and the request log: a fast upstream for
    /// measuring a proxy's own throughput.
    #[arg(long)]
    pub fixed_response: bool,
    /// `MODEL=FAULT`: a fault for that model's requests only (repeatable), e.g.
    /// `llama=rate-limit:30` beside a healthy model on the same engine.
    #[arg(long = "model-fault", value_name = "MODEL=FAULT")]
    pub model_faults: Vec<crate::models::ModelFault>,
    /// `MODEL=MS`: the model is down (503, absent from `/v1/models`) for MS milliseconds from
    /// the start, then healthy (repeatable).
    #[arg(long = "model-down", value_name = "MODEL=MS")]
    pub model_down: Vec<crate::models::ModelDown>,
    /// Serve this model but leave it out of `/v1/models`, as an engine that lists a served name
    /// or a file path of its own does (repeatable).
    #[arg(long = "unlisted", value_name = "MODEL")]
    pub unlisted: Vec<String>,
    /// Like vLLM's `--api-key`: every `/v1/*` request must carry `Authorization: Bearer KEY`,
    /// else 401 `{"error": "Unauthorized"}` (`/health` and `/metrics` stay open).
    #[arg(long, env = "ENGINESIM_API_KEY")]
    pub api_key: Option<String>,
    /// Per-model stream faults, prefill refusal and non-deterministic regeneration.
    #[command(flatten)]
    pub streams: crate::streams::StreamArgs,
    /// LoRA adapters: loaded at start, their limit, load time, extra TTFT and load failures.
    #[command(flatten)]
    pub lora: LoraArgs,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            listen: "127.0.0.1:0".into(),
            name: "sim".into(),
            models: vec!["sim-model".into()],
            ttft_ms: 10,
            prefill_ms_per_block: 1,
            itl_ms: 2,
            default_tokens: 8,
            max_num_seqs: 16,
            max_model_len: 4096,
            block_size: 16,
            cache_blocks: 4096,
            seed: 0,
            fault: None,
            fault_count: None,
            response_headers: Vec::new(),
            fixed_response: false,
            model_faults: Vec::new(),
            model_down: Vec::new(),
            unlisted: Vec::new(),
            api_key: None,
            streams: crate::streams::StreamArgs::default(),
            lora: LoraArgs::default(),
        }
    }
}

impl SimConfig {
    /// Checks what the flags cannot check one by one: every `--lora` adapter names a served base
    /// model, has a name of its own (neither a base model's nor another adapter's), and they
    /// fit in `--max-loras`. [`crate::spawn`] and the binary call it; [`crate::SimState::new`]
    /// does not.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::BadLora(m));
        for (i, l) in self.lora.loras.iter().enumerate() {
            if !self.models.contains(&l.base) {
                let served = self.models.join(", ");
                return bad(format!(
                    "--lora {}={}: the base model `{}` is not served here (--model: {served})",
                    l.name, l.base, l.base
                ));
            }
            if self.models.contains(&l.name) {
                return bad(format!("--lora {}={}: `{}` is a base model's name", l.name, l.base, l.name));
            }
            if self.lora.loras[..i].iter().any(|o| o.name == l.name) {
                return bad(format!("--lora {}: the adapter is given twice", l.name));
            }
        }
        let (n, max) = (self.lora.loras.len(), self.lora.max_loras);
        if n > max {
            return bad(format!("{n} --lora adapters but --max-loras {max}: raise --max-loras or load fewer"));
        }
        Ok(())
    }
}

/// The LoRA adapter flags (flattened into [`SimConfig`]; see [`crate::lora`]).
#[derive(clap::Args, Clone, Debug)]
pub struct LoraArgs {
    /// `NAME=BASE`: a LoRA adapter loaded at start on base model BASE (one of --model), served
    /// to requests with `"model": "NAME"` (repeatable).
    #[arg(long = "lora", value_name = "NAME=BASE")]
    pub loras: Vec<StaticLora>,
    /// Adapters loaded at once; a load beyond it gets a 400 until one is unloaded. 0 turns
    /// adapters off, as vLLM without `--enable-lora` (no adapter endpoints, no LoRA metric).
    #[arg(long, default_value_t = 4)]
    pub max_loras: usize,
    /// Time a `POST /v1/load_lora_adapter` takes before it answers, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub lora_load_ms: u64,
    /// Extra time to first token of a request to an adapter, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub lora_ttft_ms: u64,
    /// `NAME[=error|not-found]`: every load of adapter NAME fails, with a 500 (`error`, the
    /// default) or vLLM's 404 for an adapter path with no adapter (`not-found`) (repeatable).
    /// At runtime: `POST /sim/loras {"lora_name", "fail_load", "count"}`.
    #[arg(long = "lora-load-fail", value_name = "NAME[=error|not-found]")]
    pub lora_load_fail: Vec<LoraLoadFail>,
}

impl Default for LoraArgs {
    fn default() -> Self {
        LoraArgs { loras: Vec::new(), max_loras: 4, lora_load_ms: 0, lora_ttft_ms: 0, lora_load_fail: Vec::new() }
    }
}

/// `NAME=BASE` (`--lora`): an adapter loaded at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticLora {
    /// The adapter's name: the `model` its requests give.
    pub name: String,
    /// The base model it is attached to.
    pub base: String,
}

impl FromStr for StaticLora {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        match s.split_once('=') {
            Some((name, base)) if !name.is_empty() && !base.is_empty() => {
                Ok(StaticLora { name: name.to_string(), base: base.to_string() })
            }
            _ => Err(SimError::BadLora(format!("--lora `{s}`: expected NAME=BASE, e.g. `sql-lora=sim-model`"))),
        }
    }
}

/// How an injected adapter load fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadFailure {
    /// 500 `InternalServerError` (`Loading lora PATH failed`), as a broken adapter gives.
    Error,
    /// 404 `NotFoundError` (`Loading lora NAME failed: No adapter found for PATH`).
    NotFound,
}

impl FromStr for LoadFailure {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        match s {
            "error" => Ok(LoadFailure::Error),
            "not-found" => Ok(LoadFailure::NotFound),
            _ => Err(SimError::BadLora(format!("load failure `{s}`: expected `error` or `not-found`"))),
        }
    }
}

/// `NAME[=error|not-found]` (`--lora-load-fail`): loads of adapter NAME fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraLoadFail {
    /// The adapter.
    pub name: String,
    /// How its loads fail.
    pub failure: LoadFailure,
}

impl FromStr for LoraLoadFail {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        let (name, failure) = match s.split_once('=') {
            Some((name, kind)) => (name, kind.parse()?),
            None => (s, LoadFailure::Error),
        };
        if name.is_empty() {
            return Err(SimError::BadLora(format!("--lora-load-fail `{s}`: expected NAME[=error|not-found]")));
        }
        Ok(LoraLoadFail { name: name.to_string(), failure })
    }
}

/// A failure the simulator injects into an inference request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// HTTP 429, with `Retry-After: secs` when set.
    RateLimit(Option<u64>),
    /// HTTP 500.
    Error500,
    /// HTTP 503.
    Error503,
    /// The connection is closed before any response header.
    Reset,
    /// Nothing is ever sent; the request hangs until the client gives up.
    NoResponse,
    /// The first token takes this many milliseconds.
    SlowFirstToken(u64),
    /// The stream is cut (connection aborted) after this many tokens.
    Cut(u32),
    /// The stream stalls for a minute after this many tokens.
    Stall(u32),
    /// A malformed SSE chunk is sent after this many tokens.
    Malformed(u32),
    /// The stream ends cleanly but without `data: [DONE]`.
    NoDone,
    /// HTTP 400: the context length is exceeded.
    ContextLength,
    /// HTTP 400: the content policy rejected the prompt.
    ContentPolicy,
}

impl FromStr for Fault {
    type Err = SimError;
    fn from_str(s: &str) -> Result<Self, SimError> {
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        let num = |default: u64| -> Result<u64, SimError> {
            match arg {
                None => Ok(default),
                Some(a) => a.parse().map_err(|_| SimError::BadFault(s.to_string())),
            }
        };
        let small = |default: u64| num(default).map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        Ok(match kind {
            "rate-limit" => Fault::RateLimit(arg.map(|_| num(1)).transpose()?),
            "error-500" => Fault::Error500,
            "error-503" => Fault::Error503,
            "reset" => Fault::Reset,
            "no-response" => Fault::NoResponse,
            "slow-first-token" => Fault::SlowFirstToken(num(5000)?),
            "cut" => Fault::Cut(small(2)?),
            "stall" => Fault::Stall(small(2)?),
            "malformed" => Fault::Malformed(small(2)?),
            "no-done" => Fault::NoDone,
            "context-length" => Fault::ContextLength,
            "content-policy" => Fault::ContentPolicy,
            _ => return Err(SimError::BadFault(s.to_string())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        SimConfig::command().debug_assert();
    }

    #[test]
    fn faults_parse() {
        assert_eq!("rate-limit".parse::<Fault>().unwrap(), Fault::RateLimit(None));
        assert_eq!("rate-limit:3".parse::<Fault>().unwrap(), Fault::RateLimit(Some(3)));
        assert_eq!("cut:5".parse::<Fault>().unwrap(), Fault::Cut(5));
        assert_eq!("stall".parse::<Fault>().unwrap(), Fault::Stall(2));
        assert!("explode".parse::<Fault>().is_err());
        assert!("cut:x".parse::<Fault>().is_err());
    }

    #[test]
    fn lora_flags_parse_and_are_checked_against_the_models() {
        let c = SimConfig::try_parse_from([
            "sim",
            "--model",
            "base",
            "--lora",
            "sql=base",
            "--max-loras",
            "2",
            "--lora-load-fail",
            "broken",
            "--lora-load-fail",
            "gone=not-found",
        ])
        .unwrap();
        assert_eq!(c.lora.loras, vec![StaticLora { name: "sql".into(), base: "base".into() }]);
        assert_eq!(c.lora.lora_load_fail[0], LoraLoadFail { name: "broken".into(), failure: LoadFailure::Error });
        assert_eq!(c.lora.lora_load_fail[1].failure, LoadFailure::NotFound);
        assert!(c.validate().is_ok());
        for bad in ["sql", "=base", "sql="] {
            assert!(bad.parse::<StaticLora>().is_err(), "{bad}");
        }
        assert!("x=explode".parse::<LoraLoadFail>().is_err());

        let with = |loras: &[&str], max: usize| SimConfig {
            models: vec!["base".into()],
            lora: LoraArgs {
                loras: loras.iter().map(|l| l.parse().unwrap()).collect(),
                max_loras: max,
                ..Default::default()
            },
            ..SimConfig::default()
        };
        let err = with(&["sql=other"], 4).validate().unwrap_err().to_string();
        assert!(err.contains("`other` is not served") && err.contains("--model: base"), "{err}");
        assert!(with(&["base=base"], 4).validate().unwrap_err().to_string().contains("base model's name"));
        assert!(with(&["a=base", "a=base"], 4).validate().unwrap_err().to_string().contains("twice"));
        assert!(with(&["a=base", "b=base"], 1).validate().unwrap_err().to_string().contains("--max-loras 1"));
        assert!(with(&["a=base"], 0).validate().is_err(), "0 turns adapters off");
    }
}
