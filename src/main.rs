//! The `idempotency-ledger` binary: parses the command line, sets up logging in the format it
//! names, and hands over to the library.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use idempotency_ledger::cli::{Cli, Command};
use idempotency_ledger::cli::{inspect, operate};
use idempotency_ledger::domain::time::AlignedClock;
use idempotency_ledger::observe::telemetry;
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
    if let Err(e) = telemetry::init(cli.settings.log_format) {
        eprintln!("idempotency-ledger: cannot set up logging: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let clock = Arc::new(AlignedClock::default());
            server::run(cli.settings, clock, shutdown_signal(), reload_requests()).await
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

/// Yields on each SIGHUP: the operator's request to re-read the tokens file and the TLS
/// files. Installed before the server starts, so that an early SIGHUP is a reload rather than
/// the default action (ending the process).
fn reload_requests() -> std::pin::Pin<Box<dyn tokio_stream::Stream<Item = ()> + Send>> {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hangups) => Box::pin(tokio_stream::wrappers::SignalStream::new(hangups)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP: credentials are read once");
            Box::pin(tokio_stream::pending())
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
