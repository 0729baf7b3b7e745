//! A simulated cloud as YAML: the controller's `--sim-cloud FILE` (demos, end-to-end tests)
//! and `fleetctl plan --cloud FILE` (previewing claims offline) read the same file. Each
//! region names the InferenceCluster its nodes join; each offering names an InferenceClass,
//! whose device description the offered nodes carry (so selectors match them exactly as they
//! match the class). Turned into a `SimCloud`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{SimCloud, SimOffering, SimRegion};
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::common::{CapacityType, parse_price_micros};
use serde::Deserialize;

/// The file.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimCloudFile {
    /// Provider name in attempts (default `sim`).
    #[serde(default)]
    pub name: Option<String>,
    /// Seed.
    #[serde(default)]
    pub seed: u64,
    /// Seconds from acquisition to ready nodes.
    #[serde(default)]
    pub provisioning_delay_seconds: u64,
    /// Regions.
    pub regions: Vec<RegionFile>,
}

/// A region.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegionFile {
    /// Name.
    pub name: String,
    /// Jurisdiction.
    pub jurisdiction: String,
    /// The InferenceCluster its nodes join.
    pub cluster: String,
    /// Zones.
    pub zones: Vec<String>,
    /// Node quota.
    #[serde(default)]
    pub quota_nodes: Option<u32>,
    /// Offerings.
    pub offerings: Vec<OfferingFile>,
}

/// An offering.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OfferingFile {
    /// Instance type.
    pub instance_type: String,
    /// InferenceClass.
    pub class: String,
    /// Capacity type.
    pub capacity_type: CapacityType,
    /// Devices per node (default: the class's `devicesPerNode`).
    #[serde(default)]
    pub devices_per_node: Option<u32>,
    /// USD per node-hour (`"98.32"`).
    pub price_per_hour: String,
    /// Nodes each zone can give.
    pub nodes_per_zone: u32,
}

/// Parse `text` and resolve classes; errors name the field and what to change.
pub fn load(text: &str, classes: &BTreeMap<String, InferenceClassSpec>) -> Result<SimCloud, String> {
    let file: SimCloudFile = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let mut regions = Vec::new();
    for r in file.regions {
        let mut offerings = Vec::new();
        for (i, o) in r.offerings.into_iter().enumerate() {
            let at = format!("regions[{}].offerings[{i}]", r.name);
            let class = classes
                .get(&o.class)
                .ok_or_else(|| format!("{at}.class: no InferenceClass `{}`; create it or name another", o.class))?;
            let price_micros = parse_price_micros(&o.price_per_hour)
                .ok_or_else(|| format!("{at}.pricePerHour: `{}` is not a price such as \"98.32\"", o.price_per_hour))?;
            offerings.push(SimOffering {
                instance_type: o.instance_type,
                class: o.class,
                device: class.device.clone(),
                devices_per_node: o.devices_per_node.unwrap_or(class.devices_per_node),
                capacity_type: o.capacity_type,
                zones: Vec::new(),
                price_micros,
                nodes_per_zone: o.nodes_per_zone,
                reservation_id: None,
                ends_at: None,
            });
        }
        regions.push(SimRegion {
            name: r.name,
            jurisdiction: r.jurisdiction,
            cluster: r.cluster,
            zones: r.zones,
            quota_nodes: r.quota_nodes,
            offerings,
        });
    }
    Ok(SimCloud {
        name: file.name.unwrap_or_else(|| "sim".into()),
        seed: file.seed,
        provisioning_delay: Duration::from_secs(file.provisioning_delay_seconds),
        provisioning_jitter: Duration::ZERO,
        regions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offerings_take_their_device_from_the_class_and_errors_name_the_field() {
        let class: InferenceClassSpec = serde_json::from_value(serde_json::json!({
            "device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}}},
            "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "98.32"}}))
        .unwrap();
        let classes = BTreeMap::from([("h100".to_string(), class)]);
        let yaml = "regions:\n- {name: eu-west-3, jurisdiction: EU, cluster: eu2, zones: [eu-west-3a], quotaNodes: 2,\n   offerings: [{instanceType: p5.48xlarge, class: h100, capacityType: on-demand, pricePerHour: \"98.32\", nodesPerZone: 2}]}\n";
        let cloud = load(yaml, &classes).unwrap();
        let o = &cloud.regions[0].offerings[0];
        assert_eq!((o.devices_per_node, o.price_micros), (8, 98_320_000));
        assert_eq!(o.device.driver, "gpu.nvidia.com");
        let e = load(&yaml.replace("class: h100", "class: h200"), &classes).unwrap_err();
        assert!(e.contains("regions[eu-west-3].offerings[0].class: no InferenceClass `h200`"), "{e}");
        assert!(load("regions: []\nextra: 1\n", &classes).unwrap_err().contains("unknown field"));
    }
}
