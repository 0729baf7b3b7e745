//! Where the `flotilla-stage` binary gets S3 credentials, the way a pod on EKS gets them, against
//! moto checking every signature and IAM policy: static environment variables; web identity
//! (IRSA: a token file and `AWS_ROLE_ARN`, exchanged with moto's STS
//! `AssumeRoleWithWebIdentity`); container credentials (EKS Pod Identity: a loopback server in
//! the test, `AWS_CONTAINER_CREDENTIALS_FULL_URI` and an authorization token file), refreshed
//! before they expire; and none at all, which sends a public bucket's requests unsigned. A
//! recording proxy in front of moto shows which access key signed each request. The binary
//! runs with a cleared environment, so nothing from the machine leaks into the chain.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use common::moto::*;
use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::{StageEvent, StageReason, StageResult};

const BUCKET: &str = "weights";
const SOURCE: &str = "s3://weights/llama/tiny";

/// Runs the binary with only `envs` (plus a home without AWS files and no instance metadata),
/// S3 at `s3`; returns the exit code and the result.
async fn stage(dest: &Path, s3: &str, envs: &[(&str, &str)]) -> (i32, StageResult) {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla-stage"));
    cmd.env_clear()
        .args(["--source", SOURCE, "--dest", dest.to_str().unwrap(), "--expected-digest", &weights_digest()])
        .env("HOME", home.path())
        .env("AWS_CONFIG_FILE", home.path().join("none"))
        .env("AWS_SHARED_CREDENTIALS_FILE", home.path().join("none"))
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL_S3", s3)
        .env("FLOTILLA_STAGE_RETRIES", "1")
        .env("FLOTILLA_STAGE_RETRY_BACKOFF_MS", "10");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().await.unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last =
        stdout.lines().last().unwrap_or_else(|| panic!("no output; stderr: {}", String::from_utf8_lossy(&out.stderr)));
    let StageEvent::Result(result) = serde_json::from_str(last).unwrap() else { panic!("last line: {last}") };
    (out.status.code().unwrap(), result)
}

fn assert_staged(code: i32, result: &StageResult, dest: &Path) {
    assert_eq!((code, result.phase), (0, CachePhase::Ready), "{result:?}");
    assert_eq!(result.files, 4);
    for (p, b) in weights() {
        assert_eq!(std::fs::read(dest.join(p)).unwrap(), b, "{p}");
    }
}

/// The requests that went to the bucket (not STS).
fn s3_requests(log: &Log) -> Vec<Seen> {
    log.lock().unwrap().iter().filter(|s| s.path_and_query.starts_with(&format!("/{BUCKET}"))).cloned().collect()
}

#[tokio::test]
async fn static_environment_credentials_sign_every_request() {
    let m = moto().await;
    seed(&m.endpoint, BUCKET, &[]).await;
    let (key, secret) = iam_user(&m.endpoint, "stager").await;
    enforce_auth(&m.endpoint, 0).await;
    let (proxy, log) = recording_proxy(&m.endpoint).await;
    let dir = tempfile::tempdir().unwrap();
    let (code, result) =
        stage(dir.path(), &proxy, &[("AWS_ACCESS_KEY_ID", &key), ("AWS_SECRET_ACCESS_KEY", &secret)]).await;
    assert_staged(code, &result, dir.path());
    let seen = s3_requests(&log);
    assert_eq!(seen.len(), 5, "one listing page, four objects: {seen:?}");
    for s in &seen {
        assert_eq!(s.access_key(), Some(key.as_str()), "{s:?}");
        assert_eq!(s.security_token, None, "long-term keys carry no session token");
    }

    // moto checks the signature: the wrong secret is refused, and the error says what S3 said.
    let dir = tempfile::tempdir().unwrap();
    let (code, result) =
        stage(dir.path(), &proxy, &[("AWS_ACCESS_KEY_ID", &key), ("AWS_SECRET_ACCESS_KEY", "wrong")]).await;
    assert_eq!(code, StageReason::SourceUnauthorized.exit_code(), "{result:?}");
    assert!(result.message.contains("SignatureDoesNotMatch"), "{}", result.message);
    assert!(result.message.contains(&format!("access key {key} from environment variables")), "{}", result.message);
}

