//! `oci://registry/repo[:tag|@sha256:…]` in the layout ORAS and `docker buildx` artifacts use: one
//! image manifest whose layers are the files, each named by its
//! `org.opencontainers.image.title` annotation. Fetches the manifest
//! (`GET /v2/{repo}/manifests/{ref}`), then each layer (`GET /v2/{repo}/blobs/{digest}`, redirects
//! followed), and checks every blob against its digest. A registry answering 401 with a `Bearer`
//! challenge gets the token flow (anonymous, or with `--oci-username` and the token as password).

use std::collections::BTreeMap;

use flotilla_apis::stage::{hex, is_sha256_digest};
use http::header;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::StageError;
use crate::http::{Http, Req, check_status};
use crate::source::{Listing, RemoteFile, SourceConfig, encode, trim_endpoint};

/// The annotation naming a layer's file.
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";
const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

/// A repository in an OCI registry at a tag or digest.
#[derive(Debug)]
pub struct Oci {
    repo: String,
    reference: String,
    endpoint: String,
    username: Option<String>,
    token: Option<String>,
    bearer: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    #[serde(default)]
    layers: Vec<Descriptor>,
    #[serde(default)]
    manifests: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

impl Oci {
    /// Parses what follows `oci://`.
    pub fn parse(rest: &str, config: &SourceConfig) -> Result<Oci, StageError> {
        let invalid = || {
            StageError::InvalidSource(format!("oci://{rest}: give oci://registry/repository:tag or @sha256:<digest>"))
        };
        let (registry, path) = rest.split_once('/').ok_or_else(invalid)?;
        let (repo, reference) = match path.split_once('@') {
            Some((r, d)) if is_sha256_digest(d) => (r, d.to_string()),
            Some(_) => return Err(invalid()),
            None => match path.rsplit_once(':') {
                Some((r, t)) if !t.contains('/') => (r, t.to_string()),
                _ => (path, "latest".to_string()),
            },
        };
        let repo_ok = !repo.is_empty()
            && repo.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
            && !repo.split('/').any(|s| s.is_empty() || s == "." || s == "..");
        let tag_ok =
            !reference.is_empty() && reference.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(&b));
        if registry.is_empty() || !repo_ok || !tag_ok {
            return Err(invalid());
        }
        let host = if registry == "docker.io" { "registry-1.docker.io" } else { registry };
        let endpoint = config.oci_endpoint.as_deref().map(trim_endpoint).unwrap_or_else(|| format!("https://{host}"));
        let bearer = if config.oci_username.is_none() { config.token.clone() } else { None };
        Ok(Oci {
            repo: repo.to_string(),
            reference,
            endpoint,
            username: config.oci_username.clone(),
            token: config.token.clone(),
            bearer,
        })
    }

    fn req(&self, url: &str) -> Result<Req, StageError> {
        let req = Req::get(url)?;
        match &self.bearer {
            Some(t) => req.credential(&self.endpoint, &format!("Bearer {t}")),
            None => Ok(req),
        }
    }

    /// Fetches the manifest and lists its layers as files.
    pub async fn list(&mut self, http: &Http) -> Result<Listing, StageError> {
        let url = format!("{}/v2/{}/manifests/{}", self.endpoint, self.repo, self.reference);
        let manifest_req = |me: &Oci| me.req(&url).and_then(|r| r.header(header::ACCEPT, ACCEPT));
        let first = http
            .retry(|| async {
                let req = manifest_req(self)?;
                let response = http.send(&req).await?;
                if response.status() == http::StatusCode::UNAUTHORIZED && self.bearer.is_none() {
                    let challenge = response.headers().get(header::WWW_AUTHENTICATE).and_then(|v| v.to_str().ok());
                    return Ok(Err(challenge.map(str::to_owned)));
                }
                let response = check_status(response, &req.uri).await?;
                Ok(Ok(http.read_small(response, &req.uri).await?))
            })
            .await?;
        let body = match first {
            Ok(body) => body,
            Err(challenge) => {
                let challenge = challenge.ok_or_else(|| StageError::unauthorized(&url, 401))?;
                self.bearer = Some(self.fetch_token(http, &challenge, &url).await?);
                http.get_bytes(|| manifest_req(self)).await?.1
            }
        };
        let resolved = format!("sha256:{}", hex(&Sha256::digest(&body)));
        if self.reference.starts_with("sha256:") && resolved != self.reference {
            return Err(StageError::FileDigest {
                file: format!("manifest {}", self.reference),
                expected: self.reference.clone(),
                actual: resolved,
            });
        }
        let manifest: Manifest = serde_json::from_slice(&body)
            .map_err(|e| StageError::InvalidSource(format!("{url}: not an image manifest: {e}")))?;
        if manifest.manifests.is_some() {
            return Err(StageError::InvalidSource(format!(
                "{url} is an index of several manifests; give one manifest's tag or digest"
            )));
        }
        let mut files = Vec::new();
        for layer in manifest.layers {
            let Some(title) = layer.annotations.get(TITLE_ANNOTATION) else {
                return Err(StageError::InvalidSource(format!(
                    "layer {} has no {TITLE_ANNOTATION} annotation",
                    layer.digest
                )));
            };
            let Some(sha) = layer.digest.strip_prefix("sha256:").filter(|_| is_sha256_digest(&layer.digest)) else {
                return Err(StageError::InvalidSource(format!("layer {title}: digest {} is not sha256", layer.digest)));
            };
            files.push(RemoteFile {
                path: title.clone(),
                size: layer.size,
                sha256: Some(sha.to_string()),
                locator: layer.digest.clone(),
            });
        }
        if files.is_empty() {
            return Err(StageError::NotFound { what: format!("{url}: no layers") });
        }
        Ok(Listing { files, resolved: Some(resolved) })
    }

