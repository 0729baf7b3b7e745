//! Which offerings can serve which device alternative of a claim, and in what order to try
//! them. An alternative naming an InferenceClass matches an offering of one of the class's
//! AWS instance types, of the same class name (sim, static), or with the same device identity
//! (driver, `productName`) and devices per node; selectors are CEL over the offering's device,
//! evaluated with the `apis` selector engine. Offerings are tried cheapest first.

use std::collections::BTreeMap;

use flotilla_apis::cel::{Selector, SelectorEngine};
use flotilla_apis::claim::CapacityClaimSpec;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::common::CapacityType;

use crate::types::Offering;

/// One device-class alternative of a claim, compiled.
#[derive(Debug)]
pub struct Alternative<'a> {
    /// Position in the claim's fallback order (0 = first choice).
    pub rank: usize,
    /// The class name, or `alternative-N` for selector-only alternatives.
    pub label: String,
    /// The named class.
    pub class: Option<&'a InferenceClassSpec>,
    selectors: Vec<Selector>,
}

/// Compiles the claim's alternatives; `Err` names the field that is wrong.
pub fn alternatives<'a>(
    spec: &CapacityClaimSpec,
    classes: &'a BTreeMap<String, InferenceClassSpec>,
    engine: &SelectorEngine,
) -> Result<Vec<Alternative<'a>>, String> {
    let mut out = Vec::new();
    for (rank, alt) in spec.capacity.device_classes.iter().enumerate() {
        let field = format!("spec.capacity.deviceClasses[{rank}]");
        let class = match &alt.class {
            Some(name) => Some(classes.get(name).ok_or_else(|| {
                format!("{field}.class: InferenceClass {name} does not exist; create it or name an existing class")
            })?),
            None => None,
        };
        if class.is_none() && alt.selectors.is_empty() {
            return Err(format!("{field}: name a class, give selectors, or both"));
        }
        let selectors = alt
            .selectors
            .iter()
            .enumerate()
            .map(|(i, s)| engine.compile(&s.0).map_err(|e| format!("{field}.selectors[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let label = alt.class.clone().unwrap_or_else(|| format!("alternative-{}", rank + 1));
        out.push(Alternative { rank, label, class, selectors });
    }
    Ok(out)
}

impl Alternative<'_> {
    /// Whether `offering` provides devices of this alternative.
    pub fn matches(&self, offering: &Offering, engine: &SelectorEngine) -> bool {
        if let Some(class) = self.class {
            let by_type =
                class.provisioning.aws.as_ref().is_some_and(|aws| aws.instance_types.contains(&offering.instance_type));
            let by_name = offering.class.as_deref() == Some(self.label.as_str());
            let by_device = class.device.driver == offering.device.driver
                && class.devices_per_node == offering.devices_per_node
                && class
                    .device
                    .identity_attributes()
                    .iter()
                    .all(|(k, v)| offering.device.attributes.get(*k) == Some(*v));
            if !(by_type || by_name || by_device) {
                return false;
            }
        }
        if self.selectors.is_empty() {
            return true;
        }
        let Ok(device) = engine.device(&offering.device) else {
            return false;
        };
        // A selector that fails to evaluate (missing attribute) is no match, as in DRA.
        self.selectors.iter().all(|s| engine.matches(s, &device).unwrap_or(false))
    }

    /// The class name an allocation from `offering` records.
    pub fn class_for(&self, offering: &Offering) -> String {
        match (self.class, &offering.class) {
            (Some(_), _) => self.label.clone(),
            (None, Some(name)) => name.clone(),
            (None, None) => offering.instance_type.clone(),
        }
    }

    /// The price used to order offerings: the provider's, else the class's.
    pub fn price(&self, offering: &Offering, capacity_type: CapacityType) -> Option<u64> {
        offering.price_micros.or_else(|| self.class.and_then(|c| c.price_per_node_hour.micros(capacity_type)))
    }
}

/// Offerings of `capacity_type` serving `alt`, cheapest first, then by zone and type.
pub fn candidates<'o>(
    offerings: &'o [Offering],
    alt: &Alternative<'_>,
    capacity_type: CapacityType,
    reservation_ids: &[String],
    zone: Option<&str>,
    engine: &SelectorEngine,
) -> Vec<&'o Offering> {
    let mut out: Vec<&Offering> = offerings
        .iter()
        .filter(|o| o.capacity_type == capacity_type)
        .filter(|o| zone.is_none_or(|z| o.zone == z))
        .filter(|o| {
            capacity_type != CapacityType::Reserved
                || reservation_ids.is_empty()
                || o.reservation_id.as_ref().is_some_and(|id| reservation_ids.contains(id))
        })
        .filter(|o| o.available_nodes != Some(0))
        .filter(|o| alt.matches(o, engine))
        .collect();
    out.sort_by(|a, b| {
        let (pa, pb) = (alt.price(a, capacity_type), alt.price(b, capacity_type));
        // Unknown prices last.
        (pa.is_none(), pa, &a.zone, &a.instance_type).cmp(&(pb.is_none(), pb, &b.zone, &b.instance_type))
    });
    out
}
