//! FleetQuota status. The solver enforces every quota in the fleet plan (`placement/src/quota.rs`);
//! here each quota's status says what the plan uses of it: per device limit the devices held,
//! the namespace's cost per hour, the replicas the quota leaves unplaced, `Ready` (the spec is
//! usable: its classes exist, no limit counted twice) and `Exhausted` (a limit binds). Written
//! after every fleet solve (`deployment::trigger`), only when it changes. Observe (the quota and
//! the plan's usage) → decide ([`status`], pure) → apply (a status patch).

use std::collections::BTreeSet;

use flotilla_apis::FleetQuota;
use flotilla_apis::common::format_price_micros;
use flotilla_apis::conditions::{Desired, Status, merge, would_change};
use flotilla_apis::constants::{condition, reason};
use flotilla_apis::quota::{DeviceUsage, FleetQuotaStatus};
use flotilla_placement::{Plan, QuotaUsage};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PatchParams;
use kube::{Api, Client, ResourceExt};

/// `Ready`: whether the spec is usable.
fn ready(q: &FleetQuota, classes: &BTreeSet<String>) -> Desired {
    let unknown = q.spec.devices.iter().enumerate().find_map(|(i, l)| {
        let c = l.class.as_deref().filter(|c| !classes.contains(*c))?;
        Some(format!("spec.devices[{i}].class: no InferenceClass {c:?}; the limit counts nothing until one exists"))
    });
    let twice = || {
        q.spec.counted_twice().next().map(|(i, j)| {
            format!("spec.devices[{i}]: limits the same {} as spec.devices[{j}]; keep one", q.spec.devices[i].subject())
        })
    };
    match unknown.or_else(twice) {
        Some(message) => Desired::new(condition::READY, Status::False, reason::INVALID_SPEC, message),
        None => Desired::new(condition::READY, Status::True, reason::AS_EXPECTED, "enforced in every fleet plan"),
    }
}

/// `Exhausted`: whether a limit binds.
fn exhausted(usage: &QuotaUsage) -> Desired {
    if usage.unplaced > 0 {
        return Desired::new(
            condition::EXHAUSTED,
            Status::True,
            reason::QUOTA_EXCEEDED,
            format!(
                "{} replica(s) of namespace {} unplaced because of this quota ({}); their ModelDeployments say \
                 QuotaExceeded",
                usage.unplaced,
                usage.namespace,
                usage.summary()
            ),
        );
    }
    if let Some(l) = usage.limits.iter().find(|l| l.used >= l.max) {
        return Desired::new(
            condition::EXHAUSTED,
            Status::True,
            reason::AT_LIMIT,
            format!("{} at its limit ({}); the next replica it counts is refused", l.subject, usage.summary()),
        );
    }
    Desired::new(condition::EXHAUSTED, Status::False, reason::AS_EXPECTED, format!("room left: {}", usage.summary()))
}

/// The status to write for `q` given its usage in the plan (`None`: the plan has no entry for
/// it yet), or `None` when the current status already says it.
pub fn status(
    q: &FleetQuota,
    usage: Option<&QuotaUsage>,
    classes: &BTreeSet<String>,
    now: &Time,
) -> Option<FleetQuotaStatus> {
    let current = q.status.clone().unwrap_or_default();
    let generation = q.metadata.generation;
    let mut desired = vec![ready(q, classes)];
    let mut next = FleetQuotaStatus { observed_generation: generation, ..current.clone() };
    if let Some(u) = usage {
        desired.push(exhausted(u));
        next.devices = q
            .spec
            .devices
            .iter()
            .enumerate()
            .map(|(i, l)| DeviceUsage {
                class: l.class.clone(),
                capacity_type: l.capacity_type,
                used: u
                    .limits
                    .iter()
                    .find(|x| x.device == Some(i))
                    .map_or(0, |x| x.used.min(u64::from(u32::MAX)) as u32),
                max: l.max,
            })
            .collect();
        let cost = u.limits.iter().find(|x| x.device.is_none()).map(|x| x.used).unwrap_or_else(|| 0);
        next.cost_per_hour = q.spec.max_cost_per_hour.as_ref().map(|_| format_price_micros(cost));
        let summary: Vec<String> = next
            .devices
            .iter()
            .map(|d| {
                let what = [d.class.as_deref(), d.capacity_type.map(|t| t.as_str())].into_iter().flatten();
                let what: Vec<&str> = what.collect();
                let what = if what.is_empty() { "all".to_string() } else { what.join(" ") };
                format!("{what} {}/{}", d.used, d.max)
            })
            .collect();
        next.summary = (!summary.is_empty()).then(|| summary.join(", "));
        next.unplaced_replicas = Some(u.unplaced);
    }
    let same_fields = (&next.devices, &next.cost_per_hour, &next.summary, next.unplaced_replicas)
        == (&current.devices, &current.cost_per_hour, &current.summary, current.unplaced_replicas);
    if current.observed_generation == generation
        && same_fields
        && !would_change(&current.conditions.0, &desired, generation)
    {
        return None;
    }
    next.conditions = flotilla_apis::common::Conditions(merge(&current.conditions.0, &desired, generation, now));
    Some(next)
}

