//! The autoscaler's writes. On the elected replica, every `--autoscale-interval-ms`, each
//! ModelDeployment with `spec.autoscaling` gets a decision from `recommend` over the demand
//! its engines report; a new count goes through the scale subresource (as an HPA writes it,
//! conditional on the resourceVersion), with an event; `status.autoscaling` is merge-patched
//! when it changes (numbers alone at most once per `--feedback-interval-ms`). On every replica,
//! the activation writer takes a model whose request is held and raises its deployment's
//! scale from 0 to 1, conditionally, so replicas asking at once make one change.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_apis::autoscaling::{Autoscaling, AutoscalingReason, AutoscalingStatus, Demand};
use flotilla_apis::deployment::ModelDeployment;
use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{mpsc, watch};

use crate::AppState;
use crate::autoscale::recommend::{Decision, Input, Memory, recommend};
use crate::config::ms;
use crate::feed::FIELD_MANAGER;
use crate::metrics::WriteResult;
use crate::table::RoutingTable;

/// What the elected replica remembers of one deployment between decisions.
#[derive(Debug, Default)]
struct Tracked {
    memory: Memory,
    /// `spec.replicas` at the last decision.
    seen: Option<i32>,
    /// The count this replica wrote last.
    wrote: Option<i32>,
    /// When the count last left zero, until a Ready route appears.
    activated_at: Option<Instant>,
    status_at: Option<Instant>,
    last_scale: Option<Time>,
    cold_ms: Option<i64>,
}

/// Whether to write `next` over `current`: not when equal; when only the demand figures and
/// the message moved, at most once per `interval` (`since`: time since this replica's last write).
pub fn should_write(
    current: Option<&AutoscalingStatus>,
    next: &AutoscalingStatus,
    since: Option<Duration>,
    interval: Duration,
) -> bool {
    let Some(c) = current else { return true };
    if c == next {
        return false;
    }
    let same = c.recommendation == next.recommendation
        && c.reason == next.reason
        && c.last_scale_time == next.last_scale_time
        && c.last_cold_start_millis == next.last_cold_start_millis;
    !same || since.is_none_or(|s| s >= interval)
}

fn recorder(client: &Client, st: &AppState) -> Recorder {
    Recorder::new(client.clone(), Reporter { controller: FIELD_MANAGER.into(), instance: st.cfg.identity.clone() })
}

async fn event(rec: &Recorder, d: &ModelDeployment, reason: AutoscalingReason, note: String) {
    let ev = Event {
        type_: EventType::Normal,
        reason: reason.as_str().into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Scale".into(),
        secondary: None,
    };
    if let Err(e) = rec.publish(&ev, &d.object_ref(&())).await {
        tracing::debug!(deployment = %d.name_any(), error = %e, "event not recorded");
    }
}

/// Writes `replicas` through the scale subresource, conditional on `d`'s resourceVersion.
async fn write_scale(client: &Client, d: &ModelDeployment, replicas: i32) -> Result<(), kube::Error> {
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &d.namespace().unwrap_or_default());
    let mut scale = Scale::default();
    scale.metadata.name = Some(d.name_any());
    scale.metadata.namespace = d.namespace();
    scale.metadata.resource_version = d.resource_version();
    scale.spec = Some(ScaleSpec { replicas: Some(replicas) });
    let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    api.replace_scale(&d.name_any(), &pp, &scale).await.map(|_| ())
}

fn result(e: &kube::Error) -> WriteResult {
    match e {
        kube::Error::Api(s) if s.code == 409 => WriteResult::conflict,
        _ => WriteResult::error,
    }
}

/// Decide and write for every autoscaled deployment while this replica holds the lease.
pub async fn run(
    st: Arc<AppState>,
    client: Client,
    deployments: Store<ModelDeployment>,
    mut leader: watch::Receiver<bool>,
) {
    if st.cfg.autoscale_interval_ms == 0 {
        return;
    }
    let rec = recorder(&client, &st);
    let base = Instant::now();
    let mut tracked: HashMap<(String, String), Tracked> = HashMap::new();
    let mut tick = tokio::time::interval(ms(st.cfg.autoscale_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = leader.changed() => if r.is_err() { return },
        }
        if !*leader.borrow() || !st.feed.synced() || st.feed.stale() {
            // A replica that leads again starts afresh (and never scales to zero at once).
            tracked.clear();
            continue;
        }
        let table = st.table.load_full();
        let mut live = Vec::new();
        for d in deployments.state() {
            let Some(spec) = d.spec.autoscaling.as_ref() else { continue };
            if d.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let key = (d.namespace().unwrap_or_default(), d.name_any());
            let t = tracked.entry(key.clone()).or_default();
            step(&st, &client, &rec, &d, spec, t, &table, base).await;
            live.push(key);
        }
        tracked.retain(|k, _| live.contains(k));
    }
}

