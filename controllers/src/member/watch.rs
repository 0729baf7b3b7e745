//! Watches on one member's nodes, non-terminal pods and — where it serves DRA —
//! ResourceSlices and ResourceClaims: what inventory and CapacityClaims read. Cluster-wide
//! (inventory counts every device and every pod that uses one), on the member's watch client
//! (no read timeout: the watcher's own idle timeout, `WATCH_TIMEOUT_SECS` plus a margin, finds
//! a dead connection), each object stripped to what is read (`strip.rs`) before it is stored.

use std::collections::BTreeMap;

use flotilla_apis::constants::labels;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use super::{AbortOnDrop, MemberError, Timeouts, WATCH_TIMEOUT_SECS, classify, strip};
use crate::inventory::MemberObservation;

fn spawn_store<K>(api: Api<K>, config: watcher::Config, strip: fn(&mut K)) -> (Store<K>, AbortOnDrop)
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let config = config.timeout(WATCH_TIMEOUT_SECS);
    let task = tokio::spawn(async move {
        watcher(api, config).default_backoff().modify(strip).reflect(writer).for_each(|_| async {}).await;
    });
    (store, AbortOnDrop(task))
}

/// The inventory watches of one member. Dropping it stops them.
pub struct MemberWatch {
    nodes: Store<Node>,
    pods: Store<Pod>,
    slices: Option<Store<ResourceSlice>>,
    claims: Option<Store<ResourceClaim>>,
    _tasks: Vec<AbortOnDrop>,
}

impl MemberWatch {
    /// Starts them on `client` (the member's watch client); `request` asks, once, whether the
    /// member serves DRA.
    pub(super) async fn start(request: &Client, client: &Client, t: Timeouts) -> Result<Self, MemberError> {
        let slices_api = Api::<ResourceSlice>::all(request.clone());
        let one = ListParams::default().limit(1);
        let dra = match tokio::time::timeout(t.observe, slices_api.list(&one)).await {
            Ok(Ok(_)) => true,
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => false,
            Ok(Err(e)) => return Err(classify(&e)),
            Err(_) => return Err(MemberError::Unreachable("the member API server did not answer in time".into())),
        };
        let mut tasks = Vec::new();
        let (nodes, task) = spawn_store(Api::<Node>::all(client.clone()), watcher::Config::default(), strip::node);
        tasks.push(task);
        let running = watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        let (pods, task) = spawn_store(Api::<Pod>::all(client.clone()), running, strip::pod);
        tasks.push(task);
        let (slices, claims) = if dra {
            let (slices, task) =
                spawn_store(Api::<ResourceSlice>::all(client.clone()), watcher::Config::default(), strip::slice);
            tasks.push(task);
            let (claims, task) =
                spawn_store(Api::<ResourceClaim>::all(client.clone()), watcher::Config::default(), strip::claim);
            tasks.push(task);
            (Some(slices), Some(claims))
        } else {
            (None, None)
        };
        Ok(Self { nodes, pods, slices, claims, _tasks: tasks })
    }

    /// What the watches hold now; waits (bounded) for their first list.
    pub async fn observation(&self, t: Timeouts) -> Result<MemberObservation, MemberError> {
        let synced = async {
            let _ = self.nodes.wait_until_ready().await;
            let _ = self.pods.wait_until_ready().await;
            if let Some(s) = &self.slices {
                let _ = s.wait_until_ready().await;
            }
            if let Some(c) = &self.claims {
                let _ = c.wait_until_ready().await;
            }
        };
        if tokio::time::timeout(t.observe, synced).await.is_err() {
            return Err(MemberError::Unreachable(format!(
                "the member's watches did not sync within {} s",
                t.observe.as_secs()
            )));
        }
        Ok(MemberObservation {
            nodes: owned(&self.nodes),
            pods: owned(&self.pods),
            slices: self.slices.as_ref().map(owned).unwrap_or_default(),
            claims: self.claims.as_ref().map(owned).unwrap_or_default(),
        })
    }
}

/// One ModelDeployment's pods in one pool of a member, as the scheduler left them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolPods {
    /// Pods on a node.
    pub scheduled: i32,
    /// Pods on no node that the scheduler has refused (`PodScheduled=False`, `Unschedulable`)
    /// since before the grace's start.
    pub refused: i32,
    /// The scheduler's latest word on one of those.
    pub message: String,
}

impl MemberWatch {
    /// The pods in `namespace` labelled `flotilla.dev/deployment=key`, per `flotilla.dev/pool`:
    /// how many are on a node, and how many the scheduler has refused since before `before`.
    /// Pods being deleted are left out.
    pub fn pool_pods(&self, namespace: &str, key: &str, before: Timestamp) -> BTreeMap<String, PoolPods> {
        let mut out: BTreeMap<String, PoolPods> = BTreeMap::new();
        for p in self.pods.state() {
            let labels = p.metadata.labels.as_ref();
            if p.metadata.namespace.as_deref() != Some(namespace)
                || p.metadata.deletion_timestamp.is_some()
                || labels.and_then(|l| l.get(labels::DEPLOYMENT)).map(String::as_str) != Some(key)
            {
                continue;
            }
            let pool = labels.and_then(|l| l.get(labels::POOL)).cloned().unwrap_or_default();
            if p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
                out.entry(pool).or_default().scheduled += 1;
                continue;
            }
            let refusal = p.status.iter().flat_map(|s| s.conditions.iter().flatten()).find(|c| {
                c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
            });
            if let Some(r) = refusal
                && r.last_transition_time.as_ref().is_some_and(|t| t.0 <= before)
            {
                let e = out.entry(pool).or_default();
                e.refused += 1;
                e.message = r.message.clone().unwrap_or_default();
            }
        }
        out
    }
}

fn owned<K: kube::Resource<DynamicType = ()> + Clone>(store: &Store<K>) -> Vec<K> {
    store.state().into_iter().map(|a| (*a).clone()).collect()
}
