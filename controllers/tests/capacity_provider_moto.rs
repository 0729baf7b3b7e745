//! A `--capacity-provider` file with an `aws` region whose `endpointUrl` is a moto server on
//! loopback (the AWS emulator the providers crate's tests use; scripts/setup-moto.sh installs
//! it, `FLOTILLA_MOTO_SERVER` overrides the path): the file is loaded, built into the
//! `ProviderSet` the controller would use, and offerings are listed through it, next to a
//! static site. Fake static credentials only; the standard credential chain is never consulted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::cluster::InferenceClusterSpec;
use flotilla_apis::common::CapacityType;
use flotilla_controllers::claim::providerfile;
use flotilla_providers::CapacityProvider;
use flotilla_providers::aws::AwsSettings;

#[path = "../../providers/tests/moto/mod.rs"]
mod moto;
use serde_json::json;

#[tokio::test]
async fn a_provider_file_with_an_aws_region_on_moto_lists_offerings_through_the_provider_set() {
    let (url, _watchdog) = moto::start();
    let clusters: BTreeMap<String, InferenceClusterSpec> = BTreeMap::from([(
        "fra-dc".to_string(),
        serde_json::from_value(json!({"provider": {"static": {}}, "region": "onprem-fra", "zones": ["fra-dc-1"],
            "jurisdiction": "EU", "pools": [{"name": "h100", "class": "h100", "minNodes": 0, "maxNodes": 2,
            "nodes": 2, "capacityTypes": ["reserved"]}]}))
        .unwrap(),
    )]);
    let classes: BTreeMap<String, InferenceClassSpec> = BTreeMap::from([(
        "h100".to_string(),
        serde_json::from_value(json!({"device": {"driver": "gpu.nvidia.com"}, "devicesPerNode": 8,
            "provisioning": {"aws": {"instanceTypes": ["p5.48xlarge"]}},
            "pricePerNodeHour": {"onDemand": "98.32", "reserved": "60.00"}}))
        .unwrap(),
    )]);
    let file = format!(
        "regions:
- kind: aws
  region: us-east-1
  cluster: us-va-1
  jurisdiction: US
  eksCluster: inference-iad
  nodeRoleArn: arn:aws:iam::123456789012:role/flotilla-nodes
  subnets: {{us-east-1a: subnet-0a, us-east-1b: subnet-0b}}
  reservations: false
  endpointUrl: {url}
- kind: static
  cluster: fra-dc
"
    );
    let plan = providerfile::load(&file, &clusters, &classes).unwrap();
    let base = AwsSettings {
        static_credentials: Some(("testing".into(), "testing".into())),
        max_attempts: 2,
        initial_backoff: Duration::from_millis(10),
        ..Default::default()
    };
    let set = providerfile::build(plan, &classes, &base).await.unwrap();

    let offerings = set.offerings("us-east-1").await.unwrap();
    assert!(!offerings.is_empty(), "moto lists p5.48xlarge in us-east-1");
    assert!(
        offerings.iter().all(|o| o.instance_type == "p5.48xlarge"),
        "only the classes' instance types: {offerings:?}"
    );
    assert!(
        offerings.iter().all(|o| ["us-east-1a", "us-east-1b"].contains(&o.zone.as_str())),
        "only zones with a subnet"
    );
    let on_demand = offerings.iter().find(|o| o.capacity_type == CapacityType::OnDemand).unwrap();
    assert_eq!(on_demand.price_micros, Some(98_320_000), "on-demand price from the InferenceClass");
    assert_eq!(on_demand.devices_per_node, 8);

    let static_offerings = set.offerings("onprem-fra").await.unwrap();
    assert_eq!(static_offerings.len(), 1);
    assert_eq!(static_offerings[0].capacity_type, CapacityType::Reserved);
}
