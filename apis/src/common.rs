//! Types shared by several kinds: capacity types, prices, device descriptions in the DRA
//! shape, sovereignty, taints and tolerations, secret references, and the condition list.
//! Schema constraints that the API server enforces are declared here, on the types.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Condition};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a node is paid for. Order of preference is given by each policy, never by this enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    /// Capacity reserved ahead (on-demand capacity reservations, capacity blocks).
    Reserved,
    /// Pay-as-you-go capacity.
    OnDemand,
    /// Interruptible spare capacity.
    Spot,
}

impl CapacityType {
    /// Every capacity type, in the order Karpenter prefers them.
    pub const ALL: [CapacityType; 3] = [Self::Reserved, Self::Spot, Self::OnDemand];

    /// The name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::OnDemand => "on-demand",
            Self::Spot => "spot",
        }
    }
}

impl std::fmt::Display for CapacityType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A price in US dollars written as a decimal string (`"98.32"`), so YAML never rounds it.
pub const PRICE_PATTERN: &str = r"^[0-9]{1,9}(\.[0-9]{1,6})?$";

/// Parses a price written to [`PRICE_PATTERN`] into millionths of a dollar. Exact, so that
/// sums and comparisons are deterministic.
pub fn parse_price_micros(text: &str) -> Option<u64> {
    let (whole, frac) = match text.split_once('.') {
        Some((w, f)) => (w, f),
        None => (text, ""),
    };
    if whole.is_empty() || whole.len() > 9 || frac.len() > 6 {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let mut micros: u64 = 0;
    for (i, digit) in frac.bytes().enumerate() {
        micros += u64::from(digit - b'0') * 10u64.pow(5 - i as u32);
    }
    Some(whole * 1_000_000 + micros)
}

/// Formats millionths of a dollar as a price with two decimals (rounded half up).
pub fn format_price_micros(micros: u64) -> String {
    let cents = (micros + 5_000) / 10_000;
    format!("{}.{:02}", cents / 100, cents % 100)
}

/// Hourly price of one node, per capacity type. A type without a price cannot be used.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PricePerCapacityType {
    /// USD per node-hour for reserved capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"))]
    pub reserved: Option<String>,
    /// USD per node-hour on demand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"))]
    pub on_demand: Option<String>,
    /// USD per node-hour on spot (a typical recent price; providers report the live one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"))]
    pub spot: Option<String>,
}

impl PricePerCapacityType {
    /// The price for one capacity type, in millionths of a dollar.
    pub fn micros(&self, capacity_type: CapacityType) -> Option<u64> {
        let text = match capacity_type {
            CapacityType::Reserved => self.reserved.as_deref(),
            CapacityType::OnDemand => self.on_demand.as_deref(),
            CapacityType::Spot => self.spot.as_deref(),
        }?;
        parse_price_micros(text)
    }
}

/// One typed device attribute, as in a DRA `ResourceSlice`: exactly one of the four is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("(has(self.string) ? 1 : 0) + (has(self.int) ? 1 : 0) + (has(self.bool) ? 1 : 0) + (has(self.version) ? 1 : 0) == 1").message("set exactly one of string, int, bool or version"))]
#[serde(rename_all = "camelCase")]
pub struct DeviceAttribute {
    /// A string value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub string: Option<String>,
    /// An integer value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    /// A boolean value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    /// A semantic version (`"9.0.0"`), compared with `semver()` in selectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"))]
    pub version: Option<String>,
}

/// One device as a DRA driver would publish it in a `ResourceSlice`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpec {
    /// The DRA driver name, which is also the domain of unqualified attribute names.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$"))]
    pub driver: String,
    /// Typed attributes (at most 32, as in DRA). Names may be qualified (`domain/name`);
    /// unqualified ones belong to the driver's domain.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 32))]
    pub attributes: BTreeMap<String, DeviceAttribute>,
    /// Capacities such as `memory: 80Gi` (at most 32).
    #[serde(default)]
    #[schemars(extend("maxProperties" = 32))]
    pub capacity: BTreeMap<String, Quantity>,
}

