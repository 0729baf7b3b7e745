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
