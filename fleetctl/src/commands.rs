//! What `validate`, `plan`, `explain` and `crds` do: load the files (and, with `--live`, the
//! live fleet with the files laid over it), validate, solve, and print the result. Tables and
//! documents go to stdout, problems and progress to stderr.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use flotilla_apis::document::Severity;
use flotilla_apis::{FleetObject, Located};
use flotilla_placement::{FleetSnapshot, SolveOptions, solve};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::cli::Output;
use crate::live::{self, ClusterArgs, Control, LiveError};
use crate::overlay::{self, LiveFleet, Overlaid};
use crate::progress::Progress;
use crate::rejections::{self, Detail, SummarisedDeployment};
use crate::{adapters, claims, diff, load, render};

/// `fleetctl validate`.
pub fn validate(files: &[PathBuf], output: Output, strict: bool) -> anyhow::Result<ExitCode> {
    let fleet = load::load(files)?;
    let located = fleet.located_problems();
    let problems: Vec<&flotilla_apis::document::Problem> = located.iter().map(|(p, _)| p).collect();
    let errors = problems
        .iter()
        .filter(|p| p.severity == Severity::Error || (strict && p.severity == Severity::Warning))
        .count();
    let warnings = problems.iter().filter(|p| p.severity == Severity::Warning).count();
    match output {
        Output::Table => {
            for (p, column) in &located {
                eprintln!("{}", load::display(p, *column));
            }
            println!(
                "{} file(s), {} Flotilla object(s), {} other document(s) skipped: {} error(s), {} warning(s)",
                fleet.files,
                fleet.parsed.objects.len(),
                fleet.parsed.skipped.len(),
                problems.iter().filter(|p| p.severity == Severity::Error).count(),
                warnings
            );
        }
        Output::Json | Output::Yaml => print_structured(&load::report(&fleet, &located), output)?,
    }
    Ok(if errors > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Prints error problems; returns whether there were any.
fn report_errors(problems: &[(flotilla_apis::document::Problem, Option<usize>)], what: &str) -> bool {
    let errors: Vec<_> = problems.iter().filter(|(p, _)| p.severity == Severity::Error).collect();
    for (p, column) in &errors {
        eprintln!("{}", load::display(p, *column));
    }
    if !errors.is_empty() {
        eprintln!("{} error(s): fix them before {what} (`fleetctl validate` shows warnings too)", errors.len());
    }
    !errors.is_empty()
}

/// Loads and validates; on errors prints them and returns `None` (exit 1 follows).
fn load_valid(files: &[PathBuf]) -> anyhow::Result<Option<load::Fleet>> {
    let fleet = load::load(files)?;
    Ok(if report_errors(&fleet.located_problems(), "planning") { None } else { Some(fleet) })
}

/// Writes `value` to stdout as it is serialised (a full plan of a large fleet is over 100 MB
/// of JSON: not held in memory as one string).
fn print_structured<T: Serialize>(value: &T, output: Output) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    match output {
        Output::Yaml => serde_yaml_ng::to_writer(&mut out, value)?,
        _ => {
            serde_json::to_writer_pretty(&mut out, value)?;
            out.write_all(b"\n")?;
        }
    }
    out.flush()?;
    Ok(())
}

fn solve_with_progress(snapshot: &FleetSnapshot, options: &SolveOptions) -> flotilla_placement::Plan {
    let progress = Progress::start(format!(
        "solving {} deployment(s) over {} cluster(s)",
        snapshot.deployments.len(),
        snapshot.clusters.len()
    ));
    let plan = solve(snapshot, options);
    progress.finish();
    plan
}

/// What offline `plan -o json|yaml` prints: the plan's fields, plus `claims`.
#[derive(Serialize)]
struct OfflinePlan<'a, P: Serialize> {
    #[serde(flatten)]
    plan: P,
    /// For each deployment with unplaced replicas: the claim that would be made, and what the
    /// claim engine would try first.
    claims: &'a [claims::ClaimPreview],
    /// Each adapter of a planned deployment: the planned clusters it may be served in once
    /// staged, and those its policy leaves out.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    adapters: &'a [adapters::AdapterPreview],
}

