//! The AWS adapter: EC2 for discovery (GPU instance types, offerings per zone, spot prices,
//! capacity reservations and capacity blocks), EKS managed node groups for acquisition, and
//! EC2 Auto Scaling to remove the particular (empty) nodes a claim gives back (`named`).
//! Settings in (targets: which EKS cluster serves which region and jurisdiction, subnets per
//! zone, node role; optional endpoint override and static credentials for tests), typed
//! errors out; the SDK retries throttling with exponential backoff before an error becomes
//! `Throttled`. No SDK type appears in this module's public API.

/// `aws_smithy_mocks::mock_client!` without the SDK crates' `test-util` feature, which compiles
/// the legacy hyper 0.14 / h2 0.3 client into every test build: the same mock HTTP client and
/// response interceptor, with test credentials, region `us-east-1` and the latest behaviour.
#[cfg(test)]
macro_rules! mocked_client {
    ($sdk:ident, $mode:expr, $rules:expr) => {
        mocked_client!($sdk, $mode, $rules, |c| c)
    };
    ($sdk:ident, $mode:expr, $rules:expr, $more:expr) => {{
        let mut interceptor = aws_smithy_mocks::MockResponseInterceptor::new().rule_mode($mode);
        for rule in $rules {
            interceptor = interceptor.with_rule(rule);
        }
        fn coerce<T: Fn($sdk::config::Builder) -> $sdk::config::Builder>(f: T) -> T {
            f
        }
        let base = $sdk::config::Config::builder()
            .behavior_version($sdk::config::BehaviorVersion::latest())
            .region($sdk::config::Region::new("us-east-1"))
            .credentials_provider($sdk::config::Credentials::new("test", "test", None, None, "test"))
            .http_client(aws_smithy_mocks::create_mock_http_client())
            .interceptor(interceptor);
        $sdk::Client::from_conf(coerce($more)(base).build())
    }};
}

mod discover;
mod errors;
mod named;
mod nodegroups;
mod spot;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_lifecycle;
#[cfg(test)]
mod tests_named;

pub use errors::{from_code, kind_of};
pub use named::instance_id;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_ec2::config::retry::RetryConfig;

use crate::error::ProviderError;
use crate::provider::CapacityProvider;
pub use crate::types::AwsTarget;
use crate::types::{AcquireRequest, Acquisition, NodeRemoval, Offering, RegionInfo};

/// How to reach AWS.
#[derive(Clone, Debug, PartialEq)]
pub struct AwsSettings {
    /// The clusters capacity may be added to, one per region.
    pub targets: Vec<AwsTarget>,
    /// Send every call here instead of AWS (tests: a moto server).
    pub endpoint_url: Option<String>,
    /// Use these credentials (`access key id`, `secret`) instead of the standard chain.
    pub static_credentials: Option<(String, String)>,
    /// Attempts per call, retries of throttling and transient errors included.
    pub max_attempts: u32,
    /// First retry delay; doubles per retry (with jitter).
    pub initial_backoff: Duration,
    /// On-demand USD per node-hour in millionths by instance type (AWS's pricing API is not
    /// queried; InferenceClass prices go here).
    pub on_demand_prices: BTreeMap<String, u64>,
}

impl Default for AwsSettings {
    fn default() -> Self {
        Self {
            targets: Vec::new(),
            endpoint_url: None,
            static_credentials: None,
            max_attempts: 5,
            initial_backoff: Duration::from_millis(500),
            on_demand_prices: BTreeMap::new(),
        }
    }
}

#[derive(Clone, Debug)]
struct RegionClients {
    target: AwsTarget,
    ec2: aws_sdk_ec2::Client,
    eks: aws_sdk_eks::Client,
    asg: aws_sdk_autoscaling::Client,
}

/// The HTTPS client every SDK client and credential provider here sends with: rustls on `ring`.
/// The SDK is built without its default client (on aws-lc), and a client without one refuses
/// to send.
fn https_client() -> aws_sdk_ec2::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider as Tls, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new().tls_provider(Tls::Rustls(CryptoMode::Ring)).build_https()
}

/// The AWS adapter behind `CapacityProvider`.
#[derive(Clone, Debug)]
pub struct AwsProvider {
    regions: Vec<RegionClients>,
    on_demand_prices: BTreeMap<String, u64>,
}

