//! The placement problem as the solver sees it after filtering, for an exact solver to check
//! the plan against (`examples/quality_export.rs`, `scripts/solver-quality.py`): every pool
//! with its free devices per node and spread domains, and per deployment (in solve order) its
//! priority, replica shape, alternatives' limits, ceiling, spread, and the (pool, alternative)
//! options that passed every static filter and device rule (selector, sovereignty,
//! readiness, cordon, taints, claim ownership, device match, node fit, capacity type, price).

use flotilla_apis::common::parse_price_micros;
use flotilla_apis::deployment::SpreadDomain;
use serde::Serialize;

use super::{Ctx, place};
use crate::devices::{DeviceMatcher, ReplicaShape};
use crate::filters::first_refusal;
use crate::snapshot::FleetSnapshot;

/// The whole problem.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// Every pool of every cluster (a claim's reserved nodes are a pool of their own).
    pub pools: Vec<ProblemPool>,
    /// Deployments in solve order (priority, creation, name); invalid specs left out.
    pub deployments: Vec<ProblemDeployment>,
}

/// One pool.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProblemPool {
    /// Cluster name.
    pub cluster: String,
    /// Pool name.
    pub pool: String,
    /// Free devices per node.
    pub free_per_node: Vec<u32>,
    /// Spread domain indexes of its cluster: by cluster, zone, region.
    pub domains: [usize; 3],
}

/// One deployment.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProblemDeployment {
    /// `namespace/name`.
    pub name: String,
    /// `spec.placement.priority`.
    pub priority: i32,
    /// Replicas wanted.
    pub replicas: u32,
    /// Devices per pod of one replica.
    pub pods: Vec<u32>,
    /// Pods of one replica on distinct nodes.
    pub distinct_nodes: bool,
    /// Per alternative: (minReplicas, maxReplicas).
    pub alternatives: Vec<(Option<u32>, Option<u32>)>,
    /// `maxCostPerHour` in micro-dollars.
    pub max_cost_micros: Option<u64>,
    /// Spread: domain kind (0 cluster, 1 zone, 2 region) and maxSkew.
    pub spread: Option<(usize, u32)>,
    /// Where a replica may go.
    pub options: Vec<ProblemOption>,
}

/// One (pool, alternative) a deployment may take new replicas on.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProblemOption {
    /// Index into [`Problem::pools`].
    pub pool: usize,
    /// 1-based alternative rank.
    pub rank: u32,
    /// Price of one replica, micro-dollars per hour.
    pub price_micros: u64,
    /// Index of the pool's capacity type in the deployment's preference.
    pub capacity_type_rank: u32,
}

/// The problem `solve` solves for `snapshot`, with no current placements considered.
pub fn problem(snapshot: &FleetSnapshot) -> Problem {
    let mut free = super::Free::new(super::initial_free(snapshot));
    let mut matcher = DeviceMatcher::new(&snapshot.classes);
    let order = super::solve_order(snapshot);
    let class_ix: std::collections::HashMap<&str, usize> =
        snapshot.classes.keys().enumerate().map(|(i, c)| (c.as_str(), i)).collect();
    let pool_class: Vec<Vec<Option<usize>>> = snapshot
        .clusters
        .iter()
        .map(|c| c.pools.iter().map(|p| class_ix.get(p.class.as_str()).copied()).collect())
        .collect();
    let domains = place::DomainIndex::new(&snapshot.clusters);
    let name_rank = vec![0u32; snapshot.clusters.len()];
    let mut pools = Vec::new();
    let mut pool_ix: Vec<Vec<usize>> = Vec::new();
    for (ci, c) in snapshot.clusters.iter().enumerate() {
        let kinds = [SpreadDomain::Cluster, SpreadDomain::Zone, SpreadDomain::Region];
        let doms = kinds.map(|k| domains.of(k).0[ci]);
        pool_ix.push(Vec::new());
        for p in &c.pools {
            pool_ix[ci].push(pools.len());
            pools.push(ProblemPool {
                cluster: c.name.clone(),
                pool: p.name.clone(),
                free_per_node: p.free_per_node.clone(),
                domains: doms,
            });
        }
    }
    let mut evaluations = 0u64;
    let mut statics = crate::filters::StaticMemo::default();
    let class_facts: Vec<super::ClassFacts> = snapshot.classes.values().map(super::ClassFacts::of).collect();
    let mut deployments = Vec::new();
    let mut spare = Vec::new();
    for d in order {
        let ctx = Ctx {
            snapshot,
            free: &mut free,
            matcher: &mut matcher,
            statics: &mut statics,
            evaluations: &mut evaluations,
            explain: false,
            name_rank: &name_rank,
            pool_class: &pool_class,
            class_facts: &class_facts,
            spare: &mut spare,
            domains: &domains,
            cache: None,
            open: None,
            guide: None,
            quota: None,
        };
        if ctx.matcher.invalid_selector(&d.spec.devices.alternatives).is_some() {
            continue;
        }
        let policy = &d.spec.placement;
        let shape = ReplicaShape::of(&d.spec.topology);
        let cap_types = policy.capacity_types_or_default();
        let max_cost = policy.max_cost_per_hour.as_deref().and_then(parse_price_micros);
        let class_matches: Vec<Vec<_>> = d
            .spec
            .devices
            .alternatives
            .iter()
            .map(|alt| snapshot.classes.keys().map(|c| ctx.matcher.matches(alt, c)).collect())
            .collect();
        let own_claim = flotilla_apis::names::owner_key(&d.namespace, &d.name);
        let mut options = Vec::new();
        for (ci, cluster) in snapshot.clusters.iter().enumerate() {
            if first_refusal(policy, cluster, false).is_some() {
                continue;
            }
            for (pi, pool) in cluster.pools.iter().enumerate() {
                if pool.reserved_for_another(&own_claim) {
                    continue;
                }
                for (ai, accepts) in class_matches.iter().enumerate() {
                    let Ok(c) = ctx.evaluate(d, ci, pi, ai, accepts, &shape, &cap_types, max_cost, false) else {
                        continue;
                    };
                    options.push(ProblemOption {
                        pool: pool_ix[ci][pi],
                        rank: c.rank,
                        price_micros: c.replica_price,
                        capacity_type_rank: c.capacity_type_rank,
                    });
                }
            }
        }
        let kind = |by: SpreadDomain| match by {
            SpreadDomain::Cluster => 0,
            SpreadDomain::Zone => 1,
            SpreadDomain::Region => 2,
        };
        deployments.push(ProblemDeployment {
            name: format!("{}/{}", d.namespace, d.name),
            priority: d.priority(),
            replicas: d.spec.replicas.max(0) as u32,
            pods: shape.pods.clone(),
            distinct_nodes: shape.distinct_nodes,
            alternatives: d
                .spec
                .devices
                .alternatives
                .iter()
                .map(|a| (a.min_replicas.map(|m| m.max(0) as u32), a.max_replicas.map(|m| m.max(0) as u32)))
                .collect(),
            max_cost_micros: max_cost,
            spread: policy.spread.as_ref().map(|s| (kind(s.by), s.max_skew.max(1) as u32)),
            options,
        });
    }
    Problem { pools, deployments }
}
