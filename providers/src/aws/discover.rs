//! Discovery of what a region offers: `DescribeInstanceTypes` GPU info becomes a device in the
//! DRA shape InferenceClasses use (driver `gpu.<vendor>.com`, `productName`, `memory`),
//! `DescribeInstanceTypeOfferings` says which zones have each type, `DescribeSpotPriceHistory`
//! gives spot offerings and prices, `DescribeCapacityReservations` gives reserved offerings
//! (on-demand capacity reservations and capacity blocks, with their end).

use std::collections::BTreeMap;

use aws_sdk_ec2::primitives::DateTime;
use aws_sdk_ec2::types::{Filter, InstanceType, InstanceTypeInfo, LocationType};
use flotilla_apis::common::{CapacityType, DeviceAttribute, DeviceSpec, parse_price_micros};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;

use super::RegionClients;
use super::errors::from_sdk;
use crate::error::ProviderError;
use crate::types::Offering;

/// A GPU instance type as a device shape.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct GpuType {
    pub name: String,
    pub device: DeviceSpec,
    pub devices_per_node: u32,
}

/// The DRA-shaped device of an instance type, if it has GPUs.
pub(super) fn gpu_type(info: &InstanceTypeInfo) -> Option<GpuType> {
    let name = info.instance_type()?.as_str().to_string();
    let gpu = info.gpu_info()?.gpus().first()?;
    let vendor = gpu.manufacturer().unwrap_or("unknown");
    let driver = format!("gpu.{}.com", vendor.to_ascii_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), ""));
    let mut attributes = BTreeMap::new();
    let product = format!("{vendor} {}", gpu.name().unwrap_or("GPU"));
    attributes.insert("productName".to_string(), DeviceAttribute { string: Some(product), ..Default::default() });
    let mut capacity = BTreeMap::new();
    if let Some(mib) = gpu.memory_info().and_then(|m| m.size_in_mib()) {
        capacity.insert("memory".to_string(), Quantity(format!("{mib}Mi")));
    }
    let count = u32::try_from(gpu.count().unwrap_or(0)).unwrap_or(0);
    (count > 0).then_some(GpuType {
        name,
        device: DeviceSpec { driver, attributes, capacity },
        devices_per_node: count,
    })
}

fn timestamp(dt: &DateTime) -> Option<Timestamp> {
    Timestamp::from_second(dt.secs()).ok()
}

async fn gpu_types(c: &RegionClients) -> Result<Vec<GpuType>, ProviderError> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut call = c.ec2.describe_instance_types().set_next_token(token.clone());
        for t in &c.target.instance_types {
            call = call.instance_types(InstanceType::from(t.as_str()));
        }
        let page = call.send().await.map_err(|e| from_sdk("DescribeInstanceTypes", &e))?;
        out.extend(page.instance_types().iter().filter_map(gpu_type));
        token = page.next_token().filter(|t| !t.is_empty()).map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

async fn zones(c: &RegionClients, types: &[String]) -> Result<Vec<(String, String)>, ProviderError> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = c
            .ec2
            .describe_instance_type_offerings()
            .location_type(LocationType::AvailabilityZone)
            .filters(Filter::builder().name("instance-type").set_values(Some(types.to_vec())).build())
            .set_next_token(token.clone())
            .send()
            .await
            .map_err(|e| from_sdk("DescribeInstanceTypeOfferings", &e))?;
        for o in page.instance_type_offerings() {
            if let (Some(t), Some(zone)) = (o.instance_type(), o.location()) {
                out.push((t.as_str().to_string(), zone.to_string()));
            }
        }
        token = page.next_token().filter(|t| !t.is_empty()).map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Newest Linux spot price per (instance type, zone), in millionths of a dollar.
