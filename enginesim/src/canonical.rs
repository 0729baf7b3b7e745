//! The canonical answer, and prefill continuation of it. A request's tokens are words drawn by a
//! generator keyed on the simulator's `--seed`, the model, the request's `seed` and its prompt
//! text ([`prompt_text`]); the first `n` tokens of that sequence are its answer of `n` tokens, so
//! a longer answer extends a shorter one. [`canonical_text`] is that answer for a request body a
//! test is about to send. [`plan`] decides what a request gets: the canonical answer, or, for a
//! prefill continuation (vLLM's `continue_final_message` on chat, a prompt extended with the
//! partial answer on completions), the rest of the canonical answer the partial text began.

use serde_json::Value;

use crate::SimConfig;
use crate::cache::fnv;
use crate::generate::{Kind, VOCAB, words};

/// Largest number of tokens one answer has.
pub const MAX_TOKENS: u64 = 4096;

/// What the generator is keyed on.
#[derive(Clone, Copy, Debug)]
pub struct Key<'a> {
    /// The simulator's `--seed`.
    pub sim_seed: u64,
    /// The request's `model`.
    pub model: &'a str,
    /// The request's `seed`, if any.
    pub seed: Option<u64>,
    /// The prompt text ([`prompt_text`]).
    pub prompt: &'a str,
    /// 0 for deterministic answers; a fresh number per attempt when a model regenerates
    /// non-deterministically.
    pub nonce: u64,
}

/// The first `n` tokens (each a word and a space) of the sequence `key` selects.
pub fn tokens(key: &Key<'_>, n: u64) -> Vec<String> {
    let mut seed = fnv(key.sim_seed, key.model.as_bytes());
    if let Some(s) = key.seed {
        seed = fnv(seed, &s.to_le_bytes());
    }
    if key.nonce != 0 {
        seed = fnv(seed, &key.nonce.to_le_bytes());
    }
    words(seed, key.prompt, n.min(MAX_TOKENS))
}

/// The text of a message `content` (a string, or an array of text parts joined by spaces).
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().filter_map(|p| p["text"].as_str().or(p.as_str())).collect::<Vec<_>>().join(" "),
        _ => String::new(),
    }
}

/// The prompt text of chat messages: their contents joined by newlines (roles are not part of it).
pub fn chat_prompt(messages: &[Value]) -> String {
    messages.iter().map(|m| content_text(&m["content"])).collect::<Vec<_>>().join("\n")
}

/// The prompt text of a request body: [`chat_prompt`] of `messages`, or the completion `prompt`.
pub fn prompt_text(body: &Value, kind: Kind) -> String {
    match kind {
        Kind::Chat => chat_prompt(messages(body)),
        Kind::Completion => content_text(&body["prompt"]),
    }
}

fn messages(body: &Value) -> &[Value] {
    body["messages"].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// `max_tokens` (or `max_completion_tokens`), capped at [`MAX_TOKENS`].
pub fn limit(body: &Value) -> Option<u64> {
    body["max_tokens"].as_u64().or(body["max_completion_tokens"].as_u64()).map(|n| n.min(MAX_TOKENS))
}

/// The full text the simulator answers to `body` (as sent to `/v1/chat/completions` or
/// `/v1/completions`) with no fault and deterministic generation: the first `max_tokens`
/// (else `--default-tokens`) tokens of the sequence keyed on `--seed`, `model`, `seed` and the
/// prompt text. For a chat continuation body (`continue_final_message`), the answer its final
/// assistant message began: that of the conversation without it. A pure function of its inputs.
pub fn canonical_text(config: &SimConfig, kind: Kind, body: &Value) -> String {
    let mut prompt = prompt_text(body, kind);
    if kind == Kind::Chat
        && body["continue_final_message"].as_bool() == Some(true)
        && let Some((_, conversation)) = messages(body).split_last()
    {
        prompt = chat_prompt(conversation);
    }
    let n = limit(body).unwrap_or(u64::from(config.default_tokens));
    tokens(&key(config, body, &prompt, 0), n).concat()
}

fn key<'a>(config: &SimConfig, body: &'a Value, prompt: &'a str, nonce: u64) -> Key<'a> {
    let seed = body["seed"].as_u64().or(body["seed"].as_i64().map(|s| s as u64));
    Key { sim_seed: config.seed, model: body["model"].as_str().unwrap_or_default(), seed, prompt, nonce }
}

/// How a request was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Continued {
    /// An ordinary request.
    No,
    /// A continuation whose partial text is a prefix of the canonical answer: the rest of it.
    Matched,
    /// A continuation whose partial text is not: a fresh answer keyed on the whole prompt.
    Diverged,
}

