//! Drift: a member object whose live spec no longer holds what Flotilla applied — a hand edit
//! of the image, args or replicas, or another controller writing Flotilla's fields. Detected
//! from the object the reconcile already listed (no extra read): every field of the rendered
//! `spec` must be in the live `spec` with the same value. Maps may hold more keys (server
//! defaults, other owners' fields); lists of scalars (args, command) must be equal; in lists
//! of objects (containers, ports, env) each rendered element must be matched by a live one.
//! A rendered empty value (`[]`, `{}`, `""`, `0`, `false`, null) matches an absent field, as
//! the API server leaves those out. Pure; returns the paths that differ.

use serde_json::Value;

/// At most this many differing paths are reported per object.
pub const MAX_PATHS: usize = 5;

/// The paths (`spec.template.spec.containers[engine].image`) where `live` lacks what
/// `rendered` sets. Empty: no drift.
pub fn diff(rendered: &Value, live: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk("spec", rendered, Some(live), &mut out);
    out.truncate(MAX_PATHS);
    out
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Scalars compare by value; a number and a string with the same text are equal (quantities
/// and int-or-string fields come back as strings).
fn same_scalar(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(n), Value::String(s)) | (Value::String(s), Value::Number(n)) => n.to_string() == *s,
        _ => a == b,
    }
}

fn covers(rendered: &Value, live: &Value) -> bool {
    let mut out = Vec::new();
    walk("", rendered, Some(live), &mut out);
    out.is_empty()
}

/// A list element's name for a path: its `name` (containers, env, ports), else its index.
fn label(v: &Value, i: usize) -> String {
    v.get("name").and_then(Value::as_str).map_or_else(|| i.to_string(), str::to_string)
}

fn walk(path: &str, rendered: &Value, live: Option<&Value>, out: &mut Vec<String>) {
    let live = live.filter(|l| !l.is_null());
    match (rendered, live) {
        (r, None) => {
            if !is_empty(r) {
                out.push(path.to_string());
            }
        }
        (Value::Object(r), Some(Value::Object(l))) => {
            for (k, v) in r {
                walk(&format!("{path}.{k}"), v, l.get(k), out);
            }
        }
        (Value::Array(r), Some(Value::Array(l))) if r.iter().chain(l).any(Value::is_object) => {
            for (i, v) in r.iter().enumerate() {
                // The element of the same name (or index) says which field differs.
                let twin = match v.get("name") {
                    Some(name) => l.iter().find(|e| e.get("name") == Some(name)),
                    None => l.get(i),
                };
                if !l.iter().any(|e| covers(v, e)) {
                    let before = out.len();
                    walk(&format!("{path}[{}]", label(v, i)), v, twin, out);
                    if out.len() == before {
                        out.push(format!("{path}[{}]", label(v, i)));
                    }
                }
            }
        }
        (Value::Array(r), Some(Value::Array(l))) => {
            if r.len() != l.len() || r.iter().zip(l).any(|(a, b)| !same_scalar(a, b)) {
                out.push(path.to_string());
            }
        }
        (r, Some(l)) => {
            if !(same_scalar(r, l) || (is_empty(r) && is_empty(l))) {
                out.push(path.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rendered() -> Value {
        json!({"replicas": 2, "selector": {"matchLabels": {"a": "b"}},
               "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
               "template": {"metadata": {"labels": {"a": "b"}}, "spec": {
                   "nodeSelector": {"pool": "h100"},
                   "containers": [{"name": "engine", "image": "vllm:1", "args": ["--tp=4"], "env": [],
                                   "ports": [{"name": "http", "containerPort": 8000}],
                                   "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}})
    }

    /// What the API server returns for it: defaults filled in, empty fields left out.
    fn live() -> Value {
        json!({"replicas": 2, "progressDeadlineSeconds": 600, "revisionHistoryLimit": 10,
               "selector": {"matchLabels": {"a": "b"}},
               "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
               "template": {"metadata": {"labels": {"a": "b"}}, "spec": {
                   "nodeSelector": {"pool": "h100"}, "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
                   "containers": [{"name": "engine", "image": "vllm:1", "args": ["--tp=4"],
                                   "imagePullPolicy": "IfNotPresent",
                                   "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                                   "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}})
    }

    #[test]
    fn what_the_server_defaults_or_leaves_out_is_no_drift() {
        assert!(diff(&rendered(), &live()).is_empty(), "{:?}", diff(&rendered(), &live()));
        // Another owner's extra container or env var is theirs, not drift.
        let mut l = live();
        l["template"]["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "sidecar", "image": "s"}));
        l["template"]["spec"]["containers"][0]["env"] = json!([{"name": "X", "value": "1"}]);
        assert!(diff(&rendered(), &l).is_empty(), "{:?}", diff(&rendered(), &l));
    }

    #[test]
    fn hand_edits_of_image_args_or_replicas_are_named() {
        let mut l = live();
        l["template"]["spec"]["containers"][0]["image"] = json!("evil:latest");
        assert_eq!(diff(&rendered(), &l), ["spec.template.spec.containers[engine].image"]);
        let mut l = live();
        l["template"]["spec"]["containers"][0]["args"] = json!(["--tp=4", "--debug"]);
        assert_eq!(diff(&rendered(), &l), ["spec.template.spec.containers[engine].args"]);
        let mut l = live();
        l["replicas"] = json!(7);
        l["template"]["spec"]["nodeSelector"] = json!({});
        assert_eq!(diff(&rendered(), &l), ["spec.replicas", "spec.template.spec.nodeSelector.pool"]);
        // A removed container is named by its name.
        let mut l = live();
        l["template"]["spec"]["containers"][0]["name"] = json!("renamed");
        assert_eq!(diff(&rendered(), &l), ["spec.template.spec.containers[engine]"]);
    }

    #[test]
    fn numbers_and_their_string_forms_are_the_same_value() {
        let mut l = live();
        l["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!(4);
        assert!(diff(&rendered(), &l).is_empty());
        l["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("8");
        assert_eq!(diff(&rendered(), &l).len(), 1);
    }
}
