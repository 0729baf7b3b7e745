//! `fleetctl plan`'s claim preview, offline. For every deployment the plan leaves short: the
//! CapacityClaim the controller would create (the placement crate's `claim::decide`, as the
//! controller calls it) and the offerings the claim engine would try for it, first one first
//! (the providers crate's `claim::preview`), against the capacity the files and options
//! describe: the `static` InferenceClusters' pools, plus a simulated cloud given with
//! `--cloud FILE` (the controller's `--sim-cloud` format). No cluster, no cloud is called.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use flotilla_apis::cel::SelectorEngine;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::common::{CapacityType, format_price_micros};
use flotilla_apis::{CapacityClaim, FleetObject, Located, ModelDeployment};
use flotilla_placement::claim::{ClaimDecision, decide};
use flotilla_placement::plan::Plan;
use flotilla_providers::claim::preview::{self, NoTry, Try};
use flotilla_providers::{CapacityProvider, ProviderSet, SimCloud, SimProvider, StaticProvider, SystemClock};
use serde::Serialize;

/// What `plan` says about one short deployment's claim.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimPreview {
    /// The deployment's namespace.
    pub namespace: String,
    /// The deployment's name.
    pub deployment: String,
    /// Replicas the plan could not place.
    pub unplaced: u32,
    /// `Claim` (a claim would be made and something offers it), `NoOffering` (a claim would
    /// be made but nothing offers it), `NoTemplate` (no claim would be made), `ClaimExists`
    /// (the files hold a claim of the deployment's name, which the controller would leave
    /// alone), `QuotaExceeded` (a FleetQuota holds the replicas back: no claim).
    pub outcome: &'static str,
    /// The claim that would be created.
    pub claim: Option<ClaimSummary>,
    /// The offerings the engine would try, in order.
    pub tries: Vec<Try>,
    /// What to read or do, in one sentence.
    pub message: String,
}

/// The claim that would be created.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSummary {
    /// Namespace.
    pub namespace: String,
    /// Name (the deployment's).
    pub name: String,
    /// Pod sets.
    pub pod_sets: Vec<PodSetSummary>,
    /// Capacity types, in the order they are tried.
    pub capacity_types: Vec<CapacityType>,
    /// Device classes, in fallback order.
    pub device_classes: Vec<String>,
}

/// One pod set of the claim.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSetSummary {
    /// Name.
    pub name: String,
    /// Pods.
    pub count: i32,
    /// Devices per pod.
    pub devices_per_pod: i32,
}

/// Reads a simulated cloud file (`--cloud`).
pub fn load_cloud(path: &Path, classes: &BTreeMap<String, InferenceClassSpec>) -> anyhow::Result<SimCloud> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read --cloud {}", path.display()))?;
    flotilla_providers::sim::file::load(&text, classes).map_err(|e| anyhow::anyhow!("--cloud {}: {e}", path.display()))
}

/// The classes among the objects, by name.
pub fn classes(objects: &[Located<FleetObject>]) -> BTreeMap<String, InferenceClassSpec> {
    objects
        .iter()
        .filter_map(|o| match &o.value {
            FleetObject::Class(c) => Some((c.metadata.name.clone().unwrap_or_default(), c.spec.clone())),
            _ => None,
        })
        .collect()
}

/// The previews of every deployment the plan leaves with unplaced replicas, in plan order.
pub fn previews(
    objects: &[Located<FleetObject>],
    plan: &Plan,
    cloud: Option<SimCloud>,
) -> anyhow::Result<Vec<ClaimPreview>> {
    let classes = classes(objects);
    let clusters = objects
        .iter()
        .filter_map(|o| match &o.value {
            FleetObject::Cluster(c) => Some((c.metadata.name.clone().unwrap_or_default(), c.spec.clone())),
            _ => None,
        })
        .collect();
    let mut providers: Vec<Arc<dyn CapacityProvider>> = vec![Arc::new(StaticProvider::new(clusters, classes.clone()))];
    if let Some(cloud) = cloud {
        providers.push(Arc::new(SimProvider::new(cloud, Arc::new(SystemClock))));
    }
    let set = ProviderSet::new(providers).map_err(|e| anyhow::anyhow!("--cloud: {e}"))?;
    let engine = SelectorEngine::new();
    let mut out = Vec::new();
    for d in plan.deployments.iter().filter(|d| d.unplaced > 0) {
        let md = objects.iter().find_map(|o| match &o.value {
            FleetObject::Deployment(md)
                if md.metadata.name.as_deref() == Some(d.name.as_str())
                    && md.metadata.namespace.as_deref().unwrap_or("default") == d.namespace =>
            {
                Some(md)
            }
            _ => None,
        });
        let Some(md) = md else { continue };
        let mut p = ClaimPreview {
            namespace: d.namespace.clone(),
            deployment: d.name.clone(),
            unplaced: d.unplaced,
            outcome: "NoTemplate",
            claim: None,
            tries: Vec::new(),
            message: no_template(d.unplaced),
        };
        let clash = objects.iter().any(|o| {
            matches!(&o.value, FleetObject::Claim(c)
                if c.metadata.name.as_deref() == Some(d.name.as_str())
                    && c.metadata.namespace.as_deref().unwrap_or("default") == d.namespace)
        });
        if flotilla_placement::claim::held_by_quota(d) {
            p.outcome = "QuotaExceeded";
            p.message = format!(
                "no CapacityClaim would be made: a FleetQuota of namespace {} holds these replicas back (see QUOTAS), \
                 and it would refuse them on new capacity too; raise the quota first",
                d.namespace
            );
        } else if clash && md.spec.placement.capacity_claim_template.is_some() {
            p.outcome = "ClaimExists";
            p.message = format!(
                "the files hold a CapacityClaim {}/{} of the deployment's name: the controller leaves a claim it \
                 does not own alone and creates none; rename one of them",
                d.namespace, d.name
            );
        } else if let ClaimDecision::Apply(claim) = decide(md, d, None) {
            let (regions, offerings) = crate::live::block_on(preview::gather(&claim.spec, &set))?
                .map_err(|e| anyhow::anyhow!("listing offerings for {}/{}: {e}", d.namespace, d.name))?;
            match preview::preview(&claim.spec, &classes, &regions, &offerings, &engine) {
                Ok(tries) => {
                    p.outcome = "Claim";
                    p.message = format!("the claim engine would try {} offering(s)", tries.len());
                    p.tries = tries;
                }
                Err(why) => {
                    p.outcome = "NoOffering";
                    p.message = no_offering(&why, md);
                }
            }
            p.claim = Some(summary(&claim));
        }
        out.push(p);
    }
    Ok(out)
}

