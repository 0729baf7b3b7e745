//! The router's record of which LoRA adapters each endpoint holds, by endpoint URL and kept
//! across table swaps (like the outstanding counters), and the loads that change it. `place`
//! decides under one lock (`affinity::decide`) and, in the same breath, counts the request on the
//! endpoint and on the adapter there, reserves a slot for a load and takes the least recently used
//! idle adapters out to evict, so that two requests never fill one slot twice nor evict an adapter
//! a request is about to use. A load runs in a task of its own (a client that goes away does not
//! leave a slot reserved), once per (endpoint, adapter): later requests wait on the same outcome.
//! A failed load marks (endpoint, adapter) for `--adapter-backoff-ms`; after any failure the
//! record of that endpoint is refreshed from its `/v1/models`, which also heals a record that
//! drifted (a router restart, an engine restart behind the same address).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::HeaderValue;
use tokio::sync::watch;
use tokio::time::Instant;

use super::UpstreamClient;
use super::affinity::{self, Candidate, Choice, Held};
use super::engine::{self, EngineError};
use super::metrics::{AdapterCounters, AdapterEvent};
use super::pick::{Hold, Live};
use super::table::Route;

/// A load's outcome, as its waiters see it.
pub type Outcome = Option<Result<(), EngineError>>;

#[derive(Debug)]
enum State {
    Loaded,
    Loading(watch::Receiver<Outcome>),
}

#[derive(Debug)]
struct Slot {
    state: State,
    /// Requests placed for it here and not yet done (a slot with any is never evicted).
    in_flight: Arc<AtomicUsize>,
    /// When it was last placed for (a tick of the book), for least-recently-used eviction.
    used: u64,
}

#[derive(Debug, Default)]
struct Shelf {
    slots: HashMap<String, Slot>,
    /// Adapters whose load failed here, and until when they are not asked for again.
    failed: HashMap<String, Instant>,
}

impl Shelf {
    fn held(&self, adapter: &str) -> Held {
        match self.slots.get(adapter).map(|s| &s.state) {
            None => Held::Absent,
            Some(State::Loading(_)) => Held::Loading,
            Some(State::Loaded) => Held::Loaded,
        }
    }

    /// The adapters to unload so that one more fits in `max`, least recently used first: loaded
    /// ones the route may load (the router manages those only) with no request in flight.
    /// `None` when not enough of them are idle.
    fn victims(&self, route: &Route, adapter: &str) -> Option<Vec<String>> {
        let need = (self.slots.len() + 1).saturating_sub(route.max_adapters.max(1));
        if need == 0 {
            return Some(Vec::new());
        }
        let mut idle: Vec<(&String, u64)> = self
            .slots
            .iter()
            .filter(|(n, s)| {
                matches!(s.state, State::Loaded)
                    && s.in_flight.load(Ordering::Relaxed) == 0
                    && n.as_str() != adapter
                    && route.adapters.contains_key(n.as_str())
            })
            .map(|(n, s)| (n, s.used))
            .collect();
        if idle.len() < need {
            return None;
        }
        idle.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(b.0)));
        Some(idle.into_iter().take(need).map(|(n, _)| n.clone()).collect())
    }
}

#[derive(Debug, Default)]
struct Inner {
    shelves: HashMap<String, Shelf>,
    tick: u64,
}

/// Per endpoint URL, the adapters held and the loads running.
#[derive(Debug, Default)]
pub struct Book(Mutex<Inner>);

/// A request's hold on an adapter at an endpoint: it is not evicted there until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A load to run: unload `victims`, then load the adapter.
#[derive(Debug)]
pub struct Job {
    url: String,
    adapter: String,
    path: String,
    victims: Vec<String>,
    tx: watch::Sender<Outcome>,
}

/// Where a request for an adapter goes.
#[derive(Debug)]
pub struct Placement<'l> {
    /// The endpoint's index in its route.
    pub index: usize,
    /// Its URL.
    pub url: &'l str,
    /// Counts the request on the endpoint.
    pub hold: Hold,
    /// Keeps the adapter there.
    pub in_flight: InFlight,
    /// `None`: loaded already (a hit); else the load to wait for.
    pub wait: Option<watch::Receiver<Outcome>>,
    /// The load this request starts (the first to need it), to be spawned.
    pub job: Option<Job>,
}

