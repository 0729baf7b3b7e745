//! From YAML text to typed fleet objects. A stream is split into documents (keeping each
//! one's first line), every document is checked the way the API server would check it — the
//! CRD's structural schema, then its CEL rules — and only then deserialized. Every problem
//! carries the file, the document's index and line, the object and the field path.

use std::fmt;

use serde_json::Value as Json;

use crate::constants::{API_VERSION, GROUP};
use crate::{CapacityClaim, FleetQuota, InferenceClass, InferenceCluster, ModelCache, ModelDeployment};

/// Where a document came from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceLocation {
    /// File path as given.
    pub file: String,
    /// 1-based index of the document in the file.
    pub document: usize,
    /// 1-based line where the document starts.
    pub line: usize,
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} (document {})", self.file, self.line, self.document)
    }
}

/// A value and where it came from.
#[derive(Clone, Debug)]
pub struct Located<T> {
    /// Where.
    pub location: SourceLocation,
    /// What.
    pub value: T,
}

/// Any of the six kinds.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum FleetObject {
    /// An InferenceClass.
    Class(InferenceClass),
    /// An InferenceCluster.
    Cluster(InferenceCluster),
    /// A ModelDeployment.
    Deployment(ModelDeployment),
    /// A ModelCache.
    Cache(ModelCache),
    /// A CapacityClaim.
    Claim(CapacityClaim),
    /// A FleetQuota.
    Quota(FleetQuota),
}

/// The six kinds, for dispatch before an object is typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// InferenceClass.
    InferenceClass,
    /// InferenceCluster.
    InferenceCluster,
    /// ModelDeployment.
    ModelDeployment,
    /// ModelCache.
    ModelCache,
    /// CapacityClaim.
    CapacityClaim,
    /// FleetQuota.
    FleetQuota,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 6] = [
        Self::InferenceClass,
        Self::InferenceCluster,
        Self::ModelDeployment,
        Self::ModelCache,
        Self::CapacityClaim,
        Self::FleetQuota,
    ];

    /// The kind's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InferenceClass => "InferenceClass",
            Self::InferenceCluster => "InferenceCluster",
            Self::ModelDeployment => "ModelDeployment",
            Self::ModelCache => "ModelCache",
            Self::CapacityClaim => "CapacityClaim",
            Self::FleetQuota => "FleetQuota",
        }
    }

    /// Parses a kind name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether objects of the kind live in a namespace.
    pub fn namespaced(self) -> bool {
        matches!(self, Self::ModelDeployment | Self::ModelCache | Self::CapacityClaim | Self::FleetQuota)
    }
}

impl FleetObject {
    /// The object's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Self::Class(_) => Kind::InferenceClass,
            Self::Cluster(_) => Kind::InferenceCluster,
            Self::Deployment(_) => Kind::ModelDeployment,
            Self::Cache(_) => Kind::ModelCache,
            Self::Claim(_) => Kind::CapacityClaim,
            Self::Quota(_) => Kind::FleetQuota,
        }
    }

    fn meta(&self) -> &kube::core::ObjectMeta {
        match self {
            Self::Class(o) => &o.metadata,
            Self::Cluster(o) => &o.metadata,
            Self::Deployment(o) => &o.metadata,
            Self::Cache(o) => &o.metadata,
            Self::Claim(o) => &o.metadata,
            Self::Quota(o) => &o.metadata,
        }
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or("")
    }

    /// `metadata.namespace`, `default` for namespaced kinds that leave it empty.
    pub fn namespace(&self) -> Option<&str> {
        if self.kind().namespaced() { Some(self.meta().namespace.as_deref().unwrap_or("default")) } else { None }
    }

    /// `Kind ns/name` or `Kind name`, as problems name objects.
    pub fn display_name(&self) -> String {
        match self.namespace() {
            Some(ns) => format!("{} {ns}/{}", self.kind().as_str(), self.name()),
            None => format!("{} {}", self.kind().as_str(), self.name()),
        }
    }

    /// The object as a JSON value (what a YAML document of it holds).
    pub fn to_json(&self) -> serde_json::Result<Json> {
        match self {
            Self::Class(o) => serde_json::to_value(o),
            Self::Cluster(o) => serde_json::to_value(o),
            Self::Deployment(o) => serde_json::to_value(o),
            Self::Cache(o) => serde_json::to_value(o),
            Self::Claim(o) => serde_json::to_value(o),
            Self::Quota(o) => serde_json::to_value(o),
        }
    }
}

