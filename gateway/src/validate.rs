//! The JSON types of a request body's OpenAI fields, checked before any upstream is asked: a
//! client sending `"stream": "true"` (a string), `"max_tokens": "16"` or messages that are not
//! objects gets a 400 naming the field and what to send instead, and no engine sees it, so an
//! engine that fails on such a body (a 5xx) never counts the client's mistake against the route's
//! health. Only the types of fields the gateway knows are checked; values, and fields it does
//! not know (engine extensions), are the engine's to judge. `null` is accepted wherever a field
//! is optional, as OpenAI accepts it. [`check`] is a pure function of the endpoint and the body.

use serde_json::Value;

use crate::metrics::Endpoint;

/// A JSON type a field may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Bool,
    /// A whole number (`16`, not `16.0` nor `"16"`).
    Integer,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    fn matches(self, v: &Value) -> bool {
        match self {
            Kind::Bool => v.is_boolean(),
            Kind::Integer => v.is_i64() || v.is_u64(),
            Kind::Number => v.is_number(),
            Kind::String => v.is_string(),
            Kind::Array => v.is_array(),
            Kind::Object => v.is_object(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Bool => "a boolean (true or false)",
            Kind::Integer => "an integer",
            Kind::Number => "a number",
            Kind::String => "a string",
            Kind::Array => "an array",
            Kind::Object => "an object",
        }
    }
}

/// The name of `v`'s JSON type, for messages.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a fractional number",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Fields and the types each may have.
type Fields = &'static [(&'static str, &'static [Kind])];

/// Optional fields every endpoint shares, and their types.
const COMMON: Fields = &[("user", &[Kind::String])];

/// Optional fields of chat and text completions.
const GENERATION: Fields = &[
    ("stream", &[Kind::Bool]),
    ("stream_options", &[Kind::Object]),
    ("max_tokens", &[Kind::Integer]),
    ("max_completion_tokens", &[Kind::Integer]),
    ("n", &[Kind::Integer]),
    ("seed", &[Kind::Integer]),
    ("temperature", &[Kind::Number]),
    ("top_p", &[Kind::Number]),
    ("presence_penalty", &[Kind::Number]),
    ("frequency_penalty", &[Kind::Number]),
    ("stop", &[Kind::String, Kind::Array]),
    ("logit_bias", &[Kind::Object]),
];

/// Optional fields of chat completions only.
const CHAT: Fields = &[
    ("logprobs", &[Kind::Bool]),
    ("top_logprobs", &[Kind::Integer]),
    ("tools", &[Kind::Array]),
    ("tool_choice", &[Kind::String, Kind::Object]),
    ("parallel_tool_calls", &[Kind::Bool]),
    ("response_format", &[Kind::Object]),
];

/// Optional fields of text completions only.
const COMPLETION: Fields = &[("logprobs", &[Kind::Integer]), ("echo", &[Kind::Bool])];

fn wrong(field: &str, kinds: &[Kind], got: &Value) -> String {
    let want: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let hint = match (kinds, got) {
        ([Kind::Bool], Value::String(s)) if s == "true" || s == "false" => format!(": send `\"{field}\": {s}`"),
        ([Kind::Integer] | [Kind::Number], Value::String(s)) if s.trim().parse::<f64>().is_ok() => {
            format!(": send `\"{field}\": {}` without quotes", s.trim())
        }
        _ => String::new(),
    };
    format!("`{field}` must be {}, not {}{hint}", want.join(" or "), type_of(got))
}

/// The types an optional field named `key` may have on `endpoint`, if it is one the gateway knows.
fn optional(endpoint: Endpoint, key: &str) -> Option<&'static [Kind]> {
    let tables: &[Fields] = match endpoint {
        Endpoint::chat_completions => &[COMMON, GENERATION, CHAT],
        Endpoint::completions => &[COMMON, GENERATION, COMPLETION],
        Endpoint::embeddings => &[COMMON],
    };
    tables.iter().flat_map(|t| t.iter()).find(|(f, _)| *f == key).map(|(_, kinds)| *kinds)
}

