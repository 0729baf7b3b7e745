//! API keys and their limits. Keys are stored as SHA-256 digests (a file, or Kubernetes Secrets
//! in the control cluster), each with the models it may use, the jurisdictions it may be
//! served in (narrowing a model's own policy, never widening it) and per-minute limits on
//! requests and on tokens (prompt + completion, charged from the answer's `usage`). A request
//! flows `authenticate` (401) → `authorize` (403) → `admit` (429 with `Retry-After`) →
//! `charge` after the answer. The presented key is hashed at once and never stored or logged;
//! only a key's `id` appears in logs and errors.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_apis::common::{JurisdictionCode, Sovereignty};
use serde::Deserialize;

use crate::health::lock;
use crate::table::Model;

/// The file (or Secret entry) as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeysFile {
    /// The keys.
    #[serde(default)]
    pub keys: Vec<KeySpec>,
}

/// One key as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeySpec {
    /// A name for the key: shown in logs, errors and metrics instead of the key.
    pub id: String,
    /// Lower-case hex SHA-256 of the key (`printf %s "$KEY" | sha256sum`).
    pub sha256: String,
    /// Models (canonical names or aliases) the key may use; empty: every model.
    #[serde(default)]
    pub models: Vec<String>,
    /// Jurisdictions the key's requests may be served in; empty: whatever the model allows.
    #[serde(default)]
    pub jurisdictions: Vec<JurisdictionCode>,
    /// Requests per minute; absent: unlimited.
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Prompt plus completion tokens per minute; absent: unlimited.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
}

/// A key, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiKey {
    /// Its id.
    pub id: String,
    /// Allowed model names; empty: all.
    pub models: Vec<String>,
    /// Its jurisdiction restriction as a policy (empty: allows anything).
    pub sovereignty: Sovereignty,
    /// Requests per minute.
    pub requests_per_minute: Option<u32>,
    /// Tokens per minute.
    pub tokens_per_minute: Option<u64>,
}

/// Why a key may not be used for a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The model is not in the key's list.
    Model,
    /// The key's jurisdictions and the model's do not meet.
    Jurisdiction,
}

impl ApiKey {
    fn allows_name(&self, model: &Model) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| *m == model.name || model.aliases.iter().any(|a| a == m))
    }

    /// Whether the key may use `model` at all.
    pub fn authorize(&self, model: &Model) -> Result<(), Refusal> {
        if !self.allows_name(model) {
            return Err(Refusal::Model);
        }
        let mine = &self.sovereignty.allowed_jurisdictions;
        let theirs = &model.sovereignty.allowed_jurisdictions;
        if !mine.is_empty() && !theirs.is_empty() && !theirs.iter().any(|j| mine.contains(j)) {
            return Err(Refusal::Jurisdiction);
        }
        Ok(())
    }
}

