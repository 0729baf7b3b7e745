//! Reading fleet YAML from files and directories (recursively, in a stable order, each file
//! once, refusing a symlink loop) into parsed objects and problems, and the machine-readable
//! validation report.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use flotilla_apis::document::{Parsed, Problem, Severity, parse_stream_within};
use flotilla_apis::validate::validate_set;
use serde::Serialize;

/// A loaded fleet.
pub struct Fleet {
    /// Files read.
    pub files: usize,
    /// What parsing found.
    pub parsed: Parsed,
    /// Each file's text, by the name problems give it: where their fields are written.
    texts: HashMap<String, String>,
}

impl Fleet {
    /// Per-document problems plus the problems of the set as a whole, sorted by place, each at
    /// the line of its field.
    pub fn problems(&self) -> Vec<Problem> {
        self.located_problems().into_iter().map(|(p, _)| p).collect()
    }

    /// [`Fleet::problems`], each with the column of its field when it was found in the text
    /// (`fieldline`): its line is then the field's, not the document's.
    pub fn located_problems(&self) -> Vec<(Problem, Option<usize>)> {
        let mut all = self.parsed.problems.clone();
        all.extend(validate_set(&self.parsed.objects, &self.parsed.refused));
        // Each file split into lines once, and only when one of its problems names a field.
        let mut lines: HashMap<&str, Vec<&str>> = HashMap::new();
        let mut located: Vec<(Problem, Option<usize>)> = all
            .into_iter()
            .map(|mut p| {
                let at = (!p.field.is_empty()).then(|| self.texts.get_key_value(&p.location.file)).flatten().and_then(
                    |(file, text)| {
                        let lines = lines.entry(file.as_str()).or_insert_with(|| text.lines().collect());
                        crate::fieldline::locate(lines, p.location.line, &p.field)
                    },
                );
                match at {
                    Some((line, column)) => {
                        p.location.line = line;
                        (p, Some(column))
                    }
                    None => (p, None),
                }
            })
            .collect();
        located.sort_by(|(a, _), (b, _)| a.location.cmp(&b.location).then(a.field.cmp(&b.field)));
        located
    }
}

/// `problem` as `validate` prints it: `file:line:column (document N): …` when the field was
/// found, else `file:line (document N): …`.
pub fn display(problem: &Problem, column: Option<usize>) -> String {
    let text = problem.to_string();
    let Some(column) = column else { return text };
    let at = format!("{}:{} (document", problem.location.file, problem.location.line);
    match text.strip_prefix(&at) {
        Some(rest) => format!("{}:{}:{column} (document{rest}", problem.location.file, problem.location.line),
        None => text,
    }
}

impl Fleet {
    /// The solver's snapshot of the loaded objects.
    pub fn snapshot(&self) -> flotilla_placement::FleetSnapshot {
        flotilla_placement::FleetSnapshot::from_objects(self.parsed.objects.iter().map(|o| &o.value))
    }
}

/// Directories being read (the chain from `-f` down, canonical) and every directory and
/// file already read, so a symlink back up the tree is refused and one to a place already
/// read is not read twice.
#[derive(Default)]
struct Walk {
    ancestors: Vec<PathBuf>,
    seen: HashSet<PathBuf>,
}

/// `-f -`: the documents are read from standard input.
pub const STDIN: &str = "-";

/// The most `-f -` reads from standard input.
const STDIN_MAX_BYTES: u64 = 64 << 20;

fn collect(path: &Path, walk: &mut Walk, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if path == Path::new(STDIN) {
        if out.iter().any(|p| p == Path::new(STDIN)) {
            anyhow::bail!("-f - is given twice: standard input can be read once");
        }
        out.push(path.to_path_buf());
        return Ok(());
    }
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    let canonical = std::fs::canonicalize(path).with_context(|| format!("cannot resolve {}", path.display()))?;
    if walk.ancestors.contains(&canonical) {
        anyhow::bail!(
            "{} leads back to {}, which is being read (a directory cycle through a symlink): remove the link or point -f below it",
            path.display(),
            canonical.display()
        );
    }
    if !walk.seen.insert(canonical.clone()) {
        return Ok(());
    }
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("cannot list {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        walk.ancestors.push(canonical);
        for entry in entries {
            let hidden = entry.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            if entry.is_dir() || matches!(entry.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")) {
                collect(&entry, walk, out)?;
            }
        }
        walk.ancestors.pop();
    } else {
        out.push(path.to_path_buf());
    }
    Ok(())
}

/// Reads every file under the given paths.
pub fn load(paths: &[PathBuf]) -> anyhow::Result<Fleet> {
    let mut files = Vec::new();
    let mut walk = Walk::default();
    for p in paths {
        collect(p, &mut walk, &mut files)?;
    }
    if files.is_empty() {
        anyhow::bail!(
            "no *.yaml, *.yml or *.json files under {}",
            paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    let mut parsed = Parsed::default();
    let mut texts = HashMap::new();
    // One bound on what YAML aliases add, over each file and over all of them together.
    let mut budget = flotilla_apis::yaml_bound::Budget::default();
    for file in &files {
        let (name, text) = if file == Path::new(STDIN) {
            ("<stdin>".to_string(), read_stdin()?)
        } else {
            let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
            (file.display().to_string(), text)
        };
        // A UTF-8 byte-order mark (editors on Windows write one) is not content: kubectl skips it.
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let one = parse_stream_within(&name, text, &mut budget);
        parsed.objects.extend(one.objects);
        parsed.problems.extend(one.problems);
        parsed.skipped.extend(one.skipped);
        parsed.refused.extend(one.refused);
        texts.insert(name, text.to_string());
    }
    Ok(Fleet { files: files.len(), parsed, texts })
}

/// Standard input as text, at most [`STDIN_MAX_BYTES`].
fn read_stdin() -> anyhow::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::io::stdin().take(STDIN_MAX_BYTES + 1).read_to_end(&mut bytes).context("cannot read standard input")?;
    if bytes.len() as u64 > STDIN_MAX_BYTES {
        anyhow::bail!(
            "standard input is over {} MiB: split it into files and pass them with -f",
            STDIN_MAX_BYTES >> 20
        );
    }
    String::from_utf8(bytes).context("standard input is not UTF-8 text")
}

/// The validation report for `-o json|yaml`.
#[derive(Serialize)]
pub struct Report {
    files: usize,
    objects: usize,
    skipped: usize,
    errors: usize,
    warnings: usize,
    problems: Vec<ReportProblem>,
}

#[derive(Serialize)]
struct ReportProblem {
    severity: &'static str,
    file: String,
    document: usize,
    line: usize,
    /// The field's column, when its line is the field's.
    #[serde(skip_serializing_if = "Option::is_none")]
    column: Option<usize>,
    object: Option<String>,
    field: String,
    message: String,
}

/// Builds the report.
pub fn report(fleet: &Fleet, problems: &[(Problem, Option<usize>)]) -> Report {
    Report {
        files: fleet.files,
        objects: fleet.parsed.objects.len(),
        skipped: fleet.parsed.skipped.len(),
        errors: problems.iter().filter(|(p, _)| p.severity == Severity::Error).count(),
        warnings: problems.iter().filter(|(p, _)| p.severity == Severity::Warning).count(),
        problems: problems
            .iter()
            .map(|(p, column)| ReportProblem {
                severity: if p.severity == Severity::Error { "error" } else { "warning" },
                file: p.location.file.clone(),
                document: p.location.document,
                line: p.location.line,
                column: *column,
                object: p.object.clone(),
                field: p.field.clone(),
                message: p.message.clone(),
            })
            .collect(),
    }
}
