//! A tier's `open` view in a re-plan: the pools once every running deployment of the tier kept
//! what it runs (`kept_ahead`). A pool's view reads only its own free devices and the kept
//! replicas on it, so a re-plan recomputes only the pools whose free devices are dirty or where
//! a changed deployment of the tier keeps (or kept) replicas, and notes where the view differs.

use std::collections::HashMap;

use super::super::free::Free;
use super::super::kept_in_tier;
use crate::devices::ReplicaShape;
use crate::snapshot::{DeploymentView, FleetSnapshot};

/// A tier's view and the replicas it keeps.
pub(super) struct TierOpen {
    pub view: Vec<Vec<Vec<u32>>>,
    /// (flat pool, position in the tier, replicas), in `kept_ahead`'s order.
    kept: Vec<(u32, usize, u32)>,
}

impl TierOpen {
    /// The view for `tier` on `free`, from `last` (the last solve's, when the tier had one):
    /// whole without it; else only `dirty` pools and those where a `changed` deployment keeps
    /// or kept replicas are computed again, and `differs` (per flat pool) marks where the view
    /// is not the last one's. `None` when no deployment of the tier both runs and spreads.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn of(
        snapshot: &FleetSnapshot,
        cluster_ix: &HashMap<&str, usize>,
        tier: &[&DeploymentView],
        changed: &[bool],
        free: &Free,
        dirty: impl Iterator<Item = u32>,
        last: Option<TierOpen>,
        differs: &mut Vec<bool>,
    ) -> Option<TierOpen> {
        let tier_changed = changed.iter().any(|&c| c);
        let kept = match &last {
            Some(_) if !tier_changed => None,
            _ => {
                let runs = |d: &&&DeploymentView| d.current.iter().any(|p| p.desired > 0);
                if !tier.iter().filter(runs).any(|d| d.spec.placement.spread.is_some()) {
                    return None;
                }
                let mut kept = Vec::new();
                match &last {
                    // The unchanged deployments keep what they kept; only the changed ones are
                    // looked at again (the list is in tier order).
                    Some(l) => {
                        let mut old = l.kept.iter().peekable();
                        for (k, d) in tier.iter().enumerate() {
                            let mine = std::iter::from_fn(|| old.next_if(|e| e.1 == k));
                            if changed[k] {
                                mine.for_each(drop);
                                kept_in_tier(snapshot, cluster_ix, std::slice::from_ref(d), |_, ci, pi, _, desired| {
                                    kept.push((free.flat(ci, pi), k, desired));
                                });
                            } else {
                                kept.extend(mine);
                            }
                        }
                    }
                    None => kept_in_tier(snapshot, cluster_ix, tier, |k, ci, pi, _, desired| {
                        kept.push((free.flat(ci, pi), k, desired));
                    }),
                }
                Some(kept)
            }
        };
        let shape = |k: usize| ReplicaShape::of(&tier[k].spec.topology);
        let Some(mut open) = last else {
            // No view to start from: every pool.
            let kept = kept.unwrap_or_default();
            let mut view = free.raw().clone();
            for &(p, k, desired) in &kept {
                let (ci, pi) = free.coords(p);
                take(&shape(k), &mut view[ci][pi], desired);
            }
            return Some(TierOpen { view, kept });
        };
        let mut again: Vec<u32> = dirty.collect();
        if let Some(kept) = kept {
            let moved =
                |list: &[(u32, usize, u32)]| list.iter().filter(|e| changed[e.1]).map(|e| e.0).collect::<Vec<_>>();
            again.extend(moved(&open.kept));
            again.extend(moved(&kept));
            open.kept = kept;
        }
        let mut fresh: HashMap<u32, Vec<u32>> = again.into_iter().map(|p| (p, free.get_flat(p).clone())).collect();
        for &(p, k, desired) in &open.kept {
            if let Some(v) = fresh.get_mut(&p) {
                take(&shape(k), v, desired);
            }
        }
        for (p, v) in fresh {
            let (ci, pi) = free.coords(p);
            if open.view[ci][pi] != v {
                differs.resize(free.len(), false);
                differs[p as usize] = true;
                open.view[ci][pi] = v;
            }
        }
        Some(open)
    }
}

/// `replicas` of `shape` out of `free`, as many as fit.
fn take(shape: &ReplicaShape, free: &mut [u32], replicas: u32) {
    for _ in 0..replicas {
        if !shape.take_in(free) {
            break;
        }
    }
}