#[allow(clippy::too_many_arguments)]
async fn step(
    st: &AppState,
    client: &Client,
    rec: &Recorder,
    d: &ModelDeployment,
    spec: &Autoscaling,
    t: &mut Tracked,
    table: &RoutingTable,
    base: Instant,
) {
    let (ns, name) = (d.namespace().unwrap_or_default(), d.name_any());
    let Some(model) = st.feed.owner(&ns, &name) else { return };
    let now = Instant::now();
    let current = d.spec.replicas;
    let ready = d.status.as_ref().map_or(0, |s| s.ready_replicas);
    let routed = table.resolve(&model).is_some_and(|m| m.routes.iter().any(|r| r.ready));
    let by_other = t.seen.is_some_and(|s| s != current) && t.wrote != Some(current);
    if t.seen == Some(0) && current > 0 {
        // Raised from zero: by this replica's activation writer (its time is known), or by
        // another replica or a person (then first seen now, up to an interval late).
        t.activated_at = Some(st.autoscale.activation.take_activated(&model).unwrap_or(now));
    }
    if let Some(at) = t.activated_at
        && routed
    {
        let took = now.duration_since(at);
        t.cold_ms = Some(took.as_millis().min(i64::MAX as u128) as i64);
        t.activated_at = None;
        tracing::info!(deployment = %format!("{ns}/{name}"), cold_start_ms = ?t.cold_ms, "first Ready replica after a start from zero");
    }
    t.seen = Some(current);
    // An adapter runs on its model's replicas: it is not another model on the cluster.
    let serves_only = |cluster: &str| {
        table.models().filter(|m| m.parent.is_none() && m.routes.iter().any(|r| r.cluster.name == cluster)).count() <= 1
    };
    let fresh = Duration::from_millis(st.cfg.scrape_interval_ms.saturating_mul(3).max(2000));
    let signal = st.autoscale.demand.signal(&demand_names(table, &model), fresh, now, serves_only);
    let input = Input {
        spec,
        current,
        signal: signal.map(|s| s.0),
        busy: ready < current || by_other,
        now: now.duration_since(base).as_millis() as u64,
    };
    let (mut decision, memory) = recommend(&input, &t.memory);
    t.memory = memory;
    if t.activated_at.is_some() && decision.replicas == current && current > 0 {
        decision = Decision {
            reason: AutoscalingReason::Activated,
            message: format!("started from zero; waiting for a Ready replica ({} of {current} Ready)", ready),
            ..decision
        };
    }
    if decision.replicas != current {
        match write_scale(client, d, decision.replicas).await {
            Ok(()) => {
                st.metrics.autoscale.scale_write(WriteResult::ok);
                tracing::info!(deployment = %format!("{ns}/{name}"), from = current, to = decision.replicas, reason = decision.reason.as_str(), message = %decision.message, "replicas scaled");
                event(
                    rec,
                    d,
                    decision.reason,
                    format!("replicas {current} → {}: {}", decision.replicas, decision.message),
                )
                .await;
                if current == 0 {
                    t.activated_at = Some(now);
                }
                (t.wrote, t.seen) = (Some(decision.replicas), Some(decision.replicas));
                t.last_scale = Some(Time(k8s_openapi::jiff::Timestamp::now()));
            }
            Err(e) => {
                st.metrics.autoscale.scale_write(result(&e));
                tracing::warn!(deployment = %format!("{ns}/{name}"), error = %e, "replica count not written; deciding again next interval");
                return;
            }
        }
    }
    let previous = d.status.as_ref().and_then(|s| s.autoscaling.as_ref());
    let next = AutoscalingStatus {
        demand: signal.map(|(s, clusters)| Demand {
            queued: s.queued.round() as i64,
            running: s.running.round() as i64,
            kv_cache_percent: s.kv_cache.map(|k| (k * 100.0).round() as i32),
            clusters,
        }),
        recommendation: decision.replicas,
        reason: Some(decision.reason),
        message: decision.message,
        last_scale_time: t.last_scale.clone().or_else(|| previous.and_then(|p| p.last_scale_time.clone())),
        last_cold_start_millis: t.cold_ms.or_else(|| previous.and_then(|p| p.last_cold_start_millis)),
    };
    let since = t.status_at.map(|at| now.duration_since(at));
    if !should_write(previous, &next, since, ms(st.cfg.feedback_interval_ms)) {
        return;
    }
    let Ok(mut value) = serde_json::to_value(&next) else { return };
    // A merge patch keeps what it does not name: name what went away, with null.
    for field in ["demand", "lastScaleTime", "lastColdStartMillis"] {
        if let Some(obj) = value.as_object_mut() {
            obj.entry(field).or_insert(serde_json::Value::Null);
        }
    }
    let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
    let pp = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() };
    let patch = serde_json::json!({"status": {"autoscaling": value}});
    match api.patch_status(&name, &pp, &Patch::Merge(&patch)).await {
        Ok(_) => {
            st.metrics.status_write(WriteResult::ok);
            t.status_at = Some(now);
        }
        Err(e) => {
            st.metrics.status_write(result(&e));
            tracing::warn!(deployment = %format!("{ns}/{name}"), error = %e, "status.autoscaling not written; retrying");
        }
    }
}

