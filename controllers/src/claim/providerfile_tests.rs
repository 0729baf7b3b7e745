//! `--capacity-provider` files: what a good one becomes, and for each mistake the error that
//! names the entry, the field and what to change. Building never calls AWS.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use flotilla_providers::CapacityProvider;
use serde_json::json;

use super::*;

fn clusters() -> BTreeMap<String, InferenceClusterSpec> {
    let spec = |v: serde_json::Value| serde_json::from_value::<InferenceClusterSpec>(v).unwrap();
    BTreeMap::from([
        (
            "eu-fra-1".to_string(),
            spec(json!({"provider": {"aws": {"eksCluster": "inference-fra", "region": "eu-central-1"}},
                "region": "eu-central-1", "zones": ["eu-central-1a", "eu-central-1b"], "jurisdiction": "EU",
                "pools": []})),
        ),
        (
            "fra-dc".to_string(),
            spec(json!({"provider": {"static": {}}, "region": "onprem-fra", "zones": ["fra-dc-1"],
                "jurisdiction": "EU",
                "pools": [{"name": "h100", "class": "h100", "minNodes": 0, "maxNodes": 2, "nodes": 2,
                           "capacityTypes": ["reserved"]}]})),
        ),
    ])
}

fn classes() -> BTreeMap<String, InferenceClassSpec> {
    let class: InferenceClassSpec = serde_json::from_value(json!({
        "device": {"driver": "gpu.nvidia.com"}, "devicesPerNode": 8,
        "provisioning": {"aws": {"instanceTypes": ["p5.48xlarge"]}},
        "pricePerNodeHour": {"onDemand": "98.32", "reserved": "60.00"}}))
    .unwrap();
    BTreeMap::from([("h100".to_string(), class)])
}

const GOOD: &str = "\
regions:
- kind: aws
  region: eu-central-1
  cluster: eu-fra-1
  jurisdiction: EU
  nodeRoleArn: arn:aws:iam::123456789012:role/flotilla-nodes
  subnets: {eu-central-1a: subnet-0a, eu-central-1b: subnet-0b}
- kind: aws
  region: us-east-1
  cluster: us-va-1
  jurisdiction: US
  eksCluster: inference-iad
  nodeRoleArn: arn:aws:iam::123456789012:role/flotilla-nodes
  subnets: {us-east-1a: subnet-1a}
  instanceTypes: [g5.xlarge]
  reservations: false
  endpointUrl: http://127.0.0.1:5000
- kind: static
  cluster: fra-dc
";

fn err(text: &str) -> String {
    load(text, &clusters(), &classes()).unwrap_err()
}

#[test]
fn a_good_file_becomes_targets_defaults_from_the_cluster_and_the_classes() {
    let plan = load(GOOD, &clusters(), &classes()).unwrap();
    assert_eq!(plan.aws.len(), 2);
    let (fra, endpoint) = &plan.aws[0];
    assert_eq!(fra.eks_cluster, "inference-fra", "from the InferenceCluster's provider.aws");
    assert_eq!(fra.subnets.keys().collect::<Vec<_>>(), ["eu-central-1a", "eu-central-1b"]);
    assert_eq!(fra.instance_types, ["p5.48xlarge"], "from the classes");
    assert!(fra.reservations && endpoint.is_none());
    let (iad, endpoint) = &plan.aws[1];
    assert_eq!((iad.eks_cluster.as_str(), iad.instance_types.as_slice()), ("inference-iad", &["g5.xlarge".into()][..]));
    assert_eq!((iad.reservations, endpoint.as_deref()), (false, Some("http://127.0.0.1:5000")));
    assert_eq!(plan.on_demand_prices, BTreeMap::from([("p5.48xlarge".to_string(), 98_320_000)]));
    assert_eq!(plan.statics.len(), 1);
    assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
    assert!(plan.warnings[0].contains("no InferenceCluster `us-va-1` yet"), "{:?}", plan.warnings);
}

#[cfg(feature = "aws")]
#[tokio::test]
async fn a_good_file_builds_one_provider_set_without_calling_aws() {
    let plan = load(GOOD, &clusters(), &classes()).unwrap();
    let set = build(plan, &classes(), &AwsSettings::default()).await.unwrap();
    let regions: Vec<(String, String, String)> =
        set.regions().into_iter().map(|r| (r.provider, r.name, r.cluster)).collect();
    assert_eq!(
        regions,
        [
            ("aws".into(), "eu-central-1".into(), "eu-fra-1".into()),
            ("aws".into(), "us-east-1".into(), "us-va-1".into()),
            ("static".into(), "onprem-fra".into(), "fra-dc".into()),
        ]
    );
    let offerings = set.offerings("onprem-fra").await.unwrap();
    assert_eq!((offerings.len(), offerings[0].available_nodes), (1, Some(2)), "the static pool, no network");
}

