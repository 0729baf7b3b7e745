//! InferenceClass status. A class is `Ready` when its device can be handed to device selectors:
//! capacities within what a Kubernetes `resource.Quantity` holds, attributes within DRA's
//! bounds. Otherwise `Ready`=False `InvalidSpec` naming the field — the solver already refuses
//! the device of such a class, so no replica lands on its pools and every deployment that
//! wanted it says so; this is where the user sees what to fix. Observe (the class) → decide
//! (`status`, pure) → apply (a status patch, only when it changes).

use std::sync::Arc;
use std::time::Duration;

use flotilla_apis::InferenceClass;
use flotilla_apis::cel::{SelectorEngine, SelectorError};
use flotilla_apis::class::InferenceClassStatus;
use flotilla_apis::conditions::{Desired, Status, merge, would_change};
use flotilla_apis::constants::{condition, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PatchParams;
use kube::runtime::controller::{Action, Controller};
use kube::{Api, Client, ResourceExt};

use crate::Error;

/// The class's `Ready` condition: what the selector engine makes of its device.
pub fn ready(class: &InferenceClass, engine: &SelectorEngine) -> Desired {
    match engine.device(&class.spec.device) {
        Ok(_) => Desired::new(
            condition::READY,
            Status::True,
            reason::AS_EXPECTED,
            format!(
                "device {} usable by selectors, {} per node",
                class.spec.device.driver, class.spec.devices_per_node
            ),
        ),
        Err(SelectorError::Quantity { field, message } | SelectorError::DeviceBounds { field, message }) => {
            Desired::new(
                condition::READY,
                Status::False,
                reason::INVALID_SPEC,
                format!("{field}: {message}; no replica is placed on pools of this class until it is fixed"),
            )
        }
        Err(e) => Desired::new(
            condition::READY,
            Status::False,
            reason::INVALID_SPEC,
            format!("spec.device: the device cannot be described to selectors: {e}"),
        ),
    }
}

/// The status to write, or `None` when the current one already says it.
pub fn status(class: &InferenceClass, engine: &SelectorEngine, now: &Time) -> Option<InferenceClassStatus> {
    let current = class.status.clone().unwrap_or_default();
    let generation = class.metadata.generation;
    let desired = [ready(class, engine)];
    if current.observed_generation == generation && !would_change(&current.conditions.0, &desired, generation) {
        return None;
    }
    let conditions = merge(&current.conditions.0, &desired, generation, now);
    Some(InferenceClassStatus {
        observed_generation: generation,
        conditions: flotilla_apis::common::Conditions(conditions),
        ..current
    })
}

async fn reconcile(class: Arc<InferenceClass>, client: Arc<Client>) -> Result<Action, Error> {
    let engine = SelectorEngine::new();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    if let Some(next) = status(&class, &engine, &now) {
        let api = Api::<InferenceClass>::all((*client).clone());
        crate::status_patch::write_status(
            &api,
            &class.name_any(),
            class.status.as_ref(),
            class.resource_version(),
            &next,
            &PatchParams::default(),
        )
        .await?;
    }
    Ok(Action::await_change())
}

/// Runs the InferenceClass status controller (on the kind's one watch, `crate::watched`) until
/// its shutdown signal.
pub async fn run(controller: Controller<InferenceClass>, client: Client) {
    crate::runner::run(
        controller,
        crate::runner::Kind { name: "InferenceClass", metric: None, cap: Duration::from_secs(10) },
        None,
        reconcile,
        Arc::new(client),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(memory: &str) -> InferenceClass {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass",
            "metadata": {"name": "h100", "generation": 3},
            "spec": {"device": {"driver": "gpu.nvidia.com", "capacity": {"memory": memory}}, "devicesPerNode": 8}}))
        .unwrap()
    }

    #[test]
    fn a_class_whose_capacity_overflows_a_quantity_is_invalid_naming_the_field() {
        let engine = SelectorEngine::new();
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let s = status(&class("1e400"), &engine, &now).unwrap();
        let c = s.conditions.get(condition::READY).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason::INVALID_SPEC));
        assert!(c.message.contains("spec.device.capacity.memory"), "{}", c.message);
        assert_eq!(s.observed_generation, Some(3));
        // Twin: a capacity a Quantity holds is Ready.
        let s = status(&class("80Gi"), &engine, &now).unwrap();
        assert!(s.conditions.is_true(condition::READY));
    }

    #[test]
    fn a_class_whose_status_already_says_it_is_not_written_again() {
        let engine = SelectorEngine::new();
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let mut c = class("80Gi");
        c.status = status(&c, &engine, &now);
        assert!(status(&c, &engine, &now).is_none(), "a quiet class makes no write");
        c.metadata.generation = Some(4);
        assert!(status(&c, &engine, &now).is_some(), "a new generation is acknowledged");
    }
}
