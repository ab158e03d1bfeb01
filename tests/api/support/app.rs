//! `spawn_app()`: a real server on a port-0 listener over a fresh database of either backend,
//! with a real tonic client; and the stores and ledgers the conformance suite runs on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use idempotency_ledger::domain::Micros;
use idempotency_ledger::domain::time::Clock;
use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use idempotency_ledger::ledger::{Ledger, Limits};
use idempotency_ledger::server::Settings;
use idempotency_ledger::server::{self, ServeError};
use idempotency_ledger::storage::{self, PoolOptions, Store};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::pgbouncer::PgBouncer;
use super::postgres::PgCluster;

/// Which store a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    /// PostgreSQL through PgBouncer in transaction mode (`--postgres-pooler transaction`).
    PgBouncer,
}

/// A fresh, empty database: a SQLite file in its own temp dir, or a new database in this
/// process's PostgreSQL cluster.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    /// The database itself, not through the pooler (for migrations); `url` for the others.
    pub direct_url: String,
    /// Keeps the SQLite file's directory alive.
    _dir: Option<tempfile::TempDir>,
}

/// Runs `statement` on the database of `backend` at `url`, on a connection of its own.
pub async fn execute_on(backend: Backend, url: &str, statement: &'static str) {
    match backend {
        Backend::Postgres | Backend::PgBouncer => {
            let pool = sqlx::PgPool::connect(url).await.expect("connect");
            sqlx::raw_sql(statement)
                .execute(&pool)
                .await
                .expect(statement);
            pool.close().await;
        }
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(url).await.expect("connect");
            sqlx::raw_sql(statement)
                .execute(&pool)
                .await
                .expect(statement);
            pool.close().await;
        }
    }
}

impl TestDb {
    pub fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
                TestDb {
                    backend,
                    direct_url: url.clone(),
                    url,
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => {
                let url = PgCluster::shared().create_database();
                TestDb {
                    backend,
                    direct_url: url.clone(),
                    url,
                    _dir: None,
                }
            }
            Backend::PgBouncer => {
                let direct_url = PgCluster::shared().create_database();
                TestDb {
                    backend,
                    url: PgBouncer::shared().url_for(&direct_url),
                    direct_url,
                    _dir: None,
                }
            }
        }
    }

    /// Another handle on an existing database (a second server on the same one).
    pub fn existing(backend: Backend, url: &str) -> TestDb {
        TestDb {
            backend,
            url: url.to_string(),
            direct_url: url.to_string(),
            _dir: None,
        }
    }

    /// Another handle on this database.
    pub fn again(&self) -> TestDb {
        TestDb {
            backend: self.backend,
            url: self.url.clone(),
            direct_url: self.direct_url.clone(),
            _dir: None,
        }
    }

    /// The pool settings a store of this backend runs with.
    pub fn pool_options(&self, max_connections: u32) -> PoolOptions {
        PoolOptions {
            max_connections,
            acquire_timeout: Duration::from_secs(10),
            pooler: if self.backend == Backend::PgBouncer {
                storage::Pooler::Transaction
            } else {
                storage::Pooler::None
            },
            migrations_url: (self.backend == Backend::PgBouncer).then(|| self.direct_url.clone()),
            ..PoolOptions::default()
        }
    }

    /// Runs `statement` on the database itself, as an operator (or a race the test cannot
    /// time) would leave it.
    pub async fn execute(&self, statement: &'static str) {
        execute_on(self.backend, &self.direct_url, statement).await;
    }

    /// A new, migrated store over this database, with its own connection pool.
    pub async fn store(&self, max_connections: u32) -> Arc<dyn Store> {
        let store = storage::open(&self.url, &self.pool_options(max_connections))
            .await
            .expect("open store");
        store.migrate().await.expect("migrate");
        store
    }

    /// A new, migrated store over this database whose group commit has `writers` writers of
    /// each kind, and the counts of its batches.
    pub async fn batched(
        &self,
        max_connections: u32,
        writers: usize,
    ) -> (Arc<dyn Store>, Arc<storage::group_commit::Stats>) {
        let (store, stats) =
            storage::open_with_writers(&self.url, &self.pool_options(max_connections), writers)
                .await
                .expect("open store");
        store.migrate().await.expect("migrate");
        (store, stats)
    }

    /// A new, migrated backend over this database, without group commit: for tests of the
    /// backends' own statements (the multi-row ones included) and of the batcher.
    pub async fn backend(&self, max_connections: u32) -> Arc<dyn storage::Store> {
        let backend = storage::open_backend(&self.url, &self.pool_options(max_connections))
            .await
            .expect("open backend");
        backend.migrate().await.expect("migrate");
        backend
    }

    /// Sets the server settings this backend needs besides the URL.
    pub fn configure(&self, settings: &mut Settings) {
        settings.database_url = self.url.clone();
        if self.backend == Backend::PgBouncer {
            settings.postgres_pooler = storage::Pooler::Transaction;
            settings.migrations_database_url = Some(self.direct_url.clone());
        }
    }
}

