//! The gateway's link to the control cluster. Watches of InferenceClusters, ModelDeployments
//! and (optionally) API-key Secrets fill reflector stores; after each burst of events the
//! routing table is rebuilt with `fleet::table_file` and swapped atomically when it changed,
//! and the keys likewise. With `--upstream-secrets-namespace`, the Secrets there are watched
//! too, for the tokens and certificates InferenceClusters' `spec.endpointAuth` names. A failing
//! watch is retried with back-off (0.8 s doubling to 30 s), leaves the last good table serving and marks the
//! feed stale for `/readyz` and the `feed_stale` metric. The elected replica then writes each
//! ModelDeployment's `Serving` condition (decided by `feedback::serving`) on change only, and
//! (`autoscale::writer`) the replica count of those with `spec.autoscaling`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_apis::cluster::InferenceCluster;
use flotilla_apis::conditions::{merge, would_change};
use flotilla_apis::constants::condition;
use flotilla_apis::deployment::ModelDeployment;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use crate::feedback::{Endpoint, serving};
use crate::health::lock;
use crate::keys::KeySet;
use crate::metrics::{ReloadResult, WriteResult};
use crate::table::{Route, TableFile};
use crate::{AppState, GatewayError, RoutingTable};

/// Label that marks a Secret as holding API keys.
pub const KEYS_LABEL: &str = "flotilla.dev/api-keys";
/// The Secret data key holding the keys document.
pub const KEYS_DATA: &str = "keys.yaml";
/// Field manager of the gateway's status writes.
pub const FIELD_MANAGER: &str = "flotilla-gateway";

#[derive(Debug, Default)]
struct State {
    synced: bool,
    stale: Option<(Instant, String)>,
    /// Which deployment serves each model in the table.
    owners: crate::fleet::Owners,
}

/// Whether the feed has synced and whether it is failing now.
#[derive(Debug)]
pub struct FeedStatus {
    enabled: bool,
    state: Mutex<State>,
}

impl FeedStatus {
    /// A feed that is in use (`enabled`) or not (file mode).
    pub fn new(enabled: bool) -> Self {
        FeedStatus { enabled, state: Mutex::new(State::default()) }
    }

    /// Whether the table is usable: the first full list was read (always, in file mode).
    pub fn synced(&self) -> bool {
        !self.enabled || lock(&self.state).synced
    }

    /// Whether the watch is failing now.
    pub fn stale(&self) -> bool {
        lock(&self.state).stale.is_some()
    }

    /// For `/readyz`.
    pub fn describe(&self, now: Instant) -> String {
        if !self.enabled {
            return "routing table from a file".into();
        }
        let s = lock(&self.state);
        match (&s.stale, s.synced) {
            (Some((since, e)), true) => format!(
                "routing feed STALE for {}s (serving the last good table): {e}",
                now.saturating_duration_since(*since).as_secs()
            ),
            (Some((_, e)), false) => format!("waiting for the first sync with the control cluster: {e}"),
            (None, true) => "routing feed in sync with the control cluster".into(),
            (None, false) => "waiting for the first sync with the control cluster".into(),
        }
    }

    pub(crate) fn owner(&self, ns: &str, name: &str) -> Option<String> {
        lock(&self.state).owners.get(&(ns.to_string(), name.to_string())).cloned()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Clusters,
    Deployments,
    Secrets,
    UpstreamSecrets,
}

type Tagged = (Source, Result<bool, String>);

fn tagged<K>(
    source: Source,
    s: impl futures_util::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
) -> BoxStream<'static, Tagged>
where
    K: Send + 'static,
{
    // Back off between failed attempts (kube's default: exponential from 0.8 s to 30 s, with
    // jitter). Without it a control cluster that refuses connections is retried in a tight loop
    // that never yields: a core burnt, the log flooded, and the task deaf to cancellation.
    s.default_backoff()
        .map(move |r| {
            (
                source,
                r.map(|e| matches!(e, Event::InitDone | Event::Apply(_) | Event::Delete(_))).map_err(|e| e.to_string()),
            )
        })
        .boxed()
}

/// Connect to the control cluster: `--kubeconfig`, else in-cluster, else `$KUBECONFIG`.
pub async fn client(st: &AppState) -> Result<Client, GatewayError> {
    let config = match &st.cfg.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| GatewayError::Control(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| GatewayError::Control(e.to_string()))?
        }
        None => kube::Config::infer().await.map_err(|e| GatewayError::Control(e.to_string()))?,
    };
    flotilla_apis::crypto::install_crypto();
    Client::try_from(config).map_err(|e| GatewayError::Control(e.to_string()))
}

