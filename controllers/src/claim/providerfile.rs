//! `--capacity-provider FILE`: which provider serves each region, as YAML. In go the file's
//! text, the InferenceClusters and InferenceClasses the control cluster holds at start-up;
//! out comes a validated `ProviderPlan` (pure: `load`), which `build` turns into the one
//! `ProviderSet` the claim engine searches. `aws` entries become `AwsProvider`s (EKS node
//! groups; credentials from the standard AWS chain); `static` entries name `static`
//! InferenceClusters whose declared pools are the inventory. Every error names the entry and
//! field and says what to change, so a bad file stops the controller before it reconciles.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::cluster::InferenceClusterSpec;
use flotilla_apis::common::CapacityType;
#[cfg(feature = "aws")]
use flotilla_providers::aws::AwsProvider;
#[cfg(feature = "aws")]
pub use flotilla_providers::aws::AwsSettings;
use flotilla_providers::types::AwsTarget;
use flotilla_providers::{CapacityProvider, ProviderSet, StaticProvider};

/// What `build` takes to reach AWS. A controller built without the `aws` feature has no AWS
/// provider, so there is nothing to set.
#[cfg(not(feature = "aws"))]
#[derive(Clone, Debug, Default)]
pub struct AwsSettings {
    _nothing: (),
}
use serde::Deserialize;

/// The file.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapacityProviderFile {
    /// One entry per region (an AWS region, or the region of a static InferenceCluster).
    pub regions: Vec<RegionEntry>,
}

/// One region and the provider serving it.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum RegionEntry {
    /// EKS managed node groups in one AWS region.
    Aws(AwsEntry),
    /// The declared pools of one `static` InferenceCluster.
    Static(StaticEntry),
}

/// `kind: aws`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AwsEntry {
    /// AWS region (`eu-central-1`).
    #[serde(default)]
    pub region: String,
    /// The InferenceCluster whose nodes this region's capacity joins.
    #[serde(default)]
    pub cluster: String,
    /// Jurisdiction code of the region (`EU`).
    #[serde(default)]
    pub jurisdiction: String,
    /// EKS cluster name (default: the InferenceCluster's `provider.aws.eksCluster`).
    #[serde(default)]
    pub eks_cluster: Option<String>,
    /// Zones node groups may use (default: the InferenceCluster's `zones`, else the
    /// subnets' zones). Each needs a subnet.
    #[serde(default)]
    pub zones: Option<Vec<String>>,
    /// Subnet id per zone.
    #[serde(default)]
    pub subnets: BTreeMap<String, String>,
    /// IAM role ARN the nodes run as.
    #[serde(default)]
    pub node_role_arn: String,
    /// Instance types to consider (default: every `provisioning.aws.instanceTypes` of the
    /// InferenceClasses).
    #[serde(default)]
    pub instance_types: Option<Vec<String>>,
    /// Look up capacity reservations and capacity blocks (default true).
    #[serde(default)]
    pub reservations: Option<bool>,
    /// Send this region's calls here instead of AWS (tests against moto). Not for production.
    #[serde(default)]
    pub endpoint_url: Option<String>,
}

/// `kind: static`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticEntry {
    /// A `static` InferenceCluster; its region, jurisdiction, zones and pools are used.
    #[serde(default)]
    pub cluster: String,
}

/// A validated file: what `build` connects.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderPlan {
    /// AWS regions, each with its endpoint override.
    pub aws: Vec<(AwsTarget, Option<String>)>,
    /// On-demand USD per node-hour in millionths by instance type, from the classes' prices.
    pub on_demand_prices: BTreeMap<String, u64>,
    /// Static InferenceClusters `(name, spec)`.
    pub statics: Vec<(String, InferenceClusterSpec)>,
    /// Things worth saying that do not stop the controller.
    pub warnings: Vec<String>,
}

fn need(at: &str, field: &str, value: &str, example: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err(format!("{at}.{field}: missing; set it (e.g. `{field}: {example}`)"));
    }
    Ok(())
}