/// A clock the test moves by hand, to expire leases and retention without sleeping.
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new() -> Arc<ManualClock> {
        Arc::new(ManualClock(AtomicI64::new(Micros::now().0)))
    }

    pub fn advance(&self, d: Duration) {
        self.0
            .fetch_add(Micros::from_duration(d).0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        Micros(self.0.load(Ordering::SeqCst))
    }
}

/// A ledger over a fresh store of `backend`, with a manual clock and default limits.
pub struct TestLedger {
    pub ledger: Ledger,
    pub clock: Arc<ManualClock>,
    pub db: TestDb,
}

impl TestLedger {
    pub async fn new(backend: Backend) -> TestLedger {
        TestLedger::with_limits(backend, test_limits()).await
    }

    /// The ledger's clock now.
    pub fn clock_now(&self) -> Micros {
        self.clock.now()
    }

    pub async fn with_limits(backend: Backend, limits: Limits) -> TestLedger {
        init_tracing();
        let db = TestDb::new(backend);
        let clock = ManualClock::new();
        let ledger = Ledger::new(db.store(8).await, clock.clone(), limits);
        TestLedger { ledger, clock, db }
    }
}

/// A running server and a client connected to it.
pub struct TestApp {
    pub addr: SocketAddr,
    pub client: LedgerServiceClient<Channel>,
    pub channel: Channel,
    pub clock: Arc<ManualClock>,
    pub db: TestDb,
    shutdown: Option<oneshot::Sender<()>>,
    pub handle: Option<JoinHandle<Result<(), ServeError>>>,
}

/// The shipped limits, but that Reconcile hands out an unknown outcome at once (no grace):
/// what most tests of reconciliation want; the grace has tests of its own.
pub fn test_limits() -> Limits {
    Limits {
        reconcile_grace: Duration::ZERO,
        ..Limits::default()
    }
}

/// Settings for a test server: port 0, the given database, a fast health probe, no reconcile
/// grace (see [`test_limits`]).
pub fn test_settings(url: &str) -> Settings {
    let mut s = Settings::defaults();
    s.listen = "127.0.0.1:0".parse().expect("addr");
    s.database_url = url.to_string();
    s.health_probe_interval = Duration::from_millis(200);
    s.db_acquire_timeout = Duration::from_secs(2);
    s.shutdown_grace = Duration::from_secs(5);
    s.reconcile_grace = Duration::ZERO;
    // Tests that want a console ask for one on a free port; the default one is a developer's.
    s.console_listen = Some(idempotency_ledger::console::Listen::Off);
    s
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |_| {}).await
}

/// Starts a server over a fresh database of `backend`, after `configure` adjusts its settings,
/// and waits until its health reports SERVING.
pub async fn spawn_app_with(backend: Backend, configure: impl FnOnce(&mut Settings)) -> TestApp {
    let db = TestDb::new(backend);
    spawn_app_on(db, configure).await
}

/// As [`spawn_app_with`], on an existing database.
pub async fn spawn_app_on(db: TestDb, configure: impl FnOnce(&mut Settings)) -> TestApp {
    init_tracing();
    let mut settings = test_settings(&db.url);
    db.configure(&mut settings);
    configure(&mut settings);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let clock = ManualClock::new();
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(server::run(
        listener,
        settings,
        clock.clone(),
        async {
            let _ = rx.await;
        },
        tokio_stream::pending(),
    ));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let app = TestApp {
        addr,
        client: LedgerServiceClient::new(channel.clone()),
        channel,
        clock,
        db,
        shutdown: Some(tx),
        handle: Some(handle),
    };
    app.wait_for_health("", ServingStatus::Serving, Duration::from_secs(20))
        .await;
    app
}