/// Run the feed until the task is dropped. Returns the ModelDeployment store for the writer.
pub fn start(st: Arc<AppState>, client: Client) -> (Store<ModelDeployment>, tokio::task::JoinHandle<()>) {
    let (clusters, cw) = reflector::store::<InferenceCluster>();
    let (deployments, dw) = reflector::store::<ModelDeployment>();
    let mut streams: Vec<BoxStream<'static, Tagged>> = vec![
        tagged(
            Source::Clusters,
            reflector::reflector(cw, watcher::watcher(Api::all(client.clone()), watcher::Config::default())),
        ),
        tagged(
            Source::Deployments,
            reflector::reflector(dw, watcher::watcher(Api::all(client.clone()), watcher::Config::default())),
        ),
    ];
    let secrets = st.cfg.keys_namespace.as_ref().map(|ns| {
        let (store, sw) = reflector::store::<Secret>();
        let cfg = watcher::Config::default().labels(&format!("{KEYS_LABEL}=true"));
        streams.push(tagged(
            Source::Secrets,
            reflector::reflector(sw, watcher::watcher(Api::namespaced(client.clone(), ns), cfg)),
        ));
        store
    });
    let upstream = st.cfg.upstream_secrets_namespace.as_ref().map(|ns| {
        let (store, sw) = reflector::store::<Secret>();
        streams.push(tagged(
            Source::UpstreamSecrets,
            reflector::reflector(sw, watcher::watcher(Api::namespaced(client.clone(), ns), watcher::Config::default())),
        ));
        (store, ns.clone())
    });
    let store = deployments.clone();
    let task = tokio::spawn(async move {
        let mut events = futures_util::stream::select_all(streams);
        let mut synced: HashMap<&'static str, bool> = HashMap::new();
        let need = 2 + usize::from(secrets.is_some()) + usize::from(upstream.is_some());
        let mut errors: HashMap<&'static str, String> = HashMap::new();
        let mut dirty = false;
        let mut last = Built::default();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                item = events.next() => {
                    let Some((source, r)) = item else { break };
                    let key = match source {
                        Source::Clusters => "InferenceClusters",
                        Source::Deployments => "ModelDeployments",
                        Source::Secrets => "API-key Secrets",
                        Source::UpstreamSecrets => "upstream Secrets",
                    };
                    match r {
                        Ok(changed) => {
                            errors.remove(key);
                            if changed {
                                synced.insert(key, true);
                                dirty = true;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(watch = key, error = %e, "control-cluster watch failing; the last good table keeps serving");
                            errors.insert(key, e);
                        }
                    }
                    let mut s = lock(&st.feed.state);
                    s.stale = match (errors.iter().next(), s.stale.take()) {
                        (None, _) => None,
                        (Some((k, e)), Some((since, _))) => Some((since, format!("watching {k}: {e}"))),
                        (Some((k, e)), None) => Some((Instant::now(), format!("watching {k}: {e}"))),
                    };
                    st.metrics.set_feed_stale(s.stale.is_some());
                }
                _ = tick.tick(), if dirty && synced.len() == need => {
                    dirty = false;
                    let up = upstream.as_ref().map(|(store, ns)| (store, ns.as_str()));
                    rebuild(&st, &clusters, &deployments, secrets.as_ref(), up, &mut last);
                    lock(&st.feed.state).synced = true;
                }
            }
        }
    });
    (store, task)
}