/// What one request is answered with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// The output tokens.
    pub tokens: Vec<String>,
    /// Whether (and how) it continues a partial answer.
    pub continued: Continued,
}

/// Decides the answer to `body`. `Err` is the message of a 400, as vLLM gives: a continuation
/// asked of a model that refuses prefill (`refuse_prefill`), `continue_final_message` with
/// `add_generation_prompt` not `false`, or a final message that is not the assistant's.
/// `nonce` is 0 for deterministic answers.
pub fn plan(config: &SimConfig, kind: Kind, body: &Value, nonce: u64, refuse_prefill: bool) -> Result<Turn, String> {
    let budget = limit(body);
    let fresh = |prompt: &str| Turn {
        tokens: tokens(&key(config, body, prompt, nonce), budget.unwrap_or(u64::from(config.default_tokens))),
        continued: Continued::No,
    };
    let prompt = prompt_text(body, kind);
    if kind == Kind::Completion {
        // The prompt may be an earlier prompt followed by whole tokens of its answer.
        for split in completion_splits(&prompt) {
            let (head, partial) = prompt.split_at(split);
            if let Some(tokens) = rest(config, &key(config, body, head, nonce), partial, budget) {
                return Ok(Turn { tokens, continued: Continued::Matched });
            }
        }
        return Ok(fresh(&prompt));
    }
    if body.get("continue_final_message").is_none_or(Value::is_null) {
        return Ok(fresh(&prompt));
    }
    if refuse_prefill {
        return Err("continue_final_message: Extra inputs are not permitted".into());
    }
    if body["continue_final_message"].as_bool() != Some(true) {
        return Ok(fresh(&prompt));
    }
    if body["add_generation_prompt"].as_bool() != Some(false) {
        return Err("Cannot set both `continue_final_message` and `add_generation_prompt` to True.".into());
    }
    let Some((last, conversation)) = messages(body).split_last().filter(|(m, _)| m["role"] == "assistant") else {
        return Err("continue_final_message requires the final message to be the assistant's partial answer".into());
    };
    let partial = content_text(&last["content"]);
    let conversation = chat_prompt(conversation);
    match rest(config, &key(config, body, &conversation, nonce), &partial, budget) {
        Some(tokens) => Ok(Turn { tokens, continued: Continued::Matched }),
        None => Ok(Turn { continued: Continued::Diverged, ..fresh(&prompt) }),
    }
}

/// The tokens after `partial` in the sequence `key` selects, when `partial` is a prefix of its
/// text (it may end inside a token: the first output token is then that token's remainder).
/// `budget` new tokens, or as many as reach `--default-tokens` in all.
fn rest(config: &SimConfig, key: &Key<'_>, partial: &str, budget: Option<u64>) -> Option<Vec<String>> {
    let shortest = VOCAB.iter().map(|w| w.len() + 1).min().unwrap_or(1);
    let covered = (partial.len() / shortest + 1) as u64;
    let mut want = budget.unwrap_or(u64::from(config.default_tokens));
    let canon = tokens(key, covered.saturating_add(want));
    let (mut pos, mut full) = (0, 0);
    let bytes = partial.as_bytes();
    let mut first = None;
    while pos < bytes.len() {
        let token = canon.get(full)?;
        let left = &bytes[pos..];
        if left.len() >= token.len() {
            if !left.starts_with(token.as_bytes()) {
                return None;
            }
            pos += token.len();
            full += 1;
        } else {
            if !token.as_bytes().starts_with(left) {
                return None;
            }
            first = token.get(left.len()..).map(str::to_owned);
            break;
        }
    }
    if budget.is_none() {
        want = u64::from(config.default_tokens).saturating_sub(full as u64);
    }
    let mut out: Vec<String> = first.into_iter().collect();
    let skip = full + out.len();
    out.extend(canon.into_iter().skip(skip));
    out.truncate(usize::try_from(want).unwrap_or(usize::MAX));
    Some(out)
}