/// How bad a problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The input is refused.
    Error,
    /// Accepted, but probably not what was meant.
    Warning,
}

/// One thing wrong with the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Error or warning.
    pub severity: Severity,
    /// Where the document is.
    pub location: SourceLocation,
    /// `Kind ns/name`, when known.
    pub object: Option<String>,
    /// Field path (`spec.pools[0].maxNodes`); empty for the whole document.
    pub field: String,
    /// What is wrong and what to change.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}: {sev}", self.location)?;
        if let Some(o) = &self.object {
            write!(f, ": {o}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// What parsing a stream found.
#[derive(Debug, Default)]
pub struct Parsed {
    /// Flotilla objects that passed every per-document check.
    pub objects: Vec<Located<FleetObject>>,
    /// Problems found.
    pub problems: Vec<Problem>,
    /// Documents of other API groups (Namespaces, Secrets, Argo CD objects), skipped.
    pub skipped: Vec<(SourceLocation, String)>,
    /// Flotilla documents refused with errors: (kind, namespace, name). References to them are
    /// not reported again as unknown.
    pub refused: Vec<(Kind, Option<String>, String)>,
}

/// A raw document of a stream: its text and first line, and why it is refused unparsed.
struct RawDocument<'a> {
    text: &'a str,
    line: usize,
    bound: Option<crate::yaml_bound::Refusal>,
}

/// Splits a YAML stream at `---` lines, keeping the line each document starts on.
fn split_documents(text: &str) -> Vec<RawDocument<'_>> {
    let mut docs = Vec::new();
    let mut start = 0usize;
    let mut start_line = 1usize;
    let mut offset = 0usize;
    for (idx, line) in text.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_end();
        let is_sep = trimmed == "---" || trimmed.starts_with("--- ") || trimmed.starts_with("---#");
        let is_end = trimmed == "...";
        if is_sep || is_end {
            docs.push(RawDocument { text: &text[start..offset], line: start_line, bound: None });
            start = offset + line.len();
            start_line = idx + 2;
        }
        offset += line.len();
    }
    docs.push(RawDocument { text: &text[start..], line: start_line, bound: None });
    docs.into_iter()
        .filter(|d| d.text.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .collect()
}

/// Streams at least this large (bytes and documents) are checked on several threads.
const PARALLEL_BYTES: usize = 1 << 20;
const PARALLEL_DOCUMENTS: usize = 512;

/// Parses a YAML stream of fleet objects, checking each document on its own. A large stream
/// (a generated fleet of thousands of objects) is checked on up to eight threads, in runs of
/// consecutive documents whose results are joined in document order: the outcome is the
/// sequential one, item for item. A small one (every hand-written fleet, every hostile
/// fixture) stays on the caller's thread.
pub fn parse_stream(file: &str, text: &str) -> Parsed {
    parse_stream_within(file, text, &mut crate::yaml_bound::Budget::default())
}

/// [`parse_stream`] for one file of several read together: `budget` bounds what YAML aliases
/// add over the file and over the run ([`crate::yaml_bound`]). Every document's nesting and
/// nodes are checked first, in order, on this thread (a linear pass each, and the one place
/// the budget is spent, so the outcome does not depend on threads); documents refused there
/// are never parsed.
pub fn parse_stream_within(file: &str, text: &str, budget: &mut crate::yaml_bound::Budget) -> Parsed {
    budget.next_file();
    let mut docs = split_documents(text);
    for doc in &mut docs {
        doc.bound = crate::yaml_bound::check(doc.text, budget).err();
    }
    let threads = check_threads(text.len(), docs.len());
    if threads < 2 {
        return parse_documents(file, &docs, 0);
    }
    let run = docs.len().div_ceil(threads);
    let parts: Vec<Parsed> = std::thread::scope(|scope| {
        let handles: Vec<_> = docs
            .chunks(run)
            .enumerate()
            .map(|(k, chunk)| {
                // The main thread's stack size: a document's checks recurse as deep there.
                let spawned = std::thread::Builder::new()
                    .stack_size(8 << 20)
                    .spawn_scoped(scope, move || parse_documents(file, chunk, k * run));
                (chunk, k * run, spawned)
            })
            .collect();
        handles
            .into_iter()
            .map(|(chunk, first, spawned)| match spawned {
                Ok(handle) => handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                // No thread to be had (a limit on processes or memory): this run here.
                Err(_) => parse_documents(file, chunk, first),
            })
            .collect()
    });
    let mut parsed = Parsed::default();
    for part in parts {
        parsed.objects.extend(part.objects);
        parsed.problems.extend(part.problems);
        parsed.skipped.extend(part.skipped);
        parsed.refused.extend(part.refused);
    }
    parsed
}