#[derive(Default)]
struct Built {
    file: Option<TableFile>,
    problems: Vec<String>,
    key_texts: BTreeMap<String, String>,
    key_problems: Vec<String>,
    keys_installed: bool,
}

/// One key of a Secret in the upstream-Secrets namespace (`--upstream-secrets-namespace`).
fn upstream_secret(
    upstream: Option<(&Store<Secret>, &str)>,
    ns: Option<&str>,
    name: &str,
    key: &str,
) -> Result<Vec<u8>, String> {
    let Some((store, home)) = upstream else {
        return Err("the gateway reads no upstream Secrets: start it with --upstream-secrets-namespace (the chart sets it to the API-key namespace)".into());
    };
    if let Some(ns) = ns
        && ns != home
    {
        return Err(format!(
            "the gateway reads upstream Secrets only in namespace {home}, not {ns}: move the Secret there"
        ));
    }
    let secret = store
        .get(&reflector::ObjectRef::new(name).within(home))
        .ok_or_else(|| format!("no such Secret in namespace {home}"))?;
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .ok_or_else(|| "the Secret has no such key".into())
}

fn rebuild(
    st: &AppState,
    clusters: &Store<InferenceCluster>,
    deployments: &Store<ModelDeployment>,
    secrets: Option<&Store<Secret>>,
    upstream: Option<(&Store<Secret>, &str)>,
    last: &mut Built,
) {
    let cs: Vec<InferenceCluster> = clusters.state().iter().map(|c| c.as_ref().clone()).collect();
    let ds: Vec<ModelDeployment> = deployments.state().iter().map(|d| d.as_ref().clone()).collect();
    let read = |ns: Option<&str>, name: &str, key: &str| upstream_secret(upstream, ns, name, key);
    let (file, owners, problems) = crate::fleet::table_file(&cs, &ds, &read);
    if problems != last.problems {
        for p in &problems {
            tracing::warn!(problem = %p, "routing table from the control cluster");
        }
        last.problems = problems;
    }
    if last.file.as_ref() != Some(&file) {
        match RoutingTable::from_file("control cluster", file.clone()) {
            Ok(t) => {
                tracing::info!(
                    models = t.models().count(),
                    clusters = t.clusters().count(),
                    "routing table updated from the control cluster"
                );
                st.set_table(t);
                st.metrics.reload(ReloadResult::applied);
                last.file = Some(file);
            }
            Err(e) => {
                st.metrics.reload(ReloadResult::invalid);
                tracing::error!(error = %e, "routing table from the control cluster is invalid; the previous one stays");
            }
        }
    }
    lock(&st.feed.state).owners = owners;
    if let Some(secrets) = secrets {
        let mut texts = last.key_texts.clone();
        let mut seen = Vec::new();
        for s in secrets.state() {
            let source = format!("Secret {}/{}", s.namespace().unwrap_or_default(), s.name_any());
            seen.push(source.clone());
            let text =
                s.data.as_ref().and_then(|d| d.get(KEYS_DATA)).map(|b| String::from_utf8_lossy(&b.0).into_owned());
            match text.map(|t| KeySet::parses(&t).map(|()| t)) {
                Some(Ok(t)) => {
                    texts.insert(source, t);
                }
                Some(Err(e)) => {
                    tracing::error!(secret = %source, error = %e, "API keys do not parse; this Secret's last good keys stay")
                }
                None => {
                    tracing::error!(secret = %source, "API-key Secret has no `{KEYS_DATA}` entry; its last good keys stay")
                }
            }
        }
        texts.retain(|k, _| seen.contains(k));
        if texts != last.key_texts || !last.keys_installed {
            let (mut set, problems) = KeySet::from_documents(texts.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            if problems != last.key_problems {
                for p in &problems {
                    tracing::error!(problem = %p, "API key left out");
                }
                last.key_problems = problems;
            }
            st.install_keys(&mut set);
            last.key_texts = texts;
            last.keys_installed = true;
        }
    }
}

/// Write `Serving` conditions while this replica holds the lease. Runs until dropped.
pub async fn write_serving(
    st: Arc<AppState>,
    client: Client,
    deployments: Store<ModelDeployment>,
    mut leader: watch::Receiver<bool>,
) {
    let interval = Duration::from_millis(st.cfg.feedback_interval_ms);
    let mut written: HashMap<(String, String), (Instant, String, String)> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = leader.changed() => if r.is_err() { return },
        }
        let leading = *leader.borrow();
        st.metrics.set_leader(leading);
        if !leading || !st.feed.synced() || st.feed.stale() {
            continue;
        }
        let table = st.table.load_full();
        let now = Instant::now();
        for d in deployments.state() {
            let (ns, name) = (d.namespace().unwrap_or_default(), d.name_any());
            if d.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Some(model) = st.feed.owner(&ns, &name).and_then(|m| table.resolve(&m).cloned()) else { continue };
            // Of a model split by weight, this deployment's routes only, and its share.
            let id = format!("{ns}/{name}");
            let mine = |r: &&Route| model.deployments.get(r.deployment).is_none_or(|d| d.name == id);
            let endpoints: Vec<Endpoint> = model
                .routes
                .iter()
                .filter(|r| r.ready)
                .filter(mine)
                .map(|r| Endpoint {
                    cluster: r.cluster.name.clone(),
                    ready: r.weight,
                    ejected: r.health.ejected(),
                    seen: st.stats.observe(&model.name, &r.cluster.name, now),
                })
                .collect();
            let mut want = serving(&model.name, &endpoints, st.cfg.degraded_error_rate);
            // Its adapters' routes (each adapter a model of the table whose parent is this one).
            let adapters: Vec<(String, Vec<Endpoint>)> = d
                .spec
                .adapters
                .iter()
                .filter_map(|a| {
                    let m = table.resolve(&a.name).filter(|m| m.parent.as_deref() == Some(model.name.as_str()))?;
                    let routes = m.routes.iter().filter(|r| r.ready).map(|r| Endpoint {
                        cluster: r.cluster.name.clone(),
                        ready: r.weight,
                        ejected: r.health.ejected(),
                        seen: st.stats.observe(&m.name, &r.cluster.name, now),
                    });
                    Some((a.name.clone(), routes.collect()))
                })
                .collect();
            want = crate::feedback::with_adapters(want, &adapters, st.cfg.degraded_error_rate);
            let routable = model.routes.iter().filter(mine).any(|r| r.ready && crate::split::route_open(&model, r));
            if let Some(note) = crate::split::share_note(&model, &id, routable, &st.shares, now) {
                want.message.push_str(&note);
            }
            let current = d.status.as_ref().map(|s| s.conditions.0.clone()).unwrap_or_default();
            if !would_change(&current, std::slice::from_ref(&want), d.metadata.generation) {
                continue;
            }
            // Only the message moved (numbers): at most once per interval per deployment.
            let key = (ns.clone(), name.clone());
            let old = current.iter().find(|c| c.type_ == condition::SERVING);
            let same_state = old.is_some_and(|c| c.status == want.status.as_str() && c.reason == want.reason);
            if same_state && written.get(&key).is_some_and(|(at, _, _)| now.duration_since(*at) < interval) {
                continue;
            }
            let merged = merge(
                &current,
                std::slice::from_ref(&want),
                d.metadata.generation,
                &Time(k8s_openapi::jiff::Timestamp::now()),
            );
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": d.resource_version()},
                "status": {"conditions": merged},
            });
            let api: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns);
            match api
                .patch_status(
                    &name,
                    &PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() },
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {
                    st.metrics.status_write(WriteResult::ok);
                    tracing::info!(deployment = %format!("{ns}/{name}"), status = want.status.as_str(), reason = want.reason, message = %want.message, "Serving updated");
                    written.insert(key, (now, want.status.as_str().to_string(), want.reason.to_string()));
                }
                Err(kube::Error::Api(e)) if e.code == 409 => st.metrics.status_write(WriteResult::conflict),
                Err(e) => {
                    st.metrics.status_write(WriteResult::error);
                    tracing::warn!(deployment = %format!("{ns}/{name}"), error = %e, "Serving not written; retrying");
                }
            }
        }
    }
}