impl TestApp {
    /// Asks the health service about `service` ("" for the server as a whole).
    pub async fn health(&self, service: &str) -> Result<ServingStatus, tonic::Status> {
        let mut health = HealthClient::new(self.channel.clone());
        let resp = health
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await?;
        Ok(resp.into_inner().status())
    }

    /// Polls health until it reports `want`, or panics after `within`.
    pub async fn wait_for_health(&self, service: &str, want: ServingStatus, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let got = self.health(service).await;
            if matches!(&got, Ok(s) if *s == want) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "health of {service:?} did not become {want:?} within {within:?}; last: {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Triggers the graceful shutdown and waits for the server to return.
    pub async fn shutdown(&mut self) -> Result<(), ServeError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.handle.take() {
            Some(h) => h.await.expect("server task"),
            None => Ok(()),
        }
    }

    /// Sends the shutdown signal without waiting.
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A claim request for `tool` with `args` in `run`.
pub fn claim_req(run: &str, tool: &str, args: &str) -> pb::ClaimRequest {
    pb::ClaimRequest {
        run_id: run.into(),
        tool: tool.into(),
        arguments_json: args.into(),
        ..Default::default()
    }
}

/// A Complete request reporting success with `result`.
pub fn success(key: &str, token: &str, result: &[u8]) -> pb::CompleteRequest {
    pb::CompleteRequest {
        key: key.into(),
        claim_token: token.into(),
        status: pb::Status::Succeeded.into(),
        result: result.to_vec().into(),
        ..Default::default()
    }
}

/// The `ErrorInfo` reason of a status, or "" when it has none.
pub fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// Logs go to the test output only when `TEST_LOG` is set.
pub fn init_tracing() {
    if std::env::var_os("TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "debug".into()),
            )
            .with_test_writer()
            .try_init();
    }
}

/// The real `idempotency-ledger` binary as a command, killed when dropped, without the
/// caller's `DATABASE_URL` and `LEDGER_*` variables: its settings come from the flags a test
/// gives only, whatever the developer's shell exports (sqlx's `DATABASE_URL`, a `LEDGER_*`
/// setting). Every test that runs the binary starts it through this (`tests/layout.rs` holds
/// that); a test that wants a variable sets it on the command.
pub fn ledger_command() -> tokio::process::Command {
    ledger_command_at(env!("CARGO_BIN_EXE_idempotency-ledger"))
}

/// [`ledger_command`] for another build of the binary at `program` (a measurement may run a
/// release build), with the same environment.
pub fn ledger_command_at(program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command.env_remove("DATABASE_URL");
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("LEDGER_") || name.starts_with("OTEL_") {
            command.env_remove(name.as_ref());
        }
    }
    // No console unless a test asks for one (`--console-listen`): the default port is a
    // developer's, and servers of parallel tests would race for it.
    command.env("LEDGER_CONSOLE_LISTEN", "off");
    command.kill_on_drop(true);
    command
}

/// The real `idempotency-ledger` binary running as a child process on a free port.
pub struct ServerProcess {
    pub addr: SocketAddr,
    pub child: tokio::process::Child,
    /// What the server wrote to stderr so far is read by [`ServerProcess::start`] up to the
    /// start-up line; the rest keeps draining in a task.
    pub startup_log: String,
    /// What the server wrote to stderr after the start-up line, as it arrives.
    pub log: Arc<std::sync::Mutex<String>>,
}

impl ServerProcess {
    /// Starts the binary with `--database-url url` and `extra` flags, and waits until its health
    /// reports SERVING.
    /// It listens on a port the kernel picks (`--listen 127.0.0.1:0`); its start-up log says
    /// which.
    pub async fn start(url: &str, extra: &[&str]) -> ServerProcess {
        ServerProcess::start_on(url, 0, extra).await
    }

    /// As [`ServerProcess::start`], on a given port (a restart on the port a first start
    /// was given; 0 lets the kernel pick).
    pub async fn start_on(url: &str, port: u16, extra: &[&str]) -> ServerProcess {
        ServerProcess::start_with(url, port, extra, |_| {}).await
    }

