//! The two XML documents S3 sends the staging program, read with `quick-xml`'s serde support:
//! a ListObjectsV2 page (`<ListBucketResult>`: the objects' keys, sizes and ETags, whether the
//! listing is truncated and the token of the next page) and an error (`<Error><Code>`,
//! `<Message>`, and the `<Region>` or `<Endpoint>` S3 names when the bucket is elsewhere).
//! Character references (`&amp;`, `&quot;`, `&#x2F;`, …) are decoded by the parser; a body that
//! is not the document expected is an error that quotes its start.

use serde::Deserialize;

/// One ListObjectsV2 page.
#[derive(Debug, Default, Deserialize, PartialEq)]
pub struct ListPage {
    /// More keys follow on another page.
    #[serde(rename = "IsTruncated", default)]
    pub is_truncated: bool,
    /// The `continuation-token` of the next page (present when truncated).
    #[serde(rename = "NextContinuationToken", default)]
    pub next_continuation_token: Option<String>,
    /// Keys returned on this page (S3 says it when it sends none).
    #[serde(rename = "KeyCount", default)]
    pub key_count: Option<u64>,
    /// The objects, in key order.
    #[serde(rename = "Contents", default)]
    pub contents: Vec<Object>,
}

/// One object of a listing.
#[derive(Debug, Deserialize, PartialEq, Eq)]
pub struct Object {
    /// The full key.
    #[serde(rename = "Key")]
    pub key: String,
    /// Bytes.
    #[serde(rename = "Size")]
    pub size: u64,
    /// The entity tag, quotes included as S3 sends them (`"9b2cf5…"`).
    #[serde(rename = "ETag", default)]
    pub etag: Option<String>,
}

/// An S3 error document.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
pub struct S3Error {
    /// `NoSuchBucket`, `AccessDenied`, `SignatureDoesNotMatch`, …
    #[serde(rename = "Code", default)]
    pub code: String,
    /// S3's explanation.
    #[serde(rename = "Message", default)]
    pub message: String,
    /// The bucket's region (`AuthorizationHeaderMalformed`).
    #[serde(rename = "Region", default)]
    pub region: Option<String>,
    /// The endpoint to use (`PermanentRedirect`).
    #[serde(rename = "Endpoint", default)]
    pub endpoint: Option<String>,
}

/// Parses a ListObjectsV2 page; the message says what was wrong and quotes the body's start.
pub fn list_page(body: &[u8]) -> Result<ListPage, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("listing is not UTF-8: {e}"))?;
    match root(text).as_deref() {
        Some("ListBucketResult") => {}
        Some("Error") => {
            let e = error(body).unwrap_or_default();
            return Err(format!("S3 error {}: {}", e.code, e.message));
        }
        other => return Err(format!("expected <ListBucketResult>, got {other:?}: {}", quote(text))),
    }
    quick_xml::de::from_str(text).map_err(|e| format!("unreadable ListBucketResult ({e}): {}", quote(text)))
}

/// Parses an error document, if the body is one.
pub fn error(body: &[u8]) -> Option<S3Error> {
    let text = std::str::from_utf8(body).ok()?;
    if root(text).as_deref() != Some("Error") {
        return None;
    }
    quick_xml::de::from_str(text).ok()
}

/// The name of the document's root element.
fn root(text: &str) -> Option<String> {
    let mut reader = quick_xml::Reader::from_str(text);
    loop {
        match reader.read_event().ok()? {
            quick_xml::events::Event::Start(e) | quick_xml::events::Event::Empty(e) => {
                return Some(e.local_name().into_inner().to_string());
            }
            quick_xml::events::Event::Eof => return None,
            _ => {}
        }
    }
}

