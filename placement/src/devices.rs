//! Device matching and fit. Which classes each device alternative accepts (class name and CEL
//! selectors, compiled once per expression and evaluated once per class), the pods one replica
//! needs (devices each, each on one node), and whether a pool's free devices can hold them.

use std::collections::HashMap;

use flotilla_apis::cel::{CelValue, Selector, SelectorEngine, SelectorError};
use flotilla_apis::deployment::{DeviceAlternative, Topology, TopologyType};

use crate::plan::Reason;
use crate::snapshot::ClassView;

/// Result of matching one alternative against one class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClassMatch {
    /// Every selector is true.
    Match,
    /// Some selector is false on the class's device.
    NoMatch(String),
    /// The alternative names another class (or the class is not defined): the least telling
    /// refusal, reported only when no pool got further.
    OtherClass(String),
    /// The class's device cannot be handed to selectors (the class itself is invalid, e.g. a
    /// capacity no Quantity holds): the class's `Ready` condition says so too.
    ClassInvalid(String),
    /// A selector failed to evaluate (other than a missing attribute) or returned a non-bool.
    Error(String),
}

/// Caches compiled selectors and device values for one solve.
pub struct DeviceMatcher<'s> {
    engine: SelectorEngine,
    classes: &'s std::collections::BTreeMap<String, ClassView>,
    selectors: HashMap<String, Result<Selector, SelectorError>>,
    devices: HashMap<String, Result<CelValue, SelectorError>>,
    /// Per (selector, class): `None` when true, else the words of the refusal. Kept with the
    /// verdict so a refusal reads the same whichever deployment met it first.
    verdicts: HashMap<(String, String), Option<String>>,
}

impl<'s> DeviceMatcher<'s> {
    /// A matcher over the snapshot's classes.
    pub fn new(classes: &'s std::collections::BTreeMap<String, ClassView>) -> Self {
        Self {
            engine: SelectorEngine::new(),
            classes,
            selectors: HashMap::new(),
            devices: HashMap::new(),
            verdicts: HashMap::new(),
        }
    }

    /// A matcher over `classes` that starts from what another one over the same classes
    /// compiled and judged (`into_memo`).
    pub(crate) fn resume(classes: &'s std::collections::BTreeMap<String, ClassView>, memo: MatcherMemo) -> Self {
        let MatcherMemo { engine, selectors, devices, verdicts } = memo;
        Self { engine, classes, selectors, devices, verdicts }
    }

    /// What this matcher compiled and judged: a pure function of the expressions and the
    /// classes, so another matcher over the same classes may start from it.
    pub(crate) fn into_memo(self) -> MatcherMemo {
        let Self { engine, selectors, devices, verdicts, .. } = self;
        MatcherMemo { engine, selectors, devices, verdicts }
    }

    /// The first selector of `alternatives` that can never run (does not compile, nests too
    /// deep, costs too much, names an unknown variable): its field and the error.
    pub fn invalid_selector(&mut self, alternatives: &[DeviceAlternative]) -> Option<(String, String)> {
        for (i, alt) in alternatives.iter().enumerate() {
            for (j, expr) in alt.selectors.iter().enumerate() {
                let engine = &self.engine;
                let compiled = self.selectors.entry(expr.0.clone()).or_insert_with(|| engine.compile(&expr.0));
                if let Err(e) = compiled {
                    return Some((format!("spec.devices.alternatives[{i}].selectors[{j}]"), e.to_string()));
                }
            }
        }
        None
    }

