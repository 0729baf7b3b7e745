//! The dirty pools of a re-plan's walk (`walk.rs`): where the last solve's free devices, at
//! the same point of the greedy pass, differ from this walk's, and which steps read each pool.
//! A step that reads a dirty pool runs again; a step that ran again moves the last solve's
//! state on by its old writes and leaves a pool clean once both agree.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::super::super::free::{Free, StepIo};

/// What one step adds to the trace.
fn entries(io: &StepIo) -> u64 {
    (io.reads.len() + io.open_reads.len() + io.writes.iter().map(|w| 1 + w.1.len()).sum::<usize>()) as u64
}

/// A step's place in the pass: tiers in order, a tier's keep steps before its fill steps,
/// deployments in solve order.
pub(super) fn position(tier_start: usize, fill: bool, i: usize) -> u64 {
    ((tier_start as u64) << 33) | (u64::from(fill) << 32) | i as u64
}

/// The pools that are dirty at this point of the walk, and which steps read each pool.
pub(super) struct DirtyPools {
    /// The dirty pools: where the last solve's free devices, at the same point of the pass,
    /// differ from this walk's, with the last solve's. Every other pool is the same in both.
    pub(super) old: HashMap<u32, Vec<u32>>,
    /// (position of the next step that reads the pool, pool), for dirty pools.
    pub(super) next: BinaryHeap<Reverse<(u64, u32)>>,
    /// Flat pool → positions (`position`) of the steps that read it, ascending.
    pub(super) readers: Vec<Vec<u64>>,
    pub(super) incremental: bool,
    /// Entries the trace holds so far (`entries`).
    pub(super) entries: u64,
}

impl DirtyPools {
    /// Nothing dirty yet; on a first solve (not `incremental`), no pool read yet either.
    pub(super) fn new(incremental: bool, pools: usize) -> Self {
        let readers = if incremental { Vec::new() } else { vec![Vec::new(); pools] };
        DirtyPools { old: HashMap::new(), next: BinaryHeap::new(), readers, incremental, entries: 0 }
    }

    /// Pool `p` is dirty from the start of the walk, the last solve having had `was`: its first
    /// reader runs.
    pub(super) fn dirty_from_start(&mut self, p: u32, was: &[u32]) {
        self.old.insert(p, was.to_vec());
        if let Some(&q) = self.readers[p as usize].first() {
            self.next.push(Reverse((q, p)));
        }
    }

    /// The dirty pools the step at `pos` reads (their next reader was this step).
    pub(super) fn pop(&mut self, pos: u64) -> Vec<u32> {
        let mut hit = Vec::new();
        while let Some(&Reverse((p, pool))) = self.next.peek() {
            if p > pos {
                break;
            }
            self.next.pop();
            if p == pos && self.old.contains_key(&pool) && !hit.contains(&pool) {
                hit.push(pool);
            }
        }
        hit
    }