/// A controller built without the `aws` feature refuses the AWS regions by name instead of
/// starting without them; a file of static regions only still builds.
#[cfg(not(feature = "aws"))]
#[tokio::test]
async fn without_the_aws_feature_aws_regions_are_refused_by_name() {
    let plan = load(GOOD, &clusters(), &classes()).unwrap();
    let e = build(plan, &classes(), &AwsSettings::default()).await.unwrap_err();
    assert!(e.contains("region eu-central-1 (kind: aws)") && e.contains("cargo feature `aws`"), "{e}");
    let statics = load("regions:\n- kind: static\n  cluster: fra-dc\n", &clusters(), &classes()).unwrap();
    let set = build(statics, &classes(), &AwsSettings::default()).await.unwrap();
    assert_eq!(set.regions().len(), 1);
}

#[test]
fn an_unknown_kind_says_which_kinds_exist() {
    let e = err("regions:\n- kind: gce\n  region: europe-west4\n");
    assert!(e.contains("regions[0].kind: unknown variant `gce`, expected `aws` or `static`"), "{e}");
    let e = err("regions:\n- region: eu-central-1\n");
    assert!(e.contains("kind"), "{e}");
}

#[test]
fn a_zone_without_a_subnet_is_named() {
    // eu-central-1b comes from the InferenceCluster's zones.
    let e = err(&GOOD.replace(
        "subnets: {eu-central-1a: subnet-0a, eu-central-1b: subnet-0b}",
        "subnets: {eu-central-1a: subnet-0a}",
    ));
    assert!(
        e.contains(
            "regions[0] (aws eu-central-1).subnets: no subnet for zone eu-central-1b; add `eu-central-1b: subnet-…`"
        ),
        "{e}"
    );
    let e = err(&GOOD.replace(
        "subnets: {us-east-1a: subnet-1a}",
        "zones: [us-east-1a, us-east-1c]\n  subnets: {us-east-1a: subnet-1a}",
    ));
    assert!(e.contains("regions[1] (aws us-east-1).subnets: no subnet for zone us-east-1c"), "{e}");
    let e = err(&GOOD
        .replace("subnet-1a}", "subnet-1a, us-east-1z: subnet-1z}")
        .replace("  subnets: {us-east-1a", "  zones: [us-east-1a]\n  subnets: {us-east-1a"));
    assert!(e.contains("zone us-east-1z is not one of the region's zones (us-east-1a)"), "{e}");
}

#[test]
fn a_region_listed_twice_is_refused_with_both_entries() {
    let e = err(&format!(
        "{GOOD}- kind: aws\n  region: eu-central-1\n  cluster: eu-fra-1\n  jurisdiction: EU\n  nodeRoleArn: arn:x\n  subnets: {{eu-central-1a: a, eu-central-1b: b}}\n"
    ));
    assert!(
        e.contains(
            "regions[3] (aws eu-central-1): region eu-central-1 is already served by regions[0] (aws eu-central-1)"
        ),
        "{e}"
    );
    let e = err(&format!("{GOOD}- kind: static\n  cluster: fra-dc\n"));
    assert!(e.contains("regions[3] (static fra-dc).cluster: `fra-dc` is listed twice"), "{e}");
}

#[test]
fn a_cluster_that_is_not_named_or_not_known_is_refused() {
    let e = err(&GOOD.replace("  cluster: eu-fra-1\n", ""));
    assert!(e.contains("regions[0] (aws eu-central-1).cluster: missing; set it"), "{e}");
    let e = err("regions:\n- kind: static\n");
    assert!(e.contains("regions[0] (static ).cluster: missing"), "{e}");
    let e = err("regions:\n- kind: static\n  cluster: fra-dx\n");
    assert!(e.contains("regions[0] (static fra-dx).cluster: no InferenceCluster `fra-dx`"), "{e}");
    let e = err("regions:\n- kind: static\n  cluster: eu-fra-1\n");
    assert!(e.contains("InferenceCluster `eu-fra-1` is not a static cluster"), "{e}");
}

#[test]
fn other_mistakes_name_their_field() {
    let e =
        err(&GOOD
            .replace("  nodeRoleArn: arn:aws:iam::123456789012:role/flotilla-nodes\n  subnets: {eu", "  subnets: {eu"));
    assert!(e.contains("regions[0] (aws eu-central-1).nodeRoleArn: missing"), "{e}");
    let e = err(&GOOD.replace("  eksCluster: inference-iad\n", ""));
    assert!(e.contains("regions[1] (aws us-east-1).eksCluster: missing"), "{e}");
    let e = err(&GOOD.replace("cluster: eu-fra-1\n  jurisdiction: EU", "cluster: eu-fra-1\n  jurisdiction: DE"));
    assert!(
        e.contains("regions[0] (aws eu-central-1).jurisdiction: `DE` differs from InferenceCluster `eu-fra-1`'s `EU`"),
        "{e}"
    );
    let e = err(&GOOD.replace("region: eu-central-1\n", "region: eu-west-1\n"));
    assert!(e.contains("InferenceCluster `eu-fra-1` is in eu-central-1, not eu-west-1"), "{e}");
    let e = err(&GOOD.replace("reservations: false", "reservation: false"));
    assert!(e.contains("unknown field `reservation`"), "{e}");
    assert!(err("regions: []\n").contains("regions: empty"));
}