/// Where a completion prompt could end and whole generated tokens begin: the starts of the
/// trailing run of `word ` tokens, longest run first, never the prompt's very start.
fn completion_splits(prompt: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut end = prompt.len();
    while let Some(w) = VOCAB.iter().find(|w| prompt[..end].strip_suffix(' ').is_some_and(|p| p.ends_with(*w))) {
        end -= w.len() + 1;
        if end == 0 {
            break;
        }
        starts.push(end);
    }
    starts.reverse();
    starts
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn config() -> SimConfig {
        SimConfig { seed: 7, default_tokens: 12, ..SimConfig::default() }
    }

    #[test]
    fn answers_depend_on_seed_model_and_prompt_and_extend_each_other() {
        let c = config();
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let a = canonical_text(&c, Kind::Chat, &body);
        assert_eq!(a, canonical_text(&c, Kind::Chat, &body));
        assert_eq!(a.split_whitespace().count(), 12);
        for other in [
            json!({"model": "n", "messages": [{"role": "user", "content": "hi"}]}),
            json!({"model": "m", "seed": 3, "messages": [{"role": "user", "content": "hi"}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": "ho"}]}),
        ] {
            assert_ne!(a, canonical_text(&c, Kind::Chat, &other), "{other}");
        }
        let short =
            canonical_text(&c, Kind::Chat, &json!({"model": "m", "max_tokens": 5, "messages": body["messages"]}));
        assert!(a.starts_with(&short) && short.split_whitespace().count() == 5);
    }

    #[test]
    fn a_partial_answer_is_continued_to_the_canonical_answer_even_inside_a_token() {
        let c = config();
        let msgs = json!([{"role": "user", "content": "tell me"}]);
        let canon = canonical_text(&c, Kind::Chat, &json!({"model": "m", "messages": msgs}));
        for cut in [0, 1, 4, 9, canon.len() / 2, canon.len()] {
            let partial = &canon[..cut];
            let mut m = msgs.as_array().unwrap().clone();
            m.push(json!({"role": "assistant", "content": partial}));
            let body =
                json!({"model": "m", "messages": m, "continue_final_message": true, "add_generation_prompt": false});
            let turn = plan(&c, Kind::Chat, &body, 0, false).unwrap();
            assert_eq!(turn.continued, Continued::Matched);
            assert_eq!(format!("{partial}{}", turn.tokens.concat()), canon, "cut at {cut}");
        }
    }

    #[test]
    fn completion_prompts_extended_with_whole_tokens_continue() {
        let c = config();
        let canon = canonical_text(&c, Kind::Completion, &json!({"model": "m", "prompt": "Once"}));
        let toks: Vec<&str> = canon.split_inclusive(' ').collect();
        let partial = toks[..5].concat();
        let body = json!({"model": "m", "prompt": format!("Once{partial}"), "max_tokens": 3});
        let turn = plan(&c, Kind::Completion, &body, 0, false).unwrap();
        assert_eq!(turn.continued, Continued::Matched);
        assert_eq!(turn.tokens.concat(), toks[5..8].concat());
        let plain = plan(&c, Kind::Completion, &json!({"model": "m", "prompt": "Once"}), 0, false).unwrap();
        assert_eq!((plain.continued, plain.tokens.concat()), (Continued::No, canon));
        assert!(completion_splits("the fleet ").iter().all(|s| *s > 0));
    }

    #[test]
    fn vllm_rules_for_continue_final_message() {
        let c = config();
        let m = json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "the"}]);
        let ok = json!({"model": "m", "messages": m, "continue_final_message": true, "add_generation_prompt": false});
        assert!(plan(&c, Kind::Chat, &ok, 0, true).unwrap_err().contains("continue_final_message"));
        let both = json!({"model": "m", "messages": m, "continue_final_message": true});
        assert!(plan(&c, Kind::Chat, &both, 0, false).unwrap_err().contains("add_generation_prompt"));
        let user_last = json!({"model": "m", "messages": [{"role": "user", "content": "q"}],
            "continue_final_message": true, "add_generation_prompt": false});
        assert!(plan(&c, Kind::Chat, &user_last, 0, false).is_err());
        let diverged = json!({"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "zzz"}],
            "continue_final_message": true, "add_generation_prompt": false});
        assert_eq!(plan(&c, Kind::Chat, &diverged, 0, false).unwrap().continued, Continued::Diverged);
        let regenerated = plan(&c, Kind::Chat, &ok, 1, false).unwrap();
        assert_ne!(regenerated.tokens, plan(&c, Kind::Chat, &ok, 0, false).unwrap().tokens);
    }
}
