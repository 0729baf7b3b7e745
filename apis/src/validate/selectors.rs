//! The selectors of a set's objects: CEL device selectors (`SelectorChecker`: each compiles,
//! returns a bool on the classes it could see, and some class satisfies them all) and label
//! selectors (operators and values as the API server checks them, and whether they match any
//! InferenceCluster of the set).

use std::collections::{BTreeMap, HashMap};

use super::Sink;
use crate::cel::{CelValue, Selector, SelectorEngine, SelectorError};
use crate::deployment::CelExpression;

pub(super) struct SelectorChecker<'e> {
    /// Each distinct selector compiled once: a fleet repeats the same few selectors across
    /// thousands of deployments.
    compiled: HashMap<&'e str, Result<Selector, SelectorError>>,
    judge: Judge<'e>,
}

/// Evaluates compiled selectors on the classes' devices.
struct Judge<'e> {
    engine: &'e SelectorEngine,
    classes: &'e BTreeMap<&'e str, Option<CelValue>>,
    /// Each (selector, class) evaluated once: the outcome depends on nothing else.
    verdicts: HashMap<(&'e str, &'e str), Result<bool, SelectorError>>,
}

/// What one selector gave on the classes it could see.
#[derive(Debug, Default, PartialEq)]
struct Verdict {
    /// Some class satisfied it.
    matched_any: bool,
    /// Classes looked at (described to CEL), those lacking a key it reads, the first such message.
    looked: usize,
    lacking: usize,
    missing: Option<String>,
}

impl<'e> SelectorChecker<'e> {
    pub(super) fn new(engine: &'e SelectorEngine, classes: &'e BTreeMap<&'e str, Option<CelValue>>) -> Self {
        Self { compiled: HashMap::new(), judge: Judge { engine, classes, verdicts: HashMap::new() } }
    }

    /// Compiles each selector, then evaluates it on the devices it could see (the named class,
    /// or every class) so that a selector returning a non-bool is caught before it is applied.
    pub(super) fn check(
        &mut self,
        sink: &mut Sink<'_>,
        field: &str,
        class: Option<&str>,
        selectors: &'e [CelExpression],
    ) {
        let mut any_match_possible = true;
        // Problems this call adds (a selector that does not compile or fails on a class) stand
        // for the warning below; those of other fields or objects do not.
        let before = sink.problems.len();
        // The selectors no class satisfies, each with why when every class lacked what it reads.
        let mut unmet: Vec<String> = Vec::new();
        let engine = self.judge.engine;
        for (i, expr) in selectors.iter().enumerate() {
            let f = format!("{field}.selectors[{i}]");
            let selector = match self.compiled.entry(expr.0.as_str()).or_insert_with(|| engine.compile(&expr.0)) {
                Ok(s) => &*s,
                Err(e) => {
                    sink.error(f, e.to_string());
                    any_match_possible = false;
                    continue;
                }
            };
            let v = self.judge.on_classes(sink, &f, &expr.0, selector, class);
            any_match_possible &= v.matched_any;
            if !v.matched_any && v.looked > 0 {
                unmet.push(match v.missing {
                    Some(m) if v.lacking == v.looked => {
                        format!("selectors[{i}] reads what no InferenceClass publishes ({m})")
                    }
                    _ => format!("selectors[{i}] is false for every InferenceClass"),
                });
            }
        }
        if !selectors.is_empty() && any_match_possible {
            return;
        }
        if !selectors.is_empty()
            && !self.judge.classes.is_empty()
            && !sink.problems[before..].iter().any(|p| p.field.starts_with(&format!("{field}.selectors[")))
            && !sink.problems.last().is_some_and(|p| {
                // Already said of this very field of this very object (a second look).
                p.field == field && sink.current.is_some_and(|o| o.location == p.location)
            })
        {
            let why = if unmet.is_empty() { String::new() } else { format!(" ({})", unmet.join("; ")) };
            sink.warn(
                field.to_string(),
                format!(
                    "no InferenceClass in this set satisfies every selector{why}: this alternative can never be used"
                ),
            );
        }
    }
}

impl<'e> Judge<'e> {
    /// `selector` (the expression `expr`, at `field`) on every class it could see (`class`, or
    /// all): an error at `field` when it fails there other than by a missing key, which stops it.
    fn on_classes(
        &mut self,
        sink: &mut Sink<'_>,
        field: &str,
        expr: &'e str,
        selector: &Selector,
        class: Option<&str>,
    ) -> Verdict {
        let mut v = Verdict::default();
        for (name, device) in self.classes.iter() {
            if class.is_some_and(|c| c != *name) {
                continue;
            }
            let Some(device) = device else { continue };
            v.looked += 1;
            let engine = self.engine;
            let verdict = self.verdicts.entry((expr, *name)).or_insert_with(|| engine.matches(selector, device));
            match verdict {
                Ok(true) => v.matched_any = true,
                Ok(false) => {}
                Err(SelectorError::Evaluation { missing_key: true, message, .. }) => {
                    v.lacking += 1;
                    v.missing.get_or_insert_with(|| message.clone());
                }
                Err(e @ SelectorError::NonBool { .. }) => {
                    sink.error(field.to_string(), e.to_string());
                    break;
                }
                Err(e) => {
                    sink.error(field.to_string(), format!("on InferenceClass {name}: {e}"));
                    break;
                }
            }
        }
        v
    }
}