/// How long one quota's status write may take before it is given up (tried after the next
/// solve): the fleet trigger waits for these writes before it wakes deployments.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Quota status writes in flight at once.
const WRITES_AT_ONCE: usize = 8;

/// Writes the status of every quota in `quotas` that `plan` changes, a few at a time, each
/// bounded by [`WRITE_TIMEOUT`]; a failed or slow write is logged and tried again after the
/// next solve (the plan is the same, so is the status).
pub async fn write_all(
    client: &Client,
    quotas: &[std::sync::Arc<FleetQuota>],
    classes: &BTreeSet<String>,
    plan: &Plan,
) {
    use futures_util::StreamExt;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut writes = Vec::new();
    for q in quotas.iter().filter(|q| q.metadata.deletion_timestamp.is_none()) {
        let (ns, name) = (q.namespace().unwrap_or_default(), q.name_any());
        let usage = plan.quotas.iter().find(|u| u.namespace == ns && u.name == name);
        let Some(next) = status(q, usage, classes, &now) else { continue };
        let (api, q) = (Api::<FleetQuota>::namespaced(client.clone(), &ns), q.clone());
        writes.push(async move {
            let params = PatchParams::default();
            let write =
                crate::status_patch::write_status(&api, &name, q.status.as_ref(), q.resource_version(), &next, &params);
            let why = match tokio::time::timeout(WRITE_TIMEOUT, write).await {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {} s", WRITE_TIMEOUT.as_secs()),
            };
            tracing::warn!(quota = %format!("{ns}/{name}"), "FleetQuota status not written ({why}); written after the next solve");
        });
    }
    futures_util::stream::iter(writes).buffer_unordered(WRITES_AT_ONCE).collect::<Vec<()>>().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_placement::LimitUsage;

    fn quota(spec: serde_json::Value) -> FleetQuota {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "FleetQuota",
            "metadata": {"name": "gpus", "namespace": "search", "generation": 2}, "spec": spec}))
        .unwrap()
    }

    fn usage(used: u64, unplaced: u32) -> QuotaUsage {
        QuotaUsage {
            namespace: "search".into(),
            name: "gpus".into(),
            limits: vec![LimitUsage { device: Some(0), subject: "h100 devices".into(), used, max: 8 }],
            unplaced,
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn usage_against_the_limits_and_which_reason_binds() {
        let classes: BTreeSet<String> = ["h100".to_string()].into();
        let q = quota(serde_json::json!({"devices": [{"class": "h100", "max": 8}]}));
        let s = status(&q, Some(&usage(8, 1)), &classes, &now()).unwrap();
        assert_eq!((s.devices[0].used, s.devices[0].max, s.unplaced_replicas), (8, 8, Some(1)));
        assert_eq!(s.summary.as_deref(), Some("h100 8/8"));
        let c = s.conditions.get(condition::EXHAUSTED).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", reason::QUOTA_EXCEEDED));
        assert!(c.message.starts_with("1 replica(s) of namespace search unplaced"), "{}", c.message);
        assert!(s.conditions.is_true(condition::READY));
        assert_eq!(s.observed_generation, Some(2));
        let at = status(&q, Some(&usage(8, 0)), &classes, &now()).unwrap();
        assert_eq!(at.conditions.get(condition::EXHAUSTED).unwrap().reason, reason::AT_LIMIT);
        let room = status(&q, Some(&usage(4, 0)), &classes, &now()).unwrap();
        assert_eq!(room.conditions.get(condition::EXHAUSTED).unwrap().status, "False");
    }

    #[test]
    fn an_unknown_class_is_invalid_naming_the_field_and_a_quiet_quota_is_not_written_again() {
        let q = quota(serde_json::json!({"devices": [{"class": "h100", "max": 8}]}));
        let s = status(&q, Some(&usage(0, 0)), &BTreeSet::new(), &now()).unwrap();
        let c = s.conditions.get(condition::READY).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason::INVALID_SPEC));
        assert!(c.message.starts_with("spec.devices[0].class: no InferenceClass \"h100\""), "{}", c.message);
        let mut q = q;
        q.status = Some(s);
        assert!(status(&q, Some(&usage(0, 0)), &BTreeSet::new(), &now()).is_none(), "nothing changed: no write");
        assert!(status(&q, Some(&usage(4, 0)), &BTreeSet::new(), &now()).is_some(), "usage moved: written");
    }
}