    /// As [`ServerProcess::start_on`], after `configure` adjusts the command (its
    /// environment, or a `pre_exec` hook that sets resource limits).
    pub async fn start_with(
        url: &str,
        port: u16,
        extra: &[&str],
        configure: impl FnOnce(&mut tokio::process::Command),
    ) -> ServerProcess {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let mut command = ledger_command();
        // Before `configure`, which may ask for more.
        command.env("RUST_LOG", "info");
        configure(&mut command);
        let mut child = command
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--database-url")
            .arg(url)
            .arg("--health-probe-interval")
            .arg("200ms")
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn idempotency-ledger");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut startup_log = String::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let line = tokio::time::timeout_at(deadline, lines.next_line())
                .await
                .expect("server start-up line within 20 s")
                .expect("read stderr")
                .unwrap_or_else(|| panic!("server exited during start-up:\n{startup_log}"));
            startup_log.push_str(&line);
            startup_log.push('\n');
            if line.contains("store reachable") {
                break;
            }
        }
        let log = Arc::new(std::sync::Mutex::new(String::new()));
        let sink = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut sink = sink.lock().expect("log");
                sink.push_str(&line);
                sink.push('\n');
            }
        });
        let addr = if port == 0 {
            logged_addr(&startup_log, STARTING, "listen")
                .unwrap_or_else(|| panic!("no bound address in the start-up log:\n{startup_log}"))
        } else {
            addr
        };
        ServerProcess {
            addr,
            child,
            startup_log,
            log,
        }
    }

    /// Where the metrics endpoint listens, as the start-up log says (`--metrics-listen`).
    pub fn metrics_addr(&self) -> SocketAddr {
        logged_addr(&self.startup_log, "metrics endpoint listening", "metrics")
            .unwrap_or_else(|| panic!("no metrics address logged:\n{}", self.startup_log))
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn client(&self) -> LedgerServiceClient<Channel> {
        LedgerServiceClient::new(self.channel().await)
    }

    /// Sends SIGTERM (through the `kill` command, to stay free of libc).
    pub fn terminate(&self) {
        let pid = self.child.id().expect("running");
        let status = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

/// `line` without its colour escapes (the text log format colours field names on a
/// terminal, and some environments force it).
pub fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The address a server logged in the field `field` of its line with `message` (text or JSON
/// log format): where it bound `--listen 127.0.0.1:0` (`"idempotency-ledger starting"`,
/// `listen`) or `--metrics-listen 127.0.0.1:0` (`"metrics endpoint listening"`, `metrics`).
pub fn logged_addr(log: &str, message: &str, field: &str) -> Option<SocketAddr> {
    let (text, json) = (format!(" {field}="), format!("\"{field}\":\""));
    log.lines()
        .map(plain)
        .filter(|l| l.contains(message))
        .find_map(|l| {
            let at = l
                .find(&text)
                .map(|i| i + text.len())
                .or_else(|| l.find(&json).map(|i| i + json.len()))?;
            let rest = &l[at..];
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '"' || c == ',')
                .unwrap_or(rest.len());
            rest[..end].parse().ok()
        })
}

/// Waits until the log file at `path` holds the address [`logged_addr`] finds; panics with
/// the log after 20 s.
pub async fn wait_for_logged_addr(
    path: &std::path::Path,
    message: &str,
    field: &str,
) -> SocketAddr {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(addr) = logged_addr(&log, message, field) {
            return addr;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {field} address logged with {message:?} within 20 s:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The line the server logs, with its bound address (`listen`), once it is about to serve.
pub const STARTING: &str = "idempotency-ledger starting";

/// A TCP port that was free a moment ago.
/// A port that is free now, for a listener a test cannot bind itself (a server process, or a
/// metrics endpoint the server binds). Drawn below Linux's ephemeral range (32768 and up): a
/// port the kernel hands out for `:0` is also what it hands to outgoing connections (the tests'
/// PostgreSQL clients), which could take it before the server binds it.
pub fn free_port() -> u16 {
    use rand::RngExt as _;
    // The thread's generator, seeded by the operating system: tests running at once in other
    // processes draw other ports.
    let mut rng = rand::rng();
    for _ in 0..1000 {
        let port: u16 = 20_000 + rng.random_range(0..12_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range");
}