#[tokio::test]
async fn web_identity_exchanges_the_token_with_sts_and_signs_as_the_role() {
    let m = moto().await;
    seed(&m.endpoint, BUCKET, &[]).await;
    let role = iam_role(&m.endpoint, "model-reader").await;
    // The one request moto lets through unchecked is the SDK's AssumeRoleWithWebIdentity
    // (unsigned, as STS expects it); every S3 request after it must verify as the role session.
    enforce_auth(&m.endpoint, 1).await;
    let (proxy, log) = recording_proxy(&m.endpoint).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "eyJhbGciOiJSUzI1NiJ9.projected-service-account-token.sig").unwrap();
    let dest = dir.path().join("cache");
    let (code, result) = stage(
        &dest,
        &proxy,
        &[
            ("AWS_ROLE_ARN", &role),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file.to_str().unwrap()),
            ("AWS_ROLE_SESSION_NAME", "flotilla-stage"),
            ("AWS_ENDPOINT_URL_STS", &proxy),
        ],
    )
    .await;
    assert_staged(code, &result, &dest);
    let all = log.lock().unwrap().clone();
    let sts: Vec<&Seen> = all.iter().filter(|s| s.body.contains("Action=AssumeRoleWithWebIdentity")).collect();
    assert_eq!(sts.len(), 1, "credentials fetched once and cached: {all:?}");
    assert!(sts[0].body.contains("WebIdentityToken=eyJhbGciOiJSUzI1NiJ9.projected-service-account-token.sig"));
    assert!(
        sts[0].body.contains(&format!("RoleArn={}", role.replace(':', "%3A").replace('/', "%2F"))),
        "{}",
        sts[0].body
    );
    let (key, token) = (xml_text(&sts[0].response, "AccessKeyId"), xml_text(&sts[0].response, "SessionToken"));
    let seen = s3_requests(&log);
    assert_eq!(seen.len(), 5, "{seen:?}");
    for s in &seen {
        assert_eq!(s.access_key(), Some(key.as_str()), "signed as the assumed role: {s:?}");
        assert_eq!(s.security_token.as_deref(), Some(token.as_str()));
    }
}

#[tokio::test]
async fn an_unreadable_web_identity_token_is_named_and_nothing_reaches_s3() {
    let m = moto().await;
    seed(&m.endpoint, BUCKET, &[]).await;
    let (proxy, log) = recording_proxy(&m.endpoint).await;
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-token");
    let role = format!("arn:aws:iam::{ACCOUNT}:role/model-reader");
    let (code, result) = stage(
        &dir.path().join("cache"),
        &proxy,
        &[
            ("AWS_ROLE_ARN", &role),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", missing.to_str().unwrap()),
            ("AWS_ENDPOINT_URL_STS", &proxy),
            // A later provider of the chain is not used instead: the configured one must be fixed.
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1:9/creds"),
        ],
    )
    .await;
    assert_eq!(code, StageReason::SourceUnauthorized.exit_code(), "{result:?}");
    let msg = &result.message;
    assert!(msg.contains(&format!("web identity (IRSA: AWS_WEB_IDENTITY_TOKEN_FILE={}", missing.display())), "{msg}");
    assert!(msg.contains("eks.amazonaws.com/role-arn") && msg.contains("spec.serviceAccountName"), "{msg}");
    assert!(log.lock().unwrap().is_empty(), "neither STS nor S3 was asked: {:?}", log.lock().unwrap());

    // A token file without a role to assume is a configuration error that says so.
    std::fs::write(&missing, "t").unwrap();
    let (code, result) = stage(
        &dir.path().join("cache"),
        &proxy,
        &[("AWS_WEB_IDENTITY_TOKEN_FILE", missing.to_str().unwrap()), ("AWS_ENDPOINT_URL_STS", &proxy)],
    )
    .await;
    assert_eq!(code, StageReason::SourceUnauthorized.exit_code(), "{result:?}");
    assert!(result.message.contains("AWS_ROLE_ARN"), "{}", result.message);
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a time.
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let (era, doe) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[test]
fn rfc3339_is_civil_utc() {
    assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_661)), "2000-02-29T01:01:01Z");
}

