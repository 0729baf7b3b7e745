//! The command tree (clap derive): what each command takes, its `--help` examples (real
//! commands: the offline ones run in this crate's tests, the live ones in its e2e test), and
//! the dispatch to the code that does the work.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::live::ClusterArgs;
use crate::rejections::Detail;

/// Flotilla's CLI: validate, plan and inspect a multi-cluster inference fleet.
///
/// Exit codes: 0 success (every replica placed); 1 invalid input or other error; 2 some
/// replicas could not be placed; 3 the live fleet could not be read (control cluster
/// unreachable, no kubeconfig, access denied, CRDs not installed).
#[derive(Debug, Parser)]
#[command(name = "fleetctl", version, about, long_about)]
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

/// Output formats of `get`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum GetOutput {
    /// One row per object, with readiness and the conditions that need attention.
    #[default]
    Table,
    /// More columns, and every condition with its reason and message under the table.
    Wide,
    /// The objects as the API server returns them (without managedFields).
    Json,
    /// The same, as YAML.
    Yaml,
}

/// The kinds `get` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// InferenceClusters (member clusters).
    #[value(aliases = ["cluster", "inferenceclusters", "inferencecluster", "icl"])]
    Clusters,
    /// ModelDeployments.
    #[value(aliases = ["deployment", "modeldeployments", "modeldeployment", "md"])]
    Deployments,
    /// ModelCaches.
    #[value(aliases = ["cache", "modelcaches", "modelcache", "mc"])]
    Caches,
    /// CapacityClaims.
    #[value(aliases = ["claim", "capacityclaims", "capacityclaim", "cc"])]
    Claims,
    /// InferenceClasses.
    #[value(aliases = ["class", "inferenceclasses", "inferenceclass", "icls"])]
    Classes,
}

impl Kind {
    /// Whether objects of the kind live in a namespace.
    pub fn namespaced(self) -> bool {
        matches!(self, Self::Deployments | Self::Caches | Self::Claims)
    }
}

const GET_EXAMPLES: &str = "Examples:
  fleetctl get deployments -n ml
  fleetctl get md -A -o wide
  fleetctl get clusters
  fleetctl get clusters eu1 -o yaml --kubeconfig control.kubeconfig --context kwok-control";

const PLAN_EXAMPLES: &str = "Examples:
  fleetctl plan -f examples/fleet
  fleetctl plan -f examples/fleet -o json
  fleetctl plan -f examples/fleet -o json --rejections full
  fleetctl plan -f examples/fleet --cloud examples/cloud/sim.yaml
  fleetctl plan -f fleet/ --live --kubeconfig control.kubeconfig
  fleetctl plan --live";