    /// Answers a `Bearer realm=…,service=…,scope=…` challenge with a token.
    async fn fetch_token(&self, http: &Http, challenge: &str, url: &str) -> Result<String, StageError> {
        let unauthorized = || StageError::unauthorized(url, 401);
        let params = challenge.strip_prefix("Bearer ").map(parse_challenge).ok_or_else(unauthorized)?;
        let realm = params.get("realm").ok_or_else(unauthorized)?;
        let mut query = Vec::new();
        for key in ["service", "scope"] {
            if let Some(v) = params.get(key) {
                query.push(format!("{key}={}", encode(v, false)));
            }
        }
        let token_url = if query.is_empty() { realm.clone() } else { format!("{realm}?{}", query.join("&")) };
        // The realm is the one host besides the endpoint that gets credentials (the registry names
        // it, as Docker Hub's auth.docker.io); never over plain HTTP when the registry is HTTPS.
        if self.username.is_some() && self.endpoint.starts_with("https://") && !realm.starts_with("https://") {
            return Err(StageError::InvalidSource(format!(
                "{url}: the registry's token realm {realm} is not https; not sending the credentials there"
            )));
        }
        let (_, body) = http
            .get_bytes(|| {
                let req = Req::get(&token_url)?;
                match (&self.username, &self.token) {
                    (Some(u), Some(p)) => req.credential(&token_url, &format!("Basic {}", base64(&format!("{u}:{p}")))),
                    _ => Ok(req),
                }
            })
            .await?;
        let t: TokenResponse = serde_json::from_slice(&body).map_err(|e| StageError::unavailable(&token_url, e))?;
        t.token.or(t.access_token).filter(|t| !t.is_empty()).ok_or_else(unauthorized)
    }

    /// The GET of one layer blob.
    pub fn request(&self, file: &RemoteFile) -> Result<Req, StageError> {
        self.req(&format!("{}/v2/{}/blobs/{}", self.endpoint, self.repo, file.locator))
    }
}

/// `key="value",key=value` pairs of an authentication challenge.
fn parse_challenge(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let (value, next) = match after.strip_prefix('"') {
            Some(q) => q.split_once('"').unwrap_or((q, "")),
            None => after.split_once(',').unwrap_or((after, "")),
        };
        out.insert(key.trim().to_ascii_lowercase(), value.to_string());
        rest = next.trim_start_matches([',', ' ']);
    }
    out
}

/// Standard base64 with padding, for Basic credentials.
fn base64(s: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in s.as_bytes().chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_references() {
        let c = SourceConfig::default();
        let o = Oci::parse("ghcr.io/org/models/llama:v1", &c).unwrap();
        assert_eq!(
            (o.repo.as_str(), o.reference.as_str(), o.endpoint.as_str()),
            ("org/models/llama", "v1", "https://ghcr.io")
        );
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(Oci::parse(&format!("127.0.0.1:5000/m@{d}"), &c).unwrap().reference, d);
        assert_eq!(Oci::parse("127.0.0.1:5000/m", &c).unwrap().reference, "latest");
        assert_eq!(Oci::parse("docker.io/library/x:1", &c).unwrap().endpoint, "https://registry-1.docker.io");
        for bad in ["registry", "r/Upper:1", "r/m@sha256:zz", "r/../m:1"] {
            assert!(matches!(Oci::parse(bad, &c), Err(StageError::InvalidSource(_))), "{bad}");
        }
    }

    #[test]
    fn reads_bearer_challenges_and_encodes_basic() {
        let p = parse_challenge(
            r#"realm="https://auth.example/token",service="registry.example",scope="repository:m:pull""#,
        );
        assert_eq!(p["realm"], "https://auth.example/token");
        assert_eq!(p["scope"], "repository:m:pull");
        assert_eq!(base64("user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64("ab"), "YWI=");
    }
}
