//! Choosing an endpoint: the one with the fewest requests outstanding per unit of weight; among
//! equals, smooth weighted round robin (equal weights alternate, 3:1 weights give 3:1). `choose`
//! is the pure rule; `Live` is the table in force bound to the outstanding-request counters,
//! which outlive table swaps so that a rebuilt table still knows which endpoints are busy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::table::{Route, Table};

/// One candidate as `choose` sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    /// Share of traffic (above zero).
    pub weight: f64,
    /// Requests outstanding now.
    pub outstanding: usize,
    /// Already tried for this request.
    pub excluded: bool,
}

/// The candidate to use, if any is left: least `outstanding / weight`, ties by smooth weighted
/// round robin over `current` (one running credit per candidate, kept between calls).
pub fn choose(loads: &[Load], current: &mut [f64]) -> Option<usize> {
    let usable = |l: &Load| !l.excluded && l.weight > 0.0;
    let best =
        loads.iter().filter(|l| usable(l)).map(|l| l.outstanding as f64 / l.weight).min_by(|a, b| a.total_cmp(b))?;
    let tied = |l: &Load| usable(l) && (l.outstanding as f64 / l.weight - best).abs() <= best.abs() * 1e-9;
    let mut total = 0.0;
    let mut pick: Option<(usize, f64)> = None;
    for (i, l) in loads.iter().enumerate().filter(|(_, l)| tied(l)) {
        let Some(c) = current.get_mut(i) else { continue };
        *c += l.weight;
        total += l.weight;
        if pick.is_none_or(|(_, best)| *c > best) {
            pick = Some((i, *c));
        }
    }
    let (p, _) = pick?;
    if let Some(c) = current.get_mut(p) {
        *c -= total;
    }
    Some(p)
}

/// Counters of requests outstanding per endpoint URL, kept across table swaps.
#[derive(Debug, Default)]
pub struct Outstanding(Mutex<HashMap<String, Arc<AtomicUsize>>>);

impl Outstanding {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<AtomicUsize>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A request's hold on an endpoint: counted as outstanding until dropped.
#[derive(Debug)]
pub struct Hold(Arc<AtomicUsize>);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct LiveRoute {
    counters: Vec<Arc<AtomicUsize>>,
    current: Mutex<Vec<f64>>,
}

/// The table in force, with each endpoint's counter.
#[derive(Debug, Default)]
pub struct Live {
    /// The table.
    pub table: Table,
    routes: HashMap<String, LiveRoute>,
}

impl Live {
    /// Bind `table` to the counters in `out` (new endpoints get new ones; gone ones are forgotten
    /// once their last request ends).
    pub fn bind(table: Table, out: &Outstanding) -> Self {
        let mut map = out.lock();
        let mut kept: HashMap<String, Arc<AtomicUsize>> = HashMap::new();
        let mut routes = HashMap::new();
        for (value, r) in &table.routes {
            let counters: Vec<Arc<AtomicUsize>> = r
                .endpoints
                .iter()
                .map(|e| {
                    let c = map.get(&e.url).cloned().unwrap_or_default();
                    kept.insert(e.url.clone(), c.clone());
                    c
                })
                .collect();
            let current = Mutex::new(vec![0.0; counters.len()]);
            routes.insert(value.clone(), LiveRoute { counters, current });
        }
        *map = kept;
        drop(map);
        Live { table, routes }
    }

    /// The route for a header value.
    pub fn route(&self, value: &str) -> Option<&Route> {
        self.table.routes.get(value)
    }

    /// Choose an endpoint of `value`'s route other than those in `tried` (indices); the
    /// endpoint's index, URL and the hold that counts the request.
    pub fn pick(&self, value: &str, tried: &[usize]) -> Option<(usize, &str, Hold)> {
        let loads = self.loads(value, tried);
        let i = self.choose_among(value, &loads)?;
        let (url, hold) = self.hold(value, i)?;
        Some((i, url, hold))
    }

