//! Deleting an InferenceCluster. Its finalizer (`flotilla.dev/cluster-cleanup`) applies
//! `spec.deletionPolicy`: `Orphan` leaves Flotilla's workloads running in the member; `Cleanup`
//! (the default) deletes, first, every object this installation wrote to the member through
//! this InferenceCluster (`crate::sweep` with no owner left, limited to the labels
//! `flotilla.dev/install` and `flotilla.dev/cluster`): a second InferenceCluster pointing at
//! the same member, or another installation, keeps its own. Passes repeat until the member
//! holds none of them (objects being deleted included), not one pass of at most
//! `sweep::MAX_DELETES`. Decide ([`plan`], [`after_cleanup`], pure): a member Flotilla never
//! reached (no heartbeat ever) holds nothing of its; while objects are left the
//! InferenceCluster keeps its finalizer — `Ready=False` `CleaningUp` counting them; an
//! unreachable member holds it — `CleanupBlocked` — until it answers, the user lets go
//! (`deletionPolicy: Orphan` or the annotation `flotilla.dev/orphan-on-unreachable=true`), or
//! [`CLEANUP_TIMEOUT`] has passed since deletion began; then the rest is orphaned.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_apis::InferenceCluster;
use flotilla_apis::cluster::DeletionPolicy;
use flotilla_apis::conditions::{Desired, Status, merge};
use flotilla_apis::constants::{annotations, condition, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::PatchParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};

use crate::deployment::cleanup::orphan_annotated;
use crate::member::Handle;
use crate::sweep::{self, Owners, Scope};
use crate::{Context, Error};

/// How long a `Cleanup` deletion waits (for an unreachable member, or for the member's
/// objects to go) before orphaning what is left.
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(600);

/// What deletion does first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Remove the finalizer without touching the member, for the reason given.
    Release(&'static str),
    /// Remove Flotilla's objects from the member, then decide with [`after_cleanup`].
    Clean,
}

/// From the policy, the orphan annotation, and whether the member ever answered.
pub fn plan(policy: Option<DeletionPolicy>, orphan_annotated: bool, ever_reached: bool) -> Plan {
    match (policy.unwrap_or_default(), orphan_annotated, ever_reached) {
        (DeletionPolicy::Orphan, _, _) => Plan::Release("deletionPolicy Orphan: workloads left in the member"),
        (_, true, _) => Plan::Release("annotated orphan-on-unreachable: workloads left in the member"),
        (_, _, false) => Plan::Release("the member was never reached: Flotilla wrote nothing there"),
        (DeletionPolicy::Cleanup, false, true) => Plan::Clean,
    }
}

/// After a cleanup attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum After {
    /// Done: remove the finalizer.
    Release,
    /// Gave up after [`CLEANUP_TIMEOUT`]: remove the finalizer, workloads orphaned.
    Orphan(String),
    /// Keep the finalizer; the condition says why and what to do.
    Wait(Desired),
}

/// From the attempt's result (how many of the cluster's objects the member still holds, or
/// why it could not be cleaned) and how long the deletion has been going on.
pub fn after_cleanup(result: Result<usize, String>, waited: Duration) -> After {
    match result {
        Ok(0) => After::Release,
        Ok(left) if waited >= CLEANUP_TIMEOUT => {
            After::Orphan(format!("{left} object(s) still in the member after {} min", CLEANUP_TIMEOUT.as_secs() / 60))
        }
        Ok(left) => After::Wait(Desired::new(
            condition::READY,
            Status::False,
            reason::CLEANING_UP,
            format!(
                "deletion (deletionPolicy Cleanup) removes the objects Flotilla wrote to the member through this \
                 cluster: {left} left; the finalizer stays until none is, or until {} min have passed (then the rest \
                 is orphaned)",
                CLEANUP_TIMEOUT.as_secs() / 60
            ),
        )),
        Err(e) if waited >= CLEANUP_TIMEOUT => After::Orphan(e),
        Err(e) => After::Wait(Desired::new(
            condition::READY,
            Status::False,
            reason::CLEANUP_BLOCKED,
            format!(
                "deletion (deletionPolicy Cleanup) waits to remove Flotilla's workloads from the member, which cannot \
                 be reached: {e}; they are orphaned after {} min, or now with spec.deletionPolicy: Orphan or the \
                 annotation {}=true",
                CLEANUP_TIMEOUT.as_secs() / 60,
                annotations::ORPHAN_ON_UNREACHABLE
            ),
        )),
    }
}

