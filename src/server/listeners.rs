//! The listeners a server binds besides `--listen`: the metrics endpoint and the operator's
//! console; and the bounds of the gRPC clients' connections.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;

use super::{ServeError, Settings};
use crate::connections::{self, ConnectionLimits};
use crate::console::{self, Console};
use crate::credentials::Credentials;
use crate::domain::time::Clock;
use crate::ledger::Ledger;
use crate::observe::{self, Metrics};
use crate::storage;

/// What the metrics endpoint and the console serve from.
pub(super) struct Side<'a> {
    pub ledger: &'a Ledger,
    pub metrics: &'a Arc<Metrics>,
    pub store: &'a Arc<dyn storage::Store>,
    pub credentials: &'a Credentials,
    pub clock: &'a Arc<dyn Clock>,
}

impl Side<'_> {
    /// Starts the metrics endpoint (`--metrics-listen`) and the console (`--console-listen`)
    /// where the settings ask for them; both read the store only once `migrated`.
    ///
    /// # Errors
    /// An address asked for that cannot be bound.
    pub(super) async fn start(
        &self,
        settings: &Settings,
        migrated: impl Fn() -> bool + Clone + Send + Sync + 'static,
    ) -> Result<Vec<JoinHandle<()>>, ServeError> {
        let mut tasks = start_metrics(settings, self.metrics, self.store, migrated.clone()).await?;
        if let Some((addr, asked)) = settings.console_address() {
            let console = Console::new(
                self.ledger.clone(),
                self.metrics.clone(),
                self.credentials.clone(),
                self.clock.clone(),
                migrated,
                addr.port(),
                &settings.console_options(),
            );
            tasks.extend(start_console(addr, asked, console).await?);
        } else {
            tracing::info!("operator console off (--console-listen off)");
        }
        Ok(tasks)
    }
}

/// Binds the metrics endpoint (`--metrics-listen`, when set) and starts it, with the loop that
/// refreshes the gauges read from the store (only once `migrated`, and only when someone can
/// scrape them).
async fn start_metrics(
    settings: &Settings,
    metrics: &Arc<Metrics>,
    store: &Arc<dyn storage::Store>,
    migrated: impl Fn() -> bool + Send + Sync + 'static,
) -> Result<Vec<JoinHandle<()>>, ServeError> {
    let Some(addr) = settings.metrics_listen else {
        return Ok(Vec::new());
    };
    let listener = observe::http::bind(addr)
        .await
        .map_err(|e| ServeError::Transport(format!("cannot listen on {addr} for metrics: {e}")))?;
    // The address bound, which differs from the one asked for with port 0.
    let bound = listener
        .local_addr()
        .map_err(|e| ServeError::Transport(format!("metrics listener: {e}")))?;
    tracing::info!(metrics = %bound, "metrics endpoint listening");
    Ok(vec![
        tokio::spawn(observe::http::serve(listener, metrics.clone())),
        tokio::spawn(observe::refresh_loop(
            metrics.clone(),
            store.clone(),
            migrated,
            settings.metrics_refresh_interval,
        )),
    ])
}

/// Binds the console on `addr` and starts serving it. An address the operator `asked` for
/// must bind; the default one may be taken (a second server on one machine, a test suite),
/// and then the server goes on without a console and says so.
///
/// # Errors
/// An address asked for that cannot be bound.
async fn start_console(
    addr: SocketAddr,
    asked: bool,
    console: Console,
) -> Result<Option<tokio::task::JoinHandle<()>>, ServeError> {
    let listener = match console::bind(addr).await {
        Ok(listener) => listener,
        Err(e) if asked => {
            return Err(ServeError::Transport(format!(
                "cannot listen on {addr} for the console: {e}"
            )));
        }
        Err(e) => {
            tracing::warn!(
                console = %addr,
                error = %e,
                "operator console not started: its default address is taken (another server?); \
                 give --console-listen another address, or off"
            );
            return Ok(None);
        }
    };
    // The address bound, which differs from the one asked for with port 0.
    let bound = listener
        .local_addr()
        .map_err(|e| ServeError::Transport(format!("console listener: {e}")))?;
    let url = console::url(bound);
    tracing::info!(url = %url, "operator console: open {url} in a browser");
    if !bound.ip().is_loopback() {
        tracing::warn!(
            url = %url,
            "the operator console listens beyond this machine over plain HTTP: tokens and \
             entries cross the network unencrypted; prefer a loopback address with an SSH \
             tunnel or a TLS proxy"
        );
    }
    Ok(Some(tokio::spawn(console::serve(listener, console))))
}

/// The bounds of the client connections: `--max-connections` (or what the open-files limit,
/// raised to its hard limit here, leaves after the database pool and files), and the idle
/// timeout. Logs the limits, so that an operator sees what the process runs with.
pub(super) fn connection_limits(settings: &Settings) -> ConnectionLimits {
    // The database pool, its LISTEN connection, the SQLite files, the metrics endpoint and
    // the runtime's own descriptors.
    let reserved = u64::from(settings.db_max_connections) + 64;
    let max_connections = match connections::raise_descriptor_limit() {
        Ok(limit) => {
            let derived = connections::connections_for(&limit, reserved);
            let max = if settings.max_connections == 0 {
                derived
            } else {
                settings.max_connections
            };
            tracing::info!(
                open_files_soft_limit_at_start = limit.soft_before,
                open_files_soft_limit = limit.soft,
                open_files_hard_limit = limit.hard,
                max_connections = max,
                "connection limits"
            );
            if settings.max_connections > derived {
                tracing::warn!(
                    max_connections = settings.max_connections,
                    open_files_soft_limit = limit.soft,
                    "--max-connections is above what the open-files limit leaves; accepts will \
                     fail for want of descriptors before it is reached"
                );
            }
            max
        }
        Err(e) => {
            let max = if settings.max_connections == 0 {
                1024
            } else {
                settings.max_connections
            };
            tracing::warn!(error = %e, max_connections = max, "cannot read or raise the open-files limit");
            max
        }
    };
    ConnectionLimits {
        max_connections,
        idle_timeout: settings.connection_idle_timeout,
    }
}
