//! Where each LoRA adapter of a ModelDeployment is served (`status.adapters`), and so what a
//! member's replicas may load. In each of the deployment's clusters an adapter is served when
//! its policy allows the cluster (its `sovereignty` narrowing the deployment's, and its
//! `clusterSelector`) and its ModelCache exists, gives `spec.digest` and is Ready there with
//! that digest; otherwise it waits there, for the first of those that fails, with a message
//! saying what to change. The policy check ([`outside_policy`]) is the one the ModelCache
//! controller stages by (`cache/status.rs`): an adapter's files go nowhere it may not be
//! served. Pure: the reconcile gathers an [`AdapterView`] from its stores.

use std::collections::BTreeMap;

use flotilla_apis::cache::{CachePhase, ModelCache};
use flotilla_apis::common::Sovereignty;
use flotilla_apis::deployment::{Adapter, AdapterStatus, AdapterWaitReason, AdapterWaiting};
use flotilla_apis::selector::cluster_labels;
use flotilla_apis::{InferenceCluster, ModelDeployment};

/// What an adapter's policy reads of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Place {
    /// `spec.jurisdiction`.
    pub jurisdiction: String,
    /// `spec.region`.
    pub region: String,
    /// The labels cluster selectors match (`flotilla_apis::selector::cluster_labels`).
    pub labels: BTreeMap<String, String>,
}

impl Place {
    /// The place of an InferenceCluster.
    pub fn of(ic: &InferenceCluster) -> Self {
        Place {
            jurisdiction: ic.spec.jurisdiction.0.clone(),
            region: ic.spec.region.clone(),
            labels: cluster_labels(ic),
        }
    }
}

/// What an adapter's status reads of its ModelCache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdapterCache {
    /// `spec.digest`.
    pub digest: Option<String>,
    /// Per cluster of its status: the phase, the digest observed there, a failure's reason.
    pub clusters: BTreeMap<String, (CachePhase, Option<String>, Option<String>)>,
}

impl AdapterCache {
    /// What the status reads of `cache`.
    pub fn of(cache: &ModelCache) -> Self {
        AdapterCache {
            digest: cache.spec.digest.clone(),
            clusters: cache
                .status
                .iter()
                .flat_map(|s| &s.clusters)
                .map(|c| (c.cluster.clone(), (c.phase, c.digest.clone(), c.reason.clone())))
                .collect(),
        }
    }
}

/// Everything `status.adapters` and the rendered adapters are decided from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdapterView {
    /// `namespace/name` of the deployment (for messages).
    pub deployment: String,
    /// `spec.adapters`.
    pub adapters: Vec<Adapter>,
    /// `spec.placement.sovereignty` (any when unset).
    pub base: Sovereignty,
    /// The adapters' ModelCaches that exist, by name (same namespace).
    pub caches: BTreeMap<String, AdapterCache>,
    /// InferenceClusters by name (at least the deployment's).
    pub places: BTreeMap<String, Place>,
}

impl AdapterView {
    /// The view of `md`: `cache` finds a ModelCache of its namespace by name, `place` an
    /// InferenceCluster by name.
    pub fn of(
        md: &ModelDeployment,
        cache: impl Fn(&str) -> Option<AdapterCache>,
        places: BTreeMap<String, Place>,
    ) -> Self {
        let ns = md.metadata.namespace.as_deref().unwrap_or("default");
        let caches =
            md.spec.adapters.iter().filter_map(|a| Some((a.cache_ref.clone(), cache(&a.cache_ref)?))).collect();
        AdapterView {
            deployment: format!("{ns}/{}", md.metadata.name.as_deref().unwrap_or("")),
            adapters: md.spec.adapters.clone(),
            base: md.spec.placement.sovereignty.clone().unwrap_or_default(),
            caches,
            places,
        }
    }

    fn namespace(&self) -> &str {
        self.deployment.split_once('/').map_or("default", |(ns, _)| ns)
    }

