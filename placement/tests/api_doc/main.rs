//! `docs/api.md`, rendered from the sources of truth and compared with the committed file:
//! the CRDs `flotilla_apis::crd::all()` generates (fields, types, defaults, validation, CEL
//! rules, printer columns, short names, scope), the condition and reason tables of
//! `flotilla_apis::reasons`, and the solver's per-cluster reasons (`Reason::ALL`, with
//! `meaning` and `action`). The test fails on any drift; `FLOTILLA_UPDATE_DOCS=1` rewrites the
//! file instead. It lives in `placement` because the solver's reasons do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fields;

use std::fmt::Write as _;
use std::path::PathBuf;

use flotilla_apis::crd;
use flotilla_apis::reasons::{self, KINDS};
use flotilla_placement::Reason;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use fields::{cell, code};

const REGENERATE: &str = "FLOTILLA_UPDATE_DOCS=1 cargo test -p flotilla-placement --test api_doc";

fn doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md")
}

fn anchor(kind: &str) -> String {
    kind.to_lowercase()
}

fn header(out: &mut String) {
    let _ = write!(
        out,
        "# API reference: `flotilla.dev/v1alpha1`

<!-- Generated from the types; do not edit. Regenerate with `{REGENERATE}`. -->

Flotilla's six kinds, generated from what the API server enforces — the CRDs under
`charts/flotilla/crds/` (from `flotilla_apis::crd::all()`) — and from the documented
conditions and reasons in `apis/src/reasons.rs` and `placement/src/reason_doc.rs`. A test
fails when this file and the sources differ.

How to read the tables:

- **field**: the path from the object's root; `[]` is every item of a list, `<name>` every key
  of a map. A field whose parent is optional is required only when the parent is given.
- **type**: `integer (int32)` and the like carry the OpenAPI format; `quantity` is a Kubernetes
  quantity (`80Gi`, `1.5`), given as a string or a number.
- **default**: what the API server fills in when the field is omitted.
- **validation**: what the API server refuses: ranges (inclusive), lengths, patterns,
  enums, item counts, and CEL rules (`x-kubernetes-validations`) with the message they return.
  `oldSelf` rules make a field immutable. `fleetctl validate -f DIR` checks all of them, and the
  cross-object rules no schema can express, before you commit.
- **conditions**: every status carries `observedGeneration` and `conditions`, a list of
  `metav1.Condition` (`type`, `status`, `reason`, `message`, `observedGeneration`,
  `lastTransitionTime`) keyed on `type`, with one aggregate `Ready`. Reasons are a closed set
  per kind: alert on them. A reason marked *reserved* belongs to the set but no component of
  this release writes it yet.
- **what a field may reach**: a field of a namespaced kind acts only within the object's own
  namespace — the Secrets it names, the member namespace its objects are written into — and
  on objects this installation made. Every field that leads to a privileged action (a Secret
  read, a write to a member, a cloud purchase, a share of the gateway) is listed with the check
  that bounds it in [operations.md, What a tenant controls](operations.md#what-a-tenant-controls).

| kind | scope | short names | what it is |
|---|---|---|---|
"
    );
}

fn spec_description(c: &CustomResourceDefinition) -> String {
    let schema = c.spec.versions[0].schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref());
    let spec = schema.and_then(|s| s.properties.as_ref()).and_then(|p| p.get("spec"));
    spec.and_then(|s| s.description.clone()).unwrap_or_default()
}

