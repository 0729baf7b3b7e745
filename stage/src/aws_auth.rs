//! Who S3 requests are signed as, for which region, and the signing itself. Credentials come
//! from the AWS SDK's own providers (`aws-config`), tried in the order of the SDK's default
//! chain — environment variables, the shared config profile, web identity (IRSA: `AWS_ROLE_ARN`
//! and `AWS_WEB_IDENTITY_TOKEN_FILE`, exchanged with STS), container credentials (EKS Pod
//! Identity / ECS: `AWS_CONTAINER_CREDENTIALS_FULL_URI` and
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`), the EC2 instance profile — each under a name, so a
//! provider that is configured but fails is named in the error with what to change. When none
//! has credentials, requests go unsigned (public buckets). What the chain gave is cached and
//! fetched again [`REFRESH_BEFORE_EXPIRY`] before it expires, so every request of a long
//! download is signed, with `aws-sigv4`, by credentials that are current when it is sent.

use std::time::{Duration, SystemTime};

use aws_config::provider_config::ProviderConfig;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SessionTokenMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use http::header::{HeaderName, HeaderValue};
use tokio::sync::Mutex;

use crate::error::StageError;
use crate::http::{Req, error_chain};

/// How long before their expiry cached credentials are fetched again (a signature is checked
/// when the request arrives, so this covers the time between signing and sending, and skew).
pub const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(300);
/// The region signed for when neither flags, environment, profile nor instance metadata name one.
pub const DEFAULT_REGION: &str = "us-east-1";

/// Fixed credentials (the library's callers and tests; the binary uses the chain).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Session token of temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("access_key_id", &self.access_key_id).finish_non_exhaustive()
    }
}

/// Where S3 requests take their credentials from.
#[derive(Clone, Debug, Default)]
pub enum S3Auth {
    /// The SDK's providers in the default chain's order; unsigned when none has credentials.
    #[default]
    Chain,
    /// These credentials.
    Static(Credentials),
    /// Unsigned requests, whatever the environment holds.
    Anonymous,
}

/// One provider of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`.
    Environment,
    /// `AWS_PROFILE` in `~/.aws/config` / `AWS_CONFIG_FILE` / `AWS_SHARED_CREDENTIALS_FILE`.
    Profile,
    /// IRSA: `AWS_ROLE_ARN` + `AWS_WEB_IDENTITY_TOKEN_FILE`, through STS.
    WebIdentity,
    /// EKS Pod Identity / ECS: `AWS_CONTAINER_CREDENTIALS_FULL_URI` or `_RELATIVE_URI`.
    Container,
    /// The EC2 instance profile, through instance metadata.
    InstanceProfile,
    /// Given by the caller.
    Static,
}

