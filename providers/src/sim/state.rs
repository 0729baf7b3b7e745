//! The simulated provider's bookkeeping: the log of calls it received, its acquisitions and
//! how each looks at a given time (provisioning, active, interrupted by a spot reclaim or a
//! capacity-block end, released), and the seeded hash that names nodes.

use k8s_openapi::jiff::Timestamp;

use crate::types::{AcquireRequest, Acquisition, AcquisitionState, CapacityEvent, CapacityEventKind};

/// Every call the simulated provider received, in order, so tests can assert what was (and
/// was not) asked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallLog {
    /// Regions `offerings` was called for.
    pub offerings: Vec<String>,
    /// Acquisition requests.
    pub acquire: Vec<AcquireRequest>,
    /// `(region, id)` of `describe` calls.
    pub describe: Vec<(String, String)>,
    /// `(region, id)` of `release` calls.
    pub release: Vec<(String, String)>,
    /// `(region, id, nodes)` of `resize` calls.
    pub resize: Vec<(String, String, u32)>,
}

impl CallLog {
    /// Every region any call named.
    pub fn regions(&self) -> Vec<String> {
        let mut out: Vec<String> = self.offerings.clone();
        out.extend(self.acquire.iter().map(|r| r.region.clone()));
        out.extend(self.describe.iter().chain(&self.release).map(|(r, _)| r.clone()));
        out.extend(self.resize.iter().map(|(r, _, _)| r.clone()));
        out.sort();
        out.dedup();
        out
    }

    /// Calls of any kind.
    pub fn total(&self) -> usize {
        self.offerings.len() + self.acquire.len() + self.describe.len() + self.release.len() + self.resize.len()
    }
}

#[derive(Clone, Debug)]
pub(super) struct SimAcquisition {
    pub view: Acquisition,
    pub ready_at: Timestamp,
    pub ends_at: Option<Timestamp>,
    pub interrupt_at: Option<Timestamp>,
    pub released: bool,
    /// The request's `flotilla.dev/claim` label.
    pub claim: Option<String>,
}

impl SimAcquisition {
    /// Whether, at `now`, it still holds its nodes.
    pub fn holds(&self, now: Timestamp) -> bool {
        !self.released && self.lost_at(now).is_none()
    }

    fn lost_at(&self, now: Timestamp) -> Option<(Timestamp, CapacityEventKind)> {
        let spot = self.interrupt_at.filter(|at| *at <= now).map(|at| (at, CapacityEventKind::SpotInterruption));
        let end = self.ends_at.filter(|at| *at <= now).map(|at| (at, CapacityEventKind::CapacityBlockEnd));
        match (spot, end) {
            (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    pub fn at(&self, now: Timestamp) -> Acquisition {
        let mut view = self.view.clone();
        if self.released {
            view.state = AcquisitionState::Released;
            view.nodes.clear();
            view.message = "released".to_string();
        } else if let Some((at, kind)) = self.lost_at(now) {
            view.state = AcquisitionState::Interrupted;
            view.events.push(CapacityEvent { kind, at, nodes: view.nodes.iter().map(|n| n.name.clone()).collect() });
            view.message = format!("{} at {at}: the provider took {} node(s) back", kind.as_str(), view.nodes_granted);
        } else if now >= self.ready_at {
            view.state = AcquisitionState::Active;
            view.nodes.iter_mut().for_each(|n| n.ready = true);
            view.message = format!("{} node(s) ready", view.nodes_granted);
        } else {
            view.message = format!("{} node(s) provisioning, ready at {}", view.nodes_granted, self.ready_at);
        }
        view
    }
}

/// SplitMix64: a tiny, well-mixed hash for seed-derived names and delays.
pub(super) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

pub(super) fn hash(seed: u64, text: &str, index: u64) -> u64 {
    text.bytes().fold(mix(seed ^ index), |h, b| mix(h ^ u64::from(b)))
}
