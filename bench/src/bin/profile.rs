//! `profile`: instructions per RPC of the server and of the floor under callgrind
//! ([`ledger_bench::profile`] says how). `cargo run -p ledger-bench --release --bin profile`.

use std::process::ExitCode;

use clap::Parser;
use ledger_bench::profile::{self, Options};

fn main() -> ExitCode {
    match profile::run(&Options::parse()) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("profile: {e}");
            ExitCode::FAILURE
        }
    }
}
