//! `ledger-bench`: the load generator ([`ledger_bench::load`] says what it does).

use std::process::ExitCode;

use clap::Parser;
use ledger_bench::load::{self, Args};

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ledger-bench: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(load::run(args)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ledger-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
