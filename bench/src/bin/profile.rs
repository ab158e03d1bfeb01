//! `profile`: instructions per RPC of the server and of the floor under callgrind
//! ([`ledger_bench::profile`] says how), or, with `--check`, ours against the committed record.
//! `cargo run -p ledger-bench --release --bin profile`.

use std::process::ExitCode;

use clap::Parser;
use ledger_bench::profile::{self, Options};

fn main() -> ExitCode {
    let options = Options::parse();
    let result = if options.check || options.save_record {
        profile::check::run(&options)
    } else {
        profile::run(&options).map(|_| true)
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("profile: {e}");
            ExitCode::FAILURE
        }
    }
}
