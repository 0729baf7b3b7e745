//! The free devices of every pool, per node, as the greedy pass consumes them. Indexed by
//! `(cluster, pool)`. While an incremental re-plan is being traced (`replan.rs`), every access
//! is noted for the step that makes it: the pools it read (a write counts as a read too), and
//! the value each pool it wrote had before, so the step's writes are what changed. A step is a
//! pure function of its deployment and the pools it read: that is what lets a re-plan reuse it.

use std::cell::RefCell;
use std::ops::{Index, IndexMut};

pub(super) struct Free {
    pools: Vec<Vec<Vec<u32>>>,
    /// Each cluster's first pool in the flat numbering of pools.
    first: Vec<u32>,
    /// Flat pool number → (cluster, pool).
    coords: Vec<(u32, u32)>,
    rec: Option<RefCell<Recorder>>,
}

/// What one step read and wrote.
#[derive(Default)]
struct Recorder {
    stamp: u32,
    /// Per flat pool: the stamp of the step that noted its read last.
    seen: Vec<u32>,
    reads: Vec<u32>,
    /// Per flat pool: the stamp of the step that noted its first write.
    wrote: Vec<u32>,
    /// Pools written, with their value before the step's first write.
    before: Vec<(u32, Vec<u32>)>,
    open_seen: Vec<u32>,
    open_reads: Vec<u32>,
}

/// The pools one step read (free devices, and the tier's `open` view), and the pools whose
/// free devices it changed with their new value.
#[derive(Clone, Debug, Default)]
pub(super) struct StepIo {
    pub reads: Vec<u32>,
    pub open_reads: Vec<u32>,
    pub writes: Vec<(u32, Vec<u32>)>,
}

impl Free {
    pub(super) fn new(pools: Vec<Vec<Vec<u32>>>) -> Self {
        let mut first = Vec::with_capacity(pools.len());
        let mut coords = Vec::new();
        for (ci, c) in pools.iter().enumerate() {
            first.push(coords.len() as u32);
            coords.extend((0..c.len()).map(|pi| (ci as u32, pi as u32)));
        }
        Self { pools, first, coords, rec: None }
    }

    /// Every pool, without noting the access (the tier's `open` view, the improvement phase:
    /// never inside a traced step).
    pub(super) fn raw(&self) -> &Vec<Vec<Vec<u32>>> {
        &self.pools
    }

    pub(super) fn raw_mut(&mut self) -> &mut Vec<Vec<Vec<u32>>> {
        &mut self.pools
    }

    /// Pools in all.
    pub(super) fn len(&self) -> usize {
        self.coords.len()
    }

    pub(super) fn flat(&self, ci: usize, pi: usize) -> u32 {
        self.first[ci] + pi as u32
    }

    pub(super) fn coords(&self, flat: u32) -> (usize, usize) {
        let (ci, pi) = self.coords[flat as usize];
        (ci as usize, pi as usize)
    }

    pub(super) fn get_flat(&self, flat: u32) -> &Vec<u32> {
        let (ci, pi) = self.coords(flat);
        &self.pools[ci][pi]
    }

    /// Sets a pool without noting it (a reused step's write).
    pub(super) fn set_flat(&mut self, flat: u32, value: &[u32]) {
        let (ci, pi) = self.coords(flat);
        let p = &mut self.pools[ci][pi];
        p.clear();
        p.extend_from_slice(value);
    }

    /// Notes accesses from now on, step by step (`begin`, `end`).
    pub(super) fn record(&mut self) {
        let n = self.coords.len();
        self.rec = Some(RefCell::new(Recorder {
            seen: vec![0; n],
            wrote: vec![0; n],
            open_seen: vec![0; n],
            ..Recorder::default()
        }));
    }

    /// Notes nothing more (the improvement phase after a traced pass).
    pub(super) fn stop(&mut self) {
        self.rec = None;
    }

    /// A step begins: nothing noted for it yet.
    pub(super) fn begin(&mut self) {
        if let Some(r) = &mut self.rec {
            let r = r.get_mut();
            r.stamp += 1;
            r.reads.clear();
            r.before.clear();
            r.open_reads.clear();
        }
    }

    /// The step ends: what it read and what it changed, and the changed pools' values before.
    pub(super) fn end(&mut self) -> (StepIo, Vec<(u32, Vec<u32>)>) {
        let Some(r) = &mut self.rec else { return (StepIo::default(), Vec::new()) };
        let r = r.get_mut();
        let mut reads = std::mem::take(&mut r.reads);
        reads.sort_unstable();
        let mut open_reads = std::mem::take(&mut r.open_reads);
        open_reads.sort_unstable();
        let mut writes: Vec<(u32, Vec<u32>)> = Vec::new();
        let mut changed: Vec<(u32, Vec<u32>)> = Vec::new();
        for (flat, before) in r.before.drain(..) {
            let (ci, pi) = self.coords[flat as usize];
            let now = &self.pools[ci as usize][pi as usize];
            if *now != before {
                writes.push((flat, now.clone()));
                changed.push((flat, before));
            }
        }
        writes.sort_unstable_by_key(|w| w.0);
        (StepIo { reads, open_reads, writes }, changed)
    }

    /// The step read pool `(ci, pi)` of the tier's `open` view.
    pub(super) fn note_open(&self, ci: usize, pi: usize) {
        if let Some(r) = &self.rec {
            let flat = self.first[ci] + pi as u32;
            let mut r = r.borrow_mut();
            let stamp = r.stamp;
            if r.open_seen[flat as usize] != stamp {
                r.open_seen[flat as usize] = stamp;
                r.open_reads.push(flat);
            }
        }
    }
}

impl Recorder {
    fn read(&mut self, flat: u32) {
        if self.seen[flat as usize] != self.stamp {
            self.seen[flat as usize] = self.stamp;
            self.reads.push(flat);
        }
    }
}

impl Index<(usize, usize)> for Free {
    type Output = Vec<u32>;

    fn index(&self, (ci, pi): (usize, usize)) -> &Vec<u32> {
        if let Some(r) = &self.rec {
            r.borrow_mut().read(self.first[ci] + pi as u32);
        }
        &self.pools[ci][pi]
    }
}

impl IndexMut<(usize, usize)> for Free {
    fn index_mut(&mut self, (ci, pi): (usize, usize)) -> &mut Vec<u32> {
        if let Some(r) = &mut self.rec {
            let r = r.get_mut();
            let flat = self.first[ci] + pi as u32;
            r.read(flat);
            if r.wrote[flat as usize] != r.stamp {
                r.wrote[flat as usize] = r.stamp;
                r.before.push((flat, self.pools[ci][pi].clone()));
            }
        }
        &mut self.pools[ci][pi]
    }
}
