//! Prefill continuation as vLLM does it: a stream cut after N tokens, then the conversation sent
//! again with the partial answer as a final assistant message (`continue_final_message: true,
//! add_generation_prompt: false`) or, on `/v1/completions`, the prompt extended with it, gives
//! the rest of the canonical answer — prefix + continuation == canonical answer — with usage
//! counted right; a model set to refuse prefill answers 400, a non-deterministic one regenerates.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use flotilla_enginesim::canonical::canonical_text;
use flotilla_enginesim::generate::Kind;
use serde_json::{Value, json};

fn words(v: &Value) -> u64 {
    v.as_str().unwrap().split_whitespace().count() as u64
}

#[tokio::test(start_paused = true)]
async fn a_cut_chat_stream_continued_with_its_partial_answer_gives_the_canonical_answer() {
    let s = sim(|_| {});
    for (cut, max_tokens) in [(1u32, None), (4, None), (9, None), (3, Some(7u64))] {
        let mut original = chat("m", &format!("explain routing {cut}"));
        if let Some(n) = max_tokens {
            original["max_tokens"] = json!(n);
        }
        let canonical = canonical_text(&s.config, Kind::Chat, &original);
        s.set_stream_script("m", format!("cut:{cut}").parse().unwrap());
        let first = read_sse(post(&s, "/v1/chat/completions", &streamed(original.clone())).await).await;
        assert!(first.cut && first.token_chunks() == cut as usize, "{first:?}");
        let partial = first.text();

        let mut next = continuation(&original, &partial);
        if let Some(n) = max_tokens {
            next["max_tokens"] = json!(n - u64::from(cut)); // what is left of the budget
        }
        let rest = read_sse(post(&s, "/v1/chat/completions", &streamed(next.clone())).await).await;
        assert!(rest.done, "{rest:?}");
        assert_eq!(format!("{partial}{}", rest.text()), canonical, "cut after {cut}");
        let usage = rest.usage().unwrap();
        let prompt_words = words(&original["messages"][0]["content"]) + partial.split_whitespace().count() as u64;
        assert_eq!(usage["prompt_tokens"].as_u64(), Some(prompt_words), "the partial answer is prompt");
        assert_eq!(usage["completion_tokens"].as_u64(), Some(rest.token_chunks() as u64));
        assert_eq!(
            usage["completion_tokens"].as_u64().unwrap() + u64::from(cut),
            max_tokens.unwrap_or(10),
            "the two parts together are the canonical answer's tokens"
        );

        let plain = json_of(post(&s, "/v1/chat/completions", &next).await).await;
        assert_eq!(plain["choices"][0]["message"]["content"].as_str().unwrap(), rest.text(), "streamed or not");
    }
    let c = s.model_counters("m");
    assert_eq!((c.requests, c.continuations, c.stream_faults, c.diverged), (12, 8, 4, 0));
}

#[tokio::test(start_paused = true)]
async fn a_partial_answer_ending_inside_a_token_is_finished_from_there() {
    let s = sim(|_| {});
    let original = chat("m", "hello");
    let canonical = canonical_text(&s.config, Kind::Chat, &original);
    let partial = &canonical[..canonical.len() / 2 + 1];
    let r = json_of(post(&s, "/v1/chat/completions", &continuation(&original, partial)).await).await;
    assert_eq!(format!("{partial}{}", r["choices"][0]["message"]["content"].as_str().unwrap()), canonical);
}

#[tokio::test(start_paused = true)]
async fn a_completion_prompt_extended_with_the_partial_text_continues() {
    let s = sim(|_| {});
    let original = json!({"model": "m", "prompt": "The gateway", "max_tokens": 8});
    let canonical = canonical_text(&s.config, Kind::Completion, &original);
    s.set_stream_script("m", "cut:5".parse().unwrap());
    let first = read_sse(post(&s, "/v1/completions", &streamed(original.clone())).await).await;
    assert!(first.cut, "{first:?}");
    let partial = first.text();
    let prompt = format!("The gateway{partial}");
    let next = json!({"model": "m", "prompt": prompt, "max_tokens": 3});
    let rest = read_sse(post(&s, "/v1/completions", &streamed(next)).await).await;
    assert_eq!(format!("{partial}{}", rest.text()), canonical);
    let usage = rest.usage().unwrap();
    let prompt_words = prompt.split_whitespace().count() as u64; // "gatewaythe" is one word here
    assert_eq!((usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()), (Some(prompt_words), Some(3)));
    assert_eq!(s.model_counters("m").continuations, 1);
}

#[tokio::test(start_paused = true)]
async fn a_model_set_to_refuse_prefill_answers_400_and_vllm_rules_hold() {
    let s = sim(|c| c.streams.refuse_prefill = vec!["m".into()]);
    let original = chat("m", "hi");
    let canonical = canonical_text(&s.config, Kind::Chat, &original);
    let next = continuation(&original, &canonical[..8]);
    let r = post(&s, "/v1/chat/completions", &next).await;
    assert_eq!(r.status(), 400);
    let e = json_of(r).await;
    assert_eq!(e["error"]["type"], "BadRequestError", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("continue_final_message"), "{e}");
    let mut other = continuation(&chat("other", "hi"), "x");
    assert_eq!(post(&s, "/v1/chat/completions", &other).await.status(), 200, "another model accepts prefill");
    other["add_generation_prompt"] = json!(true);
    assert_eq!(post(&s, "/v1/chat/completions", &other).await.status(), 400, "vLLM refuses both at once");
    assert_eq!(post(&s, "/v1/chat/completions", &original).await.status(), 200, "plain requests still work");
    let c = s.model_counters("m");
    assert_eq!((c.requests, c.prefill_refused, c.continuations), (2, 1, 0));
    assert_eq!(s.model_counters("other").prefill_refused, 1);
}

#[tokio::test(start_paused = true)]
async fn deterministic_answers_repeat_and_a_nondeterministic_model_regenerates() {
    let s = sim(|c| c.streams.nondeterministic = vec!["other".into()]);
    let ask = |model: &str| chat(model, "same question");
    let text = |v: Value| v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let a = text(json_of(post(&s, "/v1/chat/completions", &ask("m")).await).await);
    let b = text(json_of(post(&s, "/v1/chat/completions", &ask("m")).await).await);
    assert_eq!(a, b);
    assert_eq!(a, canonical_text(&s.config, Kind::Chat, &ask("m")));
    let mut seeded = ask("m");
    seeded["seed"] = json!(5);
    assert_ne!(text(json_of(post(&s, "/v1/chat/completions", &seeded).await).await), a, "the request seed counts");

    let x = text(json_of(post(&s, "/v1/chat/completions", &ask("other")).await).await);
    let y = text(json_of(post(&s, "/v1/chat/completions", &ask("other")).await).await);
    assert_ne!(x, y, "every attempt is generated afresh");
    let partial = &x[..x.len() / 2];
    let r = json_of(post(&s, "/v1/chat/completions", &continuation(&ask("other"), partial)).await).await;
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(s.model_counters("other").diverged, 1, "a regenerated answer does not continue the partial one");
}