/// What control-cluster mode runs beside the HTTP server: the feed and, when feedback is on,
/// the lease and the `Serving` writer.
pub struct ControlTasks {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    lease: Option<tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>>,
}

/// Start control-cluster mode on `client`.
pub async fn start_control(st: Arc<AppState>, client: Client) -> Result<ControlTasks, GatewayError> {
    let (deployments, task) = start(st.clone(), client.clone());
    let mut out = ControlTasks { tasks: vec![task], lease: None };
    // Every replica raises a model at zero replicas for the requests it holds.
    let (asked, activations) = tokio::sync::mpsc::unbounded_channel();
    st.autoscale.activation.connect(asked);
    let writer = crate::autoscale::writer::activations(st.clone(), client.clone(), deployments.clone(), activations);
    out.tasks.push(tokio::spawn(writer));
    if st.cfg.feedback_interval_ms == 0 {
        return Ok(out);
    }
    let id = st.cfg.identity.clone().unwrap_or_else(|| {
        format!("{}-{}", std::env::var("HOSTNAME").unwrap_or_else(|_| "gateway".into()), std::process::id())
    });
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &st.cfg.lease_name)
        .with_namespace(&st.cfg.lease_namespace)
        .with_identity(&id)
        .with_duration(st.cfg.lease_duration)
        .with_grace((st.cfg.lease_duration / 3).max(1))
        .build()
        .await
        .map_err(|e| GatewayError::Control(format!("setting up the feedback lease: {e}")))?;
    let (leader, lease) = manager.watch().await;
    tracing::info!(identity = %id, lease = %st.cfg.lease_name, "competing to write Serving conditions");
    out.tasks.push(tokio::spawn(write_serving(st.clone(), client.clone(), deployments.clone(), leader.clone())));
    // The same elected replica decides replica counts (`autoscale::writer`).
    out.tasks.push(tokio::spawn(crate::autoscale::writer::run(st, client, deployments, leader)));
    out.lease = Some(lease);
    Ok(out)
}

