//! The `idempotency-ledger` binary: parses the command line, sets up logging in the format it
//! names (and, for `serve`, traces as the `OTEL_*` variables say), and hands over to the
//! library.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use idempotency_ledger::cli::{Cli, Command};
use idempotency_ledger::cli::{approve, inspect, operate};
use idempotency_ledger::domain::time::AlignedClock;
use idempotency_ledger::observe::telemetry;
use idempotency_ledger::observe::traces::TraceExport;
use idempotency_ledger::server;

/// mimalloc instead of the C library's allocator: a request allocates and frees a few hundred
/// small blocks on two or more worker threads, and glibc's arenas spent a noticeable share of
/// the server's CPU on it (measured in bench/HISTORY.md, "The claim path, profiled").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    // The command line first: it chooses the log format. (clap reports its own errors.) The
    // operator's commands have no --log-format: they print their own errors, and log only
    // what the environment asks for (LEDGER_LOG_FORMAT, read with the default settings).
    let cli = Cli::parse();
    let log_format = cli.settings.log_format;
    let command = cli.into_command();
    let log_format = match &command {
        Command::Serve(settings) | Command::Migrate(settings) => settings.log_format,
        _ => log_format,
    };
    // Only the server exports traces, and only when an endpoint is configured.
    let traces = match command {
        Command::Serve(_) => match TraceExport::from_env() {
            Ok(traces) => traces,
            Err(e) => {
                eprintln!("idempotency-ledger: cannot set up traces: {e}");
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    if let Err(e) = telemetry::init(log_format, traces.as_ref()) {
        eprintln!("idempotency-ledger: cannot set up logging: {e}");
        return ExitCode::FAILURE;
    }
    let result = match command {
        Command::Serve(settings) => {
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
            let served = match server::bind(settings.listen).await {
                Ok(listener) => {
                    server::run(
                        listener,
                        settings,
                        clock,
                        shutdown_signal(),
                        reload_requests(),
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            // After the drain: the spans of the last calls are queued, and go now.
            if let Some(traces) = traces {
                traces.shutdown().await;
            }
            served
        }
        Command::Migrate(settings) => server::migrate(&settings).await,
        // The inspection commands print their own errors and choose their exit status.
        Command::Entries(args) => return inspect::entries(args).await,
        Command::Entry(args) => return inspect::entry(args).await,
        Command::Resolve(args) => return operate::resolve(args).await,
        Command::Renew(args) => return operate::renew(args).await,
        Command::Acknowledge(args) => return operate::acknowledge(args).await,
        Command::Approvals(args) => return approve::approvals(args).await,
        Command::Approve(args) => return approve::decide(args, true).await,
        Command::Deny(args) => return approve::decide(args, false).await,
        Command::Mcp(args) => {
            idempotency_ledger::mcp::run(args, shutdown_signal(), reload_requests())
                .await
                .map_err(|e| server::ServeError::Config(e.to_string()))
        }
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