/// Threads to check a stream of `bytes` and `documents` on: one below the thresholds or on
/// one core, else one per core up to eight.
fn check_threads(bytes: usize, documents: usize) -> usize {
    if bytes < PARALLEL_BYTES || documents < PARALLEL_DOCUMENTS {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// Checks `docs`, the stream's documents from index `first` (0-based) on.
fn parse_documents(file: &str, docs: &[RawDocument<'_>], first: usize) -> Parsed {
    let checker = crate::schema_check::Checker::get();
    let mut parsed = Parsed::default();
    for (i, raw) in docs.iter().enumerate() {
        let location = SourceLocation { file: file.to_string(), document: first + i + 1, line: raw.line };
        let error = |field: &str, object: Option<String>, message: String| Problem {
            severity: Severity::Error,
            location: location.clone(),
            object,
            field: field.to_string(),
            message,
        };
        if let Some(refusal) = &raw.bound {
            parsed.problems.push(error("", None, refusal.message(raw.line)));
            continue;
        }
        // Through serde_yaml_ng's own Value first: it refuses duplicate keys, which a JSON map
        // would silently resolve to the last one (`jurisdiction: EU` then `jurisdiction: US`).
        let json: Json = match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(raw.text)
            .and_then(|v| serde_json::to_value(v).map_err(serde::de::Error::custom))
        {
            Ok(v) => v,
            Err(e) => {
                let at = e.location().map(|l| format!(" at line {}, column {}", raw.line + l.line() - 1, l.column()));
                let msg = e.to_string();
                let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
                parsed.problems.push(error("", None, format!("not valid YAML{}: {msg}", at.unwrap_or_default())));
                continue;
            }
        };
        let Some(map) = json.as_object() else {
            parsed.problems.push(error(
                "",
                None,
                "a document must be a mapping with apiVersion, kind and metadata".into(),
            ));
            continue;
        };
        let api_version = map.get("apiVersion").and_then(Json::as_str).unwrap_or("");
        let kind_name = map.get("kind").and_then(Json::as_str).unwrap_or("");
        if api_version.is_empty() {
            parsed.problems.push(error("apiVersion", None, format!("apiVersion is missing: set it to {API_VERSION}")));
            continue;
        }
        let group = api_version.split_once('/').map_or("", |(g, _)| g);
        if group != GROUP {
            parsed.skipped.push((location.clone(), format!("{api_version} {kind_name}")));
            continue;
        }
        let name = map.get("metadata").and_then(|m| m.get("name")).and_then(Json::as_str).unwrap_or("").to_string();
        let ns = map.get("metadata").and_then(|m| m.get("namespace")).and_then(Json::as_str).map(str::to_string);
        let object_name = match (ns.as_deref(), name.is_empty()) {
            (_, true) => Some(kind_name.to_string()),
            (Some(ns), false) => Some(format!("{kind_name} {ns}/{name}")),
            (None, false) => Some(format!("{kind_name} {name}")),
        };
        if api_version != API_VERSION {
            parsed.problems.push(error(
                "apiVersion",
                object_name,
                format!("apiVersion {api_version} is not served; this release serves {API_VERSION}"),
            ));
            continue;
        }
        if kind_name.is_empty() {
            parsed.problems.push(error(
                "kind",
                object_name,
                "kind is missing: set it to one of the Flotilla kinds".into(),
            ));
            continue;
        }
        let Some(kind) = Kind::parse(kind_name) else {
            let known: Vec<_> = Kind::ALL.iter().map(|k| k.as_str()).collect();
            parsed.problems.push(error(
                "kind",
                object_name,
                format!("unknown kind {kind_name:?} in {GROUP}; expected one of {}", known.join(", ")),
            ));
            continue;
        };
        let schema_problems = checker.check(kind, &json);
        if !schema_problems.is_empty() {
            parsed.refused.push((kind, ns.clone(), name.clone()));
            for (field, message) in schema_problems {
                parsed.problems.push(error(&field, object_name.clone(), message));
            }
            continue;
        }
        match typed(kind, json) {
            Ok(object) => parsed.objects.push(Located { location, value: object }),
            Err((field, message)) => {
                parsed.refused.push((kind, ns.clone(), name.clone()));
                parsed.problems.push(error(&field, object_name, message));
            }
        }
    }
    parsed
}

fn typed(kind: Kind, json: Json) -> Result<FleetObject, (String, String)> {
    fn de<T: serde::de::DeserializeOwned>(json: Json) -> Result<T, (String, String)> {
        serde_path_to_error::deserialize(json).map_err(|e| (e.path().to_string(), e.inner().to_string()))
    }
    Ok(match kind {
        Kind::InferenceClass => FleetObject::Class(de(json)?),
        Kind::InferenceCluster => FleetObject::Cluster(de(json)?),
        Kind::ModelDeployment => FleetObject::Deployment(de(json)?),
        Kind::ModelCache => FleetObject::Cache(de(json)?),
        Kind::CapacityClaim => FleetObject::Claim(de(json)?),
        Kind::FleetQuota => FleetObject::Quota(de(json)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_document_lines_and_skips_empty_ones() {
        let text = "# header\n---\na: 1\n---\n# only a comment\n---\nb: 2\nc: 3\n";
        let docs = split_documents(text);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].line, 3);
        assert_eq!(docs[1].line, 7);
        assert!(docs[1].text.contains("c: 3"));
    }

    #[test]
    fn a_large_stream_checked_on_threads_gives_the_sequential_result() {
        // The example EU clusters again and again, with a broken document, a foreign one and a
        // schema error every so often: large enough for the threaded path, compared item for
        // item with one thread.
        let clusters = include_str!("../../examples/fleet/clusters-eu.yaml");
        let mut text = String::new();
        for i in 0..400 {
            match i % 37 {
                13 => text.push_str("---\napiVersion: v1\nkind: Namespace\nmetadata: {name: ns}\n"),
                21 => text.push_str("---\nkind: [unclosed\n"),
                29 => text.push_str(&format!(
                    "---\napiVersion: {API_VERSION}\nkind: InferenceCluster\nmetadata: {{name: bad-{i}}}\nspec: {{region: 7}}\n"
                )),
                _ => {}
            }
            text.push_str(clusters);
            text.push('\n');
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let docs = split_documents(&text).len();
        assert_eq!(check_threads(text.len(), docs), cores.min(8), "{} bytes, {docs} documents", text.len());
        // A hand-written fleet (or a hostile fixture) stays on one thread, whatever the cores.
        assert_eq!(check_threads(PARALLEL_BYTES - 1, docs), 1);
        assert_eq!(check_threads(text.len(), PARALLEL_DOCUMENTS - 1), 1);
        let threaded = parse_stream("big.yaml", &text);
        let sequential = parse_documents("big.yaml", &split_documents(&text), 0);
        assert_eq!(threaded.problems, sequential.problems);
        assert!(!threaded.problems.is_empty(), "the broken documents are reported");
        assert_eq!(threaded.skipped, sequential.skipped);
        assert_eq!(threaded.refused, sequential.refused);
        let names = |p: &Parsed| -> Vec<String> {
            p.objects.iter().map(|o| format!("{:?} {}", o.location, o.value.name())).collect()
        };
        assert_eq!(names(&threaded), names(&sequential));
        assert!(threaded.objects.len() >= 800, "{} objects", threaded.objects.len());
    }

    #[test]
    fn foreign_groups_are_skipped_not_refused() {
        let parsed = parse_stream("x.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: ml}\n");
        assert!(parsed.problems.is_empty());
        assert_eq!(parsed.skipped.len(), 1);
        assert!(parsed.objects.is_empty());
    }
}
