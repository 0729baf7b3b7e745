//! Where a CRD's CEL rules (`x-kubernetes-validations`) run on an object, and only there.
//! kube-cel's walk turns the value of every schema node it visits into a CEL value, the whole
//! subtree each time, and copies the object to apply defaults at every level: for a 1,000 ×
//! 5,000 fleet that was most of `validate`. A [`Guide`], built once per kind from the compiled
//! schema, says which nodes carry rules that can run (on create, not the transition rules that
//! need `oldSelf`); the object is descended along the guide, and kube-cel validates each such
//! node's value on its own, the field paths of its errors prefixed with the node's path as
//! kube-cel's own walk writes them (`spec.pools[0]`). Same rules, same values, same messages.

use kube_cel::{CompiledSchema, ValidationError, Validator};
use serde_json::Value as Json;

/// Which nodes of a compiled schema hold rules that run, and the way down to them.
#[derive(Debug, Default)]
pub(crate) struct Guide {
    /// Validate this node's value here (its subtree included); nothing below is descended.
    here: bool,
    /// Declared properties with rules at or below them, sorted by name.
    properties: Vec<(String, Guide)>,
    /// Array items with rules at or below them.
    items: Option<Box<Guide>>,
    /// Map values (`additionalProperties`) with rules at or below them.
    additional: Option<Box<Guide>>,
}

impl Guide {
    /// The guide of `compiled`: with `transitions`, every rule runs (an update); without, only
    /// those that run on create. `None` when no rule in the subtree would run.
    pub(crate) fn new(compiled: &CompiledSchema, transitions: bool) -> Option<Guide> {
        let runs = |r: &Result<kube_cel::CompilationResult, kube_cel::CompilationError>| match r {
            Ok(cr) => transitions || !cr.is_transition_rule || cr.rule.optional_old_self == Some(true),
            // A rule that does not compile is reported every time the node is validated.
            Err(_) => true,
        };
        let mut branches = compiled.all_of.iter().chain(&compiled.one_of).chain(&compiled.any_of);
        let branch_rules = branches.any(|b| Guide::new(b, transitions).is_some());
        if compiled.validations.iter().any(runs) || branch_rules {
            return Some(Guide { here: true, ..Guide::default() });
        }
        let mut properties: Vec<(String, Guide)> = compiled
            .properties
            .iter()
            .filter_map(|(name, child)| Some((name.clone(), Guide::new(child, transitions)?)))
            .collect();
        properties.sort_by(|a, b| a.0.cmp(&b.0));
        let items = compiled.items.as_deref().and_then(|c| Guide::new(c, transitions)).map(Box::new);
        let additional = if compiled.preserve_unknown_fields {
            None
        } else {
            compiled.additional_properties.as_deref().and_then(|c| Guide::new(c, transitions)).map(Box::new)
        };
        if properties.is_empty() && items.is_none() && additional.is_none() {
            return None;
        }
        Some(Guide { here: false, properties, items, additional })
    }

    /// Validates `value` (and `old`, for transition rules) along the guide; errors carry the
    /// full field path.
    pub(crate) fn validate(
        &self,
        validator: &Validator,
        compiled: &CompiledSchema,
        value: &Json,
        old: Option<&Json>,
        path: &str,
        out: &mut Vec<ValidationError>,
    ) {
        if self.here {
            if let Err(errors) = validator.validate_compiled(compiled, value, old) {
                for mut e in errors.into_vec() {
                    e.field_path = prefixed(path, &e.field_path);
                    out.push(e);
                }
            }
            return;
        }
        if let Some(map) = value.as_object() {
            for (name, guide) in &self.properties {
                let Some(child) = compiled.properties.get(name) else { continue };
                // kube-cel applies a missing property's default before it walks.
                let Some(v) = map.get(name).or(child.default.as_ref()) else { continue };
                let o = old.and_then(|o| o.get(name));
                guide.validate(validator, child, v, o, &join(path, name), out);
            }
            if let (Some(guide), Some(child)) = (&self.additional, compiled.additional_properties.as_deref()) {
                for (key, v) in map.iter().filter(|(k, _)| !compiled.properties.contains_key(*k)) {
                    let o = old.and_then(|o| o.get(key));
                    guide.validate(validator, child, v, o, &join(path, key), out);
                }
            }
        }
        if let (Some(guide), Some(child), Some(items)) = (&self.items, compiled.items.as_deref(), value.as_array()) {
            for (i, v) in items.iter().enumerate() {
                let o = old.and_then(Json::as_array).and_then(|a| a.get(i));
                let at = if path.is_empty() { format!("[{i}]") } else { format!("{path}[{i}]") };
                guide.validate(validator, child, v, o, &at, out);
            }
        }
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() { name.to_string() } else { format!("{path}.{name}") }
}

/// A field path kube-cel wrote relative to a node, made absolute as its own walk from the root
/// would have written it.
fn prefixed(path: &str, relative: &str) -> String {
    if path.is_empty() {
        relative.to_string()
    } else if relative.is_empty() {
        path.to_string()
    } else if relative.starts_with('.') || relative.starts_with('[') {
        format!("{path}{relative}")
    } else {
        format!("{path}.{relative}")
    }
}

#[cfg(test)]
mod tests {
    use kube_cel::compile_schema;
    use serde_json::json;

