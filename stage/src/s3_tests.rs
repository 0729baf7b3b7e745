#![allow(clippy::unwrap_used, clippy::panic)]

use flotilla_apis::stage::StageReason;

use super::*;
use crate::aws_auth::Provider;

#[test]
fn parses_bucket_and_prefix() {
    let c = SourceConfig { s3_endpoint: Some("http://127.0.0.1:9000/".into()), ..Default::default() };
    let s = S3::parse("models/llama/70b", &c).unwrap();
    assert_eq!(s.prefix, "llama/70b/");
    assert_eq!(s.urls("us-east-1"), ("http://127.0.0.1:9000/models".into(), "http://127.0.0.1:9000/models".into()));
    let aws = S3::parse("models", &SourceConfig::default()).unwrap();
    assert_eq!(aws.prefix, "");
    assert_eq!(aws.urls("eu-central-1").1, "https://models.s3.eu-central-1.amazonaws.com/");
    assert!(S3::parse("No_Such", &c).is_err());
}

fn doc(code: &str, message: &str) -> s3_xml::S3Error {
    s3_xml::S3Error { code: code.into(), message: message.into(), ..Default::default() }
}

fn signed() -> Identity {
    Identity::Signed {
        credentials: aws_credential_types::Credentials::new("ASIAROLE", "s", Some("t".into()), None, "t"),
        from: Provider::WebIdentity,
    }
}

fn url() -> String {
    "https://weights.s3.us-east-1.amazonaws.com/llama/config.json".into()
}

#[test]
fn access_denied_names_the_identity_and_what_to_grant() {
    let e = refusal(url(), 403, &doc("AccessDenied", "Access Denied"), None, &signed(), "us-east-1");
    assert_eq!(e.reason(), StageReason::SourceUnauthorized);
    let text = e.to_string();
    assert!(text.contains("S3 AccessDenied: Access Denied"), "{text}");
    assert!(text.contains("access key ASIAROLE from web identity"), "{text}");
    assert!(text.contains("s3:GetObject"), "{text}");
    assert!(!text.contains("token Secret"), "not the token sources' advice: {text}");
}

#[test]
fn an_anonymous_refusal_says_no_credentials_were_found() {
    let e = refusal(url(), 403, &doc("AccessDenied", "Access Denied"), None, &Identity::Anonymous, "us-east-1");
    let text = e.to_string();
    assert!(text.contains("sent unsigned: no AWS credentials were found"), "{text}");
    assert!(text.contains("spec.serviceAccountName"), "{text}");
    // moto and some S3-compatible servers answer 403 without a body.
    let bare = refusal(url(), 403, &s3_xml::S3Error::default(), None, &Identity::Anonymous, "us-east-1");
    assert!(matches!(bare, StageError::Unauthorized { .. }), "{bare:?}");
}

#[test]
fn credential_codes_say_what_is_wrong_with_the_credentials() {
    for (code, says) in [
        ("InvalidAccessKeyId", "does not know this access key"),
        ("SignatureDoesNotMatch", "secret key does not belong"),
        ("RequestTimeTooSkewed", "clock"),
    ] {
        let e = refusal(url(), 403, &doc(code, "m"), None, &signed(), "us-east-1");
        assert_eq!(e.reason(), StageReason::SourceUnauthorized, "{code}");
        assert!(e.to_string().contains(says), "{code}: {e}");
    }
}

#[test]
fn missing_buckets_and_keys_are_not_found() {
    for code in ["NoSuchBucket", "NoSuchKey"] {
        let e = refusal(url(), 404, &doc(code, "The specified bucket does not exist"), None, &signed(), "us-east-1");
        assert_eq!(e.reason(), StageReason::SourceNotFound, "{code}");
        assert!(e.to_string().contains(code));
    }
    let bare = refusal(url(), 404, &s3_xml::S3Error::default(), None, &signed(), "us-east-1");
    assert_eq!(bare.reason(), StageReason::SourceNotFound);
}

#[test]
fn throttling_server_errors_and_expired_tokens_are_retried() {
    for (status, code) in [(503, "SlowDown"), (500, "InternalError"), (400, "ExpiredToken"), (502, "")] {
        let e = refusal(url(), status, &doc(code, "m"), None, &signed(), "us-east-1");
        assert!(e.is_retryable(), "{status} {code}: {e}");
    }
}

#[test]
fn a_bucket_in_another_region_names_the_region_to_set() {
    let mut d = doc("AuthorizationHeaderMalformed", "the region 'us-east-1' is wrong; expecting 'eu-central-1'");
    d.region = Some("eu-central-1".into());
    let e = refusal(url(), 400, &d, d.region.clone(), &signed(), "us-east-1");
    assert!(!e.is_retryable());
    assert!(e.to_string().contains("set --s3-region (AWS_REGION) to eu-central-1"), "{e}");
    let mut moved = doc("PermanentRedirect", "use the endpoint");
    moved.endpoint = Some("weights.s3.eu-west-1.amazonaws.com".into());
    let e = refusal(url(), 301, &moved, Some("eu-west-1".into()), &signed(), "us-east-1");
    let text = e.to_string();
    assert!(text.contains("eu-west-1") && text.contains("weights.s3.eu-west-1.amazonaws.com"), "{text}");
}

#[test]
fn a_changed_object_is_not_retried_in_the_run() {
    let e = refusal(
        url(),
        412,
        &doc("PreconditionFailed", "At least one of the pre-conditions you specified did not hold"),
        None,
        &signed(),
        "us-east-1",
    );
    assert!(!e.is_retryable());
    assert_eq!(e.reason(), StageReason::SourceUnavailable, "the Job's next attempt lists again");
    assert!(e.to_string().contains("changed since it was listed"), "{e}");
}
