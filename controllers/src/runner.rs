//! One way to run a controller: the reconcile, a per-object back-off after failures (keyed by
//! the object's reference, so that two namespaces' objects of one name never share one), the
//! failure metric, and the log line. Every kind's controller runs through [`run`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use kube::Resource;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use crate::{Error, metrics};

/// What a controller is, for its back-off, logs and metrics.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    /// The kind's name in logs.
    pub name: &'static str,
    /// Its label in `flotilla_reconcile_*` (none: not counted).
    pub metric: Option<metrics::Kind>,
    /// The longest wait after repeated failures.
    pub cap: Duration,
}

/// Consecutive failures per object.
#[derive(Debug, Default)]
pub struct Failures(Mutex<HashMap<String, u32>>);

impl Failures {
    fn forget(&self, key: &str) {
        if let Ok(mut f) = self.0.lock() {
            f.remove(key);
        }
    }

    fn count(&self, key: &str) -> u32 {
        self.0
            .lock()
            .map(|mut f| {
                let n = f.entry(key.to_string()).or_insert(0);
                *n = n.saturating_add(1);
                *n
            })
            .unwrap_or(1)
    }
}

/// The back-off key of an object: its kind, namespace and name.
fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    ObjectRef::from_obj(obj).to_string()
}

/// After a failed reconcile: logs it (a stale read at debug, the rest as warnings) and says when
/// to look again (soon after a stale read; otherwise backing off per object: 1 s doubling to
/// `cap`, at most 5 minutes).
pub fn retry_after(failures: &Failures, kind: &str, key: &str, err: &Error, cap: Duration) -> Duration {
    if let Error::Stale(why) = err {
        tracing::debug!(kind, object = %key, "{why}; looking again");
        return Duration::from_millis(500);
    }
    let n = failures.count(key);
    let wait = Duration::from_millis(500u64.saturating_mul(1 << n.min(9))).min(Duration::from_secs(300)).min(cap);
    tracing::warn!(kind, object = %key, "reconcile failed ({err}); retrying in {wait:?}");
    wait
}

/// Runs `controller` with `reconcile` until the controller's shutdown signal: a success forgets
/// the object's failures, a failure is counted and retried per [`retry_after`].
pub async fn run<K, C, R, Fut>(
    controller: Controller<K>,
    kind: Kind,
    metrics: Option<metrics::Metrics>,
    reconcile: R,
    ctx: Arc<C>,
) where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    let failures = Arc::new(Failures::default());
    let on_success = failures.clone();
    controller
        .run(
            move |obj, ctx| {
                let key = key(obj.as_ref());
                let failures = on_success.clone();
                let fut = reconcile(obj, ctx);
                async move {
                    let r = fut.await;
                    if r.is_ok() {
                        failures.forget(&key);
                    }
                    r
                }
            },
            move |obj, err, _ctx| {
                let wait = retry_after(&failures, kind.name, &key(obj.as_ref()), err, kind.cap);
                if let (Some(m), Some(k)) = (&metrics, kind.metric) {
                    m.reconciled(k, metrics::Outcome::Error, Duration::ZERO);
                }
                Action::requeue(wait)
            },
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(kind = kind.name, "controller: {e}");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_apis::ModelDeployment;

    fn md(ns: &str, name: &str) -> ModelDeployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"name": "m", "source": "hf://o/m"}, "replicas": 1, "engine": {"image": "e"},
                     "topology": {"type": "Standalone", "devicesPerReplica": 1},
                     "devices": {"alternatives": [{"class": "h100"}]}}}))
        .unwrap()
    }

    #[test]
    fn back_off_grows_per_object_and_a_stale_read_is_not_a_failure() {
        let failures = Failures::default();
        let stale = Error::Stale("x".into());
        assert_eq!(
            retry_after(&failures, "ModelDeployment", "ml/a", &stale, Duration::MAX),
            Duration::from_millis(500)
        );
        assert!(failures.0.lock().unwrap().is_empty(), "a stale read is not a failure");
        let hard = Error::Finalizer("x".into());
        assert_eq!(retry_after(&failures, "ModelDeployment", "ml/a", &hard, Duration::MAX), Duration::from_secs(1));
        assert_eq!(retry_after(&failures, "ModelDeployment", "ml/a", &hard, Duration::MAX), Duration::from_secs(2));
        assert_eq!(
            retry_after(&failures, "CapacityClaim", "ml/b", &hard, Duration::from_millis(700)),
            Duration::from_millis(700),
            "capped"
        );
        for _ in 0..20 {
            retry_after(&failures, "ModelDeployment", "ml/a", &hard, Duration::MAX);
        }
        assert_eq!(
            retry_after(&failures, "ModelDeployment", "ml/a", &hard, Duration::MAX),
            Duration::from_secs(256),
            "at most 2^9 × 0.5 s"
        );
        failures.forget("ml/a");
        assert_eq!(retry_after(&failures, "ModelDeployment", "ml/a", &hard, Duration::MAX), Duration::from_secs(1));
    }

    #[test]
    fn two_namespaces_objects_of_one_name_back_off_apart() {
        let (a, b) = (key(&md("team-a", "chat")), key(&md("team-b", "chat")));
        assert_ne!(a, b);
        assert!(a.contains("team-a") && a.contains("chat"), "{a}");
        let failures = Failures::default();
        let hard = Error::Finalizer("x".into());
        for _ in 0..5 {
            retry_after(&failures, "ModelDeployment", &a, &hard, Duration::MAX);
        }
        assert_eq!(
            retry_after(&failures, "ModelDeployment", &b, &hard, Duration::MAX),
            Duration::from_secs(1),
            "team-b's chat starts its own back-off"
        );
    }
}