    /// Matches an alternative against a class.
    pub fn matches(&mut self, alt: &DeviceAlternative, class: &str) -> ClassMatch {
        if let Some(want) = &alt.class
            && want != class
        {
            return ClassMatch::OtherClass(format!("class {class} is not {want}"));
        }
        let Some(view) = self.classes.get(class) else {
            return ClassMatch::OtherClass(format!("class {class} is not defined"));
        };
        for expr in &alt.selectors {
            let key = (expr.0.clone(), class.to_string());
            if let Some(verdict) = self.verdicts.get(&key) {
                if let Some(words) = verdict {
                    return ClassMatch::NoMatch(words.clone());
                }
                continue;
            }
            let engine = &self.engine;
            let selector = self.selectors.entry(expr.0.clone()).or_insert_with(|| engine.compile(&expr.0));
            let selector = match selector {
                Ok(s) => s,
                Err(e) => return ClassMatch::Error(e.to_string()),
            };
            let device = self.devices.entry(class.to_string()).or_insert_with(|| engine.device(&view.spec.device));
            let device = match device {
                Ok(d) => d,
                Err(e) => return ClassMatch::ClassInvalid(format!("class {class}: {e}")),
            };
            match engine.matches(selector, device) {
                Ok(true) => {
                    self.verdicts.insert(key, None);
                }
                Ok(false) => {
                    let words = format!("`{}` is false for class {class}", expr.0);
                    self.verdicts.insert(key, Some(words.clone()));
                    return ClassMatch::NoMatch(words);
                }
                Err(SelectorError::Evaluation { missing_key: true, message, .. }) => {
                    let words = format!("`{}` on class {class}: {message}", expr.0);
                    self.verdicts.insert(key, Some(words.clone()));
                    return ClassMatch::NoMatch(words);
                }
                Err(e) => return ClassMatch::Error(e.to_string()),
            }
        }
        ClassMatch::Match
    }
}

/// A matcher's compiled selectors, device values and verdicts, without its classes.
pub(crate) struct MatcherMemo {
    engine: SelectorEngine,
    selectors: HashMap<String, Result<Selector, SelectorError>>,
    devices: HashMap<String, Result<CelValue, SelectorError>>,
    verdicts: HashMap<(String, String), Option<String>>,
}

impl MatcherMemo {
    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.selectors.len() + self.devices.len() + self.verdicts.len()
    }
}

/// The pods of one replica: devices each needs on one node, and whether they need distinct nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaShape {
    /// Devices per pod, largest first.
    pub pods: Vec<u32>,
    /// Pods must be on distinct nodes (multi-node replicas).
    pub distinct_nodes: bool,
}

impl ReplicaShape {
    /// The shape of a topology.
    pub fn of(topology: &Topology) -> Self {
        let mut pods: Vec<u32> = match topology.type_ {
            TopologyType::Standalone => vec![1],
            TopologyType::TensorParallel => vec![topology.devices_per_replica],
            TopologyType::MultiNode => {
                vec![topology.devices_per_replica; topology.nodes_per_replica.unwrap_or(1) as usize]
            }
            TopologyType::Disaggregated => {
                topology.roles.iter().flat_map(|r| std::iter::repeat_n(r.devices_per_pod, r.pods as usize)).collect()
            }
        };
        pods.sort_unstable_by(|a, b| b.cmp(a));
        Self { pods, distinct_nodes: topology.type_ == TopologyType::MultiNode }
    }

    /// Devices of the whole replica.
    pub fn devices(&self) -> u32 {
        self.pods.iter().sum()
    }

    /// The largest pod.
    pub fn largest_pod(&self) -> u32 {
        self.pods.first().copied().unwrap_or(0)
    }

    /// Places one replica on `free` (devices per node), best fit, and returns the new free
    /// list, or `None` when it does not fit.
    pub fn take(&self, free: &[u32]) -> Option<Vec<u32>> {
        // One pod: the best-fit node found before anything is copied (a pool that cannot take
        // the replica costs no allocation).
        if let [pod] = self.pods[..] {
            let best = free.iter().enumerate().filter(|(_, f)| **f >= pod).min_by_key(|(i, f)| (**f, *i))?.0;
            let mut free = free.to_vec();
            free[best] -= pod;
            return Some(free);
        }
        let mut free = free.to_vec();
        let mut used = vec![false; free.len()];
        for &pod in &self.pods {
            let best = free
                .iter()
                .enumerate()
                .filter(|(i, f)| **f >= pod && !(self.distinct_nodes && used[*i]))
                .min_by_key(|(i, f)| (**f, *i))
                .map(|(i, _)| i)?;
            free[best] -= pod;
            used[best] = true;
        }
        Some(free)
    }

