//! Fields tables from a CRD's OpenAPI v3 schema: one row per field, depth first, with its
//! path (`spec.placement.sovereignty.allowedJurisdictions`, `[]` for list items, `<name>` for
//! map keys), type, whether it is required, its default, every validation the API server
//! applies (ranges, lengths, patterns, enums, item counts, list and map types, CEL rules with
//! their messages) and the first paragraph of its description.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};

/// One row of a fields table.
pub struct Row {
    pub path: String,
    pub type_: String,
    pub required: bool,
    pub default: Option<String>,
    pub validation: Vec<String>,
    pub description: String,
}

/// A cell: pipes escaped (also inside code spans, as GitHub tables want), one line.
pub fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// `code`, with a longer fence when the text holds a backtick.
pub fn code(s: &str) -> String {
    if s.contains('`') { format!("`` {s} ``") } else { format!("`{s}`") }
}

fn items(s: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match s.items.as_ref()? {
        JSONSchemaPropsOrArray::Schema(b) => Some(b),
        JSONSchemaPropsOrArray::Schemas(v) => v.first(),
    }
}

fn map_values(s: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match s.additional_properties.as_ref()? {
        JSONSchemaPropsOrBool::Schema(b) => Some(b),
        JSONSchemaPropsOrBool::Bool(_) => None,
    }
}

fn is_condition_list(path: &str) -> bool {
    path == "status.conditions"
}

/// The type as a reader writes it: `string`, `integer (int32)`, `[]string`, `map[string]object`,
/// `quantity`, `[]Condition`.
pub fn type_name(s: &JSONSchemaProps, path: &str) -> String {
    if is_condition_list(path) {
        return "[]Condition".into();
    }
    if s.x_kubernetes_int_or_string == Some(true) {
        // A `pattern` marks a count or a percentage (a disruption budget), not a quantity.
        if s.pattern.is_some() {
            return "int or percentage".into();
        }
        return "quantity (int or string)".into();
    }
    match s.type_.as_deref() {
        Some("array") => format!("[]{}", items(s).map_or("any".into(), |i| type_name(i, ""))),
        Some("object") => match map_values(s) {
            Some(v) => format!("map[string]{}", type_name(v, "")),
            None => "object".into(),
        },
        Some(t) => match s.format.as_deref() {
            Some(f) => format!("{t} ({f})"),
            None => t.to_string(),
        },
        None if s.x_kubernetes_preserve_unknown_fields == Some(true) => "any".into(),
        None => "any".into(),
    }
}

fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 { format!("{}", n as i64) } else { format!("{n}") }
}

fn range(lo: Option<String>, hi: Option<String>, what: &str) -> Option<String> {
    match (lo, hi) {
        (Some(lo), Some(hi)) if lo == hi => Some(format!("{what}exactly {lo}")),
        (Some(lo), Some(hi)) => Some(format!("{what}{lo}–{hi}")),
        (Some(lo), None) => Some(format!("{what}≥ {lo}")),
        (None, Some(hi)) => Some(format!("{what}≤ {hi}")),
        (None, None) => None,
    }
}

fn json(v: &serde_json::Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// Every validation on one schema node, in a fixed order.
pub fn constraints(s: &JSONSchemaProps) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(e) = &s.enum_ {
        let values: Vec<String> =
            e.iter().map(|v| code(v.0.as_str().map_or_else(|| json(&v.0), str::to_string).as_str())).collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    out.extend(range(s.minimum.map(number), s.maximum.map(number), ""));
    if s.exclusive_minimum == Some(true) || s.exclusive_maximum == Some(true) {
        out.push("bounds exclusive".into());
    }
    out.extend(range(s.min_length.map(|n| n.to_string()), s.max_length.map(|n| n.to_string()), "length "));
    if let Some(p) = &s.pattern {
        out.push(format!("pattern {}", code(p)));
    }
    let counted = range(s.min_items.map(|n| n.to_string()), s.max_items.map(|n| n.to_string()), "");
    out.extend(counted.map(|r| format!("{r} items")));
    let props = range(s.min_properties.map(|n| n.to_string()), s.max_properties.map(|n| n.to_string()), "");
    out.extend(props.map(|r| format!("{r} entries")));
    if s.unique_items == Some(true) {
        out.push("unique items".into());
    }
    if let Some(t) = &s.x_kubernetes_list_type {
        let keys = s.x_kubernetes_list_map_keys.as_ref().map(|k| {
            let k: Vec<String> = k.iter().map(|k| code(k)).collect();
            format!(" keyed on {}", k.join(", "))
        });
        out.push(format!("list-type {}{}", code(t), keys.unwrap_or_default()));
    }
    if let Some(t) = &s.x_kubernetes_map_type {
        out.push(format!("map-type {}", code(t)));
    }
    for rule in s.x_kubernetes_validations.iter().flatten() {
        let message = rule.message.as_deref().map(|m| format!(" — “{m}”")).unwrap_or_default();
        let at = rule.field_path.as_deref().map(|p| format!(" (at {})", code(p))).unwrap_or_default();
        out.push(format!("CEL {}{at}{message}", code(&rule.rule)));
    }
    out
}

fn first_paragraph(s: Option<&str>) -> String {
    let s = s.unwrap_or_default();
    s.split("\n\n").next().unwrap_or_default().split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The rows of `schema` (at `path`) and everything below it.
pub fn rows(schema: &JSONSchemaProps, path: &str, required: bool, out: &mut Vec<Row>) {
    let mut validation = constraints(schema);
    let mut description = first_paragraph(schema.description.as_deref());
    if is_condition_list(path) {
        description = format!("{description} Each a `metav1.Condition`; see Conditions below.");
    }
    // List items and map values that are not objects with fields of their own are described
    // on this row; object items get rows of their own under `path[]`.
    let mut child: Option<(&JSONSchemaProps, String)> = None;
    if let Some(i) = items(schema) {
        let inner = constraints(i);
        if !inner.is_empty() {
            validation.push(format!("items: {}", inner.join("; ")));
        }
        if i.properties.is_some() && !is_condition_list(path) {
            child = Some((i, format!("{path}[]")));
        }
    }
    if let Some(v) = map_values(schema) {
        let inner = constraints(v);
        if !inner.is_empty() {
            validation.push(format!("values: {}", inner.join("; ")));
        }
        if v.properties.is_some() {
            child = Some((v, format!("{path}.<name>")));
        }
    }
    out.push(Row {
        path: path.to_string(),
        type_: type_name(schema, path),
        required,
        default: schema.default.as_ref().map(|d| json(&d.0)),
        validation,
        description,
    });
    let fields = match &child {
        Some((c, p)) => c.properties.as_ref().map(|props| (*c, props, p.clone())),
        None => schema.properties.as_ref().map(|props| (schema, props, path.to_string())),
    };
    if let Some((owner, props, prefix)) = fields {
        let required: Vec<&String> = owner.required.iter().flatten().collect();
        let mut names: Vec<&String> = props.keys().collect();
        names.sort();
        for name in names {
            rows(&props[name], &format!("{prefix}.{name}"), required.contains(&name), out);
        }
    }
}

/// A Markdown table of `rows`.
pub fn table(rows: &[Row]) -> String {
    let mut s =
        String::from("| field | type | required | default | validation | description |\n|---|---|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            cell(&code(&r.path)),
            cell(&r.type_),
            if r.required { "yes" } else { "" },
            cell(&r.default.as_deref().map(code).unwrap_or_default()),
            cell(&r.validation.join("; ")),
            cell(&r.description),
        ));
    }
    s
}