/// Parses and validates `text` against the InferenceClusters and InferenceClasses by name.
pub fn load(
    text: &str,
    clusters: &BTreeMap<String, InferenceClusterSpec>,
    classes: &BTreeMap<String, InferenceClassSpec>,
) -> Result<ProviderPlan, String> {
    // serde names the path, the line and, for `kind`, the kinds there are.
    flotilla_apis::yaml_bound::check_stream(text).map_err(|e| format!("the file {e}"))?;
    let file: CapacityProviderFile = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    if file.regions.is_empty() {
        return Err("regions: empty; list at least one region, or leave --capacity-provider unset".into());
    }
    let default_types: Vec<String> = classes
        .values()
        .filter_map(|c| c.provisioning.aws.as_ref())
        .flat_map(|a| a.instance_types.iter().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut on_demand_prices = BTreeMap::new();
    for class in classes.values() {
        let (Some(aws), Some(price)) =
            (class.provisioning.aws.as_ref(), class.price_per_node_hour.micros(CapacityType::OnDemand))
        else {
            continue;
        };
        for t in &aws.instance_types {
            on_demand_prices.entry(t.clone()).or_insert(price);
        }
    }
    let mut plan = ProviderPlan { aws: Vec::new(), on_demand_prices, statics: Vec::new(), warnings: Vec::new() };
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (i, entry) in file.regions.into_iter().enumerate() {
        let (region, at) = match entry {
            RegionEntry::Aws(e) => {
                let at = format!("regions[{i}] (aws {})", e.region);
                need(&at, "region", &e.region, "eu-central-1")?;
                need(&at, "cluster", &e.cluster, "<the InferenceCluster its nodes join>")?;
                need(&at, "jurisdiction", &e.jurisdiction, "EU")?;
                need(&at, "nodeRoleArn", &e.node_role_arn, "arn:aws:iam::123456789012:role/flotilla-nodes")?;
                let known = clusters.get(&e.cluster);
                let eks_cluster = match (&e.eks_cluster, known.and_then(|c| c.provider.aws.as_ref())) {
                    (Some(name), _) if !name.trim().is_empty() => name.clone(),
                    (_, Some(aws)) => aws.eks_cluster.clone(),
                    _ => {
                        return Err(format!(
                            "{at}.eksCluster: missing, and InferenceCluster `{}` names no provider.aws.eksCluster; set it",
                            e.cluster
                        ));
                    }
                };
                match known {
                    None => plan.warnings.push(format!(
                        "{at}.cluster: no InferenceCluster `{}` yet; capacity obtained in {} joins it once it exists",
                        e.cluster, e.region
                    )),
                    Some(spec) => {
                        if spec.region != e.region {
                            return Err(format!(
                                "{at}.region: InferenceCluster `{}` is in {}, not {}; name the cluster of this region",
                                e.cluster, spec.region, e.region
                            ));
                        }
                        if spec.jurisdiction.0 != e.jurisdiction {
                            return Err(format!(
                                "{at}.jurisdiction: `{}` differs from InferenceCluster `{}`'s `{}`; make them agree",
                                e.jurisdiction, e.cluster, spec.jurisdiction.0
                            ));
                        }
                    }
                }
                let zones = match (&e.zones, known) {
                    (Some(z), _) => z.clone(),
                    (None, Some(spec)) if !spec.zones.is_empty() => spec.zones.clone(),
                    _ => e.subnets.keys().cloned().collect(),
                };
                if zones.is_empty() {
                    return Err(format!("{at}.subnets: empty; give a subnet per zone (`eu-central-1a: subnet-…`)"));
                }
                for zone in &zones {
                    if e.subnets.get(zone).is_none_or(|s| s.trim().is_empty()) {
                        return Err(format!(
                            "{at}.subnets: no subnet for zone {zone}; add `{zone}: subnet-…` or leave the zone out of `zones`"
                        ));
                    }
                }
                if let Some(extra) = e.subnets.keys().find(|z| !zones.contains(z)) {
                    return Err(format!(
                        "{at}.subnets: zone {extra} is not one of the region's zones ({}); remove it or add it to `zones`",
                        zones.join(", ")
                    ));
                }
                let instance_types = e.instance_types.clone().unwrap_or_else(|| default_types.clone());
                if instance_types.is_empty() {
                    plan.warnings.push(format!(
                        "{at}.instanceTypes: none given and no InferenceClass has provisioning.aws.instanceTypes; \
                         discovery lists every GPU instance type of the region"
                    ));
                }
                let subnets = e.subnets.into_iter().filter(|(z, _)| zones.contains(z)).collect();
                let target = AwsTarget {
                    cluster: e.cluster,
                    eks_cluster,
                    region: e.region.clone(),
                    jurisdiction: e.jurisdiction,
                    subnets,
                    node_role_arn: e.node_role_arn,
                    instance_types,
                    reservations: e.reservations.unwrap_or(true),
                };
                plan.aws.push((target, e.endpoint_url));
                (e.region, at)
            }
            RegionEntry::Static(e) => {
                let at = format!("regions[{i}] (static {})", e.cluster);
                need(&at, "cluster", &e.cluster, "<a static InferenceCluster>")?;
                let Some(spec) = clusters.get(&e.cluster) else {
                    return Err(format!(
                        "{at}.cluster: no InferenceCluster `{}`; create it (provider.static) before starting the controller, or fix the name",
                        e.cluster
                    ));
                };
                if spec.provider.static_.is_none() {
                    return Err(format!(
                        "{at}.cluster: InferenceCluster `{}` is not a static cluster (its provider is not `static`); \
                         name a static one, or use `kind: aws`",
                        e.cluster
                    ));
                }
                if plan.statics.iter().any(|(n, _)| *n == e.cluster) {
                    return Err(format!("{at}.cluster: `{}` is listed twice; keep one entry", e.cluster));
                }
                plan.statics.push((e.cluster, spec.clone()));
                (spec.region.clone(), at)
            }
        };
        if let Some(first) = seen.get(&region) {
            return Err(format!(
                "{at}: region {region} is already served by {first}; one provider per region — remove one entry"
            ));
        }
        seen.insert(region, at);
    }
    Ok(plan)
}

/// Connects a plan: one `AwsProvider` per AWS region (`base` supplies retry settings and, in
/// tests, static credentials; its targets and endpoint are replaced by the entry's) and one
/// `StaticProvider` for the static clusters, in one `ProviderSet`. No call to AWS is made.
pub async fn build(
    plan: ProviderPlan,
    classes: &BTreeMap<String, InferenceClassSpec>,
    base: &AwsSettings,
) -> Result<ProviderSet, String> {
    let mut providers: Vec<Arc<dyn CapacityProvider>> = Vec::new();
    #[cfg(feature = "aws")]
    for (target, endpoint_url) in plan.aws {
        let settings = AwsSettings {
            targets: vec![target],
            endpoint_url: endpoint_url.or_else(|| base.endpoint_url.clone()),
            on_demand_prices: plan.on_demand_prices.clone(),
            ..base.clone()
        };
        providers.push(Arc::new(AwsProvider::connect(settings).await));
    }
    #[cfg(not(feature = "aws"))]
    if let Some((target, _)) = plan.aws.first() {
        let _ = base;
        return Err(format!(
            "region {} (kind: aws): this flotilla-controller was built without AWS support (cargo feature `aws`); \
             run a build with default features, or serve the region with `kind: static`",
            target.region
        ));
    }
    if !plan.statics.is_empty() {
        providers.push(Arc::new(StaticProvider::new(plan.statics, classes.clone())));
    }
    ProviderSet::new(providers).map_err(|e| e.to_string())
}

#[cfg(test)]
#[path = "providerfile_tests.rs"]
mod tests;
