//! The API server's checks, run client-side against the CRDs generated from our own types:
//! the structural schema (types, required fields, unknown fields, enums, patterns, ranges,
//! lengths) and then the CRD's CEL rules (`x-kubernetes-validations`, via kube-cel). One
//! source of truth: `fleetctl validate` refuses exactly what `kubectl apply` would, and more.

use std::collections::HashMap;
use std::sync::OnceLock;

use kube_cel::{CompiledSchema, Validator, compile_schema};
use regex::Regex;
use serde_json::Value as Json;

use crate::cel_rules::Guide;
use crate::document::Kind;

/// A field path and a message.
pub type FieldProblem = (String, String);

/// A kind's schema, compiled once, with where its CEL rules run on create and on update.
struct KindSchema {
    schema: Json,
    compiled: CompiledSchema,
    on_create: Option<Guide>,
    on_update: Option<Guide>,
}

/// Schemas of the six kinds, compiled once.
pub struct Checker {
    schemas: HashMap<Kind, KindSchema>,
    validator: Validator,
    patterns: HashMap<String, Option<Regex>>,
}

static CHECKER: OnceLock<Checker> = OnceLock::new();

impl Checker {
    /// The process-wide checker.
    pub fn get() -> &'static Checker {
        CHECKER.get_or_init(Checker::new)
    }

    fn new() -> Self {
        let mut schemas = HashMap::new();
        let mut patterns = HashMap::new();
        for crd in crate::crd::all() {
            let Some(kind) = Kind::parse(&crd.spec.names.kind) else { continue };
            let schema = crd
                .spec
                .versions
                .first()
                .and_then(|v| v.schema.as_ref())
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| serde_json::to_value(s).ok())
                .unwrap_or(Json::Null);
            collect_patterns(&schema, &mut patterns);
            let compiled = compile_schema(&schema);
            let on_create = Guide::new(&compiled, false);
            let on_update = Guide::new(&compiled, true);
            schemas.insert(kind, KindSchema { schema, compiled, on_create, on_update });
        }
        Self { schemas, validator: Validator::new(), patterns }
    }

    /// The OpenAPI schema of a kind, as in its CRD.
    pub fn schema(&self, kind: Kind) -> Option<&Json> {
        self.schemas.get(&kind).map(|k| &k.schema)
    }

    /// Every problem the API server would report for this object on create.
    pub fn check(&self, kind: Kind, object: &Json) -> Vec<FieldProblem> {
        self.check_update(kind, object, None)
    }

    /// Every problem the API server would report when `old` is replaced by `object`
    /// (transition rules such as immutability run only when `old` is given).
    pub fn check_update(&self, kind: Kind, object: &Json, old: Option<&Json>) -> Vec<FieldProblem> {
        let Some(k) = self.schemas.get(&kind) else {
            return vec![(String::new(), format!("no schema for kind {}", kind.as_str()))];
        };
        let mut out = Vec::new();
        self.walk(&k.schema, object, "", &mut out);
        check_metadata(kind, object.get("metadata"), &mut out);
        let guide = if old.is_some() { &k.on_update } else { &k.on_create };
        if out.is_empty()
            && let Some(guide) = guide
        {
            // kube-cel evaluates the CRD's rules on the nodes that carry them: behind the same
            // boundary as selectors, so a panic there is this object's error.
            let mut errors = Vec::new();
            let run = || guide.validate(&self.validator, &k.compiled, object, old, "", &mut errors);
            match crate::cel::evaluating(run) {
                Ok(()) => out.extend(errors.into_iter().map(|e| (e.field_path, e.message))),
                Err(panic) => out.push((String::new(), format!("the CRD's validation rules failed on it: {panic}"))),
            }
        }
        out
    }

    fn walk(&self, schema: &Json, value: &Json, path: &str, out: &mut Vec<FieldProblem>) {
        let at = |p: &str| if p.is_empty() { "(root)".to_string() } else { p.to_string() };
        if value.is_null() {
            if !schema.get("nullable").and_then(Json::as_bool).unwrap_or(false) {
                out.push((at(path), "must not be null".into()));
            }
            return;
        }
        if schema.get("x-kubernetes-int-or-string").and_then(Json::as_bool) == Some(true) {
            // An int-or-string with a `pattern` is a count or a percentage (a disruption
            // budget): the pattern checks strings, the range integers. Every other one of
            // ours is a resource quantity.
            if schema.get("pattern").is_some() {
                match value {
                    Json::Number(n) if n.is_i64() || n.is_u64() => {
                        check_range(schema, n.as_f64().unwrap_or(0.0), path, out)
                    }
                    Json::String(s) => self.check_string(schema, s, path, out),
                    other => out.push((
                        at(path),
                        format!("must be an integer or a percentage (\"25%\"), not {}", type_name(other)),
                    )),
                }
                return;
            }
            match value {
                Json::Number(n) if n.is_i64() || n.is_u64() => {}
                Json::String(q) if is_quantity(q) => {
                    if let Err(message) = crate::quantity::check(q) {
                        out.push((at(path), message));
                    }
                }
                Json::String(q) => out.push((
                    at(path),
                    format!("{q:?} is not a quantity: write a number with an optional suffix (80Gi, 16G, 500M, 2)"),
                )),
                other => {
                    out.push((at(path), format!("must be a quantity (80Gi) or an integer, not {}", type_name(other))))
                }
            }
            return;
        }
        let preserve = schema.get("x-kubernetes-preserve-unknown-fields").and_then(Json::as_bool) == Some(true);
        match schema.get("type").and_then(Json::as_str) {
            Some("object") => self.walk_object(schema, value, path, preserve, out),
            Some("array") => {
                let Some(items) = value.as_array() else {
                    out.push((at(path), format!("must be a list, not {}", type_name(value))));
                    return;
                };
                if let Some(min) = schema.get("minItems").and_then(Json::as_u64)
                    && (items.len() as u64) < min
                {
                    out.push((at(path), format!("must have at least {min} item(s), has {}", items.len())));
                }
                if let Some(max) = schema.get("maxItems").and_then(Json::as_u64)
                    && items.len() as u64 > max
                {
                    out.push((at(path), format!("must have at most {max} item(s), has {}", items.len())));
                }
                if let Some(item_schema) = schema.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.walk(item_schema, item, &format!("{path}[{i}]"), out);
                    }
                }
            }
            Some("string") => {
                let Some(s) = value.as_str() else {
                    let hint = if value.is_number() { format!(": quote it, \"{value}\"") } else { String::new() };
                    out.push((at(path), format!("must be a string, not {}{hint}", type_name(value))));
                    return;
                };
                self.check_string(schema, s, path, out);
            }
            Some("integer") => {
                let Some(n) = value.as_i64() else {
                    out.push((at(path), format!("must be an integer, not {}", type_name(value))));
                    return;
                };
                check_range(schema, n as f64, path, out);
            }
            Some("number") => match value.as_f64() {
                Some(n) => check_range(schema, n, path, out),
                None => out.push((at(path), format!("must be a number, not {}", type_name(value)))),
            },
            Some("boolean") if !value.is_boolean() => {
                out.push((at(path), format!("must be true or false, not {}", type_name(value))));
            }
            _ => {}
        }
    }

    fn walk_object(&self, schema: &Json, value: &Json, path: &str, preserve: bool, out: &mut Vec<FieldProblem>) {
        let join = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
        let Some(map) = value.as_object() else {
            out.push((path.to_string(), format!("must be a mapping, not {}", type_name(value))));
            return;
        };
        let props = schema.get("properties").and_then(Json::as_object);
        if let Some(required) = schema.get("required").and_then(Json::as_array) {
            for r in required.iter().filter_map(Json::as_str) {
                if !map.contains_key(r) {
                    out.push((join(r), "is required".into()));
                }
            }
        }
        let additional = schema.get("additionalProperties").filter(|a| a.is_object());
        for (key, child) in map {
            if path.is_empty() && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue; // the API server checks these itself; see check_metadata
            }
            if let Some(child_schema) = props.and_then(|p| p.get(key)) {
                self.walk(child_schema, child, &join(key), out);
            } else if let Some(add) = additional {
                self.walk(add, child, &join(key), out);
            } else if !preserve && props.is_some() {
                let mut known: Vec<&str> = props.map(|p| p.keys().map(String::as_str).collect()).unwrap_or_default();
                known.sort_unstable();
                out.push((join(key), format!("unknown field {key:?}; known fields here: {}", known.join(", "))));
            }
        }
    }

    fn check_string(&self, schema: &Json, s: &str, path: &str, out: &mut Vec<FieldProblem>) {
        if let Some(values) = schema.get("enum").and_then(Json::as_array)
            && !values.iter().any(|v| v.as_str() == Some(s))
        {
            let allowed: Vec<String> = values.iter().filter_map(Json::as_str).map(|v| format!("{v:?}")).collect();
            out.push((path.to_string(), format!("{s:?} is not allowed; use one of {}", allowed.join(", "))));
        }
        let chars = s.chars().count() as u64;
        if let Some(min) = schema.get("minLength").and_then(Json::as_u64)
            && chars < min
        {
            out.push((path.to_string(), format!("must be at least {min} character(s) long")));
        }
        if let Some(max) = schema.get("maxLength").and_then(Json::as_u64)
            && chars > max
        {
            out.push((path.to_string(), format!("must be at most {max} characters long, is {chars}")));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Json::as_str)
            && let Some(Some(re)) = self.patterns.get(pattern)
            && !re.is_match(s)
        {
            out.push((path.to_string(), format!("{s:?} does not match the required format {pattern}")));
        }
    }
}

