#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::UNIX_EPOCH;

use aws_credential_types::credential_fn::provide_credentials_fn;
use http::header;

use super::*;

// 2013-05-24T00:00:00Z, the date of AWS's S3 signing examples.
const EXAMPLE_SECS: u64 = 1_369_353_600;

fn example_creds() -> aws_credential_types::Credentials {
    aws_credential_types::Credentials::new(
        "AKIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        None,
        None,
        "test",
    )
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn get_object_with_range_matches_the_aws_example() {
    let mut req = Req::get("https://examplebucket.s3.amazonaws.com/test.txt").unwrap();
    req = req.header(header::RANGE, "bytes=0-9").unwrap();
    sign_request(&mut req, &example_creds(), "us-east-1", at(EXAMPLE_SECS)).unwrap();
    let auth = req.headers[header::AUTHORIZATION].to_str().unwrap();
    assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request"));
    assert!(auth.contains("SignedHeaders=host;range;x-amz-content-sha256;x-amz-date"), "{auth}");
    assert!(auth.ends_with("Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"), "{auth}");
    assert_eq!(req.headers["x-amz-date"], "20130524T000000Z");
    assert!(req.headers[header::AUTHORIZATION].is_sensitive(), "kept out of Debug output");
    assert!(req.headers.get("x-amz-security-token").is_none());
}

#[test]
fn list_objects_matches_the_aws_example() {
    let mut req = Req::get("https://examplebucket.s3.amazonaws.com/?max-keys=2&prefix=J").unwrap();
    sign_request(&mut req, &example_creds(), "us-east-1", at(EXAMPLE_SECS)).unwrap();
    let auth = req.headers[header::AUTHORIZATION].to_str().unwrap();
    assert!(auth.ends_with("Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"), "{auth}");
}

#[test]
fn a_session_token_is_sent_and_signed() {
    let creds = aws_credential_types::Credentials::new("ASIAEXAMPLE", "secret", Some("tok/en".into()), None, "t");
    let mut req = Req::get("http://127.0.0.1:9000/bucket/key").unwrap();
    sign_request(&mut req, &creds, "eu-central-1", at(EXAMPLE_SECS)).unwrap();
    assert_eq!(req.headers["x-amz-security-token"], "tok/en");
    let auth = req.headers[header::AUTHORIZATION].to_str().unwrap();
    assert!(auth.contains("Credential=ASIAEXAMPLE/20130524/eu-central-1/s3/aws4_request"), "{auth}");
    assert!(auth.contains("x-amz-security-token"), "the token is part of the signature: {auth}");
}

/// A provider handing out `key-<n>` on its n-th call, expiring `ttl` seconds after the clock.
fn counting(calls: Arc<AtomicUsize>, clock: Arc<AtomicU64>, ttl: Option<u64>) -> SharedCredentialsProvider {
    SharedCredentialsProvider::new(provide_credentials_fn(move || {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        let expiry = ttl.map(|t| at(clock.load(Ordering::SeqCst) + t));
        async move { Ok(aws_credential_types::Credentials::new(format!("key-{n}"), "secret", None, expiry, "test")) }
    }))
}

fn clock(c: &Arc<AtomicU64>) -> Clock {
    let c = c.clone();
    Arc::new(move || at(c.load(Ordering::SeqCst)))
}

fn key(id: &Identity) -> String {
    match id {
        Identity::Signed { credentials, .. } => credentials.access_key_id().to_string(),
        Identity::Anonymous => "anonymous".into(),
    }
}

#[tokio::test]
async fn credentials_are_cached_until_shortly_before_they_expire() {
    let (calls, now) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU64::new(1_000_000)));
    let provider = counting(calls.clone(), now.clone(), Some(3600));
    let signer = Signer::with_providers("us-east-1".into(), vec![(Provider::WebIdentity, provider)], clock(&now));
    assert_eq!(key(&signer.identity().await.unwrap()), "key-1");
    now.fetch_add(3000, Ordering::SeqCst);
    assert_eq!(key(&signer.identity().await.unwrap()), "key-1", "10 minutes left: still cached");
    now.fetch_add(400, Ordering::SeqCst);
    assert_eq!(key(&signer.identity().await.unwrap()), "key-2", "under 5 minutes left: fetched again");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // A request signed now carries the current key.
    let mut req = Req::get("http://127.0.0.1:1/b/k").unwrap();
    signer.sign(&mut req).await.unwrap();
    assert!(req.headers[header::AUTHORIZATION].to_str().unwrap().contains("Credential=key-2/"));
    signer.invalidate().await;
    assert_eq!(key(&signer.identity().await.unwrap()), "key-3", "S3 said expired: fetched again");
}

