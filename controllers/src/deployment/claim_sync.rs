//! The CapacityClaim a ModelDeployment owns: created, updated or deleted as
//! `claim::sizing::decide` says, read from the claims reflector (no GET per reconcile). A new
//! claim waits until every member's capacity was observed and the shortfall has lasted
//! [`CLAIM_AFTER`]; a claim of the same name that the deployment does not own is never touched.

use std::time::Duration;

use flotilla_apis::CapacityClaim;
use flotilla_apis::constants::{condition, event};
use flotilla_placement::plan::DeploymentPlan;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

use super::{DeploymentContext, ModelDeployment};
use crate::claim::sizing::ClaimDecision;
use crate::member::brief;

/// Create, update or delete the CapacityClaim the deployment owns (`claim::sizing` decides).
/// Returns the claim's `namespace/name` while one exists. A claim of the same name that the
/// deployment does not own is never touched.
pub(super) async fn sync_claim(ctx: &DeploymentContext, md: &ModelDeployment, dp: &DeploymentPlan) -> Option<String> {
    md.spec.placement.capacity_claim_template.as_ref()?;
    // Without a provider nothing would act on a claim: the deployment keeps saying
    // InsufficientCapacity instead of pointing at a claim nobody handles.
    ctx.config.capacity.as_ref()?;
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let name = md.name_any();
    let who = format!("{ns}/{name}");
    let api: Api<CapacityClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = ctx.claims.get(&ObjectRef::new(&name).within(&ns)).map(|c| c.as_ref().clone());
    if let Some(c) = &existing
        && !c.owner_references().iter().any(|o| Some(&o.uid) == md.metadata.uid.as_ref())
    {
        tracing::warn!(deployment = %who, "a CapacityClaim of the same name exists and is not this deployment's: left alone");
        return None;
    }
    // A new claim only once every member's capacity has been observed: right after a start, a
    // fleet not yet looked at would otherwise look empty and buy capacity it has.
    let observed_all = ctx
        .clusters
        .state()
        .iter()
        .all(|c| c.status.as_ref().is_some_and(|s| s.conditions.get(condition::CAPACITY_KNOWN).is_some()));
    match crate::claim::sizing::decide(md, dp, existing.as_ref()) {
        ClaimDecision::None => existing.map(|_| who),
        ClaimDecision::Apply(_) if existing.is_none() && (!observed_all || !short_for_a_while(md)) => {
            tracing::debug!(deployment = %who, "not claiming capacity yet: members unobserved or the shortfall is new");
            None
        }
        ClaimDecision::Apply(claim) => {
            let pods: i32 = claim.spec.pod_sets.iter().map(|p| p.count).sum();
            match api.patch(&name, &PatchParams::apply(&ctx.config.field_manager).force(), &Patch::Apply(&*claim)).await
            {
                Ok(_) => {
                    tracing::info!(deployment = %who, pods, "CapacityClaim applied for replicas the fleet cannot place");
                    let _ = ctx
                        .recorder
                        .publish(
                            &Event {
                                type_: EventType::Normal,
                                reason: event::CAPACITY_REQUESTED.into(),
                                note: Some(format!("CapacityClaim {who} asks for {pods} pod(s) of capacity")),
                                action: "Claim".into(),
                                secondary: None,
                            },
                            &md.object_ref(&()),
                        )
                        .await;
                    Some(who)
                }
                Err(e) => {
                    tracing::warn!(deployment = %who, error = %brief(&e), "CapacityClaim not applied");
                    existing.map(|_| who)
                }
            }
        }
        ClaimDecision::Delete => {
            if let Err(e) = api.delete(&name, &Default::default()).await {
                tracing::warn!(deployment = %who, error = %brief(&e), "CapacityClaim not deleted");
                return Some(who);
            }
            tracing::info!(deployment = %who, "CapacityClaim deleted: the deployment needs no extra capacity");
            None
        }
    }
}

/// How long replicas must have been unplaced (`Placed=False` in status) before a new claim asks a
/// provider for capacity: a shortfall seen while members are still being observed, or while
/// another deployment is shrinking, must not buy nodes.
pub const CLAIM_AFTER: Duration = Duration::from_secs(15);

fn short_for_a_while(md: &ModelDeployment) -> bool {
    let Some(placed) = md.status.as_ref().and_then(|s| s.conditions.get(condition::PLACED).cloned()) else {
        return false;
    };
    let since = Timestamp::now().duration_since(placed.last_transition_time.0);
    placed.status == "False" && since.as_secs() >= CLAIM_AFTER.as_secs() as i64
}