fn no_template(unplaced: u32) -> String {
    format!(
        "no CapacityClaim would be made for the {unplaced} unplaced replica(s): the deployment has no \
         spec.placement.capacityClaimTemplate; add one (e.g. {{capacityTypes: [on-demand], \
         maxProvisioningLatency: 15m}}) to have the controller claim capacity"
    )
}

fn no_offering(why: &NoTry, md: &ModelDeployment) -> String {
    let first = md.spec.devices.alternatives.iter().find_map(|a| a.class.clone()).unwrap_or_else(|| "its class".into());
    match why {
        NoTry::Invalid(message) => format!("the claim would be invalid: {message}"),
        NoTry::NoAllowedRegion(_) | NoTry::NoOffering { .. } => {
            format!("{why}: add a --cloud file or a static pool of {first} in an allowed region")
        }
    }
}

fn summary(claim: &CapacityClaim) -> ClaimSummary {
    ClaimSummary {
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
        pod_sets: claim
            .spec
            .pod_sets
            .iter()
            .map(|p| PodSetSummary { name: p.name.clone(), count: p.count, devices_per_pod: p.devices_per_pod })
            .collect(),
        capacity_types: claim.spec.capacity.capacity_types.clone(),
        device_classes: claim
            .spec
            .capacity
            .device_classes
            .iter()
            .enumerate()
            .map(|(i, c)| c.class.clone().unwrap_or_else(|| format!("alternative-{}", i + 1)))
            .collect(),
    }
}

/// The CLAIMS section under the plan table (empty when no deployment is short).
pub fn render(previews: &[ClaimPreview]) -> String {
    if previews.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nCLAIMS (offline preview of what the controller would ask providers for)\n");
    for p in previews {
        let id = format!("{}/{}", p.namespace, p.deployment);
        let Some(claim) = &p.claim else {
            let _ = writeln!(out, "{id}: {}", p.message);
            continue;
        };
        let sets: Vec<String> = claim
            .pod_sets
            .iter()
            .map(|s| format!("{} {} pod(s) × {} device(s)", s.name, s.count, s.devices_per_pod))
            .collect();
        let _ = writeln!(
            out,
            "{id}: would create CapacityClaim {}/{} with {} pod set(s): {}",
            claim.namespace,
            claim.name,
            claim.pod_sets.len(),
            sets.join(", ")
        );
        if p.tries.is_empty() {
            let _ = writeln!(out, "  {}", p.message);
            continue;
        }
        for set in &claim.pod_sets {
            let of_set: Vec<&Try> = p.tries.iter().filter(|t| t.pod_set == set.name).collect();
            let Some(first) = of_set.first() else { continue };
            let label = if claim.pod_sets.len() > 1 { format!(" for {}", set.name) } else { String::new() };
            let free = first.available_nodes.map(|n| format!(" ({n} free)")).unwrap_or_default();
            let rest = match of_set.len() - 1 {
                0 => "nothing else to try".to_string(),
                n => format!("then {n} more offering(s)"),
            };
            let _ = writeln!(
                out,
                "  first try{label}: {} {} {} in {}/{} ({}, joins {}), {} node(s){free} at ${}/node-h; {rest}",
                first.capacity_type,
                first.class,
                first.instance_type,
                first.region,
                first.zone,
                first.provider,
                first.cluster,
                first.nodes,
                first.price_micros.map_or_else(|| "?".to_string(), format_price_micros),
            );
        }
    }
    out
}