    /// [`Self::take`] in place: true when the replica fit (`free` is then what is left), false
    /// (and `free` unchanged) when it does not. No allocation.
    pub fn take_in(&self, free: &mut [u32]) -> bool {
        if let [pod] = self.pods[..] {
            let Some(b) = free.iter().enumerate().filter(|(_, f)| **f >= pod).min_by_key(|(i, f)| (**f, *i)) else {
                return false;
            };
            let b = b.0;
            free[b] -= pod;
            return true;
        }
        self.take_nodes(free).is_some()
    }

    /// [`Self::take_in`], saying which node each pod (in `pods` order) went to.
    pub fn take_nodes(&self, free: &mut [u32]) -> Option<Vec<usize>> {
        // Nodes taken so far (a few pods per replica); given back when a pod does not fit.
        let mut used: Vec<usize> = Vec::with_capacity(self.pods.len());
        for &pod in &self.pods {
            let best = free
                .iter()
                .enumerate()
                .filter(|(i, f)| **f >= pod && !(self.distinct_nodes && used.contains(i)))
                .min_by_key(|(i, f)| (**f, *i))
                .map(|(i, _)| i);
            let Some(b) = best else {
                for (&i, &p) in used.iter().zip(&self.pods) {
                    free[i] += p;
                }
                return None;
            };
            free[b] -= pod;
            used.push(b);
        }
        Some(used)
    }

    /// Whether one more replica fits in `free` (no allocation for single-pod replicas).
    pub fn fits(&self, free: &[u32]) -> bool {
        if self.pods.len() == 1 {
            let pod = self.pods[0];
            return free.iter().any(|f| *f >= pod);
        }
        self.take(free).is_some()
    }

    /// How many replicas fit in `free`, up to `cap`.
    pub fn count(&self, free: &[u32], cap: u32) -> u32 {
        if self.pods.len() == 1 && !self.distinct_nodes {
            let pod = self.pods[0].max(1);
            let n: u32 = free.iter().map(|f| f / pod).sum();
            return n.min(cap);
        }
        let mut free = free.to_vec();
        let mut n = 0;
        while n < cap && self.take_in(&mut free) {
            n += 1;
        }
        n
    }
}

/// Why a pool cannot hold even one replica, with the numbers.
pub fn misfit(shape: &ReplicaShape, free: &[u32], per_node: u32) -> (Reason, String) {
    let (total, best, nodes) = free_facts(free);
    misfit_of(shape, (total, best, nodes), per_node)
}

/// What [`misfit`] says of a pool's free devices: their total, the most on one node, and the
/// number of nodes.
pub fn free_facts(free: &[u32]) -> (u32, u32, u32) {
    (free.iter().sum(), free.iter().copied().max().unwrap_or(0), free.len() as u32)
}