    /// A step that ran (`new`; it already changed `free`), in place of the last solve's
    /// (`old`): the last solve's state moves on by `old`'s writes; pools it or `old` wrote, or
    /// that brought it here (`hit`), are dirty when the two differ, and their next reader runs.
    /// `before`: the pools `new` changed, with their values before it.
    pub(super) fn ran(
        &mut self,
        free: &Free,
        pos: u64,
        old: Option<&StepIo>,
        new: &StepIo,
        before: Vec<(u32, Vec<u32>)>,
        hit: &[u32],
    ) {
        self.entries = (self.entries + entries(new)).saturating_sub(old.map_or(0, entries));
        if !self.incremental {
            for &p in &new.reads {
                self.readers[p as usize].push(pos);
            }
            return;
        }
        // A clean pool this step changed had, in the last solve, the value it had before.
        for (p, v) in before {
            self.old.entry(p).or_insert(v);
        }
        if let Some(o) = old {
            for (p, v) in &o.writes {
                self.old.insert(*p, v.clone());
            }
            for &p in &o.reads {
                let r = &mut self.readers[p as usize];
                if let Ok(at) = r.binary_search(&pos) {
                    r.remove(at);
                }
            }
        }
        for &p in &new.reads {
            let r = &mut self.readers[p as usize];
            if let Err(at) = r.binary_search(&pos) {
                r.insert(at, pos);
            }
        }
        let touched = old.into_iter().flat_map(|o| o.writes.iter().map(|w| w.0)).chain(new.writes.iter().map(|w| w.0));
        let mut pools: Vec<u32> = touched.chain(hit.iter().copied()).collect();
        pools.sort_unstable();
        pools.dedup();
        for p in pools {
            if self.old.get(&p).is_some_and(|o| o == free.get_flat(p)) {
                self.old.remove(&p);
            }
            if self.old.contains_key(&p) {
                let r = &self.readers[p as usize];
                let at = r.partition_point(|&q| q <= pos);
                if let Some(&q) = r.get(at) {
                    self.next.push(Reverse((q, p)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Free` of one cluster with `pools` pools of two nodes of 8 free devices.
    fn free(pools: usize) -> Free {
        Free::new(vec![vec![vec![8, 8]; pools]])
    }

    fn io(reads: &[u32], writes: &[(u32, &[u32])]) -> StepIo {
        let writes = writes.iter().map(|(p, v)| (*p, v.to_vec())).collect();
        StepIo { reads: reads.to_vec(), open_reads: vec![], writes }
    }

    #[test]
    fn a_pool_dirty_from_the_start_reaches_its_first_reader_only() {
        let mut pools = DirtyPools::new(true, 0);
        pools.readers = vec![vec![position(0, false, 1), position(0, true, 3)], vec![]];
        pools.dirty_from_start(0, &[4, 8]);
        pools.dirty_from_start(1, &[0, 0]);
        assert!(pools.pop(position(0, false, 0)).is_empty(), "a step before its first reader");
        assert_eq!(pools.pop(position(0, false, 1)), vec![0]);
        assert!(pools.pop(position(0, true, 3)).is_empty(), "only the next reader is woken");
        assert!(pools.next.is_empty(), "a pool nobody reads wakes nobody");
        assert_eq!(pools.old.len(), 2);
    }

    #[test]
    fn a_step_that_ran_again_cleans_a_pool_it_left_as_before_and_wakes_the_next_reader_otherwise() {
        let mut free = free(2);
        let mut pools = DirtyPools::new(true, 0);
        let (first, later) = (position(0, false, 0), position(0, true, 1));
        pools.readers = vec![vec![first, later], vec![first, later]];
        // The last solve's step wrote [0, 8] to pool 0 and [8, 0] to pool 1; this one writes
        // [0, 8] to pool 0 again and leaves pool 1 alone (both were [8, 8] before).
        free.set_flat(0, &[0, 8]);
        let old = io(&[0, 1], &[(0, &[0, 8]), (1, &[8, 0])]);
        let new = io(&[0, 1], &[(0, &[0, 8])]);
        pools.ran(&free, first, Some(&old), &new, vec![(0, vec![8, 8])], &[]);
        assert!(!pools.old.contains_key(&0), "pool 0 is as the last solve left it");
        assert_eq!(pools.old.get(&1), Some(&vec![8, 0]), "pool 1 differs from the last solve");
        assert_eq!(pools.pop(later), vec![1], "the next reader of pool 1 runs");
        assert_eq!(pools.entries, entries(&new).saturating_sub(entries(&old)));
    }

    #[test]
    fn a_first_solve_indexes_the_readers_of_every_step() {
        let mut pools = DirtyPools::new(false, 2);
        let free = free(2);
        pools.ran(&free, position(0, false, 0), None, &io(&[1], &[]), vec![], &[]);
        pools.ran(&free, position(0, true, 0), None, &io(&[0, 1], &[(0, &[0, 8])]), vec![], &[]);
        assert_eq!(pools.readers, vec![vec![position(0, true, 0)], vec![position(0, false, 0), position(0, true, 0)]]);
        assert!(pools.old.is_empty(), "nothing is dirty on a first solve");
    }

    #[test]
    fn positions_order_tiers_then_keep_before_fill_then_deployments() {
        assert!(position(0, true, 9) < position(10, false, 10));
        assert!(position(10, false, 12) < position(10, true, 10));
        assert!(position(10, true, 10) < position(10, true, 11));
    }
}