/// The plan's fields with each deployment's rejections summarised.
#[derive(Serialize)]
struct SummarisedPlan<'a> {
    deployments: Vec<SummarisedDeployment<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exact: Option<&'a flotilla_placement::ExactReport>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    quotas: &'a [flotilla_placement::QuotaUsage],
}

/// The solve's options: the defaults, with the exact mode when `exact`.
fn solve_options(exact: bool) -> SolveOptions {
    SolveOptions { exact: exact.then(flotilla_placement::ExactOptions::default), ..SolveOptions::default() }
}

/// Takes every deployment's rejections out of `plan` and returns them summarised, in order.
fn take_summaries(plan: &mut flotilla_placement::Plan) -> Vec<Vec<rejections::ReasonSummary>> {
    plan.deployments
        .iter_mut()
        .map(|d| rejections::summarise(&std::mem::take(&mut d.rejections), rejections::EXAMPLES_PER_REASON))
        .collect()
}

fn summarised<'a>(
    plan: &'a flotilla_placement::Plan,
    summaries: Vec<Vec<rejections::ReasonSummary>>,
) -> SummarisedPlan<'a> {
    SummarisedPlan {
        deployments: plan
            .deployments
            .iter()
            .zip(summaries)
            .map(|(plan, rejection_summary)| SummarisedDeployment { plan, rejection_summary })
            .collect(),
        exact: plan.exact.as_ref(),
        quotas: &plan.quotas,
    }
}

/// `fleetctl plan` (offline); `cloud` is a simulated cloud file to preview claims against;
/// `detail` says how much of the rejections to print; `exact` turns the exact mode on.
pub fn plan(
    files: &[PathBuf],
    output: Output,
    cloud: Option<&Path>,
    detail: Detail,
    exact: bool,
) -> anyhow::Result<ExitCode> {
    let Some(fleet) = load_valid(files)? else { return Ok(ExitCode::from(1)) };
    let cloud = match cloud {
        Some(path) => Some(claims::load_cloud(path, &claims::classes(&fleet.parsed.objects))?),
        None => None,
    };
    let mut plan = solve_with_progress(&fleet.snapshot(), &solve_options(exact));
    let previews = claims::previews(&fleet.parsed.objects, &plan, cloud)?;
    let adapters = adapters::previews(&fleet.parsed.objects, &plan);
    let exit = if plan.fully_placed() { ExitCode::SUCCESS } else { ExitCode::from(2) };
    match (output, detail) {
        (Output::Table, _) => {
            let text = render::plan_table(&plan, detail) + &adapters::render(&adapters) + &claims::render(&previews);
            std::io::stdout().write_all(text.as_bytes())?;
        }
        (_, Detail::Full) => {
            print_structured(&OfflinePlan { plan: &plan, claims: &previews, adapters: &adapters }, output)?
        }
        (_, Detail::Summary) => {
            let summaries = take_summaries(&mut plan);
            let plan = summarised(&plan, summaries);
            print_structured(&OfflinePlan { plan, claims: &previews, adapters: &adapters }, output)?
        }
    }
    Ok(exit)
}

/// The files of a live command, checked one document at a time (references are checked once
/// the live objects are known). `None`: errors were printed.
fn load_documents(files: &[PathBuf]) -> anyhow::Result<Option<load::Fleet>> {
    let fleet = load::load(files)?;
    let problems: Vec<_> = fleet.parsed.problems.iter().map(|p| (p.clone(), None)).collect();
    Ok(if report_errors(&problems, "planning") { None } else { Some(fleet) })
}

/// Reads the live fleet, with a progress indicator.
fn read_live(cluster: &ClusterArgs) -> anyhow::Result<(Control, LiveFleet)> {
    let progress = Progress::start("reading the live fleet");
    let result = live::block_on(async {
        let control = live::connect(cluster).await?;
        progress.set(format!("reading the live fleet from {}", control.server));
        let fleet = control.fleet().await?;
        Ok::<_, LiveError>((control, fleet))
    })?;
    progress.finish();
    Ok(result?)
}

