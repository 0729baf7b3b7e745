//! The router's view of its cluster: cluster-wide watches of HTTPRoutes (as `DynamicObject`s,
//! so a missing CRD or one odd route fails nothing else), Services and EndpointSlices fill
//! reflector stores; after each burst of changes (at most every 100 ms) the table is rebuilt
//! with `table::build` and swapped in when it differs, and what is not served is logged once
//! when it first appears. A failing watch keeps the last table serving, retries with backoff
//! and marks the router not ready; a cheap LIST clears the mark once the API server answers.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher::watcher};
use kube::{Client, ResourceExt};

use super::route::{self, HttpRoute};
use super::table::{self, Inputs, SERVICE_NAME_LABEL, Table};
use super::{MemberRouter, Watched};

/// What one watch event means for the table.
enum Seen {
    /// The first (or a fresh) full list is in the store.
    Listed,
    /// Something changed, or the watch is alive.
    Changed,
}

fn tagged<K: Send + 'static>(
    w: Watched,
    s: impl futures_util::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
) -> BoxStream<'static, (Watched, Result<Seen, String>)> {
    s.map(move |r| {
        let seen = r
            .map(|e| if matches!(e, Event::InitDone) { Seen::Listed } else { Seen::Changed })
            .map_err(|e| describe(w, &e));
        (w, seen)
    })
    .boxed()
}

/// A watch error with what to do about it.
fn describe(w: Watched, e: &watcher::Error) -> String {
    let code = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => 0,
    };
    match (w, code) {
        (Watched::HttpRoutes, 404) => format!(
            "{e}: the HTTPRoute CRD ({}) is not installed in this cluster: install the Gateway API standard CRDs",
            route::GATEWAY_GROUP
        ),
        (_, 403) => format!(
            "{e}: forbidden: the router's ServiceAccount needs get, list and watch on {} cluster-wide (docs/member-router.md, RBAC)",
            w.name()
        ),
        _ => e.to_string(),
    }
}

/// Watch the cluster and keep `st`'s table in step with it. Runs until the task is dropped.
pub async fn run(st: Arc<MemberRouter>, client: Client) {
    let ar = route::api_resource();
    let route_api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let service_api: Api<Service> = Api::all(client.clone());
    let slice_api: Api<EndpointSlice> = Api::all(client);
    let routes_writer = reflector::store::Writer::<DynamicObject>::new(ar);
    let routes = routes_writer.as_reader();
    let (services, services_writer) = reflector::store::<Service>();
    let (slices, slices_writer) = reflector::store::<EndpointSlice>();
    let streams = vec![
        tagged(
            Watched::HttpRoutes,
            watcher(route_api.clone(), watcher::Config::default())
                .default_backoff()
                .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None)
                .reflect(routes_writer),
        ),
        tagged(
            Watched::Services,
            watcher(service_api.clone(), watcher::Config::default())
                .default_backoff()
                .modify(|s: &mut Service| {
                    s.metadata.managed_fields = None;
                    s.metadata.annotations = None;
                    s.status = None;
                })
                .reflect(services_writer),
        ),
        tagged(
            Watched::EndpointSlices,
            watcher(slice_api.clone(), watcher::Config::default().labels(SERVICE_NAME_LABEL))
                .default_backoff()
                .modify(|s: &mut EndpointSlice| {
                    s.metadata.managed_fields = None;
                    s.metadata.annotations = None;
                })
                .reflect(slices_writer),
        ),
    ];
    let mut events = futures_util::stream::select_all(streams);
    let mut dirty = false;
    let mut last = Last::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut recheck = tokio::time::interval(Duration::from_secs(5));
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            item = events.next() => {
                let Some((w, seen)) = item else { break };
                match seen {
                    Ok(Seen::Listed) => {
                        st.sync.listed(w);
                        dirty = true;
                    }
                    Ok(Seen::Changed) => {
                        st.sync.recovered(w);
                        dirty = true;
                    }
                    Err(e) => {
                        if !st.sync.is_failing(w) {
                            tracing::warn!(watch = w.name(), error = %e, "watch failing; the last table keeps serving and the router reports not ready until it recovers");
                        } else {
                            tracing::debug!(watch = w.name(), error = %e, "watch still failing");
                        }
                        st.sync.failing(w, e);
                    }
                }
            }
            _ = tick.tick(), if dirty && st.sync.all_listed() => {
                dirty = false;
                rebuild(&st, &routes, &services, &slices, &mut last);
            }
            _ = recheck.tick() => {
                // A watch that resumed says nothing until something changes: ask the API
                // server directly whether each failing kind can be read again.
                let lp = ListParams::default().limit(1);
                for w in Watched::ALL.into_iter().filter(|w| st.sync.is_failing(*w)) {
                    let ok = match w {
                        Watched::HttpRoutes => route_api.list_metadata(&lp).await.is_ok(),
                        Watched::Services => service_api.list_metadata(&lp).await.is_ok(),
                        Watched::EndpointSlices => slice_api.list_metadata(&lp).await.is_ok(),
                    };
                    if ok {
                        tracing::info!(watch = w.name(), "watch recovered");
                        st.sync.recovered(w);
                    }
                }
            }
        }
    }
}

/// What the last rebuild put in force and said.
#[derive(Default)]
struct Last {
    table: Option<Table>,
    notes: BTreeSet<String>,
}

fn rebuild(
    st: &MemberRouter,
    routes: &Store<DynamicObject>,
    services: &Store<Service>,
    slices: &Store<EndpointSlice>,
    last: &mut Last,
) {
    let objects = routes.state();
    let (rs, unread) = table::readable(objects.iter().map(|o| o.as_ref()), &st.cfg.gateway);
    let mut notes: BTreeSet<String> = unread.into_iter().collect();
    // Only the namespaces of our routes matter: copy just their Services and slices.
    let namespaces: BTreeSet<&str> = rs.iter().map(HttpRoute::namespace).collect();
    let ours = |ns: Option<String>| ns.as_deref().is_some_and(|n| namespaces.contains(n));
    let svcs: Vec<Service> =
        services.state().iter().filter(|s| ours(s.namespace())).map(|s| s.as_ref().clone()).collect();
    let sls: Vec<EndpointSlice> =
        slices.state().iter().filter(|s| ours(s.namespace())).map(|s| s.as_ref().clone()).collect();
    let header = st.cfg.header.as_str();
    let built = table::build(Inputs { gateway: &st.cfg.gateway, header, routes: &rs, services: &svcs, slices: &sls });
    notes.extend(built.notes);
    for n in notes.difference(&last.notes) {
        tracing::warn!(note = %n, "not served");
    }
    last.notes = notes;
    if last.table.as_ref() != Some(&built.table) {
        let ready = built.table.routes.values().filter(|r| !r.endpoints.is_empty()).count();
        tracing::info!(routes = built.table.routes.len(), ready, "routing table updated");
        st.set_table(built.table.clone());
        last.table = Some(built.table);
    }
    st.sync.built();
}
