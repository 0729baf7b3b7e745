//! `hf://org/name[@revision]`: resolves the revision to a commit
//! (`GET /api/models/{repo}/revision/{rev}` → `sha`), lists that commit's files with the tree API
//! (`GET /api/models/{repo}/tree/{sha}?recursive=true`, following `Link: rel="next"` pages on the
//! endpoint's own origin and refusing a page elsewhere), and fetches each from
//! `/{repo}/resolve/{sha}/{path}` (redirects to the CDN are followed). The token goes only to the
//! endpoint's origin. LFS files carry their SHA-256 in the listing and are checked against it.
//! Pinning the commit first means a push to the branch during staging cannot mix two revisions.

use http::header;
use serde::Deserialize;

use crate::error::StageError;
use crate::http::{Http, Origin, Req, redact, resolve_reference};
use crate::source::{Listing, RemoteFile, SourceConfig, encode, trim_endpoint};

/// The public Hugging Face Hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A Hugging Face model repository at a revision.
#[derive(Debug)]
pub struct Hf {
    repo: String,
    revision: String,
    commit: Option<String>,
    endpoint: String,
    origin: Origin,
    token: Option<String>,
}

#[derive(Deserialize)]
struct RevisionInfo {
    sha: String,
}

#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    lfs: Option<Lfs>,
}

#[derive(Deserialize)]
struct Lfs {
    oid: String,
    size: u64,
}

impl Hf {
    /// Parses what follows `hf://`.
    pub fn parse(rest: &str, config: &SourceConfig) -> Result<Hf, StageError> {
        let (repo, url_rev) = match rest.split_once('@') {
            Some((r, v)) => (r, Some(v)),
            None => (rest, None),
        };
        let repo = repo.trim_end_matches('/');
        let segments: Vec<&str> = repo.split('/').collect();
        let valid = |s: &&str| {
            !matches!(*s, "" | "." | "..") && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        if segments.is_empty() || segments.len() > 2 || !segments.iter().all(valid) {
            return Err(StageError::InvalidSource(format!(
                "hf://{rest}: give hf://org/name or hf://org/name@revision"
            )));
        }
        let revision = match (url_rev, config.revision.as_deref()) {
            (Some(a), Some(b)) if a != b => {
                return Err(StageError::InvalidSource(format!(
                    "hf://{rest}: revision {a} in the URL and {b} given apart"
                )));
            }
            (Some(""), _) => return Err(StageError::InvalidSource(format!("hf://{rest}: empty revision"))),
            (Some(r), _) | (None, Some(r)) => r.to_string(),
            (None, None) => "main".to_string(),
        };
        let endpoint = trim_endpoint(config.hf_endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT));
        Ok(Hf {
            repo: repo.to_string(),
            revision,
            commit: None,
            origin: Origin::parse(&endpoint)?,
            endpoint,
            token: config.token.clone(),
        })
    }

    fn req(&self, url: &str) -> Result<Req, StageError> {
        let req = Req::get(url)?;
        match &self.token {
            Some(t) => req.credential(&self.endpoint, &format!("Bearer {t}")),
            None => Ok(req),
        }
    }

    /// The next listing page `link` names, resolved against `page`; refused when it leaves the
    /// endpoint's origin, so no listing request (with or without the token) goes elsewhere.
    fn next_page(&self, page: &str, link: &str) -> Result<String, StageError> {
        let base: http::Uri = page.parse().map_err(|e| StageError::unavailable(page, e))?;
        let next = resolve_reference(&base, link)
            .map_err(|e| StageError::unavailable(redact(&base), format!("unusable next-page link: {e}")))?;
        match Origin::of(&next) {
            Some(o) if o == self.origin => Ok(next.to_string()),
            other => Err(StageError::InvalidSource(format!(
                "hf://{}: the file listing links its next page to {}, not to the endpoint {}; not following it, as \
                 the token goes only to the endpoint (check --hf-endpoint)",
                self.repo,
                other.map_or_else(|| redact(&next), |o| o.to_string()),
                self.origin
            ))),
        }
    }