/// Operators and values of a label selector, as the API server checks them.
pub(super) fn check_label_selector(
    sink: &mut Sink<'_>,
    field: &str,
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) {
    for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
        let f = format!("{field}.matchExpressions[{i}]");
        let n = e.values.as_ref().map_or(0, Vec::len);
        match e.operator.as_str() {
            "In" | "NotIn" if n == 0 => {
                sink.error(format!("{f}.values"), format!("{} needs at least one value", e.operator))
            }
            "Exists" | "DoesNotExist" if n > 0 => {
                sink.error(format!("{f}.values"), format!("{} takes no values", e.operator))
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => sink.error(
                format!("{f}.operator"),
                format!("{other:?} is not allowed; use one of \"In\", \"NotIn\", \"Exists\", \"DoesNotExist\""),
            ),
        }
        if e.key.is_empty() {
            sink.error(format!("{f}.key"), "must not be empty");
        }
    }
}

/// A warning when the set holds InferenceClusters and `sel` matches none of them, naming why
/// for the first few (nothing can be placed there until a cluster's labels or the selector
/// change). A set without clusters (a deployment's own file) says nothing.
pub(super) fn check_selects_some(
    sink: &mut Sink<'_>,
    field: &str,
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    clusters: &[(&str, BTreeMap<String, String>)],
) {
    let valid = |op: &str| matches!(op, "In" | "NotIn" | "Exists" | "DoesNotExist");
    // An invalid selector is an error already (`check_label_selector`).
    if clusters.is_empty() || sel.match_expressions.iter().flatten().any(|e| !valid(&e.operator)) {
        return;
    }
    let mut why = Vec::new();
    for (name, labels) in clusters {
        match crate::selector::selector_matches(sel, labels) {
            Ok(()) => return,
            Err(e) => why.push(format!("{name}: {e}")),
        }
    }
    let more = why.len().saturating_sub(3);
    why.truncate(3);
    if more > 0 {
        why.push(format!("{more} more"));
    }
    sink.warn(
        field,
        format!(
            "matches none of the {} InferenceClusters in this set ({}): nothing can be placed until one matches",
            clusters.len(),
            why.join("; ")
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::super::tests::{CLASS, CLUSTER, fields, parse, reported};
    use super::*;
    use crate::document::FleetObject;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    /// The problems `SelectorChecker::check` reports on `selectors` (for alternative 0, of
    /// `class` or any) with the H100 class in the set, and the checker's verdicts after.
    fn on_selectors(
        class: Option<&str>,
        selectors: &[&str],
    ) -> (Vec<(crate::document::Severity, String, String)>, usize) {
        let objects = parse(&[CLASS, CLUSTER]);
        let engine = SelectorEngine::new();
        let classes = super::super::describe_classes(&mut Sink { problems: vec![], current: None }, &objects, &engine);
        let exprs: Vec<CelExpression> = selectors.iter().map(|s| CelExpression((*s).into())).collect();
        let mut checker = SelectorChecker::new(&engine, &classes);
        let field = "spec.devices.alternatives[0]";
        let problems = reported(&objects[0], |sink| {
            checker.check(sink, field, class, &exprs);
            checker.check(sink, field, class, &exprs);
        });
        (problems, checker.judge.verdicts.len())
    }

    #[test]
    fn a_selector_compiles_returns_a_bool_and_is_judged_once_per_class() {
        let hopper = r#"device.attributes["gpu.nvidia.com"].architecture == "Hopper""#;
        let (problems, verdicts) = on_selectors(None, &[hopper]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(verdicts, 1, "one class, one verdict, however often it is checked");
        let (problems, _) = on_selectors(None, &["device.("]);
        assert_eq!(fields(&problems), vec!["spec.devices.alternatives[0].selectors[0]"; 2]);
        let (problems, _) = on_selectors(None, &[r#"device.attributes["gpu.nvidia.com"].architecture"#]);
        assert_eq!(fields(&problems)[0], "spec.devices.alternatives[0].selectors[0]", "not a bool");
        // A class the set does not have: nothing to evaluate it on, so no reason given.
        let (problems, verdicts) = on_selectors(Some("a100"), &[hopper]);
        assert_eq!(verdicts, 0);
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].2.starts_with("no InferenceClass in this set satisfies every selector:"),
            "{}",
            problems[0].2
        );
    }

    #[test]
    fn an_alternative_no_class_satisfies_is_warned_about_with_why() {
        let ampere = r#"device.attributes["gpu.nvidia.com"].architecture == "Ampere""#;
        let (problems, _) = on_selectors(None, &[ampere]);
        // Checked twice in a row: said once (the last problem is already about the field).
        assert_eq!(fields(&problems), vec!["spec.devices.alternatives[0]"]);
        assert!(problems[0].2.contains("selectors[0] is false for every InferenceClass"), "{}", problems[0].2);
        let missing = r#"device.attributes["gpu.nvidia.com"].nvlink"#;
        let (problems, _) = on_selectors(None, &[missing]);
        assert!(problems[0].2.contains("selectors[0] reads what no InferenceClass publishes"), "{}", problems[0].2);
    }

    #[test]
    fn another_objects_or_alternatives_problem_does_not_silence_the_warning() {
        let objects = parse(&[CLASS, CLUSTER]);
        let engine = SelectorEngine::new();
        let classes = super::super::describe_classes(&mut Sink { problems: vec![], current: None }, &objects, &engine);
        let mut checker = SelectorChecker::new(&engine, &classes);
        let broken = [CelExpression("device.(".into())];
        let ampere = [CelExpression(r#"device.attributes["gpu.nvidia.com"].architecture == "Ampere""#.into())];
        let mut sink = Sink { problems: vec![], current: Some(&objects[0]) };
        // Alternative 10's selector does not compile; alternative 1 (whose field is a prefix of
        // its) can never be used; nor can alternative 1 of another object: both are said.
        checker.check(&mut sink, "spec.devices.alternatives[10]", None, &broken);
        checker.check(&mut sink, "spec.devices.alternatives[1]", None, &ampere);
        sink.current = Some(&objects[1]);
        checker.check(&mut sink, "spec.devices.alternatives[1]", None, &ampere);
        let warned: Vec<(&str, usize)> = sink
            .problems
            .iter()
            .filter(|p| p.message.starts_with("no InferenceClass"))
            .map(|p| (p.field.as_str(), p.location.document))
            .collect();
        let field = "spec.devices.alternatives[1]";
        let docs = (objects[0].location.document, objects[1].location.document);
        assert_eq!(warned, [(field, docs.0), (field, docs.1)], "{:?}", sink.problems);
    }

    #[test]
    fn a_judge_counts_the_classes_it_looked_at_and_those_lacking_a_key() {
        let objects = parse(&[CLASS]);
        let engine = SelectorEngine::new();
        let classes = super::super::describe_classes(&mut Sink { problems: vec![], current: None }, &objects, &engine);
        let mut judge = Judge { engine: &engine, classes: &classes, verdicts: HashMap::new() };
        let expr = r#"device.attributes["gpu.nvidia.com"].nvlink"#;
        let Ok(selector) = engine.compile(expr) else { panic!("compiles") };
        let mut sink = Sink { problems: vec![], current: None };
        let v = judge.on_classes(&mut sink, "f", expr, &selector, None);
        assert_eq!((v.matched_any, v.looked, v.lacking), (false, 1, 1));
        assert!(v.missing.is_some());
        assert_eq!(judge.on_classes(&mut sink, "f", expr, &selector, Some("other")), Verdict::default());
    }

    #[test]
    fn a_label_selector_uses_the_api_servers_operators_and_matches_some_cluster() {
        let sel = |json: &str| -> LabelSelector { serde_json::from_str(json).unwrap() };
        let objects = parse(&[CLASS, CLUSTER]);
        let FleetObject::Cluster(c) = &objects[1].value else { panic!("not a cluster") };
        let clusters = vec![("eu-fra-1", crate::selector::cluster_labels(c))];
        let check = |s: &LabelSelector| {
            reported(&objects[0], |sink| {
                check_label_selector(sink, "f", s);
                check_selects_some(sink, "f", s, &clusters);
            })
        };
        let eu = sel(r#"{"matchLabels": {"flotilla.dev/jurisdiction": "EU"}}"#);
        assert!(check(&eu).is_empty());
        let bad = sel(r#"{"matchExpressions": [{"key": "", "operator": "In"}, {"key": "a", "operator": "Near"}]}"#);
        assert_eq!(
            fields(&check(&bad)),
            vec!["f.matchExpressions[0].values", "f.matchExpressions[0].key", "f.matchExpressions[1].operator"]
        );
        let none = sel(r#"{"matchLabels": {"tier": "premium"}}"#);
        let said = check(&none);
        assert_eq!(fields(&said), vec!["f"]);
        assert!(said[0].2.contains("matches none of the 1 InferenceClusters in this set (eu-fra-1:"), "{}", said[0].2);
        // A set without clusters says nothing.
        assert!(reported(&objects[0], |sink| check_selects_some(sink, "f", &none, &[])).is_empty());
    }
}