/// The live fleet with the files over it, or `None` when the files are invalid over it.
fn overlaid(files: &[PathBuf], cluster: &ClusterArgs) -> anyhow::Result<Option<(Control, LiveFleet, Overlaid)>> {
    let loaded = if files.is_empty() {
        None
    } else {
        match load_documents(files)? {
            Some(f) => Some(f),
            None => return Ok(None),
        }
    };
    let (control, live) = read_live(cluster)?;
    let (objects, refused): (&[Located<FleetObject>], &[_]) =
        loaded.as_ref().map_or((&[], &[]), |f| (&f.parsed.objects[..], &f.parsed.refused[..]));
    let problems: Vec<_> = overlay::validate_over(&live, objects, refused).into_iter().map(|p| (p, None)).collect();
    if report_errors(&problems, "planning") {
        return Ok(None);
    }
    let over = overlay::overlay(&live, objects, Timestamp::now());
    Ok(Some((control, live, over)))
}

/// What `plan --live -o json|yaml` prints.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LivePlan<'a, P: Serialize> {
    server: &'a str,
    replaced: Vec<String>,
    added: Vec<String>,
    diff: &'a diff::PlanDiff,
    plan: P,
}

fn key_names(keys: &std::collections::BTreeSet<overlay::Key>) -> Vec<String> {
    keys.iter()
        .map(|(kind, ns, name)| match ns {
            Some(ns) => format!("{}/{ns}/{name}", kind.as_str()),
            None => format!("{}/{name}", kind.as_str()),
        })
        .collect()
}

/// `fleetctl plan --live`; `detail` says how much of the plan's rejections `-o json|yaml`
/// prints (the NEWLY UNPLACED section and the diff's `reasons` list every cluster); `exact`
/// turns the exact mode on.
pub fn plan_live(
    files: &[PathBuf],
    output: Output,
    cluster: &ClusterArgs,
    detail: Detail,
    exact: bool,
) -> anyhow::Result<ExitCode> {
    let Some((control, live, over)) = overlaid(files, cluster)? else { return Ok(ExitCode::from(1)) };
    let mut plan = solve_with_progress(&over.fleet.snapshot(), &solve_options(exact));
    let changes = diff::diff(&live.deployments, &plan);
    let exit = if plan.fully_placed() { ExitCode::SUCCESS } else { ExitCode::from(2) };
    match output {
        Output::Table => {
            let mut out = format!(
                "Plan over the live fleet at {}: {} object(s) from files replace live ones, {} are new.\n\n",
                control.server,
                over.replaced.len(),
                over.added.len()
            );
            out.push_str(&diff::render(&changes));
            let placed: u32 = plan.deployments.iter().map(|d| d.desired - d.unplaced).sum();
            let desired: u32 = plan.deployments.iter().map(|d| d.desired).sum();
            let cost: u64 = plan.deployments.iter().map(|d| d.cost_micros_per_hour).sum();
            out.push_str(&format!(
                "Planned fleet: {placed} of {desired} replicas placed, ${}/h.\n",
                flotilla_apis::common::format_price_micros(cost)
            ));
            std::io::stdout().write_all(out.as_bytes())?;
        }
        _ => {
            let (server, replaced, added) = (&control.server, key_names(&over.replaced), key_names(&over.added));
            match detail {
                Detail::Full => {
                    print_structured(&LivePlan { server, replaced, added, diff: &changes, plan: &plan }, output)?
                }
                Detail::Summary => {
                    let summaries = take_summaries(&mut plan);
                    let plan = summarised(&plan, summaries);
                    print_structured(&LivePlan { server, replaced, added, diff: &changes, plan }, output)?
                }
            }
        }
    }
    Ok(exit)
}

const KINDS: [&str; 4] = ["modeldeployment", "modeldeployments", "md", "deployment"];

/// Splits an explain target into an optional namespace and a name.
pub fn parse_target(target: &str, namespace: Option<&str>) -> anyhow::Result<(Option<String>, String)> {
    let parts: Vec<&str> = target.split('/').collect();
    let is_kind = |k: &str| KINDS.contains(&k.to_ascii_lowercase().as_str());
    let (ns, name) = match parts.as_slice() {
        [kind, ns, name] if is_kind(kind) => (Some(*ns), *name),
        [kind, name] if is_kind(kind) => (None, *name),
        [ns, name] => (Some(*ns), *name),
        [name] => (None, *name),
        _ => anyhow::bail!("target {target:?}: write modeldeployment/<namespace>/<name>, or md/<name> with -n"),
    };
    if name.is_empty() || ns.is_some_and(str::is_empty) {
        anyhow::bail!("target {target:?}: write modeldeployment/<namespace>/<name>, or md/<name> with -n");
    }
    match (ns, namespace) {
        (Some(a), Some(b)) if a != b => anyhow::bail!("target {target:?} is in namespace {a}, but -n says {b}"),
        (Some(a), _) | (None, Some(a)) => Ok((Some(a.to_string()), name.to_string())),
        (None, None) => Ok((None, name.to_string())),
    }
}