    /// Resolves the revision and lists the commit's files.
    pub async fn list(&mut self, http: &Http) -> Result<Listing, StageError> {
        let url = format!("{}/api/models/{}/revision/{}", self.endpoint, self.repo, encode(&self.revision, false));
        let (_, body) = http.get_bytes(|| self.req(&url)).await?;
        let info: RevisionInfo = serde_json::from_slice(&body)
            .map_err(|e| StageError::unavailable(&url, format!("unreadable revision info: {e}")))?;
        if info.sha.is_empty() || !info.sha.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(StageError::unavailable(&url, format!("unusable commit id {:?}", info.sha)));
        }
        let mut files = Vec::new();
        let mut next = Some(format!("{}/api/models/{}/tree/{}?recursive=true", self.endpoint, self.repo, info.sha));
        while let Some(url) = next.take() {
            let (headers, body) = http.get_bytes(|| self.req(&url)).await?;
            let entries: Vec<TreeEntry> = serde_json::from_slice(&body)
                .map_err(|e| StageError::unavailable(&url, format!("unreadable file listing: {e}")))?;
            for e in entries.into_iter().filter(|e| e.kind == "file") {
                let (size, sha256) = match e.lfs {
                    Some(l) => (l.size, Some(l.oid.to_ascii_lowercase())),
                    None => (e.size, None),
                };
                files.push(RemoteFile { locator: e.path.clone(), path: e.path, size, sha256 });
            }
            let link = headers.get_all(header::LINK).iter().filter_map(|v| v.to_str().ok()).find_map(next_link);
            next = link.map(|l| self.next_page(&url, &l)).transpose()?;
        }
        if files.is_empty() {
            return Err(StageError::NotFound { what: format!("hf://{}@{}: no files", self.repo, self.revision) });
        }
        self.commit = Some(info.sha.clone());
        Ok(Listing { files, resolved: Some(info.sha) })
    }

    /// The GET of one file at the resolved commit.
    pub fn request(&self, file: &RemoteFile) -> Result<Req, StageError> {
        let rev = self.commit.as_deref().unwrap_or(&self.revision);
        self.req(&format!("{}/{}/resolve/{}/{}", self.endpoint, self.repo, rev, encode(&file.locator, true)))
    }
}

/// The `rel="next"` target of one `Link` header value.
fn next_link(value: &str) -> Option<String> {
    value.split(',').find_map(|part| {
        let (target, params) = part.trim().split_once(';')?;
        let is_next = params.split(';').any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next"));
        is_next.then(|| target.trim().trim_start_matches('<').trim_end_matches('>').to_string())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_repo_and_revision() {
        let c = SourceConfig::default();
        let h = Hf::parse("meta-llama/Llama-3.3-70B-Instruct@v1.0", &c).unwrap();
        assert_eq!((h.repo.as_str(), h.revision.as_str()), ("meta-llama/Llama-3.3-70B-Instruct", "v1.0"));
        assert_eq!(Hf::parse("gpt2", &c).unwrap().revision, "main");
        let given = SourceConfig { revision: Some("abc".into()), ..c.clone() };
        assert_eq!(Hf::parse("a/b", &given).unwrap().revision, "abc");
        assert!(Hf::parse("a/b@def", &given).is_err(), "conflicting revisions");
        for bad in ["", "a/b/c", "a b/c", "a/b@", "../x"] {
            assert!(matches!(Hf::parse(bad, &c), Err(StageError::InvalidSource(_))), "{bad}");
        }
    }

    #[test]
    fn next_pages_stay_on_the_endpoint() {
        let h = Hf::parse("a/b", &SourceConfig::default()).unwrap();
        let page = "https://huggingface.co/api/models/a/b/tree/x?recursive=true";
        assert_eq!(
            h.next_page(page, "/api/models/a/b/tree/x?cursor=2").unwrap(),
            "https://huggingface.co/api/models/a/b/tree/x?cursor=2"
        );
        assert!(h.next_page(page, "https://huggingface.co:443/api?cursor=2").is_ok());
        for foreign in ["https://evil.example/api", "http://huggingface.co/api", "https://huggingface.co:8443/api"] {
            let e = h.next_page(page, foreign).unwrap_err();
            assert!(
                matches!(&e, StageError::InvalidSource(m) if m.contains("https://huggingface.co:443")),
                "{foreign}: {e}"
            );
        }
    }

    #[test]
    fn finds_the_next_page() {
        let v = r#"<https://hf.co/api/models/a/b/tree/x?cursor=abc>; rel="next", <https://hf.co/x>; rel="prev""#;
        assert_eq!(next_link(v).unwrap(), "https://hf.co/api/models/a/b/tree/x?cursor=abc");
        assert_eq!(next_link(r#"<https://hf.co/x>; rel="prev""#), None);
    }
}