    /// Whether replicas in `cluster` may load `adapter`, else why not and what to change.
    pub fn check(&self, adapter: &Adapter, cluster: &str) -> Result<(), (AdapterWaitReason, String)> {
        let outside = match self.places.get(cluster) {
            Some(place) => outside_policy(adapter, &self.base, place),
            // Its jurisdiction cannot be checked: never served there.
            None => Some(format!("no InferenceCluster {cluster} is known, so its jurisdiction cannot be checked")),
        };
        if let Some(why) = outside {
            return Err((
                AdapterWaitReason::OutsidePolicy,
                format!(
                    "{why}: the adapter is never staged or served here (change the adapter's policy to serve it here)"
                ),
            ));
        }
        let cache = format!("{}/{}", self.namespace(), adapter.cache_ref);
        let Some(c) = self.caches.get(&adapter.cache_ref) else {
            return Err((
                AdapterWaitReason::CacheNotFound,
                format!("no ModelCache {cache}: create it (with spec.digest) or fix spec.adapters[].cacheRef"),
            ));
        };
        let Some(digest) = &c.digest else {
            return Err((
                AdapterWaitReason::CacheUnverified,
                format!(
                    "ModelCache {cache} gives no spec.digest: adapters are loaded only from verified files; add the digest"
                ),
            ));
        };
        let not_ready = |what: String| Err((AdapterWaitReason::CacheNotReady, what));
        match c.clusters.get(cluster) {
            None => not_ready(format!(
                "ModelCache {cache} is not staged in {cluster}: list {} in its spec.targets.deployments or select {cluster} \
                 with its spec.targets.clusterSelector",
                self.deployment.split_once('/').map_or(self.deployment.as_str(), |(_, n)| n)
            )),
            Some((CachePhase::Ready, seen, _)) if seen.as_deref() == Some(digest.as_str()) => Ok(()),
            Some((CachePhase::Ready, seen, _)) => not_ready(format!(
                "ModelCache {cache} in {cluster} holds digest {}, not its spec.digest {digest}: served here once it is \
                 staged and verified again",
                seen.as_deref().unwrap_or("<none>")
            )),
            Some((CachePhase::Failed, _, why)) => not_ready(format!(
                "ModelCache {cache} failed in {cluster} ({}): its status.clusters says what to fix",
                why.as_deref().unwrap_or("no reason given")
            )),
            Some((phase, _, _)) => {
                not_ready(format!("ModelCache {cache} is {phase:?} in {cluster}: served here once it is Ready"))
            }
        }
    }

    /// The adapters replicas in `cluster` may load, in `spec.adapters` order.
    pub fn loadable(&self, cluster: &str) -> Vec<&Adapter> {
        self.adapters.iter().filter(|a| self.check(a, cluster).is_ok()).collect()
    }

    /// `status.adapters` for a deployment in `clusters`: per adapter (in spec order), the
    /// clusters it is served in and the others with why, each sorted by cluster.
    pub fn statuses<'a>(&self, clusters: impl IntoIterator<Item = &'a str>) -> Vec<AdapterStatus> {
        let mut clusters: Vec<&str> = clusters.into_iter().collect();
        clusters.sort_unstable();
        clusters.dedup();
        self.adapters
            .iter()
            .map(|a| {
                let mut status = AdapterStatus { name: a.name.clone(), ..Default::default() };
                for c in &clusters {
                    match self.check(a, c) {
                        Ok(()) => status.clusters.push(c.to_string()),
                        Err((reason, message)) => {
                            status.waiting.push(AdapterWaiting { cluster: c.to_string(), reason, message })
                        }
                    }
                }
                status
            })
            .collect()
    }
}

/// Why `adapter`'s policy (its sovereignty narrowing `base`, then its cluster selector) leaves
/// `place` out; `None` when it allows it. A selector that cannot be evaluated leaves it out.
pub fn outside_policy(adapter: &Adapter, base: &Sovereignty, place: &Place) -> Option<String> {
    adapter.outside_policy(base, &place.jurisdiction, &place.region, &place.labels)
}

#[cfg(test)]
#[path = "adapters_tests.rs"]
mod tests;