impl ControlTasks {
    /// Stop the feed and the writer and give up the lease.
    pub async fn stop(self) {
        for task in self.tasks {
            task.abort();
            let _ = task.await;
        }
        // The writer held the leader channel; with it gone the lease task ends and hands back
        // the manager, which releases the lease so a standby takes over at once.
        if let Some(task) = self.lease
            && let Ok(Ok(Ok(manager))) = tokio::time::timeout(Duration::from_secs(5), task).await
        {
            let _ = manager.release().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(ns: &str, name: &str, data: &[(&str, &[u8])]) -> Secret {
        let mut s = Secret::default();
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s.data = Some(data.iter().map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.to_vec()))).collect());
        s
    }

    #[test]
    fn upstream_secrets_are_read_only_from_their_namespace_and_name_what_is_missing() {
        let (store, mut writer) = reflector::store::<Secret>();
        writer.apply_watcher_event(&Event::Apply(secret("gw", "eu1-engine", &[("token", b"t")])));
        let up = Some((&store, "gw"));
        assert_eq!(upstream_secret(up, None, "eu1-engine", "token").unwrap(), b"t");
        assert_eq!(upstream_secret(up, Some("gw"), "eu1-engine", "token").unwrap(), b"t");
        let e = upstream_secret(up, Some("flotilla-system"), "eu1-engine", "token").unwrap_err();
        assert!(e.contains("only in namespace gw, not flotilla-system"), "{e}");
        assert!(
            upstream_secret(up, None, "eu2-engine", "token").unwrap_err().contains("no such Secret in namespace gw")
        );
        assert!(upstream_secret(up, None, "eu1-engine", "ca.crt").unwrap_err().contains("no such key"));
        let e = upstream_secret(None, None, "eu1-engine", "token").unwrap_err();
        assert!(e.contains("--upstream-secrets-namespace"), "{e}");
    }
}