fn kind_section(out: &mut String, c: &CustomResourceDefinition) {
    let kind = &c.spec.names.kind;
    let v = &c.spec.versions[0];
    let short: Vec<String> = c.spec.names.short_names.iter().flatten().map(|s| code(s)).collect();
    let categories: Vec<String> = c.spec.names.categories.iter().flatten().map(|s| code(s)).collect();
    let _ = writeln!(out, "## {kind}\n\n{}\n", spec_description(c));
    let _ = writeln!(out, "- **Scope**: {}", c.spec.scope);
    let _ = writeln!(
        out,
        "- **Names**: plural {}, singular {}, short {}, categories {}",
        code(&c.spec.names.plural),
        code(c.spec.names.singular.as_deref().unwrap_or_default()),
        short.join(", "),
        categories.join(", ")
    );
    let subresources = v.subresources.as_ref();
    let mut subs = Vec::new();
    if subresources.and_then(|s| s.status.as_ref()).is_some() {
        subs.push("`status`".to_string());
    }
    if let Some(scale) = subresources.and_then(|s| s.scale.as_ref()) {
        subs.push(format!(
            "`scale` (replicas {}, status {})",
            code(&scale.spec_replicas_path),
            code(&scale.status_replicas_path)
        ));
    }
    let _ = writeln!(out, "- **Subresources**: {}", subs.join(", "));
    if let Some(k) = KINDS.iter().find(|k| k.kind == kind) {
        let _ = writeln!(out, "- **Status written by**: {}", k.writer);
    }
    let _ = writeln!(
        out,
        "\n### Printer columns\n\n`kubectl get {}`; columns with a priority show with `-o wide`.\n\n| column | type | JSONPath | priority |\n|---|---|---|---|",
        c.spec.names.plural
    );
    for col in v.additional_printer_columns.iter().flatten() {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            cell(&col.name),
            col.type_,
            cell(&code(&col.json_path)),
            col.priority.unwrap_or(0)
        );
    }
    let root = v.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref());
    let props = root.and_then(|r| r.properties.as_ref());
    let required: Vec<String> = root.and_then(|r| r.required.clone()).unwrap_or_default();
    for (part, title) in [("spec", "Spec"), ("status", "Status")] {
        let Some(schema) = props.and_then(|p| p.get(part)) else { continue };
        let mut rows = Vec::new();
        fields::rows(schema, part, required.iter().any(|r| r == part), &mut rows);
        let _ = writeln!(out, "\n### {title}\n\n{}", fields::table(&rows).trim_end());
    }
    let _ = writeln!(out, "\n### Conditions\n\n| type | meaning |\n|---|---|");
    for cond in reasons::conditions_of(kind) {
        let _ = writeln!(out, "| {} | {} |", code(cond.type_), cell(cond.meaning));
    }
    let _ = writeln!(out, "\n### Reasons\n\n| reason | written on | what it means | what to do |\n|---|---|---|---|");
    for r in reasons::reasons_of(kind) {
        let on = match r.conditions.strip_prefix("reserved") {
            Some("") => "*reserved*".to_string(),
            Some(rest) => format!("{} (*reserved*)", rest.trim_start_matches(": ")),
            None => r.conditions.to_string(),
        };
        let _ = writeln!(out, "| {} | {} | {} | {} |", code(r.reason), cell(&on), cell(r.meaning), cell(r.action));
    }
    if kind == "ModelDeployment" {
        unplaced_section(out);
    }
    out.push('\n');
}

fn unplaced_section(out: &mut String) {
    let _ = writeln!(
        out,
        "
### Per-cluster reasons: `status.unplaced.reasons[].reason`

While replicas stay unplaced, each cluster that refused one reports the solver's first reason,
with the numbers in `message` (at most 16 clusters; then one entry with cluster `*` and reason
`Truncated`). `fleetctl plan` prints the same reasons and `fleetctl explain` every filter's
verdict; see [placement.md](placement.md). When no replica is placed and every cluster gave a
*cluster rule* reason, `Placed` says `NoEligibleCluster`; otherwise `CostCeilingExceeded` when a
cluster gave that, else `InsufficientCapacity`.

| reason | refusal | what it means | what to do |
|---|---|---|---|"
    );
    for r in Reason::ALL {
        let class = if r.is_static() { "cluster rule" } else { "capacity" };
        let _ = writeln!(out, "| {} | {class} | {} | {} |", code(r.as_str()), cell(r.meaning()), cell(r.action()));
    }
    let _ = writeln!(
        out,
        "| `Truncated` | — | More than 16 clusters refused; the message counts the rest. | Run `fleetctl explain --live md/<name> -n <namespace>` to see every cluster. |"
    );
}