const EXPLAIN_EXAMPLES: &str = "Examples:
  fleetctl explain -f examples/fleet modeldeployment/ml/llama-3.3-70b-eu
  fleetctl explain -f examples/fleet md/gpt-oss-120b -n ml -o yaml
  fleetctl explain --live md/llama-3.3-70b-eu -n ml";

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check fleet YAML the way the API server would, and more: schema, CEL rules, CEL device
    /// selectors, references between objects, duplicates.
    ///
    /// Exit code: 0 when no errors (warnings allowed), 1 when any error was found.
    #[command(
        after_help = "Examples:\n  fleetctl validate -f examples/fleet\n  fleetctl validate -f examples/fleet -o json --strict"
    )]
    Validate {
        /// Files or directories (read recursively: *.yaml, *.yml, *.json); `-` reads standard input.
        #[arg(short = 'f', long = "filename", required = true, env = "FLEETCTL_FILES", value_delimiter = ',')]
        files: Vec<PathBuf>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Treat warnings as errors.
        #[arg(long)]
        strict: bool,
    },
    /// Show where every ModelDeployment replica would run, and why.
    ///
    /// Offline (no cluster needed): plans the files alone. With --live: reads the fleet from
    /// the control cluster (clusters with their observed capacity, classes, deployments with
    /// their current placements), lays the files over it (an object in the files replaces the
    /// live one of the same kind, namespace and name), solves as the controller does, and shows
    /// what would change against what runs now: per deployment and cluster, current replicas →
    /// planned, clusters added and removed, replicas newly left unplaced and why.
    ///
    /// Offline, for every deployment with unplaced replicas, a CLAIMS section (and a `claims`
    /// field in -o json|yaml) previews the CapacityClaim the controller would create from its
    /// capacityClaimTemplate and the offering the claim engine would try first, against the
    /// pools of the files' `static` InferenceClusters and the simulated cloud of --cloud.
    ///
    /// Exit code: 0 when every replica is placed, 2 when some could not be (the UNPLACED
    /// section says why, per cluster), 1 when the input is invalid (nothing is planned), 3 when
    /// the live fleet cannot be read.
    #[command(after_help = PLAN_EXAMPLES)]
    Plan {
        /// Files or directories (read recursively: *.yaml, *.yml, *.json; `-`: standard input). Optional with
        /// --live: without files, the live fleet is planned as it is (drift from its status).
        #[arg(
            short = 'f',
            long = "filename",
            required_unless_present = "live",
            env = "FLEETCTL_FILES",
            value_delimiter = ','
        )]
        files: Vec<PathBuf>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Plan over the live fleet of the control cluster and show the difference.
        #[arg(long)]
        live: bool,
        /// How rejected clusters are shown for deployments with unplaced replicas: `summary`
        /// gives, per deployment, how many clusters refused it for each reason with the first
        /// three of each (in -o json|yaml a `rejectionSummary` list instead of `rejections`);
        /// `full` lists every cluster with its reason and message.
        #[arg(long, value_enum, value_name = "DETAIL", default_value_t = Detail::Summary)]
        rejections: Detail,
        /// A simulated cloud (the controller's --sim-cloud YAML: regions with jurisdiction,
        /// cluster, zones and offerings) to preview claims against, besides the static pools
        /// of the files. Offline only.
        #[arg(long, value_name = "FILE", conflicts_with = "live")]
        cloud: Option<PathBuf>,
        /// When replicas stay unplaced, also search the optimum with an integer program (the
        /// most replicas for the highest priority tier, then the next, ...; then fallback
        /// order, capacity type and price) within a budget, and keep the plan it guides when
        /// that places more. The output says which produced the plan and whether the optimum
        /// was proven.
        #[arg(long)]
        exact: bool,
        /// The control cluster (with --live).
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Explain one deployment's placement: each cluster's filter verdicts and candidate scores.
    ///
    /// Offline from files, or with --live over the live fleet (files, if any, laid over it).
    /// Exit code: 0 explained, 1 invalid input or unknown deployment, 3 the live fleet cannot
    /// be read.
    #[command(after_help = EXPLAIN_EXAMPLES)]
    Explain {
        /// Files or directories (read recursively; `-`: standard input). Optional with --live.
        #[arg(
            short = 'f',
            long = "filename",
            required_unless_present = "live",
            env = "FLEETCTL_FILES",
            value_delimiter = ','
        )]
        files: Vec<PathBuf>,
        /// `modeldeployment/<namespace>/<name>`, `md/<name>` with -n, or `<namespace>/<name>`.
        target: String,
        /// The deployment's namespace [default: offline, the one deployment of that name, else
        /// `default`; live, the context's namespace].
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Explain over the live fleet of the control cluster.
        #[arg(long)]
        live: bool,
        /// Explain the plan the exact mode gives (as `fleetctl plan --exact`).
        #[arg(long)]
        exact: bool,
        /// The control cluster (with --live).
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// List Flotilla objects of the control cluster with their readiness and conditions.
    ///
    /// The CONDITIONS column shows Ready first, then every condition that needs attention, as
    /// Type=Status(Reason); -o wide shows every condition, with its message, under the table.
    /// Exit code: 0 listed (also when there is nothing), 1 a named object does not exist, 3 the
    /// control cluster cannot be read.
    #[command(after_help = GET_EXAMPLES)]
    Get {
        /// What to list. The kinds' names and short names work too: icl, md, mc, cc, icls,
        /// inferencecluster(s), modeldeployment(s), modelcache(s), capacityclaim(s),
        /// inferenceclass(es).
        #[arg(value_enum)]
        kind: Kind,
        /// Only this object.
        name: Option<String>,
        /// Namespace of deployments, caches and claims [default: the context's namespace].
        #[arg(short = 'n', long, conflicts_with = "all_namespaces")]
        namespace: Option<String>,
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: GetOutput,
        /// The control cluster.
        #[command(flatten)]
        cluster: ClusterArgs,
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
    /// Print a shell completion script.
    #[command(after_help = "Examples:
  fleetctl completion bash > ~/.local/share/bash-completion/completions/fleetctl
  fleetctl completion zsh > \"${fpath[1]}/_fleetctl\"
  fleetctl completion fish > ~/.config/fish/completions/fleetctl.fish")]
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the version.
    Version,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    use crate::commands;
    match cli.command {
        Command::Validate { files, output, strict } => commands::validate(&files, output, strict),
        Command::Crds { write } => commands::crds(write),
        Command::Plan { live: false, cluster, .. } | Command::Explain { live: false, cluster, .. }
            if cluster.kubeconfig.is_some() || cluster.context.is_some() =>
        {
            anyhow::bail!(
                "--kubeconfig and --context choose the control cluster of --live: add --live, or leave them out"
            )
        }
        Command::Plan { files, output, live: false, cloud, rejections, exact, .. } => {
            commands::plan(&files, output, cloud.as_deref(), rejections, exact)
        }
        Command::Plan { files, output, live: true, cluster, rejections, exact, .. } => {
            commands::plan_live(&files, output, &cluster, rejections, exact)
        }
        Command::Explain { files, target, namespace, output, live, exact, cluster } => {
            let live = live.then_some(&cluster);
            commands::explain(&files, &target, namespace.as_deref(), output, live, exact)
        }
        Command::Get { kind, name, namespace, all_namespaces, output, cluster } => {
            let scope = if all_namespaces { crate::get::Scope::All } else { crate::get::Scope::Namespace(namespace) };
            crate::get::get(kind, name.as_deref(), scope, output, &cluster)
        }
        Command::Completion { shell } => {
            use clap::CommandFactory;
            // Into a buffer first: a closed pipe is an error to report, not a panic.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "fleetctl", &mut script);
            std::io::Write::write_all(&mut std::io::stdout(), &script)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Version => {
            println!("fleetctl {} (API {})", env!("CARGO_PKG_VERSION"), flotilla_apis::constants::API_VERSION);
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Cli, Command, Kind};

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn kinds_take_kubectl_names() {
        for (word, kind) in [
            ("md", Kind::Deployments),
            ("inferenceclusters", Kind::Clusters),
            ("cc", Kind::Claims),
            ("icls", Kind::Classes),
        ] {
            let cli = Cli::try_parse_from(["fleetctl", "get", word]).unwrap();
            assert!(matches!(cli.command, Command::Get { kind: k, .. } if k == kind), "{word}");
        }
        assert!(Cli::try_parse_from(["fleetctl", "get", "pods"]).is_err());
    }

    #[test]
    fn namespace_and_all_namespaces_conflict() {
        assert!(Cli::try_parse_from(["fleetctl", "get", "md", "-n", "ml", "-A"]).is_err());
    }

    #[test]
    fn files_are_optional_only_with_live() {
        assert!(Cli::try_parse_from(["fleetctl", "plan"]).is_err());
        assert!(Cli::try_parse_from(["fleetctl", "plan", "--live"]).is_ok());
        assert!(Cli::try_parse_from(["fleetctl", "explain", "md/x", "-n", "ml"]).is_err());
        assert!(Cli::try_parse_from(["fleetctl", "explain", "--live", "md/x", "-n", "ml"]).is_ok());
    }

    #[test]
    fn cloud_is_offline_only() {
        assert!(Cli::try_parse_from(["fleetctl", "plan", "-f", "x", "--cloud", "sim.yaml"]).is_ok());
        assert!(Cli::try_parse_from(["fleetctl", "plan", "--live", "--cloud", "sim.yaml"]).is_err());
    }

    #[test]
    fn cluster_flags_without_live_are_refused() {
        let cli = Cli::try_parse_from(["fleetctl", "plan", "-f", "x", "--kubeconfig", "k"]).unwrap();
        let err = super::run(cli).unwrap_err().to_string();
        assert!(err.contains("add --live"), "{err}");
    }
}