impl Provider {
    /// The provider and how it was configured (variable names and non-secret values).
    pub fn describe(self) -> String {
        let var = |n: &str| format!("{n}={}", std::env::var(n).unwrap_or_else(|_| "<unset>".into()));
        match self {
            Provider::Environment => "environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)".into(),
            Provider::Profile => format!("shared config profile ({})", var("AWS_PROFILE")),
            Provider::WebIdentity => {
                format!("web identity (IRSA: {}, {})", var("AWS_WEB_IDENTITY_TOKEN_FILE"), var("AWS_ROLE_ARN"))
            }
            Provider::Container => {
                let uri = if std::env::var_os("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some() {
                    var("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                } else {
                    var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                };
                format!(
                    "container credentials (EKS Pod Identity / ECS: {uri}, {})",
                    var("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
                )
            }
            Provider::InstanceProfile => "EC2 instance profile (instance metadata)".into(),
            Provider::Static => "the given credentials".into(),
        }
    }

    /// What to check or change when this provider fails.
    pub fn hint(self) -> &'static str {
        match self {
            Provider::Environment => {
                "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the credentials Secret's keys), or neither"
            }
            Provider::Profile => "fix the profile in the AWS config file, or unset AWS_PROFILE",
            Provider::WebIdentity => {
                "the staging Job's service account (ModelCache spec.serviceAccountName) must carry the eks.amazonaws.com/role-arn annotation, the projected token file AWS_WEB_IDENTITY_TOKEN_FILE must be mounted and readable, and the role's trust policy must allow that service account"
            }
            Provider::Container => {
                "the staging Job's service account (ModelCache spec.serviceAccountName) needs an EKS Pod Identity association for its namespace, the eks-pod-identity-agent must run on the node, and AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE must be readable"
            }
            Provider::InstanceProfile => {
                "attach a role to the node's instance profile and allow pods to reach instance metadata (hop limit 2), or set AWS_EC2_METADATA_DISABLED=true to skip it"
            }
            Provider::Static => "check the credentials given",
        }
    }
}

/// What requests are signed as.
#[derive(Clone, Debug)]
pub enum Identity {
    /// No credentials: requests go unsigned.
    Anonymous,
    /// Credentials and the provider that gave them.
    Signed {
        /// The credentials.
        credentials: aws_credential_types::Credentials,
        /// Where they came from.
        from: Provider,
    },
}

impl Identity {
    /// For messages: who the requests were sent as (never a secret).
    pub fn describe(&self) -> String {
        match self {
            Identity::Anonymous => "sent unsigned: no AWS credentials were found (environment, profile, web identity, container credentials, instance profile)".into(),
            Identity::Signed { credentials, from } => {
                format!("signed with access key {} from {}", credentials.access_key_id(), from.describe())
            }
        }
    }

    /// Whether it can still be used at `now` without fetching again.
    fn fresh(&self, now: SystemTime) -> bool {
        match self {
            Identity::Anonymous => true,
            Identity::Signed { credentials, .. } => {
                credentials.expiry().is_none_or(|e| e > now + REFRESH_BEFORE_EXPIRY)
            }
        }
    }

    /// Whether it has not expired at `now`.
    fn valid(&self, now: SystemTime) -> bool {
        match self {
            Identity::Anonymous => true,
            Identity::Signed { credentials, .. } => credentials.expiry().is_none_or(|e| e > now),
        }
    }
}

/// Signs S3 requests for one region with what the providers give, cached until near expiry.
pub struct Signer {
    region: String,
    providers: Vec<(Provider, SharedCredentialsProvider)>,
    cached: Mutex<Option<Identity>>,
    now: Clock,
}

/// Where the signer reads the time (the system clock outside tests).
pub type Clock = std::sync::Arc<dyn Fn() -> SystemTime + Send + Sync>;

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<Provider> = self.providers.iter().map(|(p, _)| *p).collect();
        f.debug_struct("Signer").field("region", &self.region).field("providers", &names).finish_non_exhaustive()
    }
}

impl Signer {
    /// A signer for `region` taking credentials as `auth` says.
    pub fn new(auth: &S3Auth, region: String) -> Signer {
        let providers = match auth {
            S3Auth::Anonymous => Vec::new(),
            S3Auth::Static(c) => vec![(
                Provider::Static,
                SharedCredentialsProvider::new(aws_credential_types::Credentials::new(
                    c.access_key_id.clone(),
                    c.secret_access_key.clone(),
                    c.session_token.clone(),
                    None,
                    "flotilla-stage",
                )),
            )],
            S3Auth::Chain => {
                default_chain(&region, instance_metadata_allowed(std::env::var(IMDS_DISABLED).ok().as_deref()))
            }
        };
        Signer::with_providers(region, providers, std::sync::Arc::new(SystemTime::now))
    }

    /// A signer over these providers (tried in order) and this clock.
    pub fn with_providers(region: String, providers: Vec<(Provider, SharedCredentialsProvider)>, now: Clock) -> Signer {
        Signer { region, providers, cached: Mutex::new(None), now }
    }

