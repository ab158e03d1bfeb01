//! The running server: the store, the ledger service behind its auth interceptor and byte
//! budget, health, reflection, TLS, the background probe that runs migrations and keeps health
//! honest, the re-reading of credentials on request (SIGHUP), and the graceful, time-bounded
//! shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic_health::ServingStatus;

mod health;
mod listeners;
mod loops;
pub mod settings;
pub mod tls;

pub use settings::{Settings, StoreArguments, Wakeup};
pub use tls::{ServerTls, TlsFiles};

use crate::connections::Listener;
use crate::credentials::Credentials;
use crate::domain::Policy;
use crate::domain::time::Clock;
use crate::error::LedgerError;
use crate::grpc::admission::{Admission, AdmitBytes, BytesInFlight};
use crate::grpc::{LedgerApi, LedgerServiceServer, pb};
use crate::ledger::Ledger;
use crate::observe::{self, GrpcMetricsLayer, Metrics};
use crate::storage::{self, StoreError, redact_url};
pub(crate) use health::ClockAlignment;
use health::{Readiness, probe_loop, set_health};

/// The fully qualified name of the ledger service, as health and reflection report it.
pub const LEDGER_SERVICE: &str = crate::proto::ledger_service_server::SERVICE_NAME;

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting is unusable (tokens file, TLS files, inconsistent limits).
    #[error("configuration: {0}")]
    Config(String),
    /// The store could not be opened.
    #[error("store: {0}")]
    Store(#[from] storage::StoreError),
    /// The listener or the HTTP/2 server failed.
    #[error("transport: {0}")]
    Transport(String),
}

/// Serves on `listener` (bound by the caller: the binary binds `--listen`, tests port 0) until
/// `shutdown` resolves, then turns health NOT_SERVING, lets in-flight calls finish for up to
/// `--shutdown-grace`, and returns. Each time `reloads` yields (the binary yields on SIGHUP),
/// re-reads the tokens file, the TLS certificate, key and client CA, and the approval policy,
/// putting each in force whole if it reads and parses and keeping the one in force (and logging
/// why) if not. Every task it starts ends with it.
///
/// # Errors
/// See [`ServeError`].
pub async fn run(
    listener: TcpListener,
    settings: Settings,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    reloads: impl Stream<Item = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let Opened {
        credentials,
        tls,
        store,
        metrics,
        ledger,
    } = Opened::open(&settings, &clock).await?;
    // Every task this server starts is owned here and stopped when it returns, also on an
    // early return below.
    let mut tasks = OwnedTasks::default();
    let state = Arc::new(Readiness::default());
    let started = loops::start(
        &settings,
        &ledger,
        &metrics,
        &state,
        &credentials,
        &tls,
        reloads,
    );
    tasks.0.extend(started);
    let addr: SocketAddr = listener
        .local_addr()
        .map_err(|e| ServeError::Transport(e.to_string()))?;
    let listener = Listener::new(listener, listeners::connection_limits(&settings));
    let (reporter, health_service) = tonic_health::server::health_reporter();
    // tonic-health reports "" as SERVING from the start; nothing is served until migrated.
    set_health(&reporter, ServingStatus::NotServing).await;
    let migrated = {
        let state = state.clone();
        move || state.migrated.load(Ordering::Acquire)
    };
    let side = listeners::Side {
        ledger: &ledger,
        metrics: &metrics,
        store: &store,
        credentials: &credentials,
        clock: &clock,
    };
    tasks.0.extend(side.start(&settings, migrated).await?);
    let ledger_service = ledger_service(&settings, &ledger, &metrics, &credentials, &state);
    log_start(
        addr,
        &settings,
        store.backend(),
        &credentials,
        tls.is_some(),
    );
    let Stopping {
        signal,
        fatal,
        drain,
    } = Stopping::start(
        Probe {
            store,
            reporter,
            state,
            metrics,
            clock,
            interval: settings.health_probe_interval,
        },
        shutdown,
        &mut tasks,
    );
    let router = Server::builder()
        .http2_keepalive_interval(Some(settings.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(settings.http2_keepalive_timeout))
        // Outermost, so the access log sees the code the caller gets.
        .layer(observe::telemetry::CallLogLayer)
        .add_service(health_service)
        .add_service(reflection().build_v1().map_err(reflection_failed)?)
        .add_service(reflection().build_v1alpha().map_err(reflection_failed)?)
        .add_service(ledger_service);
    // TLS is ours, not tonic's (which fixes its configuration when it binds), so that a
    // reload can replace the certificate: see `tls`.
    let server: std::pin::Pin<
        Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>,
    > = match tls {
        Some(tls) => {
            Box::pin(router.serve_with_incoming_shutdown(tls.accept(listener.incoming()), signal))
        }
        None => Box::pin(router.serve_with_incoming_shutdown(listener.incoming(), signal)),
    };
    let result = until_drained(server, fatal, drain, settings.shutdown_grace).await;
    drop(tasks);
    // The replays answered from memory since the last write of their counts.
    if let Err(e) = ledger.flush_replay_counts().await {
        tracing::warn!(error = %e, "the last replay counts could not be written");
    }
    tracing::info!("idempotency-ledger stopped");
    result
}

/// What a server opens before it serves: its credentials and TLS files, the store, the
/// metrics, and the ledger with its approval policy.
struct Opened {
    credentials: Credentials,
    tls: Option<Arc<ServerTls>>,
    store: Arc<dyn storage::Store>,
    metrics: Arc<Metrics>,
    ledger: Ledger,
}

impl Opened {
    /// Checks `settings` and opens what they name.
    ///
    /// # Errors
    /// A setting or file that cannot be used; a store that cannot be opened.
    async fn open(settings: &Settings, clock: &Arc<dyn Clock>) -> Result<Opened, ServeError> {
        settings.validate().map_err(ServeError::Config)?;
        let credentials =
            Credentials::load(settings.auth_tokens_file.as_deref()).map_err(ServeError::Config)?;
        let tls = server_tls(settings)?;
        let store = storage::open(&settings.database_url, &settings.pool()).await?;
        let metrics = Metrics::new(clock.clone(), &settings.metrics_options());
        let ledger = Ledger::new(store.clone(), clock.clone(), settings.limits());
        ledger.approvals().set_policy(
            approval_policy(settings.approval_policy.as_deref()).map_err(ServeError::Config)?,
        );
        if let Some(path) = &settings.approval_policy {
            tracing::info!(
                file = %path.display(),
                rules = ledger.approvals().policy().len(),
                "approval policy in force"
            );
        }
        Ok(Opened {
            credentials,
            tls,
            store,
            metrics,
            ledger,
        })
    }
}

/// The start-up line: where the server listens, its store, tenancy, who may decide, and TLS.
fn log_start(
    addr: SocketAddr,
    settings: &Settings,
    backend: &str,
    credentials: &Credentials,
    tls: bool,
) {
    tracing::info!(
        listen = %addr,
        store = %redact_url(&settings.database_url),
        backend,
        tenancy = %credentials.current().describe(),
        deciders = if credentials.current().requires_credentials() {
            "credentials with the approver role"
        } else {
            "every caller (no credentials configured)"
        },
        tls,
        mutual_tls = settings.tls_client_ca.is_some(),
        "idempotency-ledger starting"
    );
}

/// Binds `addr` for the ledger's gRPC service (`--listen`).
///
/// # Errors
/// [`ServeError::Transport`] naming the address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| ServeError::Transport(format!("cannot listen on {addr}: {e}")))
}

