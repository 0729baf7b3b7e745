//! How the gateway reaches a member's entry point, and how it tells a misconfigured entry from
//! an outage. A URL goes through [`normalise_url`] when a table is loaded (one trailing `/v1`
//! is dropped, since the gateway appends `/v1/...` itself; an API path, a query or a fragment
//! is refused). An upstream answer goes through [`config_fault`]: a 404 that is not an OpenAI
//! error body (a wrong path, not an unknown model) and a 401/403 (a missing or wrong upstream
//! credential) are configuration faults, reported as a cluster health reason rather than
//! retried as if the cluster were down. Upstream credentials ([`UpstreamToken`]) are sent as
//! `Authorization: Bearer` and never printed.

use std::fmt;

use http::{HeaderValue, StatusCode};
use prometheus_client::encoding::EncodeLabelValue;

/// A bearer token the gateway sends to one cluster's engine. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamToken(String);

impl UpstreamToken {
    /// A token from the text of a file or Secret (surrounding whitespace dropped); `Err` says
    /// what is wrong without quoting the text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err("it is empty".into());
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("it holds spaces or characters that cannot go in an HTTP header".into());
        }
        Ok(UpstreamToken(t.to_string()))
    }

    /// The `Authorization` header value, marked sensitive (hyper then never prints it).
    pub fn header(&self) -> Option<HeaderValue> {
        let mut v = HeaderValue::from_str(&format!("Bearer {}", self.0)).ok()?;
        v.set_sensitive(true);
        Some(v)
    }
}

impl fmt::Debug for UpstreamToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UpstreamToken(<redacted>)")
    }
}

/// What the gateway holds to reach one cluster: an upstream token, and for `https://` a CA
/// bundle and a client certificate and key (PEM). Printed only as which parts are present.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Material {
    /// Bearer token for the engine.
    pub token: Option<UpstreamToken>,
    /// PEM CA bundle verifying the entry point (absent: the system's roots).
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate chain (mutual TLS).
    pub client_cert_pem: Option<Vec<u8>>,
    /// PEM client private key (mutual TLS).
    pub client_key_pem: Option<Vec<u8>>,
}

impl Material {
    /// Whether any TLS setting is present.
    pub fn has_tls(&self) -> bool {
        self.ca_pem.is_some() || self.client_cert_pem.is_some() || self.client_key_pem.is_some()
    }
}

impl fmt::Debug for Material {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Material")
            .field("token", &self.token.is_some())
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.client_cert_pem.is_some())
            .field("client_key", &self.client_key_pem.is_some())
            .finish()
    }
}

/// URL schemes a member entry point may use.
pub const SCHEMES: &[&str] = &["http", "https"];

/// API paths a base URL must not end in (the gateway appends them itself).
const API_PATHS: [&str; 4] = ["/chat/completions", "/completions", "/embeddings", "/models"];

/// A member's base URL as the gateway uses it: without a trailing slash and without one
/// trailing `/v1`, with a note saying what was changed. Refused (with the reason and what to
/// write instead): a scheme other than `schemes`, a query or fragment, an API path, `/v1/v1`.
pub fn normalise_url(url: &str, schemes: &[&str]) -> Result<(String, Option<String>), String> {
    let Some(scheme) = schemes.iter().find(|s| url.starts_with(&format!("{s}://"))) else {
        let want: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
        return Err(format!("url `{url}` must start with {}", want.join(" or ")));
    };
    if url.contains('?') || url.contains('#') {
        return Err(format!(
            "url `{url}` has a query or fragment: give the engine's base URL, e.g. {scheme}://host:8000"
        ));
    }
    let rest = url.get(scheme.len() + 3..).unwrap_or_default().trim_end_matches('/');
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("url `{url}` has no host"));
    }
    let trimmed = format!("{scheme}://{rest}");
    if let Some(p) = API_PATHS.iter().find(|p| trimmed.ends_with(*p)) {
        return Err(format!(
            "url `{url}` ends in the API path `{p}`: give the engine's base URL (the gateway appends /v1{p} itself)"
        ));
    }
    let Some(base) = rest.strip_suffix("/v1").map(|r| format!("{scheme}://{r}")) else { return Ok((trimmed, None)) };
    if base.ends_with("/v1") {
        return Err(format!("url `{url}` ends in /v1/v1: give the engine's base URL, without /v1"));
    }
    let note = format!(
        "url `{url}` ends in /v1, which the gateway appends itself: using `{base}` (write it so to silence this)"
    );
    Ok((base.to_string(), Some(note)))
}

/// Why a cluster's entry point is misconfigured (a cluster health reason and metric label).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ConfigReason {
    /// The API path is not there (404 without an OpenAI error body): the URL is wrong.
    UpstreamNotFound,
    /// The engine refused the gateway's credential (401/403): missing or wrong token.
    UpstreamUnauthorized,
    /// The TLS handshake failed: the member's certificate is not trusted by the CA bundle or
    /// names another host, or the member refused the gateway's client certificate.
    UpstreamTls,
}