/// [`misfit`] from the facts [`free_facts`] keeps.
pub fn misfit_of(shape: &ReplicaShape, (total, best, nodes): (u32, u32, u32), per_node: u32) -> (Reason, String) {
    if shape.largest_pod() > per_node {
        return (
            Reason::DoesNotFitNode,
            format!("a pod needs {} devices on one node; nodes of this class have {per_node}", shape.largest_pod()),
        );
    }
    // Enough devices in all, but split over nodes none of which has room for the largest pod.
    let split = if best < shape.largest_pod() && total >= shape.largest_pod() {
        format!("but no node has {} free (at most {best} on one node)", shape.largest_pod())
    } else {
        format!("at most {best} on one node")
    };
    (
        Reason::InsufficientDevices,
        format!(
            "needs {} devices ({} pod(s), largest {} on one node); {} free on {} node(s), {split}",
            shape.devices(),
            shape.pods.len(),
            shape.largest_pod(),
            total,
            nodes,
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(pods: &[u32], distinct: bool) -> ReplicaShape {
        ReplicaShape { pods: pods.to_vec(), distinct_nodes: distinct }
    }

    #[test]
    fn a_refusal_reads_the_same_the_second_time() {
        // An AMD class, asked for an NVIDIA capacity: the key is missing, and the words say so
        // for every deployment that asks, not only the first (the verdict is memoized).
        let spec = serde_json::json!({
            "device": {"driver": "gpu.amd.com", "capacity": {"memory": "192Gi"}},
            "devicesPerNode": 8,
            "pricePerNodeHour": {"onDemand": "40.00"},
        });
        let spec = serde_json::from_value(spec).expect("class spec");
        let classes = std::collections::BTreeMap::from([("mi300x".to_string(), ClassView { spec })]);
        let alt: DeviceAlternative = serde_json::from_value(serde_json::json!({
            "selectors": ["device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity(\"24Gi\")) >= 0"],
        }))
        .expect("alternative");
        let mut matcher = DeviceMatcher::new(&classes);
        let first = matcher.matches(&alt, "mi300x");
        let ClassMatch::NoMatch(words) = &first else { panic!("{first:?}") };
        assert!(words.contains("on class mi300x"), "{words}");
        assert!(!words.contains("is false"), "a missing key is not a false comparison: {words}");
        assert_eq!(matcher.matches(&alt, "mi300x"), first);
    }

    #[test]
    fn tensor_parallel_needs_one_node_with_enough() {
        let s = shape(&[4], false);
        assert_eq!(s.count(&[3, 3, 3], 10), 0, "9 free but no node has 4");
        assert_eq!(s.count(&[8, 4, 3], 10), 3);
        assert_eq!(s.count(&[8, 8], 3), 3, "capped");
    }

    /// `take_in` is `take` in place: the same nodes left, and nothing changed when the
    /// replica does not fit (a pod that fits before one that does not is given back).
    #[test]
    fn take_in_is_take_in_place() {
        let frees: [&[u32]; 7] = [&[8, 2], &[4, 4], &[3, 3, 3], &[8, 8, 8], &[16], &[0, 7, 1, 8], &[]];
        for pods in [&[4u32][..], &[8], &[8, 8], &[4, 2], &[8, 4, 4], &[1]] {
            for distinct in [false, true] {
                let s = shape(pods, distinct);
                for free in frees {
                    let mut mine = free.to_vec();
                    let fit = s.take_in(&mut mine);
                    match s.take(free) {
                        Some(next) => assert!(fit && mine == next, "{pods:?} {distinct} {free:?}"),
                        None => assert!(!fit && mine == free, "{pods:?} {distinct} {free:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn multi_node_needs_distinct_nodes() {
        let s = shape(&[8, 8], true);
        assert_eq!(s.count(&[16], 5), 0, "one big node is not two nodes");
        assert_eq!(s.count(&[8, 8, 8], 5), 1);
        let s = shape(&[8, 8], false);
        assert_eq!(s.count(&[16], 5), 1, "without the distinct-node rule they share");
    }

    #[test]
    fn misfit_says_when_free_devices_are_split_over_nodes() {
        let tp8 = shape(&[8], false);
        let (reason, split) = misfit(&tp8, &[4, 4], 8);
        assert_eq!(reason, Reason::InsufficientDevices);
        assert!(split.contains("8 free on 2 node(s), but no node has 8 free (at most 4 on one node)"), "{split}");
        // Twin: too few devices in all is not a split.
        let (_, few) = misfit(&tp8, &[4], 8);
        assert!(few.ends_with("4 free on 1 node(s), at most 4 on one node"), "{few}");
        assert!(!few.contains("no node has"), "{few}");
    }

    #[test]
    fn best_fit_keeps_big_holes() {
        let s = shape(&[2], false);
        assert_eq!(s.take(&[8, 2]), Some(vec![8, 0]));
    }
}
