//! A ModelDeployment in a namespace tenants may not use (`crate::tenancy`): its status says so,
//! `Placed=False` and `Ready=False` with `InvalidSpec`, and nothing is solved, claimed or written
//! to any member. The status is written only when it changes.

use flotilla_apis::conditions::merge;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::{DeploymentContext, ModelDeployment, write_status};
use crate::Error;
use crate::tenancy::{DEPLOYMENT_REFUSED, refused};

/// Writes the refusal (when it is not there yet) and waits for a change.
pub(super) async fn refuse(ctx: &DeploymentContext, md: &ModelDeployment, why: &str) -> Result<Action, Error> {
    let current = md.status.clone().unwrap_or_default();
    let mut next = current.clone();
    next.observed_generation = md.metadata.generation;
    next.conditions.0 = merge(
        &current.conditions.0,
        &refused(&DEPLOYMENT_REFUSED, why),
        md.metadata.generation,
        &Time(Timestamp::now()),
    );
    if write_status(ctx, md, md.status.as_ref(), md.resource_version(), &next).await?.is_some() {
        tracing::warn!(deployment = %format!("{}/{}", md.namespace().unwrap_or_default(), md.name_any()), "refused: {why}");
    }
    Ok(Action::await_change())
}
