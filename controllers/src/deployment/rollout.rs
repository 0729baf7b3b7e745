//! Make-before-break. Given what the plan wants per (cluster, pool) and what members run now
//! (replicas asked for, replicas ready), decide what to ask for now: increases at once;
//! decreases (a move away, a scale-in) only as far as the ready replicas that remain keep
//! serving capacity at `min(desired, ready before)`. Not-ready replicas go first. Where the
//! deployment's ModelCache is not Ready, no new replicas start (`gate_on_cache`). Pure.
//!
//! "Ready" here means *serving*: ready replicas of any template. A spec change (a new image or
//! args) rolls a member's pods; while it does, its old replicas are not Ready in status (they
//! run the old spec, see `members/readiness.rs`) but they still serve, so they still hold the
//! floor: a rollout never makes this step remove replicas anywhere.

use std::collections::BTreeMap;

/// A (cluster, pool) key.
pub type Key = (String, String);

/// What a member runs for one key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Running {
    /// Replicas asked for.
    pub applied: i32,
    /// Replicas ready, on any template: they serve (make-before-break counts these).
    pub ready: i32,
    /// Replicas ready on the current template (what status reports as ready).
    pub current: i32,
}

/// The replica count to apply per key. Keys absent from the result are left alone (their
/// cluster could not be observed); keys at 0 are to be removed.
pub fn step(target: &BTreeMap<Key, i32>, running: &BTreeMap<Key, Running>, desired_total: i32) -> BTreeMap<Key, i32> {
    let ready_before: i32 = running.values().map(|r| r.ready).sum();
    let floor = desired_total.min(ready_before);
    let mut next: BTreeMap<Key, i32> = BTreeMap::new();
    for (k, t) in target {
        let cur = running.get(k).copied().unwrap_or_default();
        next.insert(k.clone(), (*t).max(0).max(if cur.applied > *t { cur.applied } else { 0 }));
    }
    for (k, r) in running {
        next.entry(k.clone()).or_insert(r.applied);
    }
    let guaranteed =
        |n: &BTreeMap<Key, i32>| -> i32 { n.iter().map(|(k, v)| running.get(k).map_or(0, |r| r.ready.min(*v))).sum() };
    let mut surplus = guaranteed(&next) - floor;
    let keys: Vec<Key> = next.keys().cloned().collect();
    for k in keys {
        let want = target.get(&k).copied().unwrap_or(0).max(0);
        let Some(v) = next.get_mut(&k) else { continue };
        if *v <= want {
            continue;
        }
        let ready = running.get(&k).map_or(0, |r| r.ready);
        let free = (*v - ready.min(*v)).min(*v - want);
        *v -= free;
        let drop = (*v - want).min(surplus.max(0));
        *v -= drop;
        surplus -= drop;
    }
    next
}

/// Holds replicas back where the deployment's ModelCache is not Ready: in such a cluster no
/// more replicas start than already run there (nothing running is torn down). Returns the
/// clusters where replicas were held back.
pub fn gate_on_cache(
    next: &mut BTreeMap<Key, i32>,
    running: &BTreeMap<Key, Running>,
    cache_ready: impl Fn(&str) -> bool,
) -> std::collections::BTreeSet<String> {
    let mut held = std::collections::BTreeSet::new();
    for (k, v) in next.iter_mut() {
        let now = running.get(k).map_or(0, |r| r.applied);
        if *v > now && !cache_ready(&k.0) {
            *v = now;
            held.insert(k.0.clone());
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_start_only_where_the_cache_is_ready() {
        let mut next = tgt(&[("a", 2), ("b", 3), ("c", 1)]);
        let held = gate_on_cache(&mut next, &run(&[("b", 1, 1)]), |c| c == "a");
        assert_eq!(next, tgt(&[("a", 2), ("b", 1), ("c", 0)]), "b keeps what runs, c starts nothing");
        assert_eq!(held.into_iter().collect::<Vec<_>>(), ["b", "c"]);
        // Twin: Ready everywhere changes nothing.
        let mut next = tgt(&[("a", 2), ("b", 3)]);
        assert!(gate_on_cache(&mut next, &BTreeMap::new(), |_| true).is_empty());
        assert_eq!(next, tgt(&[("a", 2), ("b", 3)]));
    }

    fn k(c: &str) -> Key {
        (c.to_string(), "p".to_string())
    }

    fn run(items: &[(&str, i32, i32)]) -> BTreeMap<Key, Running> {
        items.iter().map(|(c, a, r)| (k(c), Running { applied: *a, ready: *r, current: *r })).collect()
    }

    fn tgt(items: &[(&str, i32)]) -> BTreeMap<Key, i32> {
        items.iter().map(|(c, n)| (k(c), *n)).collect()
    }

    #[test]
    fn a_move_keeps_the_old_until_the_new_is_ready() {
        // 4 ready on a; the plan moves all 4 to b.
        let t = tgt(&[("b", 4)]);
        let step1 = step(&t, &run(&[("a", 4, 4)]), 4);
        assert_eq!(step1, tgt(&[("a", 4), ("b", 4)]), "b scales up, a stays");
        // b has 2 ready: a may drop 2.
        let step2 = step(&t, &run(&[("a", 4, 4), ("b", 4, 2)]), 4);
        assert_eq!(step2, tgt(&[("a", 2), ("b", 4)]));
        // b all ready: a goes to 0.
        let step3 = step(&t, &run(&[("a", 2, 2), ("b", 4, 4)]), 4);
        assert_eq!(step3, tgt(&[("a", 0), ("b", 4)]));
    }

    #[test]
    fn without_make_before_break_the_twin_would_drop_at_once() {
        // The same move with nothing ready before: nothing to protect, a is removed at once.
        let t = tgt(&[("b", 4)]);
        assert_eq!(step(&t, &run(&[("a", 4, 0)]), 4), tgt(&[("a", 0), ("b", 4)]));
    }

    #[test]
    fn a_rollout_in_progress_tears_nothing_down() {
        // A move from a to b while a rolls a new image: a's 4 replicas serve but none is on the
        // current spec yet. The floor counts serving replicas, so a keeps all 4 until b is ready.
        let t = tgt(&[("b", 4)]);
        let rolling = |applied, ready| Running { applied, ready, current: 0 };
        let running = BTreeMap::from([(k("a"), rolling(4, 4)), (k("b"), rolling(4, 0))]);
        assert_eq!(step(&t, &running, 4), tgt(&[("a", 4), ("b", 4)]));
        // And a rollout in place changes no replica count.
        let t = tgt(&[("a", 4)]);
        assert_eq!(step(&t, &BTreeMap::from([(k("a"), rolling(4, 4))]), 4), tgt(&[("a", 4)]));
    }

    #[test]
    fn scale_in_drops_not_ready_first_then_ready_down_to_target() {
        let t = tgt(&[("a", 2)]);
        assert_eq!(step(&t, &run(&[("a", 5, 3)]), 2), tgt(&[("a", 2)]));
    }

    #[test]
    fn unobserved_keys_are_kept_as_they_are() {
        let t = tgt(&[("a", 2)]);
        let next = step(&t, &run(&[("a", 2, 2), ("c", 3, 3)]), 2);
        assert_eq!(next.get(&k("c")), Some(&0), "c is not in the plan: removed once a holds the floor");
        let next = step(&t, &run(&[("a", 2, 0), ("c", 3, 3)]), 2);
        assert_eq!(next.get(&k("c")), Some(&2), "a not ready yet: c keeps 2 (the floor)");
    }
}