fn check_range(schema: &Json, n: f64, path: &str, out: &mut Vec<FieldProblem>) {
    if let Some(min) = schema.get("minimum").and_then(Json::as_f64)
        && n < min
    {
        out.push((path.to_string(), format!("must be at least {min}, is {n}")));
    }
    if let Some(max) = schema.get("maximum").and_then(Json::as_f64)
        && n > max
    {
        out.push((path.to_string(), format!("must be at most {max}, is {n}")));
    }
}

fn collect_patterns(schema: &Json, out: &mut HashMap<String, Option<Regex>>) {
    match schema {
        Json::Object(map) => {
            if let Some(p) = map.get("pattern").and_then(Json::as_str) {
                out.entry(p.to_string()).or_insert_with(|| Regex::new(p).ok());
            }
            map.values().for_each(|v| collect_patterns(v, out));
        }
        Json::Array(items) => items.iter().for_each(|v| collect_patterns(v, out)),
        _ => {}
    }
}

fn type_name(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "a mapping",
    }
}

const METADATA_FIELDS: [&str; 5] = ["name", "namespace", "labels", "annotations", "finalizers"];

fn check_metadata(kind: Kind, metadata: Option<&Json>, out: &mut Vec<FieldProblem>) {
    let Some(meta) = metadata.and_then(Json::as_object) else {
        out.push(("metadata".into(), "is required, with at least a name".into()));
        return;
    };
    for key in meta.keys() {
        if !METADATA_FIELDS.contains(&key.as_str()) {
            out.push((
                format!("metadata.{key}"),
                format!("{key:?} is not set by hand; use {}", METADATA_FIELDS.join(", ")),
            ));
        }
    }
    match meta.get("name").and_then(Json::as_str) {
        None => out.push(("metadata.name".into(), "is required".into())),
        Some(name) if !is_dns_subdomain(name) => out.push((
            "metadata.name".into(),
            format!("{name:?} must be a DNS subdomain: lower-case letters, digits, '-' and '.', at most 253"),
        )),
        Some(_) => {}
    }
    if let Some(ns) = meta.get("namespace") {
        if !kind.namespaced() {
            out.push((
                "metadata.namespace".into(),
                format!("{} is cluster-scoped: remove the namespace", kind.as_str()),
            ));
        } else if !ns.as_str().is_some_and(is_dns_label) {
            out.push(("metadata.namespace".into(), "must be a DNS label (lower-case letters, digits, '-')".into()));
        }
    }
    for field in ["labels", "annotations"] {
        if let Some(m) = meta.get(field) {
            let ok = m.as_object().is_some_and(|m| m.values().all(Json::is_string));
            if !ok {
                out.push((
                    format!("metadata.{field}"),
                    "must map strings to strings (quote numbers and booleans)".into(),
                ));
            }
        }
    }
}

/// Whether `s` is a Kubernetes resource quantity (`80Gi`, `1.5`, `500m`, `1e3`).
pub fn is_quantity(s: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$").ok()
    })
    .as_ref()
    .is_some_and(|re| re.is_match(s))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}