impl ConfigReason {
    /// What to change, for logs, `/readyz` and error messages.
    pub fn advice(self) -> &'static str {
        match self {
            ConfigReason::UpstreamNotFound => {
                "the cluster's URL is not the engine's base URL: give it as http(s)://host:port (no /v1 and no API path)"
            }
            ConfigReason::UpstreamUnauthorized => {
                "the engine refused the gateway's upstream credential: set or fix the cluster's token (tokenFile in the routing table, spec.endpointAuth.tokenSecretRef on the InferenceCluster)"
            }
            ConfigReason::UpstreamTls => {
                "check the CA bundle that verifies the member (caFile, spec.endpointAuth.caSecretRef), that the URL's host is a name in its certificate, and the client certificate it expects (clientCertFile/clientKeyFile, spec.endpointAuth.clientCertSecretRef)"
            }
        }
    }
}

/// Whether a body is an OpenAI-style error (`{"error": ...}` or vLLM's `{"object": "error"}`)
/// that is not a router's "no such path".
fn engine_error_body(body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else { return false };
    let shaped = !v["error"].is_null() || v["object"].as_str() == Some("error");
    shaped && v["error"]["code"].as_str() != Some("unknown_url")
}

/// The configuration fault an upstream answer shows, if any: a 404 that is not an engine's
/// error body (an unknown model gets one; a wrong path gets a router's bare 404), or 401/403.
pub fn config_fault(status: StatusCode, body: &[u8]) -> Option<ConfigReason> {
    match status {
        StatusCode::NOT_FOUND if !engine_error_body(body) => Some(ConfigReason::UpstreamNotFound),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Some(ConfigReason::UpstreamUnauthorized),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HTTP: &[&str] = &["http"];

    #[test]
    fn one_trailing_v1_is_dropped_with_a_note() {
        for (url, want) in [
            ("http://e:8000/v1", "http://e:8000"),
            ("http://e:8000/v1/", "http://e:8000"),
            ("http://e/openai/v1", "http://e/openai"),
        ] {
            let (base, note) = normalise_url(url, HTTP).unwrap();
            assert_eq!(base, want);
            assert!(note.unwrap().contains("ends in /v1"), "{url}");
        }
        assert_eq!(normalise_url("http://e:8000/", HTTP).unwrap(), ("http://e:8000".into(), None));
        assert_eq!(normalise_url("http://e/v1x", HTTP).unwrap(), ("http://e/v1x".into(), None));
        assert_eq!(normalise_url("http://v1", HTTP).unwrap(), ("http://v1".into(), None), "a host named v1");
    }

    #[test]
    fn ambiguous_urls_are_refused_with_the_reason() {
        for (url, why) in [
            ("http://e/v1/v1", "/v1/v1"),
            ("http://e/v1/chat/completions", "API path"),
            ("http://e/v1/models/", "API path"),
            ("http://e/v1?x=1", "query"),
            ("https://e", "must start with http://"),
            ("http:///v1", "no host"),
            ("http://", "no host"),
            ("http:///v1", "no host"),
        ] {
            let e = normalise_url(url, HTTP).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
        }
        assert!(normalise_url("https://e/v1", &["http", "https"]).is_ok());
    }

    #[test]
    fn a_bare_404_is_a_wrong_path_and_an_engines_404_is_an_unknown_model() {
        let nf = StatusCode::NOT_FOUND;
        // FastAPI's (vLLM's router) and nginx's answers to a path that is not there.
        assert_eq!(config_fault(nf, br#"{"detail":"Not Found"}"#), Some(ConfigReason::UpstreamNotFound));
        assert_eq!(config_fault(nf, b"<html>404</html>"), Some(ConfigReason::UpstreamNotFound));
        assert_eq!(config_fault(nf, b""), Some(ConfigReason::UpstreamNotFound));
        let gw = br#"{"error":{"message":"no such endpoint","code":"unknown_url"}}"#;
        assert_eq!(config_fault(nf, gw), Some(ConfigReason::UpstreamNotFound), "a chained gateway's wrong path");
        // vLLM's unknown model, old and new shapes: a model problem.
        let old = br#"{"object":"error","message":"The model `x` does not exist.","type":"NotFoundError","param":null,"code":404}"#;
        let new = br#"{"error":{"message":"The model `x` does not exist.","type":"NotFoundError","param":"model","code":404}}"#;
        assert_eq!(config_fault(nf, old), None);
        assert_eq!(config_fault(nf, new), None);
        assert_eq!(
            config_fault(StatusCode::UNAUTHORIZED, br#"{"error":"Unauthorized"}"#),
            Some(ConfigReason::UpstreamUnauthorized)
        );
        assert_eq!(config_fault(StatusCode::BAD_REQUEST, b""), None);
        assert_eq!(config_fault(StatusCode::INTERNAL_SERVER_ERROR, b""), None);
    }

    #[test]
    fn tokens_are_checked_and_never_printed() {
        let t = UpstreamToken::parse(" s3cret\n").unwrap();
        assert!(!format!("{t:?}").contains("s3cret"));
        let h = t.header().unwrap();
        assert!(h.is_sensitive());
        assert_eq!(h.to_str().unwrap(), "Bearer s3cret");
        assert!(!format!("{h:?}").contains("s3cret"));
        assert!(UpstreamToken::parse("  ").unwrap_err().contains("empty"));
        let e = UpstreamToken::parse("a b").unwrap_err();
        assert!(!e.contains("a b"), "{e}");
    }
}
