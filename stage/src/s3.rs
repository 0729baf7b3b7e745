//! `s3://bucket[/prefix]`: lists the objects under `prefix/` with ListObjectsV2 (following
//! continuation tokens) and fetches each with GetObject, every request signed with SigV4 when
//! credentials are set and anonymous otherwise. A custom endpoint (MinIO, moto, a VPC endpoint)
//! is addressed path-style; AWS itself virtual-hosted-style. Object keys become paths relative
//! to the prefix; "directory" marker keys ending in `/` are skipped.

use crate::error::StageError;
use crate::http::{Http, Req};
use crate::sigv4::{self, Credentials};
use crate::source::{Listing, RemoteFile, SourceConfig, encode, trim_endpoint};

/// An S3 bucket and prefix.
#[derive(Debug)]
pub struct S3 {
    bucket: String,
    prefix: String,
    /// `(base URL for objects, URL for listing without query)`.
    base: String,
    list_url: String,
    region: String,
    credentials: Option<Credentials>,
    page_size: Option<u32>,
}

impl S3 {
    /// Parses what follows `s3://`.
    pub fn parse(rest: &str, config: &SourceConfig) -> Result<S3, StageError> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let valid = bucket.len() >= 3
            && bucket.len() <= 63
            && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !valid {
            return Err(StageError::InvalidSource(format!("s3://{rest}: {bucket:?} is not a valid bucket name")));
        }
        let prefix = match prefix.trim_start_matches('/') {
            "" => String::new(),
            p if p.ends_with('/') => p.to_string(),
            p => format!("{p}/"),
        };
        let region = config.s3_region.clone().unwrap_or_else(|| "us-east-1".into());
        let (base, list_url) = match &config.s3_endpoint {
            Some(e) => {
                let base = format!("{}/{bucket}", trim_endpoint(e));
                (base.clone(), base)
            }
            None => {
                let base = format!("https://{bucket}.s3.{region}.amazonaws.com");
                (base.clone(), format!("{base}/"))
            }
        };
        Ok(S3 {
            bucket: bucket.to_string(),
            prefix,
            base,
            list_url,
            region,
            credentials: config.s3_credentials.clone(),
            page_size: config.s3_page_size,
        })
    }

    fn signed(&self, url: &str, range: Option<&str>) -> Result<Req, StageError> {
        let mut req = Req::get(url)?;
        if let Some(r) = range {
            req = req.header(http::header::RANGE, r)?;
        }
        if let Some(c) = &self.credentials {
            sigv4::sign(&req.uri, &mut req.headers, &self.region, "s3", c, sigv4::now_secs())?;
        }
        Ok(req)
    }

    /// Lists every object under the prefix.
    pub async fn list(&mut self, http: &Http) -> Result<Listing, StageError> {
        let mut files = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![("list-type", "2".to_string()), ("prefix", encode(&self.prefix, false))];
            if let Some(n) = self.page_size {
                query.push(("max-keys", n.to_string()));
            }
            if let Some(t) = &token {
                query.push(("continuation-token", encode(t, false)));
            }
            query.sort();
            let q = query.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
            let url = format!("{}?{q}", self.list_url);
            let (_, body) = http.get_bytes(|| self.signed(&url, None)).await?;
            let xml = String::from_utf8_lossy(&body);
            for contents in elements(&xml, "Contents") {
                let key = elements(contents, "Key").first().map(|k| unescape(k)).unwrap_or_default();
                let size = elements(contents, "Size").first().and_then(|s| s.trim().parse::<u64>().ok());
                let (Some(path), Some(size)) = (key.strip_prefix(&self.prefix), size) else {
                    return Err(StageError::unavailable(&url, format!("unusable listing entry {key:?}")));
                };
                if path.is_empty() || path.ends_with('/') {
                    continue;
                }
                files.push(RemoteFile { path: path.to_string(), size, sha256: None, locator: key.clone() });
            }
            let truncated = elements(&xml, "IsTruncated").first().is_some_and(|t| t.trim() == "true");
            token = elements(&xml, "NextContinuationToken").first().map(|t| unescape(t));
            if !truncated || token.is_none() {
                break;
            }
        }
        if files.is_empty() {
            return Err(StageError::NotFound { what: format!("s3://{}/{}: no objects", self.bucket, self.prefix) });
        }
        Ok(Listing { files, resolved: None })
    }

    /// The GetObject of one key, with its Range signed.
    pub fn request(&self, file: &RemoteFile, range: Option<&str>) -> Result<Req, StageError> {
        self.signed(&format!("{}/{}", self.base, encode(&file.locator, true)), range)
    }
}

/// The inner text of every `<name>…</name>` element (not nested in itself) in `xml`.
fn elements<'a>(xml: &'a str, name: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        out.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    out
}

/// Replaces XML's predefined and numeric character references.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let Some(end) = tail.find(';') else { break };
        let entity = &tail[1..end];
        let ch = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e if e.starts_with("#x") => u32::from_str_radix(&e[2..], 16).ok().and_then(char::from_u32),
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &tail[end + 1..];
            }
            None => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_a_list_objects_v2_page() {
        let xml = r#"<?xml version="1.0"?><ListBucketResult><IsTruncated>true</IsTruncated>
            <Contents><Key>m/a&amp;b.json</Key><Size>12</Size></Contents>
            <Contents><Key>m/dir/</Key><Size>0</Size></Contents>
            <NextContinuationToken>t&#x2F;1</NextContinuationToken></ListBucketResult>"#;
        let contents = elements(xml, "Contents");
        assert_eq!(contents.len(), 2);
        assert_eq!(unescape(elements(contents[0], "Key")[0]), "m/a&b.json");
        assert_eq!(unescape(elements(xml, "NextContinuationToken")[0]), "t/1");
        assert_eq!(unescape("a &bogus; &#65;"), "a &bogus; A");
    }

    #[test]
    fn parses_bucket_and_prefix() {
        let c = SourceConfig { s3_endpoint: Some("http://127.0.0.1:9000/".into()), ..Default::default() };
        let s = S3::parse("models/llama/70b", &c).unwrap();
        assert_eq!((s.prefix.as_str(), s.base.as_str()), ("llama/70b/", "http://127.0.0.1:9000/models"));
        let aws = S3::parse("models", &SourceConfig::default()).unwrap();
        assert_eq!((aws.prefix.as_str(), aws.list_url.as_str()), ("", "https://models.s3.us-east-1.amazonaws.com/"));
        assert!(S3::parse("No_Such", &c).is_err());
    }
}