    use super::*;

    fn schema() -> Json {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "x-kubernetes-validations": [{"rule": "self.region == oldSelf.region", "message": "immutable"}],
                    "properties": {
                        "region": {"type": "string"},
                        "pools": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "x-kubernetes-validations": [
                                    {"rule": "self.minNodes <= self.maxNodes", "message": "min above max"},
                                    {"rule": "self.maxNodes < 100", "fieldPath": ".maxNodes", "message": "too many"}
                                ],
                                "properties": {
                                    "minNodes": {"type": "integer", "default": 0},
                                    "maxNodes": {"type": "integer"}
                                }
                            }
                        },
                        "labels": {
                            "type": "object",
                            "additionalProperties": {
                                "type": "string",
                                "x-kubernetes-validations": [{"rule": "self.size() < 4", "message": "long"}]
                            }
                        }
                    }
                },
                "status": {"type": "object", "properties": {"free": {"type": "integer"}}}
            }
        })
    }

    fn errors(object: &Json, old: Option<&Json>) -> Vec<(String, String)> {
        let compiled = compile_schema(&schema());
        let mut out = Vec::new();
        if let Some(g) = Guide::new(&compiled, old.is_some()) {
            g.validate(&Validator::new(), &compiled, object, old, "", &mut out);
        }
        let mut out: Vec<(String, String)> = out.into_iter().map(|e| (e.field_path, e.message)).collect();
        out.sort();
        out
    }

    fn from_the_root(object: &Json, old: Option<&Json>) -> Vec<(String, String)> {
        let compiled = compile_schema(&schema());
        let mut out: Vec<(String, String)> = match Validator::new().validate_compiled(&compiled, object, old) {
            Ok(()) => Vec::new(),
            Err(e) => e.into_vec().into_iter().map(|e| (e.field_path, e.message)).collect(),
        };
        out.sort();
        out
    }

    #[test]
    fn same_errors_at_the_same_paths_as_kube_cels_walk_from_the_root() {
        let bad = json!({
            "spec": {"region": "b", "pools": [{"maxNodes": 2}, {"minNodes": 300, "maxNodes": 200}],
                     "labels": {"ok": "abc", "bad": "abcdef"}},
            "status": {"free": 1}
        });
        let old = json!({"spec": {"region": "a"}});
        let want = vec![
            ("spec".to_string(), "immutable".to_string()),
            ("spec.labels.bad".to_string(), "long".to_string()),
            ("spec.pools[1]".to_string(), "min above max".to_string()),
            ("spec.pools[1].maxNodes".to_string(), "too many".to_string()),
        ];
        assert_eq!(from_the_root(&bad, Some(&old)), want);
        assert_eq!(errors(&bad, Some(&old)), want);
        // On create the transition rule does not run, in either walk.
        let create: Vec<_> = want[1..].to_vec();
        assert_eq!(from_the_root(&bad, None), create);
        assert_eq!(errors(&bad, None), create);
        // The default of minNodes (0) is seen by the rule, as kube-cel applies it.
        let fine = json!({"spec": {"region": "a", "pools": [{"maxNodes": 0}]}});
        assert_eq!(errors(&fine, None), Vec::<(String, String)>::new());
        assert_eq!(from_the_root(&fine, None), Vec::<(String, String)>::new());
    }

    #[test]
    fn nodes_without_rules_are_not_visited() {
        let compiled = compile_schema(&schema());
        let create = Guide::new(&compiled, false).expect("rules below the root");
        let names: Vec<&str> = create.properties.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["spec"], "status has no rules: not in the guide");
        let spec = &create.properties[0].1;
        assert!(!spec.here, "spec's only rule is a transition rule: not validated on create");
        let update = Guide::new(&compiled, true).expect("rules");
        assert!(update.properties[0].1.here, "on update spec's transition rule runs");
        let plain = compile_schema(&json!({"type": "object", "properties": {"a": {"type": "string"}}}));
        assert!(Guide::new(&plain, false).is_none());
    }
}