/// `fleetctl explain`, offline or over the live fleet.
pub fn explain(
    files: &[PathBuf],
    target: &str,
    namespace: Option<&str>,
    output: Output,
    live: Option<&ClusterArgs>,
    exact: bool,
) -> anyhow::Result<ExitCode> {
    let (ns, name) = parse_target(target, namespace)?;
    let (snapshot, ns, source) = match live {
        None => {
            let Some(fleet) = load_valid(files)? else { return Ok(ExitCode::from(1)) };
            let snapshot = fleet.snapshot();
            let ns = ns.unwrap_or_else(|| {
                let mut of_name = snapshot.deployments.iter().filter(|d| d.name == name);
                match (of_name.next(), of_name.next()) {
                    (Some(d), None) => d.namespace.clone(),
                    _ => "default".to_string(),
                }
            });
            (snapshot, ns, "the given files".to_string())
        }
        Some(cluster) => {
            let Some((control, _, over)) = overlaid(files, cluster)? else { return Ok(ExitCode::from(1)) };
            let ns = ns.unwrap_or_else(|| control.namespace.clone());
            (over.fleet.snapshot(), ns, format!("the live fleet at {}", control.server))
        }
    };
    explain_in(&snapshot, &ns, &name, &source, output, exact)
}

fn explain_in(
    snapshot: &FleetSnapshot,
    ns: &str,
    name: &str,
    source: &str,
    output: Output,
    exact: bool,
) -> anyhow::Result<ExitCode> {
    if !snapshot.deployments.iter().any(|d| d.namespace == ns && d.name == name) {
        let known: Vec<String> = snapshot.deployments.iter().map(|d| format!("{}/{}", d.namespace, d.name)).collect();
        anyhow::bail!(
            "no ModelDeployment {ns}/{name} in {source}; there are: {}",
            if known.is_empty() { "none".to_string() } else { known.join(", ") }
        );
    }
    let options = SolveOptions { explain: Some((ns.to_string(), name.to_string())), ..solve_options(exact) };
    let plan = solve_with_progress(snapshot, &options);
    let Some(d) = plan.get(ns, name) else { anyhow::bail!("the solver returned no plan for {ns}/{name}") };
    match output {
        Output::Table => {
            let mut text = render::explain_text(d);
            // Which pass's plan this explains, with the exact mode.
            if let Some(report) = &plan.exact {
                text.push('\n');
                text.push_str(&render::exact_line(report));
            }
            std::io::stdout().write_all(text.as_bytes())?;
        }
        _ => print_structured(d, output)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `fleetctl crds`.
pub fn crds(write: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    match write {
        None => {
            let text = flotilla_apis::crd::all_yaml()?;
            std::io::stdout().write_all(text.as_bytes())?;
        }
        Some(dir) => write_crds(&dir)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn write_crds(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for crd in flotilla_apis::crd::all() {
        let path = dir.join(flotilla_apis::crd::file_name(&crd));
        std::fs::write(&path, flotilla_apis::crd::to_yaml(&crd)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_target;

    #[test]
    fn targets() {
        let t = |s: &str, n: Option<&str>| parse_target(s, n).ok();
        let some = |ns: &str, name: &str| Some((Some(ns.to_string()), name.to_string()));
        assert_eq!(t("modeldeployment/ml/llama", None), some("ml", "llama"));
        assert_eq!(t("md/llama", Some("ml")), some("ml", "llama"));
        assert_eq!(t("ml/llama", None), some("ml", "llama"));
        assert_eq!(t("md/llama", None), Some((None, "llama".to_string())));
        assert_eq!(t("llama", Some("ml")), some("ml", "llama"));
        assert_eq!(t("md/ml/llama", Some("ml")), some("ml", "llama"));
        assert_eq!(t("md/ml/llama", Some("other")), None);
        assert_eq!(t("a/b/c/d", None), None);
        assert_eq!(t("md/", None), None);
    }
}