/// Passes over the member until it holds none of the cluster's objects, or `budget` has
/// passed: how many are left.
async fn clean(
    member: &Handle,
    scope: &Scope<'_>,
    t: crate::member::Timeouts,
    budget: Duration,
) -> Result<usize, String> {
    let until = Instant::now() + budget;
    loop {
        let s = sweep::member(member, scope, t).await?;
        tracing::info!(found = s.found, deleted = s.deleted, "InferenceCluster cleanup pass");
        if s.found == 0 {
            return Ok(0);
        }
        if Instant::now() >= until {
            return Ok(s.found - s.deleted);
        }
        if s.deleted == 0 {
            // All that is left is being deleted: look again shortly.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The finalizer's cleanup.
pub async fn cleanup(ic: Arc<InferenceCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = ic.name_any();
    let reached = ic.status.as_ref().is_some_and(|s| s.last_heartbeat.is_some());
    if let Plan::Release(why) = plan(ic.spec.deletion_policy, orphan_annotated(&ic.metadata), reached) {
        tracing::info!(cluster = %name, "InferenceCluster deleted: {why}");
        return Ok(Action::await_change());
    }
    let result = match ctx.members.handle(&ctx.client, &ic, ctx.config.timeouts).await {
        Ok(member) => {
            let namespaces = Owners::from_stores(&ctx.tenants.0, &ctx.tenants.1).namespaces();
            // No owner: every object of this installation written through this cluster goes;
            // look in the tenants' namespaces where the member does not allow a cluster-wide list.
            let t = ctx.config.timeouts;
            let scope = Scope {
                owners: &Owners::default(),
                namespaces: &namespaces,
                install: &ctx.config.install_id,
                grace: Duration::ZERO,
                cluster: Some(&name),
                max_share: None,
                approved: None,
                list_all: true,
            };
            clean(&member, &scope, t, t.observe * 4).await
        }
        Err(e) => Err(e.to_string()),
    };
    let since = ic.metadata.deletion_timestamp.as_ref().map_or(0, |t| Timestamp::now().as_second() - t.0.as_second());
    match after_cleanup(result, Duration::from_secs(since.max(0) as u64)) {
        After::Release => {
            tracing::info!(cluster = %name, "InferenceCluster deleted: Flotilla's workloads removed from the member");
            Ok(Action::await_change())
        }
        After::Orphan(e) => {
            tracing::warn!(cluster = %name, "InferenceCluster deleted after {} s unreachable ({e}): its workloads are orphaned in the member", since);
            Ok(Action::await_change())
        }
        After::Wait(cond) => {
            let current = ic.status.clone().unwrap_or_default();
            let mut next = current.clone();
            next.conditions.0 = merge(
                &current.conditions.0,
                std::slice::from_ref(&cond),
                ic.metadata.generation,
                &Time(Timestamp::now()),
            );
            let api = Api::<InferenceCluster>::all(ctx.client.clone());
            let pp = PatchParams::apply(&ctx.config.field_manager);
            if crate::status_patch::write_status(&api, &name, Some(&current), ic.resource_version(), &next, &pp)
                .await?
                .is_some()
            {
                ctx.metrics.status_write(crate::metrics::Kind::InferenceCluster);
            }
            Err(Error::Cleanup(cond.message))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_decides_whether_the_member_is_cleaned() {
        assert_eq!(plan(None, false, true), Plan::Clean, "Cleanup is the default");
        assert_eq!(plan(Some(DeletionPolicy::Cleanup), false, true), Plan::Clean);
        assert!(matches!(plan(Some(DeletionPolicy::Orphan), false, true), Plan::Release(_)));
        assert!(matches!(plan(None, true, true), Plan::Release(_)), "the annotation lets go");
        assert!(matches!(plan(None, false, false), Plan::Release(_)), "never reached: nothing to clean");
    }

    #[test]
    fn an_unreachable_member_holds_deletion_only_up_to_the_timeout() {
        assert_eq!(after_cleanup(Ok(0), Duration::ZERO), After::Release);
        let early = after_cleanup(Err("connection failed".into()), Duration::from_secs(30));
        let After::Wait(c) = early else { panic!("{early:?}") };
        assert_eq!((c.type_, c.status, c.reason), (condition::READY, Status::False, reason::CLEANUP_BLOCKED));
        assert!(
            c.message.contains("connection failed") && c.message.contains("deletionPolicy: Orphan"),
            "{}",
            c.message
        );
        assert_eq!(after_cleanup(Err("x".into()), CLEANUP_TIMEOUT), After::Orphan("x".into()));
    }

    #[test]
    fn the_finalizer_stays_while_objects_are_left_up_to_the_timeout() {
        let w = after_cleanup(Ok(250), Duration::from_secs(30));
        let After::Wait(c) = w else { panic!("{w:?}") };
        assert_eq!((c.status, c.reason), (Status::False, reason::CLEANING_UP));
        assert!(c.message.contains("250 left"), "{}", c.message);
        let After::Orphan(why) = after_cleanup(Ok(7), CLEANUP_TIMEOUT) else { panic!() };
        assert!(why.contains("7 object(s)"), "{why}");
    }
}