/// Why no endpoint was placed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoPlace {
    /// Every endpoint not yet tried holds its maximum with no idle adapter to evict.
    Full,
    /// The endpoints not yet tried failed to load it moments ago.
    BackingOff,
    /// Every endpoint was tried.
    Exhausted,
}

/// What `place` needs to know besides the route.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// `--adapter-affinity`.
    pub affinity: bool,
    /// `--adapter-saturation`.
    pub saturation: f64,
}

impl Book {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Place a request for `adapter` (listed by `value`'s route) on an endpoint not in `tried`.
    pub fn place<'l>(
        &self,
        live: &'l Live,
        value: &str,
        adapter: &str,
        tried: &[usize],
        policy: Policy,
        now: Instant,
    ) -> Result<Placement<'l>, NoPlace> {
        let route = live.route(value).ok_or(NoPlace::Exhausted)?;
        let loads = live.loads(value, tried);
        let mut g = self.lock();
        let empty = Shelf::default();
        let cands: Vec<Candidate> = route
            .endpoints
            .iter()
            .zip(&loads)
            .map(|(e, load)| {
                let shelf = g.shelves.get(&e.url).unwrap_or(&empty);
                Candidate {
                    load: *load,
                    held: shelf.held(adapter),
                    backing_off: shelf.failed.get(adapter).is_some_and(|until| *until > now),
                    room: shelf.victims(route, adapter).is_some(),
                }
            })
            .collect();
        let Some(choice) =
            affinity::decide(&cands, policy.affinity, policy.saturation, |l| live.choose_among(value, l))
        else {
            let open = cands.iter().filter(|c| !c.load.excluded && c.held == Held::Absent);
            let (mut full, mut backing) = (false, false);
            for c in open {
                backing |= c.backing_off;
                full |= !c.backing_off && !c.room;
            }
            return Err(if full {
                NoPlace::Full
            } else if backing {
                NoPlace::BackingOff
            } else {
                NoPlace::Exhausted
            });
        };
        let index = choice.index();
        let (url, hold) = live.hold(value, index).ok_or(NoPlace::Exhausted)?;
        g.tick += 1;
        let tick = g.tick;
        let shelf = g.shelves.entry(url.to_string()).or_default();
        let mut job = None;
        if let Choice::Load(_) = choice {
            let victims = shelf.victims(route, adapter).unwrap_or_default();
            for v in &victims {
                shelf.slots.remove(v);
            }
            let (tx, rx) = watch::channel(None);
            let in_flight = Arc::new(AtomicUsize::new(0));
            shelf.slots.insert(adapter.to_string(), Slot { state: State::Loading(rx), in_flight, used: tick });
            let path = route.adapters.get(adapter).cloned().unwrap_or_default();
            job = Some(Job { url: url.to_string(), adapter: adapter.to_string(), path, victims, tx });
        }
        let Some(slot) = shelf.slots.get_mut(adapter) else { return Err(NoPlace::Exhausted) };
        slot.used = tick;
        slot.in_flight.fetch_add(1, Ordering::Relaxed);
        let in_flight = InFlight(slot.in_flight.clone());
        let wait = match &slot.state {
            State::Loaded => None,
            State::Loading(rx) => Some(rx.clone()),
        };
        Ok(Placement { index, url, hold, in_flight, wait, job })
    }

    /// The engine at `url` does not know `adapter` after all (it answered 404 to a request for
    /// it): forget it there, so that the next request loads it again.
    pub fn forget(&self, url: &str, adapter: &str) {
        let mut g = self.lock();
        let Some(shelf) = g.shelves.get_mut(url) else { return };
        if shelf.slots.get(adapter).is_some_and(|s| matches!(s.state, State::Loaded)) {
            shelf.slots.remove(adapter);
        }
    }

    /// Forget endpoints that are in no route of the table in force.
    pub fn retain(&self, urls: &HashSet<&str>) {
        self.lock().shelves.retain(|u, _| urls.contains(u.as_str()));
    }

    /// The adapters the router believes loaded at `url`, sorted.
    pub fn loaded(&self, url: &str) -> Vec<String> {
        let g = self.lock();
        let mut names: Vec<String> = g
            .shelves
            .get(url)
            .map(|s| s.slots.iter().filter(|(_, s)| matches!(s.state, State::Loaded)).map(|(n, _)| n.clone()).collect())
            .unwrap_or_default();
        names.sort_unstable();
        names
    }

    fn finish(&self, job: &Job, outcome: &Result<(), EngineError>, backoff_until: Instant) {
        let mut g = self.lock();
        let Some(shelf) = g.shelves.get_mut(&job.url) else { return };
        match outcome {
            Ok(()) => {
                if let Some(slot) = shelf.slots.get_mut(&job.adapter) {
                    slot.state = State::Loaded;
                }
                shelf.failed.remove(&job.adapter);
            }
            Err(e) => {
                shelf.slots.remove(&job.adapter);
                // An engine at its maximum is no fault of the adapter: only the refresh follows.
                if !matches!(e, EngineError::Full { .. }) {
                    shelf.failed.insert(job.adapter.clone(), backoff_until);
                }
            }
        }
    }

    /// Replace the record of loaded adapters at `url` with the engine's own list (loads running
    /// stay as they are); adapters found there and not in the record count as least recently used.
    fn adopt(&self, url: &str, names: &[String]) {
        let mut g = self.lock();
        let Some(shelf) = g.shelves.get_mut(url) else { return };
        shelf.slots.retain(|n, s| matches!(s.state, State::Loading(_)) || names.contains(n));
        for n in names {
            shelf.slots.entry(n.clone()).or_insert_with(|| Slot {
                state: State::Loaded,
                in_flight: Arc::new(AtomicUsize::new(0)),
                used: 0,
            });
        }
    }
}

