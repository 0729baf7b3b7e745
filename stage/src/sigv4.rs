//! AWS Signature Version 4 for the S3 GETs (ListObjectsV2 and GetObject), written out instead of
//! pulling in the AWS SDK: HMAC-SHA256 over `sha2`, the canonical request (path as sent, sorted
//! query, signed `host`, `range` and `x-amz-*` headers), the scope
//! `<date>/<region>/<service>/aws4_request`, and the `Authorization` header. Checked against the
//! examples in AWS's S3 SigV4 documentation.

use std::time::{SystemTime, UNIX_EPOCH};

use flotilla_apis::stage::hex;
use http::{HeaderMap, HeaderValue, Uri, header};
use sha2::{Digest, Sha256};

use crate::error::StageError;

/// SHA-256 of an empty payload (every request here is a GET).
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// AWS credentials from the standard environment variables.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `AWS_ACCESS_KEY_ID`
    pub access_key_id: String,
    /// `AWS_SECRET_ACCESS_KEY`
    pub secret_access_key: String,
    /// `AWS_SESSION_TOKEN`
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("access_key_id", &self.access_key_id).finish_non_exhaustive()
    }
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let ipad: Vec<u8> = block.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = block.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new().chain_update(&ipad).chain_update(data).finalize();
    Sha256::new().chain_update(&opad).chain_update(inner).finalize().into()
}

/// `(YYYYMMDDTHHMMSSZ, YYYYMMDD)` for seconds since the Unix epoch.
pub fn amz_date(secs: u64) -> (String, String) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let date = format!("{year:04}{month:02}{day:02}");
    (format!("{date}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60), date)
}

/// Seconds since the Unix epoch now.
pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
}

/// Adds `host`, `x-amz-date`, `x-amz-content-sha256`, the session token and `authorization` to a GET.
pub fn sign(
    uri: &Uri,
    headers: &mut HeaderMap,
    region: &str,
    service: &str,
    creds: &Credentials,
    secs: u64,
) -> Result<(), StageError> {
    let value = |s: &str| {
        HeaderValue::from_str(s)
            .map_err(|_| StageError::InvalidSource("credentials or URL not valid in a header".into()))
    };
    let (amz_date, date) = amz_date(secs);
    let host = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    headers.insert(header::HOST, value(host)?);
    headers.insert("x-amz-date", value(&amz_date)?);
    headers.insert("x-amz-content-sha256", HeaderValue::from_static(EMPTY_SHA256));
    if let Some(t) = &creds.session_token {
        headers.insert("x-amz-security-token", value(t)?);
    }
    let mut signed: Vec<(String, String)> = headers
        .iter()
        .filter(|(n, _)| matches!(n.as_str(), "host" | "range") || n.as_str().starts_with("x-amz-"))
        .map(|(n, v)| (n.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).trim().to_string()))
        .collect();
    signed.sort();
    let signed_names = signed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(";");
    let canonical_headers: String = signed.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let mut query: Vec<(&str, &str)> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    query.sort();
    let canonical_query = query.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
    let path = if uri.path().is_empty() { "/" } else { uri.path() };
    let canonical = format!("GET\n{path}\n{canonical_query}\n{canonical_headers}\n{signed_names}\n{EMPTY_SHA256}");
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex(&Sha256::digest(canonical.as_bytes())));
    let mut key = hmac_sha256(format!("AWS4{}", creds.secret_access_key).as_bytes(), date.as_bytes());
    for part in [region, service, "aws4_request"] {
        key = hmac_sha256(&key, part.as_bytes());
    }
    let signature = hex(&hmac_sha256(&key, to_sign.as_bytes()));
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_names}, Signature={signature}",
        creds.access_key_id
    );
    headers.insert(header::AUTHORIZATION, value(&auth)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn example_creds() -> Credentials {
        Credentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        }
    }

    // 2013-05-24T00:00:00Z, the date of AWS's S3 signing examples.
    const EXAMPLE_SECS: u64 = 1_369_353_600;

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex(&mac), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(amz_date(EXAMPLE_SECS), ("20130524T000000Z".into(), "20130524".into()));
        assert_eq!(amz_date(951_782_400 + 3_661).0, "20000229T010101Z");
        assert_eq!(amz_date(0).0, "19700101T000000Z");
    }

    #[test]
    fn get_object_with_range_matches_the_aws_example() {
        let uri: Uri = "https://examplebucket.s3.amazonaws.com/test.txt".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::RANGE, HeaderValue::from_static("bytes=0-9"));
        sign(&uri, &mut h, "us-east-1", "s3", &example_creds(), EXAMPLE_SECS).unwrap();
        let auth = h[header::AUTHORIZATION].to_str().unwrap();
        assert!(auth.contains("SignedHeaders=host;range;x-amz-content-sha256;x-amz-date"), "{auth}");
        assert!(auth.ends_with("Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"), "{auth}");
    }

    #[test]
    fn list_objects_matches_the_aws_example() {
        let uri: Uri = "https://examplebucket.s3.amazonaws.com/?max-keys=2&prefix=J".parse().unwrap();
        let mut h = HeaderMap::new();
        sign(&uri, &mut h, "us-east-1", "s3", &example_creds(), EXAMPLE_SECS).unwrap();
        let auth = h[header::AUTHORIZATION].to_str().unwrap();
        assert!(auth.ends_with("Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"), "{auth}");
    }
}