impl AwsProvider {
    /// Builds clients for every target: region from the target, credentials from the
    /// standard chain (or `static_credentials`), endpoint from `endpoint_url` if set.
    pub async fn connect(settings: AwsSettings) -> Self {
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(https_client()).retry_config(
            RetryConfig::standard()
                .with_max_attempts(settings.max_attempts.max(1))
                .with_initial_backoff(settings.initial_backoff),
        );
        if let Some(url) = &settings.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        if let Some((id, secret)) = &settings.static_credentials {
            loader = loader.credentials_provider(aws_sdk_ec2::config::Credentials::new(
                id.clone(),
                secret.clone(),
                None,
                None,
                "flotilla-static",
            ));
        }
        if let Some(first) = settings.targets.first() {
            loader = loader.region(Region::new(first.region.clone()));
        }
        let shared = loader.load().await;
        Self::from_config(&shared, settings)
    }

    fn from_config(shared: &SdkConfig, settings: AwsSettings) -> Self {
        let regions = settings
            .targets
            .into_iter()
            .map(|target| {
                let region = Region::new(target.region.clone());
                let ec2 = aws_sdk_ec2::Client::from_conf(
                    aws_sdk_ec2::config::Builder::from(shared).region(region.clone()).build(),
                );
                let eks = aws_sdk_eks::Client::from_conf(
                    aws_sdk_eks::config::Builder::from(shared).region(region.clone()).build(),
                );
                let asg = aws_sdk_autoscaling::Client::from_conf(
                    aws_sdk_autoscaling::config::Builder::from(shared).region(region).build(),
                );
                RegionClients { target, ec2, eks, asg }
            })
            .collect();
        Self { regions, on_demand_prices: settings.on_demand_prices }
    }

    /// An adapter over ready-made clients (unit tests with `aws-smithy-mocks`).
    #[cfg(test)]
    fn from_clients(
        target: AwsTarget,
        ec2: aws_sdk_ec2::Client,
        eks: aws_sdk_eks::Client,
        asg: aws_sdk_autoscaling::Client,
    ) -> Self {
        Self { regions: vec![RegionClients { target, ec2, eks, asg }], on_demand_prices: BTreeMap::new() }
    }

    fn clients(&self, region: &str) -> Result<&RegionClients, ProviderError> {
        self.regions.iter().find(|r| r.target.region == region).ok_or_else(|| {
            ProviderError::new(
                crate::error::ErrorKind::InvalidRequest,
                "UnknownRegion",
                format!("no EKS cluster is configured for region {region}"),
            )
        })
    }
}

#[async_trait]
impl CapacityProvider for AwsProvider {
    fn name(&self) -> &str {
        "aws"
    }

    fn regions(&self) -> Vec<RegionInfo> {
        self.regions
            .iter()
            .map(|r| RegionInfo {
                provider: "aws".to_string(),
                name: r.target.region.clone(),
                jurisdiction: r.target.jurisdiction.clone(),
                cluster: r.target.cluster.clone(),
                zones: r.target.subnets.keys().cloned().collect(),
            })
            .collect()
    }

    async fn offerings(&self, region: &str) -> Result<Vec<Offering>, ProviderError> {
        discover::offerings(self.clients(region)?, &self.on_demand_prices).await
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquisition, ProviderError> {
        nodegroups::acquire(self.clients(&request.region)?, request).await
    }

    async fn describe(&self, region: &str, id: &str) -> Result<Acquisition, ProviderError> {
        nodegroups::describe(self.clients(region)?, id).await
    }

    async fn resize(&self, region: &str, id: &str, nodes: u32) -> Result<Acquisition, ProviderError> {
        nodegroups::resize(self.clients(region)?, id, nodes).await
    }

    async fn remove_nodes(&self, region: &str, id: &str, removal: &NodeRemoval) -> Result<Acquisition, ProviderError> {
        named::remove_nodes(self.clients(region)?, id, removal).await
    }

    async fn release(&self, region: &str, id: &str) -> Result<(), ProviderError> {
        nodegroups::release(self.clients(region)?, id).await
    }

    async fn held_by(&self, claim: &str) -> Result<Vec<(String, String)>, ProviderError> {
        let mut out = Vec::new();
        for c in &self.regions {
            let ids = nodegroups::held_by(c, claim).await?;
            out.extend(ids.into_iter().map(|id| (c.target.region.clone(), id)));
        }
        Ok(out)
    }
}