/// What the health probe runs with: it applies the migrations, then keeps health honest.
struct Probe {
    store: Arc<dyn storage::Store>,
    reporter: tonic_health::server::HealthReporter,
    state: Arc<Readiness>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    interval: std::time::Duration,
}

/// How a server stops: the signal that starts the drain, a store found misconfigured by the
/// probe (`fatal`), and whether the drain began (`drain`).
struct Stopping<S> {
    signal: S,
    fatal: tokio::sync::oneshot::Receiver<String>,
    drain: watch::Receiver<bool>,
}

impl Stopping<()> {
    /// Starts the health probe (owned by `tasks`) and makes the signal that, once `shutdown`
    /// resolves, turns health NOT_SERVING and stops the probe before the listener closes.
    fn start(
        probe: Probe,
        shutdown: impl Future<Output = ()> + Send + 'static,
        tasks: &mut OwnedTasks,
    ) -> Stopping<impl Future<Output = ()> + Send + 'static> {
        let (fatal_tx, fatal) = tokio::sync::oneshot::channel();
        let (reporter, state) = (probe.reporter.clone(), probe.state.clone());
        let task = tokio::spawn(probe_loop(
            probe.store,
            probe.reporter,
            probe.state,
            probe.metrics,
            probe.clock,
            probe.interval,
            fatal_tx,
        ));
        let probe_stop = task.abort_handle();
        tasks.push(task);
        let (drain_tx, drain) = watch::channel(false);
        let signal = async move {
            shutdown.await;
            // Health goes first, so load balancers stop sending before the listener closes;
            // the probe is stopped before, so it cannot report SERVING again.
            state.draining.store(true, Ordering::Release);
            probe_stop.abort();
            set_health(&reporter, ServingStatus::NotServing).await;
            tracing::info!("shutting down: draining in-flight calls");
            let _ = drain_tx.send(true);
        };
        Stopping {
            signal,
            fatal,
            drain,
        }
    }
}

/// Serves `server` until it ends, the store turns out to be misconfigured (`fatal`), or
/// `grace` after the drain began (`drain`) with calls still in flight.
async fn until_drained(
    server: impl Future<Output = Result<(), tonic::transport::Error>>,
    mut fatal: tokio::sync::oneshot::Receiver<String>,
    mut drain: watch::Receiver<bool>,
    grace: std::time::Duration,
) -> Result<(), ServeError> {
    let bounded_drain = async move {
        while !*drain.borrow() {
            if drain.changed().await.is_err() {
                // The server ended on its own; the other branch finishes it.
                std::future::pending::<()>().await;
            }
        }
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        served = server => served.map_err(|e| ServeError::Transport(e.to_string())),
        Ok(reason) = &mut fatal => Err(ServeError::Store(StoreError::Misconfigured(reason))),
        () = bounded_drain => {
            tracing::warn!(grace = ?grace, "in-flight calls did not finish within the grace period");
            Ok(())
        }
    }
}

