//! The command tree (clap derive) and what each command does with the loaded fleet.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use flotilla_apis::document::Severity;

use crate::load;

/// Flotilla's CLI: validate, plan and inspect a multi-cluster inference fleet.
#[derive(Debug, Parser)]
#[command(name = "fleetctl", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Output formats for machine-readable commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable text.
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check fleet YAML the way the API server would, and more: schema, CEL rules, CEL device
    /// selectors, references between objects, duplicates.
    ///
    /// Exit code: 0 when no errors (warnings allowed), 1 when any error was found.
    #[command(
        after_help = "Examples:\n  fleetctl validate -f examples/fleet\n  fleetctl validate -f fleet/ -f extra.yaml -o json"
    )]
    Validate {
        /// Files or directories (read recursively: *.yaml, *.yml, *.json).
        #[arg(short = 'f', long = "filename", required = true, env = "FLEETCTL_FILES", value_delimiter = ',')]
        files: Vec<PathBuf>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Treat warnings as errors.
        #[arg(long)]
        strict: bool,
    },
    /// Show where every ModelDeployment replica would run, and why — no cluster needed.
    ///
    /// Exit code: 0 when every replica is placed, 2 when some could not be (the UNPLACED
    /// section says why, per cluster), 1 when the input is invalid (nothing is planned).
    #[command(after_help = "Examples:\n  fleetctl plan -f examples/fleet\n  fleetctl plan -f examples/fleet -o json")]
    Plan {
        /// Files or directories (read recursively: *.yaml, *.yml, *.json).
        #[arg(short = 'f', long = "filename", required = true, env = "FLEETCTL_FILES", value_delimiter = ',')]
        files: Vec<PathBuf>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Explain one deployment's placement: each cluster's filter verdicts and candidate scores.
    #[command(
        after_help = "Examples:\n  fleetctl explain -f examples/fleet modeldeployment/ml/llama-3.3-70b-eu\n  fleetctl explain -f examples/fleet md/ml/gpt-oss-120b -o yaml"
    )]
    Explain {
        /// Files or directories (read recursively).
        #[arg(short = 'f', long = "filename", required = true, env = "FLEETCTL_FILES", value_delimiter = ',')]
        files: Vec<PathBuf>,
        /// `modeldeployment/<namespace>/<name>` (also `md/<ns>/<name>` or `<ns>/<name>`).
        target: String,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Print the CustomResourceDefinitions of every Flotilla kind as YAML.
    #[command(
        after_help = "Examples:\n  fleetctl crds | kubectl apply --server-side -f -\n  fleetctl crds --write charts/flotilla/crds"
    )]
    Crds {
        /// Write one file per CRD into this directory instead of printing.
        #[arg(long)]
        write: Option<PathBuf>,
    },
    /// Print the version.
    Version,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Validate { files, output, strict } => validate(&files, output, strict),
        Command::Crds { write } => crds(write),
        Command::Plan { files, output } => plan(&files, output),
        Command::Explain { files, target, output } => explain(&files, &target, output),
        Command::Version => {
            println!("fleetctl {} (API {})", env!("CARGO_PKG_VERSION"), flotilla_apis::constants::API_VERSION);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn validate(files: &[PathBuf], output: Output, strict: bool) -> anyhow::Result<ExitCode> {
    let fleet = load::load(files)?;
    let problems = fleet.problems();
    let errors = problems
        .iter()
        .filter(|p| p.severity == Severity::Error || (strict && p.severity == Severity::Warning))
        .count();
    let warnings = problems.iter().filter(|p| p.severity == Severity::Warning).count();
    match output {
        Output::Table => {
            for p in &problems {
                eprintln!("{p}");
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
        Output::Json | Output::Yaml => {
            let report = load::report(&fleet, &problems);
            let text = if output == Output::Json {
                serde_json::to_string_pretty(&report)?
            } else {
                serde_yaml_ng::to_string(&report)?
            };
            println!("{text}");
        }
    }
    Ok(if errors > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Loads and validates; on errors prints them and returns `None` (exit 1 follows).
fn load_valid(files: &[PathBuf]) -> anyhow::Result<Option<load::Fleet>> {
    let fleet = load::load(files)?;
    let problems = fleet.problems();
    let errors: Vec<_> = problems.iter().filter(|p| p.severity == Severity::Error).collect();
    if !errors.is_empty() {
        for p in &errors {
            eprintln!("{p}");
        }
        eprintln!("{} error(s): fix them before planning (`fleetctl validate` shows warnings too)", errors.len());
        return Ok(None);
    }
    Ok(Some(fleet))
}

fn print_structured<T: serde::Serialize>(value: &T, output: Output) -> anyhow::Result<()> {
    let text = match output {
        Output::Yaml => serde_yaml_ng::to_string(value)?,
        _ => serde_json::to_string_pretty(value)? + "\n",
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

fn plan(files: &[PathBuf], output: Output) -> anyhow::Result<ExitCode> {
    let Some(fleet) = load_valid(files)? else { return Ok(ExitCode::from(1)) };
    let snapshot = fleet.snapshot();
    let plan = flotilla_placement::solve(&snapshot, &flotilla_placement::SolveOptions::default());
    match output {
        Output::Table => std::io::stdout().write_all(crate::render::plan_table(&plan).as_bytes())?,
        _ => print_structured(&plan, output)?,
    }
    Ok(if plan.fully_placed() { ExitCode::SUCCESS } else { ExitCode::from(2) })
}

fn parse_target(target: &str) -> anyhow::Result<(String, String)> {
    let parts: Vec<&str> = target.split('/').collect();
    let (ns, name) = match parts.as_slice() {
        [kind, ns, name]
            if matches!(kind.to_ascii_lowercase().as_str(), "modeldeployment" | "modeldeployments" | "md") =>
        {
            (*ns, *name)
        }
        [ns, name] => (*ns, *name),
        _ => anyhow::bail!("target {target:?}: write modeldeployment/<namespace>/<name>"),
    };
    Ok((ns.to_string(), name.to_string()))
}

fn explain(files: &[PathBuf], target: &str, output: Output) -> anyhow::Result<ExitCode> {
    let (ns, name) = parse_target(target)?;
    let Some(fleet) = load_valid(files)? else { return Ok(ExitCode::from(1)) };
    let snapshot = fleet.snapshot();
    if !snapshot.deployments.iter().any(|d| d.namespace == ns && d.name == name) {
        let known: Vec<String> = snapshot.deployments.iter().map(|d| format!("{}/{}", d.namespace, d.name)).collect();
        anyhow::bail!("no ModelDeployment {ns}/{name} in the given files; there are: {}", known.join(", "));
    }
    let options = flotilla_placement::SolveOptions { explain: Some((ns.clone(), name.clone())), ..Default::default() };
    let plan = flotilla_placement::solve(&snapshot, &options);
    let Some(d) = plan.get(&ns, &name) else { anyhow::bail!("the solver returned no plan for {ns}/{name}") };
    match output {
        Output::Table => std::io::stdout().write_all(crate::render::explain_text(d).as_bytes())?,
        _ => print_structured(d, output)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn crds(write: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    match write {
        None => {
            let text = flotilla_apis::crd::all_yaml()?;
            std::io::stdout().write_all(text.as_bytes())?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for crd in flotilla_apis::crd::all() {
                let path = dir.join(flotilla_apis::crd::file_name(&crd));
                std::fs::write(&path, flotilla_apis::crd::to_yaml(&crd)?)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
