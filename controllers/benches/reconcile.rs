//! What one ModelDeployment reconcile costs the controller before it talks to any API server,
//! as the fleet grows: whether the fleet plan still holds and the deployment's entry in it
//! (`DeploymentContext::plan_for`, then the entry looked up as `apply` does), on an unchanged
//! fleet of 100, 1,000 and 10,000 deployments over 20 clusters, the stores and the plan digest
//! fed from watch events as the controller's own watches feed them. The solve itself happens
//! once, before timing. Target: flat (independent of the fleet's size), not linear.
//!
//! `cargo bench -p flotilla-controllers --bench reconcile`; results in docs/benchmarks.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use flotilla_apis::document::FleetObject;
use flotilla_apis::{CapacityClaim, InferenceClass, InferenceCluster, ModelCache, ModelDeployment};
use flotilla_controllers::deployment::{DeploymentContext, Stores, trigger::Facts};
use flotilla_controllers::member::MemberClients;
use flotilla_controllers::{ControllerConfig, metrics::Metrics};
use flotilla_placement::generate::{GenSpec, generate_objects};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;

struct Fleet {
    ctx: DeploymentContext,
    deployments: Vec<Arc<ModelDeployment>>,
}

fn fleet(deployments: usize) -> Fleet {
    let mut classes = Writer::<InferenceClass>::default();
    let mut clusters = Writer::<InferenceCluster>::default();
    let caches = Writer::<ModelCache>::default();
    let mut deps = Writer::<ModelDeployment>::default();
    let claims = Writer::<CapacityClaim>::default();
    let facts = Facts::default();
    let mut list = Vec::new();
    for (i, o) in generate_objects(&GenSpec { clusters: 20, deployments, seed: 1 }).into_iter().enumerate() {
        let (uid, rv) = (Some(format!("uid-{i}")), Some("1".to_string()));
        match o {
            FleetObject::Class(mut c) => {
                (c.metadata.uid, c.metadata.resource_version) = (uid, rv);
                let e = Event::Apply(c);
                classes.apply_watcher_event(&e);
                facts.class_event(&e);
            }
            FleetObject::Cluster(mut c) => {
                (c.metadata.uid, c.metadata.resource_version) = (uid, rv);
                let e = Event::Apply(c);
                clusters.apply_watcher_event(&e);
                facts.cluster_event(&e);
            }
            FleetObject::Deployment(mut d) => {
                (d.metadata.uid, d.metadata.resource_version, d.metadata.generation) = (uid, rv, Some(1));
                list.push(Arc::new(d.clone()));
                let e = Event::Apply(d);
                deps.apply_watcher_event(&e);
                facts.deployment_event(&e);
            }
            _ => {}
        }
    }
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let stores = Stores {
        clusters: clusters.as_reader(),
        classes: classes.as_reader(),
        caches: caches.as_reader(),
        deployments: deps.as_reader(),
        claims: claims.as_reader(),
        quotas: kube::runtime::reflector::store::Writer::default().as_reader(),
    };
    let ctx = DeploymentContext::new(
        client,
        stores,
        Arc::new(MemberClients::new("flotilla-system")),
        Metrics::default(),
        ControllerConfig::default(),
        facts.digest.clone(),
    );
    Fleet { ctx, deployments: list }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("reconcile: plan entry on an unchanged fleet");
    for n in [100, 1_000, 10_000] {
        let f = fleet(n);
        // The one solve, before timing.
        rt.block_on(f.ctx.plan_for(&f.deployments[0])).unwrap();
        let mut i = 0;
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                i = (i + 7919) % f.deployments.len();
                let d = &f.deployments[i];
                let plan = rt.block_on(f.ctx.plan_for(d)).unwrap();
                let ns = d.metadata.namespace.as_deref().unwrap_or("default");
                let name = d.metadata.name.as_deref().unwrap_or_default();
                assert!(plan.get(ns, name).is_some());
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