    /// The region signed for.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// What requests are signed as now: the cached identity while it is fresh, else the first
    /// provider's that has credentials. When fetching again fails, credentials that have not
    /// expired yet are still used.
    pub async fn identity(&self) -> Result<Identity, StageError> {
        let now = (self.now)();
        let mut cached = self.cached.lock().await;
        if let Some(id) = cached.as_ref().filter(|id| id.fresh(now)) {
            return Ok(id.clone());
        }
        match self.load().await {
            Ok(id) => {
                *cached = Some(id.clone());
                Ok(id)
            }
            Err(e) => match cached.as_ref().filter(|id| id.valid(now)) {
                Some(old) => {
                    eprintln!("flotilla-stage: {e}; using the credentials fetched earlier until they expire");
                    Ok(old.clone())
                }
                None => Err(e),
            },
        }
    }

    /// Forgets the cached identity, so the next request fetches credentials again (S3 said
    /// they expired).
    pub async fn invalidate(&self) {
        self.cached.lock().await.take();
    }

    async fn load(&self) -> Result<Identity, StageError> {
        for (from, provider) in &self.providers {
            match provider.provide_credentials().await {
                Ok(credentials) => return Ok(Identity::Signed { credentials, from: *from }),
                Err(CredentialsError::CredentialsNotLoaded(_)) => continue,
                Err(e) => {
                    let detail = error_chain(&e);
                    let transient = matches!(e, CredentialsError::ProviderTimedOut(_)) || is_transient(&detail);
                    return Err(StageError::Credentials {
                        provider: from.describe(),
                        detail,
                        hint: from.hint(),
                        transient,
                    });
                }
            }
        }
        Ok(Identity::Anonymous)
    }

    /// Signs `req` (a GET with an empty body) as the current identity; unsigned when anonymous.
    pub async fn sign(&self, req: &mut Req) -> Result<Identity, StageError> {
        let id = self.identity().await?;
        if let Identity::Signed { credentials, .. } = &id {
            sign_request(req, credentials, &self.region, (self.now)())?;
        }
        Ok(id)
    }
}

/// The providers' configuration with the HTTPS client they send with (STS, container and
/// instance metadata): rustls on `ring`. The SDK is built without its default client (on
/// aws-lc), and a provider without a client fails every request.
fn provider_config() -> ProviderConfig {
    use aws_smithy_http_client::tls::{Provider as Tls, rustls_provider::CryptoMode};
    ProviderConfig::default().with_http_client(
        aws_smithy_http_client::Builder::new().tls_provider(Tls::Rustls(CryptoMode::Ring)).build_https(),
    )
}

/// The variable that keeps the AWS SDK from the instance metadata service (the staging Job
/// sets it unless the operator allows the node's role: docs/staging.md).
pub const IMDS_DISABLED: &str = "AWS_EC2_METADATA_DISABLED";

