//! `s3://bucket[/prefix]`: lists the objects under `prefix/` with ListObjectsV2 (following
//! continuation tokens while the page is truncated) and fetches each with GetObject, pinned to
//! the listed ETag with `If-Match` so every byte of a run comes from the version it listed.
//! Every request is signed just before it is sent with the credentials the AWS SDK's chain
//! gives at that moment ([`crate::aws_auth`]), or sent unsigned when there are none. A custom
//! endpoint (MinIO, moto, a VPC endpoint) is addressed path-style; AWS itself
//! virtual-hosted-style in the resolved region. Object keys become paths relative to the
//! prefix; "directory" marker keys ending in `/` are skipped. S3's error documents become
//! errors that name S3's code, who the request was sent as, and what to change.

use std::collections::HashMap;

use bytes::Bytes;
use http::{Response, Uri, header};
use hyper::body::Incoming;

use crate::aws_auth::{self, Identity, S3Auth, Signer};
use crate::error::StageError;
use crate::http::{Http, Req, error_body, redact};
use crate::s3_xml;
use crate::source::{Listing, RemoteFile, SourceConfig, encode, trim_endpoint};

/// An S3 bucket and prefix.
#[derive(Debug)]
pub struct S3 {
    bucket: String,
    prefix: String,
    endpoint: Option<String>,
    region: Option<String>,
    auth: S3Auth,
    page_size: Option<u32>,
    /// Set by [`S3::list`], once the region is known.
    resolved: Option<Box<Resolved>>,
    /// Key → ETag from the listing.
    etags: HashMap<String, String>,
}

/// Where and as whom requests go, once the region is resolved.
#[derive(Debug)]
struct Resolved {
    /// Base URL for objects (`<base>/<key>`).
    base: String,
    /// URL of the listing, without query.
    list_url: String,
    signer: Signer,
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
        Ok(S3 {
            bucket: bucket.to_string(),
            prefix,
            endpoint: config.s3_endpoint.clone(),
            region: config.s3_region.clone(),
            auth: config.s3_auth.clone(),
            page_size: config.s3_page_size,
            resolved: None,
            etags: HashMap::new(),
        })
    }

    /// `(base URL for objects, listing URL)` for a region.
    fn urls(&self, region: &str) -> (String, String) {
        match &self.endpoint {
            Some(e) => {
                let base = format!("{}/{}", trim_endpoint(e), self.bucket);
                (base.clone(), base)
            }
            None => {
                let base = format!("https://{}.s3.{region}.amazonaws.com", self.bucket);
                (base.clone(), format!("{base}/"))
            }
        }
    }

    fn resolved(&self) -> Result<&Resolved, StageError> {
        self.resolved
            .as_deref()
            .ok_or_else(|| StageError::InvalidSource(format!("s3://{}: fetched before it was listed", self.bucket)))
    }

    /// A GET of `url` with `headers`, signed as the current identity.
    async fn signed(&self, url: &str, headers: &[(header::HeaderName, &str)]) -> Result<Req, StageError> {
        let mut req = Req::get(url)?;
        for (name, value) in headers {
            req = req.header(name.clone(), value)?;
        }
        self.resolved()?.signer.sign(&mut req).await?;
        Ok(req)
    }

    /// Lists every object under the prefix (resolving the region and credentials first).
    pub async fn list(&mut self, http: &Http) -> Result<Listing, StageError> {
        let region = aws_auth::region(self.region.as_deref(), self.endpoint.is_some()).await;
        let (base, list_url) = self.urls(&region);
        let signer = Signer::new(&self.auth, region);
        self.resolved = Some(Box::new(Resolved { base, list_url, signer }));
        let list_url = self.resolved()?.list_url.clone();
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
            let url = format!("{list_url}?{q}");
            let body = self.get_small(http, &url).await?;
            let page = s3_xml::list_page(&body).map_err(|e| StageError::unavailable(&list_url, e))?;
            for object in page.contents {
                let Some(path) = object.key.strip_prefix(&self.prefix) else {
                    return Err(StageError::unavailable(
                        &list_url,
                        format!("listed key {:?} is outside the prefix {:?}", object.key, self.prefix),
                    ));
                };
                if path.is_empty() || path.ends_with('/') {
                    continue;
                }
                if let Some(etag) = object.etag.filter(|e| !e.is_empty()) {
                    self.etags.insert(object.key.clone(), etag);
                }
                files.push(RemoteFile {
                    path: path.to_string(),
                    size: object.size,
                    sha256: None,
                    locator: object.key.clone(),
                });
            }
            match (page.is_truncated, page.next_continuation_token) {
                (true, Some(next)) if Some(&next) != token.as_ref() => token = Some(next),
                (true, _) => {
                    return Err(StageError::unavailable(
                        &list_url,
                        "the listing is truncated but gives no new NextContinuationToken",
                    ));
                }
                (false, _) => break,
            }
        }
        if files.is_empty() {
            return Err(StageError::NotFound { what: format!("s3://{}/{}: no objects", self.bucket, self.prefix) });
        }
        Ok(Listing { files, resolved: None })
    }

    /// A small body (a listing page), retried and signed afresh on each attempt.
    async fn get_small(&self, http: &Http, url: &str) -> Result<Bytes, StageError> {
        http.retry(|| async {
            let req = self.signed(url, &[]).await?;
            let response = http.send(&req).await?;
            let response = self.check(response, &req.uri).await?;
            http.read_small(response, &req.uri).await
        })
        .await
    }

    /// The GetObject of one key from `range`, pinned to the listed ETag, signed.
    pub async fn request(&self, file: &RemoteFile, range: Option<&str>) -> Result<Req, StageError> {
        let url = format!("{}/{}", self.resolved()?.base, encode(&file.locator, true));
        let mut headers = Vec::new();
        if let Some(r) = range {
            headers.push((header::RANGE, r));
        }
        if let Some(etag) = self.etags.get(&file.locator) {
            headers.push((header::IF_MATCH, etag.as_str()));
        }
        self.signed(&url, &headers).await
    }

    /// Passes a 2xx; turns anything else into the error S3's error document and status say.
    /// An expired token makes the next request fetch credentials again, and is retried.
    pub async fn check(&self, response: Response<Incoming>, uri: &Uri) -> Result<Response<Incoming>, StageError> {
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Ok(response);
        }
        let header_region =
            response.headers().get("x-amz-bucket-region").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let body = error_body(response).await;
        let doc = s3_xml::error(body.as_bytes()).unwrap_or_default();
        let resolved = self.resolved()?;
        let identity = resolved.signer.identity().await.unwrap_or(Identity::Anonymous);
        let error = refusal(
            redact(uri),
            status,
            &doc,
            header_region.or(doc.region.clone()),
            &identity,
            resolved.signer.region(),
        );
        if matches!(doc.code.as_str(), "ExpiredToken" | "TokenRefreshRequired") {
            resolved.signer.invalidate().await;
        }
        Err(error)
    }
}