#[tokio::test]
async fn container_credentials_come_with_the_pod_identity_token_and_are_refreshed() {
    let m = moto().await;
    seed(&m.endpoint, BUCKET, &[]).await;
    let role = iam_role(&m.endpoint, "model-reader").await;
    let sessions = [assume_role(&m.endpoint, &role, "pod-1").await, assume_role(&m.endpoint, &role, "pod-2").await];
    enforce_auth(&m.endpoint, 0).await;
    let (proxy, log) = recording_proxy(&m.endpoint).await;

    // The EKS Pod Identity agent, on loopback: it hands out the sessions in turn, each said to
    // expire in 2 minutes — inside the 5 minutes before expiry in which the staging program
    // fetches again — so every request is signed after a fresh fetch.
    let calls: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let handed = sessions.clone();
    let c = calls.clone();
    let agent = axum::Router::new().route(
        "/v1/credentials",
        axum::routing::get(move |headers: HeaderMap| {
            let c = c.clone();
            let sessions = handed.clone();
            async move {
                let mut calls = c.lock().unwrap();
                calls.push(headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned));
                let s = &sessions[(calls.len() - 1) % 2];
                axum::Json(serde_json::json!({
                    "AccessKeyId": s.access_key_id,
                    "SecretAccessKey": s.secret_access_key,
                    "Token": s.session_token,
                    "AccountId": ACCOUNT,
                    "Expiration": rfc3339(SystemTime::now() + Duration::from_secs(120)),
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let agent_url = format!("http://{}/v1/credentials", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, agent).await.unwrap() });

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("eks-pod-identity-token");
    std::fs::write(&token_file, "pod-identity-token").unwrap();
    let dest = dir.path().join("cache");
    let (code, result) = stage(
        &dest,
        &proxy,
        &[
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", &agent_url),
            ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file.to_str().unwrap()),
            ("FLOTILLA_STAGE_CONCURRENCY", "1"),
        ],
    )
    .await;
    assert_staged(code, &result, &dest);
    let calls = calls.lock().unwrap().clone();
    assert!(calls.len() >= 5, "fetched again for each request near expiry: {} fetches", calls.len());
    assert!(calls.iter().all(|a| a.as_deref() == Some("pod-identity-token")), "{calls:?}");
    let seen = s3_requests(&log);
    assert_eq!(seen.len(), 5, "{seen:?}");
    for s in &seen {
        let pair = (s.access_key().unwrap_or_default(), s.security_token.as_deref().unwrap_or_default());
        assert!(
            sessions.iter().any(|x| (x.access_key_id.as_str(), x.session_token.as_str()) == pair),
            "signed as one of the sessions handed out, with its token: {s:?}"
        );
    }
    let keys: std::collections::BTreeSet<&str> = seen.iter().filter_map(Seen::access_key).collect();
    assert_eq!(keys.len(), 2, "both sessions signed requests, as they were handed out: {keys:?}");
}

#[tokio::test]
async fn without_credentials_a_public_bucket_is_read_unsigned() {
    let m = moto().await;
    seed(&m.endpoint, BUCKET, &[("x-amz-acl", "public-read")]).await;
    let (proxy, log) = recording_proxy(&m.endpoint).await;
    let dir = tempfile::tempdir().unwrap();
    let (code, result) = stage(dir.path(), &proxy, &[]).await;
    assert_staged(code, &result, dir.path());
    let seen = s3_requests(&log);
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert!(seen.iter().all(|s| s.authorization.is_none() && s.security_token.is_none()), "{seen:?}");

    // The same objects without the public ACL: refused, and the message says nothing was found.
    let m2 = moto().await;
    seed(&m2.endpoint, BUCKET, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let (code, result) = stage(dir.path(), &m2.endpoint, &[]).await;
    assert_eq!(code, StageReason::SourceUnauthorized.exit_code(), "{result:?}");
    assert!(result.message.contains("no AWS credentials were found"), "{}", result.message);
}