/// The keys in force: digests → keys. Replaced as a whole on reload.
#[derive(Clone, Debug, Default)]
pub struct KeySet {
    by_digest: HashMap<[u8; 32], Arc<ApiKey>>,
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_digest(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl KeySet {
    /// Keys from named YAML documents (a file, or each Secret's entry); `source` names the
    /// document in problems. A key with a problem is left out (it is refused, never granted
    /// more than written) and the problem names the document, the key's id and the field.
    pub fn from_documents<'a>(docs: impl IntoIterator<Item = (&'a str, &'a str)>) -> (Self, Vec<String>) {
        let mut set = KeySet::default();
        let mut ids: BTreeMap<String, String> = BTreeMap::new();
        let mut problems = Vec::new();
        for (source, text) in docs {
            let file: KeysFile = match serde_yaml_ng::from_str(text) {
                Ok(f) => f,
                Err(e) => {
                    problems.push(format!("{source}: {e}"));
                    continue;
                }
            };
            for k in file.keys {
                if let Some(first) = ids.insert(k.id.clone(), source.to_string()) {
                    problems
                        .push(format!("{source}: key id `{}` is also used in {first}: give each key its own id", k.id));
                    continue;
                }
                let Some(digest) = parse_digest(&k.sha256) else {
                    problems.push(format!(
                        "{source}: key `{}`: sha256 must be 64 hex digits (printf %s \"$KEY\" | sha256sum)",
                        k.id
                    ));
                    continue;
                };
                if k.requests_per_minute == Some(0) || k.tokens_per_minute == Some(0) {
                    problems.push(format!(
                        "{source}: key `{}`: a per-minute limit of 0 refuses everything; remove the key to revoke it",
                        k.id
                    ));
                    continue;
                }
                let key = ApiKey {
                    id: k.id,
                    models: k.models,
                    sovereignty: Sovereignty { allowed_jurisdictions: k.jurisdictions, ..Default::default() },
                    requests_per_minute: k.requests_per_minute,
                    tokens_per_minute: k.tokens_per_minute,
                };
                if set.by_digest.contains_key(&digest) {
                    problems.push(format!("{source}: key `{}` has the sha256 of another key: it is left out", key.id));
                    continue;
                }
                set.by_digest.insert(digest, Arc::new(key));
            }
        }
        (set, problems)
    }

    /// Whether `text` is a keys document at all (the caller keeps its last good one otherwise).
    pub fn parses(text: &str) -> Result<(), String> {
        serde_yaml_ng::from_str::<KeysFile>(text).map(|_| ()).map_err(|e| e.to_string())
    }

    /// Full-access keys given in plain text on the command line (hashed here).
    pub fn add_plain(&mut self, keys: &[String]) {
        for (i, k) in keys.iter().enumerate() {
            let key = ApiKey {
                id: format!("flag-{}", i + 1),
                models: Vec::new(),
                sovereignty: Sovereignty::default(),
                requests_per_minute: None,
                tokens_per_minute: None,
            };
            self.by_digest.insert(sha256(k.trim().as_bytes()), Arc::new(key));
        }
    }

    /// The key whose digest matches `presented`'s.
    pub fn authenticate(&self, presented: &str) -> Option<Arc<ApiKey>> {
        self.by_digest.get(&sha256(presented.trim().as_bytes())).cloned()
    }

    /// How many keys are in force.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// Whether no key is in force.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

/// A bucket that refills `per_minute` units over a minute, holding at most `per_minute`.
/// It may go into debt (tokens are charged after the answer); while it is in debt or empty,
/// requests wait.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    fn refill(&mut self, per_minute: f64, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * per_minute / 60.0).min(per_minute);
        self.at = now;
    }
    /// Time until the level reaches `need`.
    fn wait_for(&self, need: f64, per_minute: f64) -> Duration {
        Duration::from_secs_f64(((need - self.level).max(0.0)) * 60.0 / per_minute)
    }
}

#[derive(Debug, Default)]
struct Usage {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

/// Per-key limit state; it survives key reloads (keyed by id), so rotating a key's record
/// does not reset its budget.
#[derive(Debug, Default)]
pub struct Limiter {
    usage: Mutex<HashMap<String, Usage>>,
}

/// Which limit was hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Requests per minute.
    Requests,
    /// Tokens per minute.
    Tokens,
}

impl Limiter {
    /// Admit one request for `key` at `now`, or say which limit it hit and how long to wait.
    pub fn admit(&self, key: &ApiKey, now: Instant) -> Result<(), (Limit, Duration)> {
        let mut all = lock(&self.usage);
        let u = all.entry(key.id.clone()).or_default();
        if let Some(tpm) = key.tokens_per_minute {
            let tpm = tpm as f64;
            let b = u.tokens.get_or_insert(Bucket { level: tpm, at: now });
            b.refill(tpm, now);
            if b.level <= 0.0 {
                return Err((Limit::Tokens, b.wait_for(1.0, tpm)));
            }
        }
        if let Some(rpm) = key.requests_per_minute {
            let rpm = f64::from(rpm);
            let b = u.requests.get_or_insert(Bucket { level: rpm, at: now });
            b.refill(rpm, now);
            if b.level < 1.0 {
                return Err((Limit::Requests, b.wait_for(1.0, rpm)));
            }
            b.level -= 1.0;
        }
        Ok(())
    }

    /// Charge `tokens` used by an answer to `key`.
    pub fn charge(&self, key: &ApiKey, tokens: u64, now: Instant) {
        let Some(tpm) = key.tokens_per_minute else { return };
        let tpm = tpm as f64;
        let mut all = lock(&self.usage);
        let b = all.entry(key.id.clone()).or_default().tokens.get_or_insert(Bucket { level: tpm, at: now });
        b.refill(tpm, now);
        b.level -= tokens as f64;
    }

    /// Forget keys that are no longer in force.
    pub fn retain(&self, set: &KeySet) {
        let ids: std::collections::HashSet<&str> = set.by_digest.values().map(|k| k.id.as_str()).collect();
        lock(&self.usage).retain(|id, _| ids.contains(id.as_str()));
    }
}