/// What Flotilla refuses to evaluate, with the numbers from the code that enforces them.
fn limits_section(out: &mut String) {
    use flotilla_apis::cel::{
        MAX_COMPREHENSION_DEPTH, MAX_COST, MAX_LIST_LEN, MAX_NESTING, MAX_SELECTOR_LEN, MAX_STRING_BYTES,
        NAMESPACED_FUNCTIONS,
    };
    let _ = writeln!(
        out,
        "## Limits\n\n\
User input is evaluated with bounds, so that one bad object gets its own error (`fleetctl \
validate`, or `InvalidSpec` from the controller) and harms nothing else. Each row is enforced \
by `fleetctl validate` and `fleetctl plan`, by the controller before a selector is evaluated, \
and by the solver.\n\n\
| what | limit | why |\n|---|---|---|\n\
| selector length | {MAX_SELECTOR_LEN} bytes | as in DRA. |\n\
| selector nesting | {MAX_NESTING} levels, counted on the tokens before parsing: one per open bracket, one per operator or member access chained at a level (`a.b.c`, `x + y`, `c ? d : e`); `&&`, `\\|\\|`, `,` and `:` end a chain; strings, comments and whitespace do not count | the CEL parser and evaluator recurse once per level with large frames: 55 nested parentheses overflowed the stack. The error gives the line and column. Parsing and evaluation also run on a stack of known size, and a panic inside the CEL library becomes the selector's error. |\n\
| comprehensions | {MAX_COMPREHENSION_DEPTH} nested (`all`, `exists`, `exists_one`, `map`, `filter`), read from the syntax tree | nested comprehensions multiply their cost. |\n\
| estimated cost | {MAX_COST}, Kubernetes' CEL budget | estimated from the syntax tree as cel-go does: one unit per node, a tenth per byte or element a string or list operation touches, a comprehension's body once per element of its range. A device map has at most 32 entries and strings of at most 64 bytes (DRA's bounds); literal lists count their length, `lists.range(n)` counts `n` (unbounded unless `n` is a literal), and `replace` counts what the string can grow to. The error gives the estimate. |\n\
| run-time growth | `replace` builds at most {MAX_STRING_BYTES} bytes, `lists.range` at most {MAX_LIST_LEN} elements, `quantity()` range-checks its argument | a guard behind the estimate: the checked functions refuse before kube-cel's run. |\n\
| quantities | magnitude at most 2^63-1 units, in steps of 1n; device capacities not negative (`-0` included) | what Kubernetes' `resource.Quantity` can hold. Kubernetes silently caps larger values and rounds finer ones; Flotilla refuses them, since a capped `1e400` compares wrongly and overflows kube-cel's quantity arithmetic. |\n\
| YAML and JSON nesting | {} levels, block collections and flow brackets together, counted in one pass over the text before it is parsed; the error gives the file, line and column | the parser's time grew with the square of the depth: 100,000 nested flow mappings took minutes before its recursion limit answered. |\n\
| YAML documents | {} nodes each, aliases expanded; the nodes aliases add, beyond two per byte of text, at most {} per file and {} per run of `fleetctl` | one anchor referenced 3,000 times by nodes referenced 3,000 times is 9 million nodes (12 s, 950 MB); the count stops at the bound. Aliases spread over 1,000 documents of one file were each under the per-document bound. |\n\
| directories | a symlink back to a directory being read is refused; one to a directory already read is read once | `a -> .` and `b -> .` made 2^40 paths. A UTF-8 byte-order mark is accepted, as kubectl does. |\n\n\
Library functions called through a namespace, as Kubernetes CEL offers them: {}.\n",
        flotilla_apis::yaml_bound::depth::MAX_DEPTH,
        flotilla_apis::yaml_bound::MAX_YAML_NODES,
        flotilla_apis::yaml_bound::MAX_FILE_ALIAS_NODES,
        flotilla_apis::yaml_bound::MAX_RUN_ALIAS_NODES,
        NAMESPACED_FUNCTIONS.iter().map(|f| code(f)).collect::<Vec<_>>().join(", ")
    );
}

fn render() -> String {
    let crds = crd::all();
    let mut out = String::new();
    header(&mut out);
    for c in &crds {
        let kind = &c.spec.names.kind;
        let short: Vec<String> = c.spec.names.short_names.iter().flatten().map(|s| code(s)).collect();
        let _ = writeln!(
            out,
            "| [{kind}](#{}) | {} | {} | {} |",
            anchor(kind),
            c.spec.scope,
            short.join(", "),
            cell(&spec_description(c))
        );
    }
    out.push('\n');
    for c in &crds {
        kind_section(&mut out, c);
    }
    limits_section(&mut out);
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

#[test]
fn committed_api_doc_matches_the_types() {
    let want = render();
    let path = doc_path();
    if std::env::var_os("FLOTILLA_UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let line = have.lines().zip(want.lines()).position(|(a, b)| a != b).map_or(0, |i| i + 1);
        panic!("{} differs from the types (first at line {line}); regenerate with `{REGENERATE}`", path.display());
    }
}

#[test]
fn the_doc_is_deterministic_and_covers_every_kind_field_and_reason() {
    let doc = render();
    assert_eq!(doc, render());
    for c in crd::all() {
        assert!(doc.contains(&format!("## {}\n", c.spec.names.kind)));
    }
    for path in [
        "`spec.placement.sovereignty.allowedJurisdictions`",
        "`spec.devices.alternatives[].selectors`",
        "`spec.device.attributes.<name>.string`",
        "`status.unplaced.reasons[].reason`",
    ] {
        assert!(doc.contains(path), "{path} missing");
    }
    // CEL rules with their messages, escaped for tables.
    assert!(doc.contains("CEL `self.model.name == oldSelf.model.name` — “spec.model.name is immutable"));
    assert!(doc.contains("\\|\\|"), "CEL `||` must be escaped inside table cells");
    for r in reasons::ALL {
        assert!(doc.contains(&format!("| `{}` |", r.reason)), "{} missing", r.reason);
    }
    for r in Reason::ALL {
        assert!(doc.contains(&format!("| `{r}` |")), "{r} missing");
    }
    // Every table row has the same number of cells as its header.
    let mut columns = 0;
    for line in doc.lines() {
        if !line.starts_with('|') {
            columns = 0;
            continue;
        }
        let n = line.replace("\\|", "").matches('|').count();
        if columns == 0 {
            columns = n;
        }
        assert_eq!(n, columns, "{line}");
    }
}
