//! One watch per control-cluster kind. A [`Watched`] kind is a single reflector (one WATCH on
//! the control cluster's API server, one cache in memory) shared by everything that reads the
//! kind: the kind's own controller, which is triggered from the same reflector
//! (`Controller::for_shared_stream`) and looks objects up in the same store; the other
//! controllers, which read the store; and named wake-up subscriptions ([`Watched::changes`]),
//! coalesced "something of this kind changed" signals for controllers that look at every object
//! when another kind moves.

use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use kube::runtime::reflector::{self, ReflectHandle, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Resource};

use crate::member::AbortOnDrop;

/// How many object references may wait between the reflector and its controller. The
/// reflector waits when they are full (the controller's queue merges repeats of one object).
const TRIGGER_BUFFER: usize = 1024;

/// A control-cluster kind, watched once.
pub struct Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    trigger: Option<ReflectHandle<K>>,
    changed: tokio::sync::watch::Receiver<u64>,
    _task: Arc<AbortOnDrop>,
}

/// Whether the kind's own controller will run on this reflector ([`Watched::controller`]). One
/// that will not must say so: the reflector would otherwise wait for a reader that never comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnController {
    /// A controller of this kind runs on the reflector.
    Yes,
    /// Only the store and the wake-ups are used.
    No,
}

impl<K> Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    /// Starts the kind's one watch. `on_event` sees every watch event right after the store took
    /// it in (the fleet trigger's facts). The watch stops when the returned value and every
    /// controller made from it are dropped.
    pub fn start(
        api: Api<K>,
        own: OwnController,
        on_event: impl Fn(&watcher::Event<K>) + Send + Sync + 'static,
    ) -> Self {
        let writer = reflector::store::Writer::<K>::new_shared(TRIGGER_BUFFER, ());
        let store = writer.as_reader();
        // Subscribed before the watch starts, so that the first full list reaches the controller.
        let trigger = match own {
            OwnController::Yes => writer.subscribe(),
            OwnController::No => None,
        };
        let (tx, changed) = tokio::sync::watch::channel(0u64);
        let task = tokio::spawn(async move {
            watcher(api, watcher::Config::default())
                .default_backoff()
                .reflect_shared(writer)
                .for_each(|r| {
                    if let Ok(event) = r {
                        on_event(&event);
                        if matches!(
                            event,
                            watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone
                        ) {
                            tx.send_modify(|n| *n = n.wrapping_add(1));
                        }
                    }
                    async {}
                })
                .await;
        });
        Watched { store, trigger, changed, _task: Arc::new(AbortOnDrop(task)) }
    }

    /// The kind's cache (every reader shares it).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// A wake-up subscription: yields once whenever objects of this kind changed since the
    /// subscriber last looked (bursts are coalesced). `who` names the subscriber in the logs.
    pub fn changes(&self, who: &'static str) -> impl Stream<Item = ()> + Send + 'static {
        // A clone has seen what the original saw, which is nothing: every subscriber's first
        // wake-up comes with the first full list, whenever it subscribed.
        let rx = self.changed.clone();
        futures_util::stream::unfold(rx, move |mut rx| async move {
            match rx.changed().await {
                Ok(()) => Some(((), rx)),
                Err(_) => {
                    tracing::debug!(subscriber = who, "a watch ended; its wake-ups stop");
                    None
                }
            }
        })
    }

    /// The kind's controller, triggered by this reflector and reading its store (no watch of its
    /// own). Once per `Watched`, made with [`OwnController::Yes`]; otherwise (a wiring error) the
    /// controller is never triggered, and says so in the log.
    pub fn controller(&mut self) -> Controller<K> {
        let keep = self._task.clone();
        let Some(trigger) = self.trigger.take() else {
            tracing::error!(
                kind = %K::kind(&()),
                "a second controller of one kind, or one started without OwnController::Yes: it is never triggered"
            );
            return Controller::for_shared_stream(futures_util::stream::empty(), self.store.clone());
        };
        // The controller holds the watch alive as long as it runs.
        let trigger = trigger.map(move |obj| {
            let _ = &keep;
            obj
        });
        Controller::for_shared_stream(trigger, self.store.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wake_up_subscription_coalesces_a_burst_and_sees_later_changes() {
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let task = tokio::spawn(async {});
        let w: Watched<k8s_openapi::api::core::v1::ConfigMap> = Watched {
            store: reflector::store::Writer::default().as_reader(),
            trigger: None,
            changed: rx,
            _task: Arc::new(AbortOnDrop(task)),
        };
        let mut a = std::pin::pin!(w.changes("a"));
        let mut b = std::pin::pin!(w.changes("b"));
        for _ in 0..5 {
            tx.send_modify(|n| *n += 1);
        }
        // Five changes before anyone looked: one wake-up each, not five.
        assert_eq!(a.next().await, Some(()));
        assert_eq!(b.next().await, Some(()));
        let nothing = tokio::time::timeout(std::time::Duration::from_millis(50), a.next()).await;
        assert!(nothing.is_err(), "a burst is one wake-up");
        tx.send_modify(|n| *n += 1);
        assert_eq!(a.next().await, Some(()));
        drop(tx);
        assert_eq!(b.next().await, Some(()), "b still hears of the change it had not seen");
        assert_eq!(b.next().await, None, "and then that the watch ended");
    }
}
