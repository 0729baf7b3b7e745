//! `fleetctl`: the Flotilla CLI. Reads fleet YAML (files and directories) and validates it,
//! prints the CRDs, and — without any cluster — shows where replicas would run and why.

use std::process::ExitCode;

use clap::Parser;

mod cli;
mod load;
mod render;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