/// The ledger's gRPC service as it is served: authentication (which also refuses calls until
/// the store is migrated), the byte budget, the transport's own refusals rewritten as the
/// ledger's answers, and the metrics around it all.
fn ledger_service(
    settings: &Settings,
    ledger: &Ledger,
    metrics: &Arc<Metrics>,
    credentials: &Credentials,
    state: &Arc<Readiness>,
) -> impl tower::Service<
    http::Request<tonic::body::Body>,
    Response = http::Response<tonic::body::Body>,
    Error = std::convert::Infallible,
    Future: Send + 'static,
> + tonic::server::NamedService
+ Clone
+ Send
+ Sync
+ 'static {
    let interceptor = {
        let state = state.clone();
        let mut authenticate = crate::grpc::auth::interceptor(credentials);
        // Authentication comes first, so an unauthenticated caller learns nothing, not even
        // whether the server is ready.
        move |request| {
            let request = authenticate(request)?;
            if state.migrated.load(Ordering::Acquire) {
                Ok(request)
            } else {
                Err(crate::grpc::error::status(LedgerError::Unavailable(
                    "migrations have not run yet".into(),
                )))
            }
        }
    };
    let admission = Arc::new(Admission::new(
        settings.max_concurrent_requests,
        settings.tenant_rate_limit,
        if settings.tenant_rate_burst > 0.0 {
            settings.tenant_rate_burst
        } else {
            settings.tenant_rate_limit
        },
    ));
    let api = LedgerApi::new(
        ledger.clone(),
        metrics.clone(),
        admission,
        settings.request_timeout,
    );
    // Inside authentication, so that an unauthenticated caller learns nothing of the load, and
    // outside decoding, so that a call over the budget is refused before its message is read.
    let service = InterceptedService::new(
        AdmitBytes::new(
            LedgerServiceServer::new(api)
                .max_decoding_message_size(settings.max_message_bytes)
                .max_encoding_message_size(settings.max_message_bytes),
            BytesInFlight::new(settings.max_inflight_bytes),
        ),
        interceptor,
    );
    // tonic's own refusals (an oversized or undecodable request) become the ledger's answers
    // here, once, inside the metrics and the access log, so both see the code the caller gets.
    let service = crate::grpc::TransportRefusals::new(service);
    // Outside the interceptor, so calls refused by authentication are counted too.
    tower::Layer::layer(&GrpcMetricsLayer::new(metrics.clone()), service)
}

/// The reflection services' builder, describing the ledger, health and the error details
/// (built as v1, and as v1alpha, which grpcurl 1.8 asks for).
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(pb::ERROR_DETAILS_DESCRIPTOR_SET)
}

/// A reflection service that could not be built.
fn reflection_failed(e: tonic_reflection::server::Error) -> ServeError {
    ServeError::Transport(format!("reflection: {e}"))
}

/// The background tasks of one server, aborted when dropped: `serve` owns them, so none
/// outlives it, whichever way it returns.
#[derive(Default)]
struct OwnedTasks(Vec<tokio::task::JoinHandle<()>>);

impl OwnedTasks {
    fn push(&mut self, task: tokio::task::JoinHandle<()>) {
        self.0.push(task);
    }
}

impl Drop for OwnedTasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Applies the migrations of the store `settings` names, and returns.
///
/// # Errors
/// The store cannot be opened or a migration fails.
pub async fn migrate(settings: &Settings) -> Result<(), ServeError> {
    let store = storage::open(&settings.database_url, &settings.pool()).await?;
    store.migrate().await?;
    tracing::info!(store = %redact_url(&settings.database_url), "migrations applied");
    Ok(())
}

/// The TLS configuration of `--tls-cert` and `--tls-key` (and `--tls-client-ca`, with which
/// a client without a certificate signed by that CA cannot connect), if set.
fn server_tls(settings: &Settings) -> Result<Option<Arc<ServerTls>>, ServeError> {
    let (Some(cert), Some(key)) = (&settings.tls_cert, &settings.tls_key) else {
        return Ok(None);
    };
    let files = TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: settings.tls_client_ca.clone(),
    };
    let tls = ServerTls::load(files).map_err(|e| ServeError::Config(format!("TLS: {e}")))?;
    Ok(Some(Arc::new(tls)))
}

/// The approval policy of `--approval-policy` (none without the flag).
///
/// # Errors
/// The file and line that does not parse.
fn approval_policy(file: Option<&std::path::Path>) -> Result<Policy, String> {
    let Some(file) = file else {
        return Ok(Policy::none());
    };
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read the approval policy {}: {e}", file.display()))?;
    Policy::parse(&text).map_err(|e| format!("{}: {e}", file.display()))
}
