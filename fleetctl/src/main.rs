//! `fleetctl`: the Flotilla CLI's entry point. Parses the command line, runs the command and
//! turns its outcome into an exit code: the command's own (0, 2), 3 when the live fleet could
//! not be read, 64 for a command line that cannot be parsed (an unknown command or flag: not
//! 2, which `plan` uses for unplaced replicas), 1 for any other error (printed on stderr).

use std::process::ExitCode;

use clap::Parser;
use fleetctl::cli;
use fleetctl::live::{EXIT_UNREACHABLE, LiveError};

/// The solver allocates many small vectors (candidates, free devices per node) and a large plan:
/// with mimalloc a 1,000 × 5,000 solve peaks at about half the memory of glibc's malloc
/// (`solve_once`: 213 → 116 MB) and takes somewhat less time (`docs/benchmarks.md`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A command line that cannot be parsed (BSD `EX_USAGE`).
const EXIT_USAGE: u8 = 64;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` print to stdout and succeed; usage errors print to stderr.
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(EXIT_USAGE) } else { ExitCode::SUCCESS };
        }
    };
    match cli::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<LiveError>().is_some() { ExitCode::from(EXIT_UNREACHABLE) } else { ExitCode::from(1) }
        }
    }
}
