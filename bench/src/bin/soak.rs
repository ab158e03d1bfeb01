//! `soak`: mixed load on each store, sampling what the server holds ([`ledger_bench::soak`]
//! says how). `cargo run -p ledger-bench --release --bin soak`.

use std::process::ExitCode;

use clap::Parser;
use ledger_bench::soak::{self, Options};

fn main() -> ExitCode {
    let options = Options::parse();
    match soak::run(&options) {
        Ok(runs) => {
            let leaking = runs.iter().any(|r| {
                [&r.rss_mib, &r.fds, &r.db_connections]
                    .iter()
                    .any(|t| t.as_ref().is_some_and(|t| !t.flat))
            });
            if leaking {
                eprintln!("soak: a measure was not flat after the warm-up (see the table)");
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("soak: error: {e}");
            ExitCode::FAILURE
        }
    }
}