impl DeviceSpec {
    /// The attributes that identify a device of this class on a member: `productName` when the
    /// class declares one (descriptive attributes such as bandwidth are often not published by
    /// drivers), otherwise every attribute.
    pub fn identity_attributes(&self) -> Vec<(&String, &DeviceAttribute)> {
        let product: Vec<_> =
            self.attributes.iter().filter(|(k, _)| k.rsplit('/').next() == Some("productName")).collect();
        if product.is_empty() { self.attributes.iter().collect() } else { product }
    }
}

/// Where a model or its replicas may be, by law or by choice. Applies to placement and to
/// request routing alike, including every fallback and failover.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sovereignty {
    /// Jurisdiction codes (`EU`, `US`, `APAC`, ...). Empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_jurisdictions: Vec<JurisdictionCode>,
    /// Regions (`eu-central-1`). Empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_regions: Vec<String>,
    /// Regions never to use, even when allowed otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_regions: Vec<String>,
}

impl Sovereignty {
    /// Whether a cluster in `jurisdiction` and `region` is allowed.
    pub fn allows(&self, jurisdiction: &str, region: &str) -> bool {
        (self.allowed_jurisdictions.is_empty() || self.allowed_jurisdictions.iter().any(|j| j.0 == jurisdiction))
            && (self.allowed_regions.is_empty() || self.allowed_regions.iter().any(|r| r == region))
            && !self.denied_regions.iter().any(|r| r == region)
    }
}

/// A jurisdiction code: upper-case letters, digits and dashes (`EU`, `US`, `APAC`, `UK`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct JurisdictionCode(
    #[schemars(length(min = 2, max = 16), regex(pattern = r"^[A-Z][A-Z0-9-]*[A-Z0-9]$"))] pub String,
);

impl JurisdictionCode {
    /// The code as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The effect of a taint, as in Kubernetes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TaintEffect {
    /// Nothing new is placed without a toleration.
    NoSchedule,
    /// Placement avoids the cluster when it can.
    PreferNoSchedule,
    /// Nothing runs without a toleration; existing placements move away.
    NoExecute,
}

/// A taint on a member cluster: deployments must tolerate it to be placed there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTaint {
    /// Taint key.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
    /// Taint value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// What the taint does.
    pub effect: TaintEffect,
}

/// How a toleration compares values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TolerationOperator {
    /// Key and value must match.
    #[default]
    Equal,
    /// Only the key must match.
    Exists,
}

/// A toleration of cluster taints, as in Kubernetes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.operator) || self.operator != 'Exists' || !has(self.value)").message("value must be empty when operator is Exists"))]
#[serde(rename_all = "camelCase")]
pub struct ClusterToleration {
    /// Taint key to tolerate; empty with `Exists` tolerates every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub key: Option<String>,
    /// `Equal` (default) or `Exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<TolerationOperator>,
    /// Value to match with `Equal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub value: Option<String>,
    /// Effect to tolerate; empty tolerates every effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,
}

impl ClusterToleration {
    /// Whether this toleration covers the taint.
    pub fn tolerates(&self, taint: &ClusterTaint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        match (self.operator.unwrap_or_default(), self.key.as_deref()) {
            (TolerationOperator::Exists, None) => true,
            (TolerationOperator::Exists, Some(k)) => k == taint.key,
            (TolerationOperator::Equal, Some(k)) => {
                k == taint.key && self.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
            }
            (TolerationOperator::Equal, None) => false,
        }
    }
}

/// A reference to a Secret in the control cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Namespace of the Secret (for cluster-scoped kinds; namespaced kinds use their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside the Secret; each kind documents its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// `metav1.Condition` list as every Flotilla status carries it: a list-map keyed on `type`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
#[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
pub struct Conditions(pub Vec<Condition>);

impl Conditions {
    /// The condition of a type, if present.
    pub fn get(&self, type_: &str) -> Option<&Condition> {
        self.0.iter().find(|c| c.type_ == type_)
    }

    /// Whether the condition of a type is present with status `True`.
    pub fn is_true(&self, type_: &str) -> bool {
        self.get(type_).is_some_and(|c| c.status == "True")
    }
}

/// A duration as Go writes it (`90s`, `15m`, `1h30m`).
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// For `skip_serializing_if`: a count that is zero is left out of status.
pub fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}