#[tokio::test]
async fn credentials_without_expiry_are_fetched_once() {
    let (calls, now) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU64::new(5)));
    let signer = Signer::with_providers(
        "us-east-1".into(),
        vec![(Provider::Environment, counting(calls.clone(), now.clone(), None))],
        clock(&now),
    );
    for _ in 0..3 {
        signer.identity().await.unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn providers_without_credentials_are_skipped_and_none_means_unsigned() {
    let none = || {
        SharedCredentialsProvider::new(provide_credentials_fn(|| async {
            Err(CredentialsError::not_loaded("not configured"))
        }))
    };
    let (calls, now) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU64::new(5)));
    let signer = Signer::with_providers(
        "us-east-1".into(),
        vec![(Provider::Environment, none()), (Provider::Container, counting(calls.clone(), now.clone(), None))],
        clock(&now),
    );
    let id = signer.identity().await.unwrap();
    assert!(matches!(id, Identity::Signed { from: Provider::Container, .. }), "{id:?}");

    let anonymous = Signer::with_providers("us-east-1".into(), vec![(Provider::Environment, none())], clock(&now));
    let mut req = Req::get("http://127.0.0.1:1/b/k").unwrap();
    assert!(matches!(anonymous.sign(&mut req).await.unwrap(), Identity::Anonymous));
    assert!(req.headers.is_empty(), "an unsigned request carries no AWS headers: {:?}", req.headers);
}

#[tokio::test]
async fn a_configured_provider_that_fails_is_named_and_stops_the_chain() {
    let failing = SharedCredentialsProvider::new(provide_credentials_fn(|| async {
        Err(CredentialsError::provider_error(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied")))
    }));
    let (calls, now) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU64::new(5)));
    let signer = Signer::with_providers(
        "us-east-1".into(),
        vec![(Provider::WebIdentity, failing), (Provider::Container, counting(calls.clone(), now.clone(), None))],
        clock(&now),
    );
    let e = signer.identity().await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("web identity (IRSA: AWS_WEB_IDENTITY_TOKEN_FILE="), "{text}");
    assert!(text.contains("denied") && text.contains("eks.amazonaws.com/role-arn"), "{text}");
    assert_eq!(e.reason(), flotilla_apis::stage::StageReason::SourceUnauthorized);
    assert!(!e.is_retryable());
    assert_eq!(calls.load(Ordering::SeqCst), 0, "a later provider is not tried: the configured one must be fixed");
}

#[tokio::test]
async fn a_failed_refresh_keeps_credentials_that_have_not_expired() {
    let now = Arc::new(AtomicU64::new(1_000));
    let calls = Arc::new(AtomicUsize::new(0));
    let (c, n) = (calls.clone(), now.clone());
    let flaky = SharedCredentialsProvider::new(provide_credentials_fn(move || {
        let first = c.fetch_add(1, Ordering::SeqCst) == 0;
        let expiry = at(n.load(Ordering::SeqCst) + 600);
        async move {
            if first {
                Ok(aws_credential_types::Credentials::new("key-1", "s", None, Some(expiry), "t"))
            } else {
                Err(CredentialsError::provider_error(std::io::Error::other("dispatch failure: connection refused")))
            }
        }
    }));
    let signer = Signer::with_providers("us-east-1".into(), vec![(Provider::Container, flaky)], clock(&now));
    assert_eq!(key(&signer.identity().await.unwrap()), "key-1");
    now.fetch_add(400, Ordering::SeqCst);
    assert_eq!(key(&signer.identity().await.unwrap()), "key-1", "refresh failed, 200 s left: kept");
    now.fetch_add(300, Ordering::SeqCst);
    let e = signer.identity().await.unwrap_err();
    assert!(e.is_retryable(), "network trouble reaching the provider is transient: {e}");
}

#[test]
fn transient_provider_failures_are_told_apart() {
    assert!(is_transient("dispatch failure: io error: Connection refused"));
    assert!(is_transient("service error: Throttling: Rate exceeded"));
    assert!(!is_transient("service error: AccessDenied: Not authorized to perform sts:AssumeRoleWithWebIdentity"));
    assert!(!is_transient("No such file or directory (os error 2)"));
    assert!(is_transient("service error: IDPCommunicationError: the OIDC provider did not answer"));
    assert!(!is_transient("AccessDenied: arn:aws:sts::503000000000:assumed-role/x is not authorized"));
}

#[tokio::test]
async fn the_configured_region_wins() {
    assert_eq!(region(Some("eu-central-1"), false).await, "eu-central-1");
    assert_eq!(region(Some(" "), true).await, DEFAULT_REGION, "a custom endpoint never asks instance metadata");
}

#[test]
fn instance_metadata_is_not_asked_when_the_job_disables_it() {
    for off in ["true", "TRUE", " true "] {
        assert!(!instance_metadata_allowed(Some(off)), "{off:?}");
    }
    for on in [None, Some("false"), Some(""), Some("1")] {
        assert!(instance_metadata_allowed(on), "{on:?}: the SDK reads only `true` as disabled");
    }
    let names = |allowed| default_chain("us-east-1", allowed).into_iter().map(|(p, _)| p).collect::<Vec<_>>();
    let closed = names(false);
    assert!(!closed.contains(&Provider::InstanceProfile), "{closed:?}");
    assert_eq!(
        closed,
        [Provider::Environment, Provider::Profile, Provider::WebIdentity, Provider::Container],
        "the tenant's own ways in stay, in the SDK's order"
    );
    assert_eq!(names(true).last(), Some(&Provider::InstanceProfile), "allowed: last, as in the SDK's chain");
}