/// The error for S3's answer `status` with error document `doc` to a request sent as `identity`.
fn refusal(
    url: String,
    status: u16,
    doc: &s3_xml::S3Error,
    bucket_region: Option<String>,
    identity: &Identity,
    signed_region: &str,
) -> StageError {
    let said = if doc.code.is_empty() {
        "S3 sent no error code".to_string()
    } else {
        format!("S3 {}: {}", doc.code, doc.message.trim())
    };
    let region_hint = match bucket_region.filter(|r| r != signed_region) {
        Some(r) => format!("; the bucket is in region {r}, not {signed_region}: set --s3-region (AWS_REGION) to {r}"),
        None => String::new(),
    };
    let endpoint_hint = doc.endpoint.as_ref().map(|e| format!("; S3 asks for the endpoint {e}")).unwrap_or_default();
    match (status, doc.code.as_str()) {
        (_, "ExpiredToken" | "TokenRefreshRequired") => {
            StageError::unavailable(url, format!("{said}; fetching credentials again"))
        }
        (_, "RequestTimeTooSkewed") => StageError::Unauthorized {
            url,
            status,
            hint: format!("{said}; the node's clock is more than 15 minutes off: fix its time synchronisation"),
        },
        (_, "NoSuchBucket" | "NoSuchKey") | (404, "") => StageError::NotFound { what: format!("{url} ({said})") },
        (_, "PreconditionFailed") | (412, _) => StageError::Rejected {
            url,
            status,
            detail: format!(
                ": {said}: the object changed since it was listed; the next attempt of the Job lists it again"
            ),
        },
        (_, "SlowDown" | "InternalError" | "ServiceUnavailable" | "RequestTimeout") | (408 | 429 | 500..=599, _) => {
            StageError::unavailable(url, format!("{said}{region_hint}"))
        }
        (401 | 403, _) | (_, "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "InvalidToken") => {
            let change = match (identity, doc.code.as_str()) {
                (Identity::Anonymous, _) => {
                    "the bucket is not public: give the staging Job AWS credentials (ModelCache spec.serviceAccountName for IRSA or EKS Pod Identity, or spec.credentialsRef with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
                }
                (_, "InvalidAccessKeyId") => {
                    "S3 does not know this access key: check the credentials, and that they belong to this endpoint's account"
                }
                (_, "SignatureDoesNotMatch") => {
                    "the secret key does not belong to this access key: check the credentials"
                }
                (_, "InvalidToken") => "the session token is malformed or does not belong to this access key",
                _ => {
                    "allow s3:ListBucket on the bucket and s3:GetObject on its objects for this identity (its IAM role or user policy), and check the bucket policy and any KMS key policy"
                }
            };
            StageError::Unauthorized {
                url,
                status,
                hint: format!("{said}; the request was {}: {change}{region_hint}", identity.describe()),
            }
        }
        _ => StageError::Rejected { url, status, detail: format!(": {said}{region_hint}{endpoint_hint}") },
    }
}

#[cfg(test)]
#[path = "s3_tests.rs"]
mod tests;