/// Whether `body` (a JSON object) has the right types for `endpoint`; `Err` says which field is
/// wrong and what to send (the required field first, then the first wrong one of the body's).
///
/// One pass over the body's own fields, each looked up among the few the gateway knows: a
/// lookup of every known field in the body would hash each name, on every request.
pub fn check(endpoint: Endpoint, body: &Value) -> Result<(), String> {
    let (required, kinds): (&str, &[Kind]) = match endpoint {
        Endpoint::chat_completions => ("messages", &[Kind::Array]),
        Endpoint::completions => ("prompt", &[Kind::String, Kind::Array]),
        Endpoint::embeddings => ("input", &[Kind::String, Kind::Array]),
    };
    let Some(fields) = body.as_object() else { return Err("the body must be a JSON object".into()) };
    match fields.get(required) {
        None | Some(Value::Null) => return Err(format!("`{required}` is required")),
        Some(v) if !kinds.iter().any(|k| k.matches(v)) => return Err(wrong(required, kinds, v)),
        Some(_) => {}
    }
    for (field, v) in fields {
        if v.is_null() {
            continue;
        }
        let Some(kinds) = optional(endpoint, field) else { continue };
        if !kinds.iter().any(|k| k.matches(v)) {
            return Err(wrong(field, kinds, v));
        }
        if field == "stream_options"
            && let Some(u) = v.get("include_usage").filter(|u| !u.is_null() && !u.is_boolean())
        {
            return Err(wrong("stream_options.include_usage", &[Kind::Bool], u));
        }
    }
    if endpoint == Endpoint::chat_completions {
        for (i, m) in fields.get("messages").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let Some(m) = m.as_object() else {
                return Err(format!("`messages[{i}]` must be an object with `role` and `content`, not {}", type_of(m)));
            };
            if !m.get("role").is_some_and(Value::is_string) {
                return Err(format!("`messages[{i}].role` must be a string (system, user, assistant, tool)"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(extra: Value) -> Value {
        let mut v = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    #[test]
    fn well_typed_bodies_pass_with_extensions_and_nulls() {
        let ok = chat(json!({"stream": true, "stream_options": {"include_usage": true}, "max_tokens": 16,
            "temperature": 0, "top_p": 0.9, "seed": 7, "stop": ["\n"], "n": null, "user": "u",
            "cache_prompt": "anything", "tools": [], "tool_choice": "auto"}));
        assert_eq!(check(Endpoint::chat_completions, &ok), Ok(()));
        let text = json!({"model": "m", "prompt": ["a", "b"], "logprobs": 2, "echo": false, "stop": "x"});
        assert_eq!(check(Endpoint::completions, &text), Ok(()));
        assert_eq!(check(Endpoint::embeddings, &json!({"model": "m", "input": "x"})), Ok(()));
    }

    #[test]
    fn a_wrong_type_is_named_with_what_to_send() {
        let e = check(Endpoint::chat_completions, &chat(json!({"stream": "true"}))).unwrap_err();
        assert_eq!(e, "`stream` must be a boolean (true or false), not a string: send `\"stream\": true`");
        let e = check(Endpoint::chat_completions, &chat(json!({"max_tokens": "16"}))).unwrap_err();
        assert!(
            e.contains("`max_tokens` must be an integer") && e.contains("`\"max_tokens\": 16` without quotes"),
            "{e}"
        );
        let e = check(Endpoint::chat_completions, &chat(json!({"max_tokens": 16.5}))).unwrap_err();
        assert!(e.contains("not a fractional number"), "{e}");
        let e = check(Endpoint::chat_completions, &chat(json!({"temperature": "hot"}))).unwrap_err();
        assert_eq!(e, "`temperature` must be a number, not a string");
        let e = check(Endpoint::chat_completions, &chat(json!({"stream_options": {"include_usage": 1}}))).unwrap_err();
        assert!(e.starts_with("`stream_options.include_usage` must be a boolean"), "{e}");
        let e = check(Endpoint::completions, &json!({"prompt": "p", "logprobs": true})).unwrap_err();
        assert!(e.starts_with("`logprobs` must be an integer"), "completions' logprobs is a count: {e}");
        assert!(check(Endpoint::chat_completions, &chat(json!({"logprobs": true}))).is_ok(), "chat's is a switch");
    }

    #[test]
    fn required_fields_and_message_shapes() {
        assert_eq!(check(Endpoint::chat_completions, &json!({"model": "m"})), Err("`messages` is required".into()));
        let e = check(Endpoint::chat_completions, &json!({"model": "m", "messages": "hi"})).unwrap_err();
        assert_eq!(e, "`messages` must be an array, not a string");
        let e = check(Endpoint::chat_completions, &json!({"messages": ["hi"]})).unwrap_err();
        assert!(e.starts_with("`messages[0]` must be an object"), "{e}");
        let e = check(Endpoint::chat_completions, &json!({"messages": [{"content": "hi"}]})).unwrap_err();
        assert!(e.starts_with("`messages[0].role` must be a string"), "{e}");
        assert!(
            check(Endpoint::completions, &json!({"prompt": 3}))
                .unwrap_err()
                .starts_with("`prompt` must be a string or an array")
        );
        assert_eq!(check(Endpoint::embeddings, &json!({})), Err("`input` is required".into()));
        assert_eq!(check(Endpoint::chat_completions, &json!([1])), Err("the body must be a JSON object".into()));
    }

    #[test]
    fn the_required_field_is_judged_first_then_any_wrong_field() {
        let body = json!({"temperature": "hot", "stream": "yes", "messages": "hi"});
        let e = check(Endpoint::chat_completions, &body).unwrap_err();
        assert_eq!(e, "`messages` must be an array, not a string");
        let body = json!({"temperature": "hot", "stream": "yes", "messages": []});
        let e = check(Endpoint::chat_completions, &body).unwrap_err();
        let (t, s) = (
            "`temperature` must be a number, not a string",
            "`stream` must be a boolean (true or false), not a string",
        );
        assert!(e == t || e.starts_with(s), "one wrong field named: {e}");
        // A field of another endpoint is not judged here: `echo` is a completions field.
        assert_eq!(check(Endpoint::chat_completions, &json!({"messages": [], "echo": "x"})), Ok(()));
        assert!(check(Endpoint::completions, &json!({"prompt": "p", "echo": "x"})).is_err());
    }
}