/// The names whose demand is `model`'s: the model, then its LoRA adapters (their requests run
/// on its replicas).
pub fn demand_names<'t>(table: &'t RoutingTable, model: &'t str) -> Vec<&'t str> {
    let adapters = table.models().filter(|m| m.parent.as_deref() == Some(model)).map(|m| m.name.as_str());
    std::iter::once(model).chain(adapters).collect()
}

/// The deployment to raise for a request held for `name` (a model, or a LoRA adapter: then the
/// oldest deployment of its parent that declares it, the one the table routes it to) and the
/// model name the leader's decisions know it by. `owner` gives the model a deployment serves.
pub fn activation_target<'d>(
    table: &RoutingTable,
    name: &str,
    deployments: &'d [Arc<ModelDeployment>],
    owner: impl Fn(&ModelDeployment) -> Option<String>,
) -> Option<(&'d Arc<ModelDeployment>, String)> {
    let parent = table.resolve(name).and_then(|m| m.parent.clone());
    let model = parent.clone().unwrap_or_else(|| name.to_string());
    let serves = |d: &ModelDeployment| {
        owner(d).as_deref() == Some(model.as_str())
            && (parent.is_none() || d.spec.adapters.iter().any(|a| a.name == name))
    };
    let oldest =
        |d: &&Arc<ModelDeployment>| (d.metadata.creation_timestamp.as_ref().map(|t| t.0), d.namespace(), d.name_any());
    deployments.iter().filter(|d| serves(d)).min_by_key(oldest).map(|d| (d, model))
}

/// On every replica: raise the deployment of each model whose request is held from 0 to 1.
pub async fn activations(
    st: Arc<AppState>,
    client: Client,
    deployments: Store<ModelDeployment>,
    mut asked: mpsc::UnboundedReceiver<String>,
) {
    let rec = recorder(&client, &st);
    let mut last: HashMap<String, Instant> = HashMap::new();
    while let Some(model) = asked.recv().await {
        if last.get(&model).is_some_and(|at| at.elapsed() < Duration::from_secs(2)) {
            continue;
        }
        last.insert(model.clone(), Instant::now());
        let all = deployments.state();
        let owner = |d: &ModelDeployment| st.feed.owner(&d.namespace().unwrap_or_default(), &d.name_any());
        let Some((d, base)) = activation_target(&st.table.load(), &model, &all, owner) else { continue };
        let d = d.clone();
        if d.spec.autoscaling.as_ref().is_none_or(|a| a.min_replicas != 0) {
            continue;
        }
        let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &d.namespace().unwrap_or_default());
        let scale = match api.get_scale(&d.name_any()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(model = %model, error = %e, "cannot read the scale to activate; retried on the next held request");
                last.remove(&model);
                continue;
            }
        };
        if scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0) > 0 {
            continue;
        }
        // Conditional on the scale's resourceVersion: of replicas asking at once, one writes.
        let up = Scale { spec: Some(ScaleSpec { replicas: Some(1) }), status: None, ..scale };
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
        match api.replace_scale(&d.name_any(), &pp, &up).await {
            Ok(_) => {
                st.metrics.autoscale.scale_write(WriteResult::ok);
                // The leader's decisions know the deployment by its model, an adapter's parent.
                st.autoscale.activation.activated(&base);
                tracing::info!(model = %model, deployment = %d.name_any(), "activated from zero for a held request");
                event(
                    &rec,
                    &d,
                    AutoscalingReason::Activated,
                    "replicas 0 → 1: a request arrived at zero replicas and is held by the gateway".into(),
                )
                .await;
            }
            Err(e) => {
                st.metrics.autoscale.scale_write(result(&e));
                if result(&e) != WriteResult::conflict {
                    tracing::warn!(model = %model, error = %e, "activation not written; retried on the next held request");
                    last.remove(&model);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_written_on_change_and_moving_numbers_at_most_once_per_interval() {
        let base = AutoscalingStatus {
            demand: Some(Demand { queued: 4, running: 10, kv_cache_percent: None, clusters: 2 }),
            recommendation: 3,
            reason: Some(AutoscalingReason::Steady),
            message: "4 queued".into(),
            ..Default::default()
        };
        let interval = Duration::from_secs(10);
        assert!(should_write(None, &base, None, interval));
        assert!(!should_write(Some(&base), &base.clone(), None, interval), "equal: no write");
        let numbers = AutoscalingStatus {
            demand: Some(Demand { queued: 5, ..base.demand.clone().unwrap() }),
            message: "5 queued".into(),
            ..base.clone()
        };
        assert!(!should_write(Some(&base), &numbers, Some(Duration::from_secs(3)), interval));
        assert!(should_write(Some(&base), &numbers, Some(Duration::from_secs(10)), interval));
        let scaled = AutoscalingStatus { recommendation: 4, reason: Some(AutoscalingReason::ScaledUp), ..numbers };
        assert!(should_write(Some(&base), &scaled, Some(Duration::from_secs(1)), interval), "a new count: at once");
    }
}
