//! `compare`: the ledger server against pgbench running its SQL and against the gRPC floor
//! ([`ledger_bench::compare`] says how). `cargo run -p ledger-bench --release -- --smoke`.

use std::process::ExitCode;

use clap::Parser;
use ledger_bench::compare::{self, Options};

fn main() -> ExitCode {
    match compare::run(Options::parse()) {
        Ok(failed) if failed.is_empty() => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("compare: cells with errors: {}", failed.join(" "));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("compare: error: {e}");
            ExitCode::FAILURE
        }
    }
}