/// Prompt plus completion tokens from an OpenAI `usage` object, if there is one.
pub fn usage_tokens(v: &serde_json::Value) -> Option<u64> {
    let u = v.get("usage")?;
    u["total_tokens"]
        .as_u64()
        .or_else(|| Some(u["prompt_tokens"].as_u64().unwrap_or(0) + u["completion_tokens"].as_u64().unwrap_or(0)))
        .filter(|t| *t > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(models: &str, juris: &str) -> String {
        format!(
            "keys:\n  - id: eu-team\n    sha256: {}\n    models: {models}\n    jurisdictions: {juris}\n    requestsPerMinute: 2\n    tokensPerMinute: 100\n",
            hex(&sha256(b"sk-eu"))
        )
    }

    fn model(name: &str, juris: &[&str]) -> Model {
        Model {
            name: name.into(),
            aliases: vec![format!("{name}-alias")],
            sovereignty: Sovereignty {
                allowed_jurisdictions: juris.iter().map(|j| JurisdictionCode((*j).into())).collect(),
                ..Default::default()
            },
            fallbacks: vec![],
            routes: vec![],
            deployments: vec![],
            scale_to_zero: false,
            parent: None,
            meters: Default::default(),
        }
    }

    #[test]
    fn keys_are_found_by_digest_and_never_by_plain_text() {
        let text = doc("[]", "[EU]");
        let set = KeySet::from_documents([("keys.yaml", text.as_str())]).0;
        assert_eq!(set.authenticate("sk-eu").unwrap().id, "eu-team");
        assert!(set.authenticate("sk-us").is_none());
        // The digest itself is not a key.
        assert!(set.authenticate(&hex(&sha256(b"sk-eu"))).is_none());
    }

    #[test]
    fn a_key_narrows_jurisdictions_and_models_but_never_widens() {
        let text = doc("[small, big-alias]", "[EU]");
        let set = KeySet::from_documents([("k", text.as_str())]).0;
        let k = set.authenticate("sk-eu").unwrap();
        assert_eq!(k.authorize(&model("small", &[])), Ok(()));
        assert_eq!(k.authorize(&model("small", &["EU", "US"])), Ok(()));
        assert_eq!(k.authorize(&model("small", &["US"])), Err(Refusal::Jurisdiction));
        assert_eq!(k.authorize(&model("big", &["EU"])), Ok(()), "allowed through an alias");
        assert_eq!(k.authorize(&model("other", &["EU"])), Err(Refusal::Model));
        assert!(k.sovereignty.allows("EU", "eu-west-1"));
        assert!(!k.sovereignty.allows("US", "us-east-1"));
    }

    #[test]
    fn invalid_documents_name_the_key_and_field() {
        let bad = "keys:\n  - {id: a, sha256: nothex}\n  - {id: a, sha256: nothex}\n";
        let (set, e) = KeySet::from_documents([("secret/ns/keys", bad)]);
        assert!(set.is_empty());
        assert!(e[0].contains("secret/ns/keys: key `a`: sha256 must be 64 hex digits"), "{e:?}");
        assert!(e[1].contains("key id `a` is also used"), "{e:?}");
        let unknown = KeySet::from_documents([("f", "keys:\n  - {id: a, sha: x}\n")]).1;
        assert!(KeySet::parses("keys:\n  - {id: a, sha: x}\n").is_err());
        assert!(unknown[0].contains("unknown field `sha`"), "{unknown:?}");
    }

    #[test]
    fn request_and_token_limits_refill_over_a_minute() {
        let text = doc("[]", "[]");
        let set = KeySet::from_documents([("k", text.as_str())]).0;
        let k = set.authenticate("sk-eu").unwrap();
        let l = Limiter::default();
        let t0 = Instant::now();
        assert!(l.admit(&k, t0).is_ok());
        assert!(l.admit(&k, t0).is_ok());
        let (limit, wait) = l.admit(&k, t0).unwrap_err();
        assert_eq!(limit, Limit::Requests);
        assert_eq!(wait.as_secs(), 30, "2 per minute: one more after 30 s");
        let t1 = t0 + Duration::from_secs(30);
        assert!(l.admit(&k, t1).is_ok());
        // 250 tokens against 100 per minute: 150 in debt, plus one to get going = 91 s.
        l.charge(&k, 250, t1);
        let (limit, wait) = l.admit(&k, t1 + Duration::from_secs(60)).unwrap_err();
        assert_eq!(limit, Limit::Tokens);
        assert_eq!(wait.as_secs(), 30, "after 60 s of refill 50 tokens of debt remain: 30 s more, plus the one token");
        assert!(l.admit(&k, t1 + Duration::from_secs(91)).is_ok());
    }

    #[test]
    fn usage_is_read_from_answers() {
        let v = serde_json::json!({"usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}});
        assert_eq!(usage_tokens(&v), Some(12));
        let v = serde_json::json!({"usage": {"prompt_tokens": 7, "completion_tokens": 5}});
        assert_eq!(usage_tokens(&v), Some(12));
        assert_eq!(usage_tokens(&serde_json::json!({"choices": []})), None);
    }
}