    /// Each endpoint of `value`'s route as `choose` sees it, those in `tried` excluded.
    pub fn loads(&self, value: &str, tried: &[usize]) -> Vec<Load> {
        let (Some(route), Some(live)) = (self.table.routes.get(value), self.routes.get(value)) else {
            return Vec::new();
        };
        route
            .endpoints
            .iter()
            .zip(&live.counters)
            .enumerate()
            .map(|(i, (e, c))| Load {
                weight: e.weight,
                outstanding: c.load(Ordering::Relaxed),
                excluded: tried.contains(&i),
            })
            .collect()
    }

    /// `choose` over `loads` (as `loads` gave them, some perhaps excluded since) with the
    /// route's round-robin credits.
    pub fn choose_among(&self, value: &str, loads: &[Load]) -> Option<usize> {
        let live = self.routes.get(value)?;
        let mut current = live.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.len() != loads.len() {
            return None;
        }
        choose(loads, &mut current)
    }

    /// Count a request on endpoint `i` of `value`'s route: its URL and the hold.
    pub fn hold(&self, value: &str, i: usize) -> Option<(&str, Hold)> {
        let route = self.table.routes.get(value)?;
        let counter = self.routes.get(value)?.counters.get(i)?.clone();
        let url = route.endpoints.get(i)?.url.as_str();
        counter.fetch_add(1, Ordering::Relaxed);
        Some((url, Hold(counter)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(weights: &[f64]) -> Vec<Load> {
        weights.iter().map(|w| Load { weight: *w, outstanding: 0, excluded: false }).collect()
    }

    fn sequence(loads: &[Load], n: usize) -> Vec<usize> {
        let mut current = vec![0.0; loads.len()];
        (0..n).filter_map(|_| choose(loads, &mut current)).collect()
    }

    #[test]
    fn equal_idle_endpoints_alternate() {
        assert_eq!(sequence(&idle(&[1.0, 1.0, 1.0]), 6), [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn idle_endpoints_share_by_weight() {
        let s = sequence(&idle(&[3.0, 1.0]), 8);
        assert_eq!(s.iter().filter(|i| **i == 0).count(), 6, "{s:?}");
        assert_eq!(s.iter().filter(|i| **i == 1).count(), 2, "{s:?}");
    }

    #[test]
    fn the_least_outstanding_per_weight_wins() {
        let mut loads = idle(&[1.0, 1.0, 2.0]);
        loads[0].outstanding = 2;
        loads[1].outstanding = 1;
        loads[2].outstanding = 3; // 1.5 per unit of weight
        assert_eq!(sequence(&loads, 3), [1, 1, 1]);
    }

    #[test]
    fn excluded_and_weightless_endpoints_are_never_chosen() {
        let mut loads = idle(&[1.0, 0.0, 1.0]);
        loads[0].excluded = true;
        assert_eq!(sequence(&loads, 4), [2, 2, 2, 2]);
        loads[2].excluded = true;
        assert_eq!(sequence(&loads, 1), Vec::<usize>::new());
        assert_eq!(choose(&[], &mut []), None);
    }

    #[test]
    fn holds_count_until_dropped_and_survive_a_rebuild() {
        let out = Outstanding::default();
        let t = Table::default().with("a/x", Route::new("m", "a/x", &[("http://e1", 1.0), ("http://e2", 1.0)]));
        let live = Live::bind(t.clone(), &out);
        let (i, _, hold) = live.pick("a/x", &[]).unwrap();
        // The rebuilt table still sees the first endpoint busy: the next pick is the other one.
        let live = Live::bind(t, &out);
        let (j, _, _h2) = live.pick("a/x", &[]).unwrap();
        assert_ne!(i, j);
        drop(hold);
        assert!(live.pick("a/x", &[0, 1]).is_none());
        assert!(live.pick("a/unknown", &[]).is_none());
    }
}