async fn spot_prices(c: &RegionClients, types: &[String]) -> Result<BTreeMap<(String, String), u64>, ProviderError> {
    let mut newest: BTreeMap<(String, String), (i64, u64)> = BTreeMap::new();
    let mut token: Option<String> = None;
    loop {
        let mut call = c
            .ec2
            .describe_spot_price_history()
            .product_descriptions("Linux/UNIX")
            .start_time(DateTime::from(std::time::SystemTime::now()))
            .set_next_token(token.clone());
        for t in types {
            call = call.instance_types(InstanceType::from(t.as_str()));
        }
        let page = call.send().await.map_err(|e| from_sdk("DescribeSpotPriceHistory", &e))?;
        for p in page.spot_price_history() {
            let (Some(t), Some(zone), Some(price)) = (p.instance_type(), p.availability_zone(), p.spot_price()) else {
                continue;
            };
            let Some(micros) = parse_price_micros(price) else { continue };
            let at = p.timestamp().map_or(0, |d| d.secs());
            let key = (t.as_str().to_string(), zone.to_string());
            if newest.get(&key).is_none_or(|(seen, _)| at >= *seen) {
                newest.insert(key, (at, micros));
            }
        }
        token = page.next_token().filter(|t| !t.is_empty()).map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    Ok(newest.into_iter().map(|(k, (_, p))| (k, p)).collect())
}

/// Active capacity reservations and capacity blocks of the given types.
async fn reservations(c: &RegionClients, gpu: &[GpuType]) -> Result<Vec<Offering>, ProviderError> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = c
            .ec2
            .describe_capacity_reservations()
            .filters(Filter::builder().name("state").values("active").build())
            .set_next_token(token.clone())
            .send()
            .await
            .map_err(|e| from_sdk("DescribeCapacityReservations", &e))?;
        for r in page.capacity_reservations() {
            let (Some(id), Some(t), Some(zone)) =
                (r.capacity_reservation_id(), r.instance_type(), r.availability_zone())
            else {
                continue;
            };
            let Some(g) = gpu.iter().find(|g| g.name == t) else { continue };
            out.push(Offering {
                region: c.target.region.clone(),
                zone: zone.to_string(),
                instance_type: t.to_string(),
                capacity_type: CapacityType::Reserved,
                device: g.device.clone(),
                devices_per_node: g.devices_per_node,
                // Already paid for: the cheapest way to run.
                price_micros: Some(0),
                reservation_id: Some(id.to_string()),
                available_nodes: r.available_instance_count().and_then(|n| u32::try_from(n).ok()),
                ends_at: r.end_date().and_then(timestamp),
                class: None,
                cluster: None,
            });
        }
        token = page.next_token().filter(|t| !t.is_empty()).map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    Ok(out)
}

pub(super) async fn offerings(
    c: &RegionClients,
    prices: &BTreeMap<String, u64>,
) -> Result<Vec<Offering>, ProviderError> {
    let gpu = gpu_types(c).await?;
    if gpu.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<String> = gpu.iter().map(|g| g.name.clone()).collect();
    let placed = zones(c, &names).await?;
    let spot = spot_prices(c, &names).await?;
    let usable = |zone: &str| c.target.subnets.is_empty() || c.target.subnets.contains_key(zone);
    let mut out = Vec::new();
    for (t, zone) in placed.iter().filter(|(_, z)| usable(z)) {
        let Some(g) = gpu.iter().find(|g| g.name == *t) else { continue };
        let base = Offering {
            region: c.target.region.clone(),
            zone: zone.clone(),
            instance_type: t.clone(),
            capacity_type: CapacityType::OnDemand,
            device: g.device.clone(),
            devices_per_node: g.devices_per_node,
            price_micros: prices.get(t).copied(),
            reservation_id: None,
            available_nodes: None,
            ends_at: None,
            class: None,
            cluster: None,
        };
        if let Some(price) = spot.get(&(t.clone(), zone.clone())) {
            out.push(Offering { capacity_type: CapacityType::Spot, price_micros: Some(*price), ..base.clone() });
        }
        out.push(base);
    }
    if c.target.reservations {
        out.extend(reservations(c, &gpu).await?.into_iter().filter(|o| usable(&o.zone)));
    }
    Ok(out)
}
