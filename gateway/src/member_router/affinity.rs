//! Which endpoint serves a request for a LoRA adapter. With affinity, the least-loaded endpoint
//! that has the adapter loaded serves it unless it is saturated: `saturation` or more requests
//! outstanding per unit of weight beyond the least-loaded endpoint of the route; else a load of
//! it already running is joined; else the least-loaded endpoint that may load it (not backing off
//! from a failed load of it, and with a free slot or an idle adapter to evict) loads it.
//! Without affinity the endpoint is the one a base-model request would get, loading the adapter
//! there when needed. `decide` is the pure rule; `choose` (fewest outstanding per weight, ties by
//! round robin) is passed in, so that the route's round-robin credits are used.

use super::pick::Load;

/// Whether an endpoint holds the adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Not loaded, not loading.
    Absent,
    /// A load is running: a request joins it.
    Loading,
    /// Loaded.
    Loaded,
}

/// One endpoint as `decide` sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Weight, requests outstanding, already tried for this request.
    pub load: Load,
    /// Whether it holds the adapter.
    pub held: Held,
    /// A load of the adapter failed here recently: it is not asked again yet.
    pub backing_off: bool,
    /// It can take one more adapter: a free slot, or enough idle adapters to evict.
    pub room: bool,
}

impl Candidate {
    fn usable(&self) -> bool {
        !self.load.excluded && self.load.weight > 0.0
    }

    fn can_load(&self) -> bool {
        self.usable() && self.held == Held::Absent && !self.backing_off && self.room
    }

    fn ratio(&self) -> f64 {
        self.load.outstanding as f64 / self.load.weight
    }
}

/// What to do with the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Send it to endpoint `i`, which has the adapter loaded.
    Hit(usize),
    /// Wait for the load running on endpoint `i`, then send it there.
    Join(usize),
    /// Load the adapter on endpoint `i`, then send it there.
    Load(usize),
}

impl Choice {
    /// The endpoint.
    pub fn index(self) -> usize {
        match self {
            Choice::Hit(i) | Choice::Join(i) | Choice::Load(i) => i,
        }
    }
}

fn only(cands: &[Candidate], keep: impl Fn(&Candidate) -> bool) -> Vec<Load> {
    cands.iter().map(|c| Load { excluded: !keep(c), ..c.load }).collect()
}

fn choice(cands: &[Candidate], i: usize) -> Option<Choice> {
    Some(match cands.get(i)?.held {
        Held::Loaded => Choice::Hit(i),
        Held::Loading => Choice::Join(i),
        Held::Absent => Choice::Load(i),
    })
}

/// The endpoint for the request, if any can serve it.
pub fn decide(
    cands: &[Candidate],
    affinity: bool,
    saturation: f64,
    mut choose: impl FnMut(&[Load]) -> Option<usize>,
) -> Option<Choice> {
    if !affinity {
        let i = choose(&only(cands, |c| c.usable() && (c.held != Held::Absent || c.can_load())))?;
        return choice(cands, i);
    }
    let least = cands.iter().filter(|c| c.usable()).map(Candidate::ratio).min_by(f64::total_cmp)?;
    let with = |held: Held| only(cands, move |c| c.usable() && c.held == held);
    let warm =
        cands.iter().filter(|c| c.usable() && c.held == Held::Loaded).map(Candidate::ratio).min_by(f64::total_cmp);
    if warm.is_some_and(|w| w < least + saturation) {
        return choice(cands, choose(&with(Held::Loaded))?);
    }
    // A load already running ends no later than a new one would: join it, however busy its
    // endpoint looks (its requests are waiting for the load, not for the engine).
    if let Some(i) = choose(&with(Held::Loading)) {
        return choice(cands, i);
    }
    match choose(&only(cands, Candidate::can_load)) {
        Some(i) => choice(cands, i),
        // Nowhere else to load it: a saturated holder still beats no answer.
        None => choice(cands, choose(&with(Held::Loaded))?),
    }
}

#[cfg(test)]
mod tests {
    use super::super::pick::choose;
    use super::*;

    fn cand(outstanding: usize, held: Held) -> Candidate {
        Candidate { load: Load { weight: 1.0, outstanding, excluded: false }, held, backing_off: false, room: true }
    }

    fn run(cands: &[Candidate], affinity: bool, n: usize) -> Vec<Option<Choice>> {
        let mut current = vec![0.0; cands.len()];
        (0..n).map(|_| decide(cands, affinity, 4.0, |l| choose(l, &mut current))).collect()
    }

    #[test]
    fn a_holder_wins_over_idler_endpoints_until_saturated() {
        let mut c = [cand(3, Held::Loaded), cand(0, Held::Absent), cand(1, Held::Absent)];
        assert_eq!(run(&c, true, 2), [Some(Choice::Hit(0)); 2], "3 beyond the least is not saturated at 4");
        c[0].load.outstanding = 4;
        assert_eq!(run(&c, true, 1), [Some(Choice::Load(1))], "saturated: the least-loaded loads it");
        c[0].held = Held::Loading;
        assert_eq!(run(&c, true, 1), [Some(Choice::Join(0))], "a running load is joined, however busy");
        c[1].held = Held::Loaded;
        c[1].load.outstanding = 2;
        assert_eq!(run(&c, true, 1), [Some(Choice::Hit(1))], "loaded beats loading");
    }

    #[test]
    fn among_holders_the_least_loaded_serves() {
        let c = [cand(5, Held::Loaded), cand(2, Held::Loaded), cand(0, Held::Absent)];
        assert_eq!(run(&c, true, 1), [Some(Choice::Hit(1))]);
    }

    #[test]
    fn nobody_holding_it_loads_it_on_the_least_loaded_that_may() {
        let mut c = [cand(0, Held::Absent), cand(1, Held::Absent), cand(2, Held::Absent)];
        c[0].backing_off = true;
        assert_eq!(run(&c, true, 1), [Some(Choice::Load(1))], "a recent failure here: not asked again");
        c[1].room = false;
        assert_eq!(run(&c, true, 1), [Some(Choice::Load(2))], "no slot and nothing idle to evict");
        c[2].load.excluded = true;
        assert_eq!(run(&c, true, 1), [None], "already tried");
    }

    #[test]
    fn a_saturated_holder_serves_when_nothing_else_may_load() {
        let mut c = [cand(9, Held::Loaded), cand(0, Held::Absent)];
        c[1].room = false;
        assert_eq!(run(&c, true, 1), [Some(Choice::Hit(0))]);
    }

    #[test]
    fn without_affinity_the_request_lands_as_a_base_request_would() {
        let c = [cand(0, Held::Absent), cand(0, Held::Absent), cand(0, Held::Loaded)];
        let got = run(&c, false, 3);
        assert_eq!(got, [Some(Choice::Load(0)), Some(Choice::Load(1)), Some(Choice::Hit(2))], "round robin");
        let mut c = c;
        c[0].load.outstanding = 1;
        c[2].load.outstanding = 1;
        assert_eq!(run(&c, false, 1), [Some(Choice::Load(1))], "least outstanding, loaded or not");
        c[1].room = false;
        c[1].load.outstanding = 2;
        assert_eq!(run(&c, false, 2), [Some(Choice::Load(0)), Some(Choice::Hit(2))]);
    }
}