/// What a load task needs besides its job.
#[derive(Clone, Debug)]
pub struct Loader {
    /// The record to update.
    pub book: Arc<Book>,
    /// The client that reaches endpoints.
    pub client: UpstreamClient,
    /// Per-adapter counters.
    pub counters: AdapterCounters,
    /// `--adapter-load-timeout-ms`.
    pub timeout: Duration,
    /// `--adapter-backoff-ms`.
    pub backoff: Duration,
}

impl Loader {
    /// Run `job`: unload its victims, load its adapter, record and announce the outcome.
    /// `auth` is the `Authorization` of the request that started it (an engine with an API key
    /// wants it on these calls too).
    pub async fn run(self, job: Job, auth: Option<HeaderValue>) {
        let auth = auth.as_ref();
        let ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let work = async {
            for v in &job.victims {
                engine::unload(&self.client, &job.url, v, auth).await?;
                self.counters.count(v, AdapterEvent::Eviction);
            }
            engine::load(&self.client, &job.url, &job.adapter, &job.path, auth).await
        };
        let outcome = tokio::time::timeout(self.timeout, work).await.unwrap_or(Err(EngineError::TimedOut { ms }));
        match &outcome {
            Ok(()) => self.counters.count(&job.adapter, AdapterEvent::Load),
            Err(e) => {
                self.counters.count(&job.adapter, AdapterEvent::LoadFailure);
                tracing::warn!(endpoint = %job.url, adapter = %job.adapter, error = %e, "adapter load failed");
            }
        }
        self.book.finish(&job, &outcome, Instant::now() + self.backoff);
        let failed = outcome.is_err();
        job.tx.send_replace(Some(outcome));
        if failed {
            // What the engine holds now is uncertain (an unload or a load may have gone half
            // way): ask it, briefly.
            let list = tokio::time::timeout(self.timeout, engine::loaded(&self.client, &job.url, auth)).await;
            if let Ok(Ok(names)) = list {
                self.book.adopt(&job.url, &names);
            }
        }
    }
}

#[cfg(test)]
#[path = "adapters_tests.rs"]
mod tests;