/// The first 200 characters of a body, for messages.
fn quote(text: &str) -> String {
    let t: String = text.trim().chars().take(200).collect();
    format!("{t:?}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A truncated first page as S3 sends it (namespace, owner, storage class, quoted ETags).
    const PAGE_1: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>weights</Name>
  <Prefix>llama/70b/</Prefix>
  <KeyCount>3</KeyCount>
  <MaxKeys>3</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents>
    <Key>llama/70b/config.json</Key>
    <LastModified>2026-01-12T17:50:30.000Z</LastModified>
    <ETag>&quot;fba9dede5f27731c9771645a39863328&quot;</ETag>
    <ChecksumAlgorithm>CRC32</ChecksumAlgorithm>
    <Size>434</Size>
    <StorageClass>STANDARD</StorageClass>
  </Contents>
  <Contents>
    <Key>llama/70b/R&amp;D &lt;v2&gt;/a&#x2F;b&#39;s.bin</Key>
    <LastModified>2026-01-12T17:50:31.000Z</LastModified>
    <ETag>"a1b2c3-2"</ETag>
    <Size>21474836480</Size>
    <StorageClass>STANDARD</StorageClass>
  </Contents>
  <Contents>
    <Key>llama/70b/shards/</Key>
    <LastModified>2026-01-12T17:50:32.000Z</LastModified>
    <ETag>&quot;d41d8cd98f00b204e9800998ecf8427e&quot;</ETag>
    <Size>0</Size>
    <StorageClass>STANDARD</StorageClass>
  </Contents>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
  <StartAfter></StartAfter>
</ListBucketResult>"#;

    const LAST_PAGE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>weights</Name><Prefix>llama/70b/</Prefix><ContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</ContinuationToken><KeyCount>1</KeyCount><MaxKeys>3</MaxKeys><IsTruncated>false</IsTruncated><Contents><Key>llama/70b/shards/model-00001.safetensors</Key><LastModified>2026-01-12T17:50:33.000Z</LastModified><ETag>"e3"</ETag><Size>7</Size><StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>"#;

    #[test]
    fn reads_a_truncated_page_with_entities_sizes_and_etags() {
        let p = list_page(PAGE_1.as_bytes()).unwrap();
        assert!(p.is_truncated);
        assert_eq!(p.next_continuation_token.as_deref(), Some("1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="));
        assert_eq!(p.key_count, Some(3));
        let keys: Vec<&str> = p.contents.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["llama/70b/config.json", "llama/70b/R&D <v2>/a/b's.bin", "llama/70b/shards/"]);
        assert_eq!(p.contents[1].size, 21_474_836_480, "sizes past 4 GiB");
        assert_eq!(p.contents[0].etag.as_deref(), Some("\"fba9dede5f27731c9771645a39863328\""));
        assert_eq!(p.contents[1].etag.as_deref(), Some("\"a1b2c3-2\""));
    }

    #[test]
    fn reads_the_last_page() {
        let p = list_page(LAST_PAGE.as_bytes()).unwrap();
        assert!(!p.is_truncated);
        assert_eq!(p.next_continuation_token, None);
        assert_eq!(p.contents.len(), 1);
        assert_eq!(p.contents[0].size, 7);
    }

    #[test]
    fn an_empty_listing_has_no_contents() {
        let xml = r#"<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>none/</Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated></ListBucketResult>"#;
        let p = list_page(xml.as_bytes()).unwrap();
        assert_eq!((p.contents.len(), p.key_count, p.is_truncated), (0, Some(0), false));
    }

    #[test]
    fn unusable_listings_are_errors_that_quote_the_body() {
        let bad_size = PAGE_1.replace("<Size>434</Size>", "<Size>lots</Size>");
        let e = list_page(bad_size.as_bytes()).unwrap_err();
        assert!(e.contains("unreadable ListBucketResult"), "{e}");
        let e = list_page(b"<html><body>Proxy login</body></html>").unwrap_err();
        assert!(e.contains("expected <ListBucketResult>") && e.contains("Proxy login"), "{e}");
        let e = list_page(b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>").unwrap_err();
        assert_eq!(e, "S3 error AccessDenied: Access Denied");
        let missing_key = "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>";
        assert!(list_page(missing_key.as_bytes()).is_err(), "an object without a key");
    }

    #[test]
    fn reads_error_documents() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>AuthorizationHeaderMalformed</Code><Message>The authorization header is malformed; the region &apos;us-east-1&apos; is wrong; expecting &apos;eu-central-1&apos;</Message><Region>eu-central-1</Region><RequestId>4442587FB7D0A2F9</RequestId><HostId>x</HostId></Error>"#;
        let e = error(xml.as_bytes()).unwrap();
        assert_eq!(e.code, "AuthorizationHeaderMalformed");
        assert!(e.message.contains("region 'us-east-1' is wrong"), "{}", e.message);
        assert_eq!(e.region.as_deref(), Some("eu-central-1"));
        let redirect = "<Error><Code>PermanentRedirect</Code><Message>Use the endpoint.</Message><Endpoint>weights.s3.eu-west-1.amazonaws.com</Endpoint><Bucket>weights</Bucket></Error>";
        assert_eq!(error(redirect.as_bytes()).unwrap().endpoint.as_deref(), Some("weights.s3.eu-west-1.amazonaws.com"));
        assert_eq!(error(b""), None);
        assert_eq!(error(b"{\"error\":1}"), None);
        assert_eq!(error(PAGE_1.as_bytes()), None);
    }
}