/// Whether the instance metadata service may be asked, given `AWS_EC2_METADATA_DISABLED`: not
/// when it says `true` (any case), as the SDK's own providers read it.
pub fn instance_metadata_allowed(disabled: Option<&str>) -> bool {
    !disabled.is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// The SDK's default region chain (environment, profile, instance metadata unless disabled),
/// with the client instance metadata needs (the SDK's own `DefaultRegionChain` takes none from
/// outside).
fn region_chain() -> aws_config::meta::region::RegionProviderChain {
    use aws_config::environment::region::EnvironmentVariableRegionProvider;
    use aws_config::imds::region::ImdsRegionProvider;
    use aws_config::profile::region::ProfileFileRegionProvider;
    let conf = provider_config();
    let chain = aws_config::meta::region::RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
        .or_else(ProfileFileRegionProvider::builder().configure(&conf).build());
    if instance_metadata_allowed(std::env::var(IMDS_DISABLED).ok().as_deref()) {
        chain.or_else(ImdsRegionProvider::builder().configure(&conf).build())
    } else {
        chain
    }
}

/// The SDK's providers in the order of its default chain, configured for `region` (STS); the
/// instance profile only when `instance_metadata` (not when `AWS_EC2_METADATA_DISABLED=true`:
/// the SDK's provider would refuse then too, but it is not even asked).
pub fn default_chain(region: &str, instance_metadata: bool) -> Vec<(Provider, SharedCredentialsProvider)> {
    use aws_config::ecs::EcsCredentialsProvider;
    use aws_config::environment::EnvironmentVariableCredentialsProvider;
    use aws_config::imds::credentials::ImdsCredentialsProvider;
    use aws_config::profile::ProfileFileCredentialsProvider;
    use aws_config::web_identity_token::WebIdentityTokenCredentialsProvider;
    let conf = provider_config().with_region(Some(aws_config::Region::new(region.to_string())));
    let mut chain = vec![
        (Provider::Environment, SharedCredentialsProvider::new(EnvironmentVariableCredentialsProvider::new())),
        (
            Provider::Profile,
            SharedCredentialsProvider::new(ProfileFileCredentialsProvider::builder().configure(&conf).build()),
        ),
        (
            Provider::WebIdentity,
            SharedCredentialsProvider::new(WebIdentityTokenCredentialsProvider::builder().configure(&conf).build()),
        ),
        (
            Provider::Container,
            SharedCredentialsProvider::new(EcsCredentialsProvider::builder().configure(&conf).build()),
        ),
    ];
    if instance_metadata {
        chain.push((
            Provider::InstanceProfile,
            SharedCredentialsProvider::new(ImdsCredentialsProvider::builder().configure(&conf).build()),
        ));
    }
    chain
}

/// Whether a provider's failure looks like network trouble (worth another attempt of the Job)
/// rather than a configuration or permission problem. The SDK's clients already retried.
pub fn is_transient(detail: &str) -> bool {
    let d = detail.to_ascii_lowercase();
    [
        "dispatch failure",
        "timed out",
        "timeout",
        "connection refused",
        "throttl",
        "service unavailable",
        "serviceunavailable",
        "internalfailure",
        "idpcommunicationerror",
    ]
    .iter()
    .any(|s| d.contains(s))
}

/// The region to sign for and to address AWS with: the configured one; else, for AWS itself
/// (no custom endpoint), the SDK's region chain (environment, profile, instance metadata);
/// else [`DEFAULT_REGION`].
pub async fn region(configured: Option<&str>, custom_endpoint: bool) -> String {
    if let Some(r) = configured.map(str::trim).filter(|r| !r.is_empty()) {
        return r.to_string();
    }
    if !custom_endpoint && let Some(r) = region_chain().region().await {
        return r.to_string();
    }
    DEFAULT_REGION.to_string()
}

/// Adds SigV4 headers for S3 (`x-amz-date`, `x-amz-content-sha256` of the empty body, the
/// session token, `authorization`) to a GET, signing `host`, `range` and every header it has.
pub fn sign_request(
    req: &mut Req,
    credentials: &aws_credential_types::Credentials,
    region: &str,
    time: SystemTime,
) -> Result<(), StageError> {
    let uri = req.uri.to_string();
    let failed = |e: &dyn std::fmt::Display| StageError::InvalidSource(format!("cannot sign {uri}: {e}"));
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings.session_token_mode = SessionTokenMode::Include;
    let identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("s3")
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| failed(&e))?
        .into();
    let headers: Vec<(&str, &str)> =
        req.headers.iter().filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?))).collect();
    let signable = SignableRequest::new("GET", uri.as_str(), headers.into_iter(), SignableBody::Bytes(&[]))
        .map_err(|e| failed(&e))?;
    let (instructions, _signature) =
        aws_sigv4::http_request::sign(signable, &params).map_err(|e| failed(&e))?.into_parts();
    let (new_headers, _) = instructions.into_parts();
    for h in new_headers {
        let name = HeaderName::from_bytes(h.name().as_bytes()).map_err(|e| failed(&e))?;
        let mut value = HeaderValue::from_str(h.value()).map_err(|e| failed(&e))?;
        // The signature and the session token never show in a request's Debug output.
        value.set_sensitive(h.sensitive() || name == http::header::AUTHORIZATION || name == "x-amz-security-token");
        req.headers.insert(name, value);
    }
    Ok(())
}

#[cfg(test)]
#[path = "aws_auth_tests.rs"]
mod tests;
