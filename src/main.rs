//! The `idempotency-ledger` binary: parses the command line, sets up logging in the format it
//! names (and, for `serve`, traces as the `OTEL_*` variables say), and hands over to the
//! library.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use idempotency_ledger::cli::{Cli, Command};
use idempotency_ledger::cli::{inspect, operate};
use idempotency_ledger::domain::time::AlignedClock;
use idempotency_ledger::observe::telemetry;
use idempotency_ledger::observe::traces::TraceExport;
use idempotency_ledger::server;

/// mimalloc instead of the C library's allocator: a request allocates and frees a few hundred
/// small blocks on two or more worker threads, and glibc's arenas spent about a tenth of the
/// server's CPU on it (bench/README.md, "The claim path, profiled").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    // The command line first: it chooses the log format. (clap reports its own errors.)
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve);
    // Only the server exports traces, and only when an endpoint is configured.
    let traces = match command {
        Command::Serve => match TraceExport::from_env() {
            Ok(traces) => traces,
            Err(e) => {
                eprintln!("idempotency-ledger: cannot set up traces: {e}");
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    if let Err(e) = telemetry::init(cli.settings.log_format, traces.as_ref()) {
        eprintln!("idempotency-ledger: cannot set up logging: {e}");
        return ExitCode::FAILURE;
    }
    let result = match command {
        Command::Serve => {
            if let Some(traces) = &traces {
                let c = traces.config();
                tracing::info!(
                    endpoint = c.shown_endpoint(),
                    protocol = c.protocol.as_str(),
                    sampler = %c.sampler,
                    "exporting traces over OTLP"
                );
            }
            let clock = Arc::new(AlignedClock::default());
            let served = server::run(cli.settings, clock, shutdown_signal()).await;
            // After the drain: the spans of the last calls are queued, and go now.
            if let Some(traces) = traces {
                traces.shutdown().await;
            }
            served
        }
        Command::Migrate => server::migrate(&cli.settings).await,
        // The inspection commands print their own errors and choose their exit status.
        Command::Entries(args) => return inspect::entries(args).await,
        Command::Entry(args) => return inspect::entry(args).await,
        Command::Resolve(args) => return operate::resolve(args).await,
        Command::Renew(args) => return operate::renew(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "idempotency-ledger failed");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM (orchestrators) or SIGINT (a terminal's Ctrl-C).
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
