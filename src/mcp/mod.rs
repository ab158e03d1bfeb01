//! The MCP gateway (`idempotency-ledger mcp`): the ledger between any MCP client and one MCP
//! server (the *upstream*), neither of them changed. A `tools/call` of a governed tool is a
//! Claim before it reaches the upstream and a Complete after; every other message passes
//! through unchanged both ways. So a call the client re-issues (a new request id after a broken
//! stream, a retry of the runtime, the model asking again) acts once, a repeat reads the stored
//! result with the ledger's note, and an outcome nobody knows is never sent again.
//!
//! # Layout
//!
//! `policy, rpc, answers ← govern ← stdio, upstream_http ← http`
//!
//! - [`policy`]: which tools are governed and how (the policy file, the tools' hints).
//! - [`rpc`]: JSON-RPC messages as the gateway routes them, and the errors it answers itself.
//! - [`answers`]: the `CallToolResult` the client receives for each outcome.
//! - [`govern`]: one `tools/call`: its run, its Claim, the upstream's answer, its Complete.
//! - [`backend`]: where the calls are claimed: a ledger in this process, or a ledger server
//!   over gRPC (`--ledger`).
//! - [`stdio`]: the stdio transport: the upstream as a child process, restarted when it exits.
//! - [`upstream_http`]: an upstream over Streamable HTTP: a message a POST, its answer JSON or
//!   an event stream.
//! - [`http`]: the Streamable HTTP transport for clients: the edge's checks (origin, token,
//!   size), governed calls answered by the gateway, everything else streamed through.
//!
//! rmcp (the official Rust SDK) gives the protocol's model: the gateway reads tool calls and
//! writes its own results with it. Its transports serve a typed client or server, which would
//! drop what they do not model; a gateway must pass on every member of every message, so the
//! routing here keeps messages as the JSON values they arrived as.

pub mod answers;
pub mod backend;
pub mod govern;
pub mod http;
pub mod policy;
pub mod rpc;
pub mod stdio;
pub mod upstream_http;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::defaults::{self, parse_duration};
use crate::domain::Tenant;
use crate::domain::time::{AlignedClock, Clock};
use crate::ledger::Limits;
use crate::observe::metrics::{Metrics, MetricsOptions};
use crate::server::ClockAlignment;
use crate::storage;
use govern::{Gateway, Rules, Seal};
use policy::McpPolicy;

/// Stand between an MCP client and an MCP server: every side-effecting `tools/call` acts once
/// per intent, a repeat gets the stored result with an honest note, and an outcome nobody knows
/// is never sent again. The line for a desktop client's server list:
///
///   idempotency-ledger mcp -- npx -y @modelcontextprotocol/server-memory
#[derive(Args, Debug, Clone)]
pub struct McpArgs {
    /// The upstream MCP server's command and its arguments (stdio), after `--`. The gateway
    /// starts it, passes every message on, restarts it when it exits, and stops it when the
    /// client goes away.
    #[arg(last = true, value_name = "COMMAND", conflicts_with_all = ["listen", "upstream"])]
    pub command: Vec<OsString>,

    /// Serve MCP clients over Streamable HTTP on this address (with --upstream), instead of
    /// stdio.
    #[arg(long, env = "LEDGER_MCP_LISTEN", requires = "upstream")]
    pub listen: Option<std::net::SocketAddr>,

    /// The upstream MCP server's Streamable HTTP endpoint (http:// or https://host:port/path),
    /// with --listen. Its URL and credentials come from here only, never from a client.
    #[arg(long, env = "LEDGER_MCP_UPSTREAM", requires = "listen")]
    pub upstream: Option<String>,

    /// A PEM file of CA certificates an https:// upstream's certificate may chain to, besides
    /// the Mozilla roots (a private CA).
    #[arg(long, env = "LEDGER_MCP_UPSTREAM_CA", requires = "upstream")]
    pub upstream_ca: Option<PathBuf>,

    /// A header sent with every message to the upstream, `Name: value` (its credentials);
    /// repeat it for more. A client's own Authorization is never passed on.
    #[arg(
        long = "upstream-header",
        env = "LEDGER_MCP_UPSTREAM_HEADERS",
        value_delimiter = '\n'
    )]
    pub upstream_headers: Vec<String>,

    /// HTTP: the tokens file, one credential a line `<tenant> <token>` (as the server's
    /// --auth-tokens-file): a client sends `Authorization: Bearer <token>`, and its calls are
    /// that tenant's. Without it, every client is tenant `default`.
    #[arg(long, env = "LEDGER_MCP_AUTH_TOKENS_FILE")]
    pub auth_tokens_file: Option<PathBuf>,

    /// HTTP: a browser origin allowed to call the gateway (repeat for more). Requests without
    /// an Origin header (not from a browser) pass; on a loopback address, this machine's
    /// origins (http://localhost…, http://127.0.0.1…) pass too.
    #[arg(
        long = "allowed-origin",
        env = "LEDGER_MCP_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,

    /// HTTP: the largest request body taken; a larger one is refused (413) and nothing is sent
    /// on.
    #[arg(long, env = "LEDGER_MCP_MAX_BODY_BYTES", default_value_t = 1_048_576)]
    pub max_body_bytes: usize,

    /// The upstream's name: entries are recorded as `<name>/<tool>`. By default the name the
    /// upstream gives itself (`serverInfo.name`). Keep it stable: it is part of every key.
    #[arg(long, env = "LEDGER_MCP_NAME")]
    pub name: Option<String>,

    /// The ledger's store: `sqlite://FILE` or `postgres://…` (several gateways then share one
    /// ledger). By default a SQLite file in the user's state directory
    /// ($XDG_STATE_HOME/idempotency-ledger/mcp.db, else ~/.local/state/…).
    #[arg(long, env = "LEDGER_MCP_DATABASE_URL", conflicts_with = "ledger")]
    pub database_url: Option<String>,

    /// A running ledger server to claim the calls in, over gRPC (`http://HOST:PORT`, or
    /// `https://` with --ledger-ca), instead of a store of the gateway's own: its tenants,
    /// approvals, console, metrics and reconcilers then see the gateway's calls. The tenant is
    /// --ledger-token's (so a tokens file may name one tenant only); with
    /// --approvals-at-client the token needs the approver role.
    #[arg(long, env = "LEDGER_MCP_LEDGER")]
    pub ledger: Option<String>,

    /// The bearer token the gateway calls the ledger server with (prefer the environment
    /// variable: a flag is visible in the process list).
    #[arg(
        long,
        env = "LEDGER_MCP_LEDGER_TOKEN",
        hide_env_values = true,
        requires = "ledger"
    )]
    pub ledger_token: Option<String>,

    /// PEM CA certificate that signed an https:// ledger server's certificate.
    #[arg(long, env = "LEDGER_MCP_LEDGER_CA", requires = "ledger")]
    pub ledger_ca: Option<PathBuf>,

    /// The policy file: which tools pass, which act once, which a person must approve, and
    /// their paired reads (one line a tool name or glob: see the guide). Re-read on SIGHUP; a
    /// file that does not parse keeps the one in force and the log names its line. Without it
    /// every tool acts once, but those the upstream marks read-only, which pass.
    #[arg(long, env = "LEDGER_MCP_POLICY")]
    pub mcp_policy: Option<PathBuf>,

    /// A call that names no run (`_meta["idempotency-ledger/run"]`) is the same intent as an
    /// identical call made less than this after the last one; later it is a new intent.
    #[arg(long, env = "LEDGER_MCP_SAME_INTENT_WITHIN", default_value = "10m", value_parser = parse_duration)]
    pub same_intent_within: Duration,

    /// Take the call's W3C trace id (`_meta.traceparent`) as its run when it names none, before
    /// the window.
    #[arg(long, env = "LEDGER_MCP_RUN_FROM_TRACE")]
    pub run_from_trace: bool,

    /// The tenant the entries belong to.
    #[arg(long, env = "LEDGER_MCP_TENANT", default_value = "default")]
    pub tenant: String,

    /// How long a repeat of a call in flight waits for its result before it is told the call
    /// is in progress.
    #[arg(long, env = "LEDGER_MCP_WAIT", default_value = "30s", value_parser = parse_duration)]
    pub wait: Duration,

    /// The lease of a call sent to the upstream, renewed every third of it while the upstream
    /// works.
    #[arg(long, env = "LEDGER_MCP_LEASE", default_value = "60s", value_parser = parse_duration)]
    pub lease: Duration,

    /// How long the upstream may take to answer a governed call; past it the outcome is
    /// recorded as unknown (never sent again) and the client is told so.
    #[arg(long, env = "LEDGER_MCP_CALL_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub call_timeout: Duration,

    /// How long a finished call is kept (and replayed); the ledger's default (24h) when unset.
    #[arg(long, env = "LEDGER_MCP_RETENTION", value_parser = parse_duration)]
    pub retention: Option<Duration>,

    /// How long an outcome stays unknown before its paired read (`confirm` in the policy) asks
    /// the upstream whether the effect happened: an effect may still be landing right after
    /// the answer was lost.
    #[arg(long, env = "LEDGER_MCP_CONFIRM_AFTER", default_value = "2s", value_parser = parse_duration)]
    pub confirm_after: Duration,

    /// A gated call asks the person at the client (a form, on the 2026-07-28 revision's
    /// input-required round trip) where the client says it can show one; the person's answer
    /// decides under the gateway's authority, bound to the arguments shown. Without it (or for
    /// a client that cannot be asked) an approver decides in the console or the CLI.
    #[arg(long, env = "LEDGER_MCP_APPROVALS_AT_CLIENT")]
    pub approvals_at_client: bool,

    /// A file of secret bytes (32 or more; `head -c 32 /dev/urandom`) the gateway seals the
    /// questions it asks at the client with, so that an answer sealed by one replica is read by
    /// another: give every replica behind one address the same file. Without it each process
    /// seals with a random key of its own (one replica, or stdio), and an answer that reaches
    /// another replica asks the person again.
    #[arg(long, env = "LEDGER_MCP_APPROVALS_SEAL_FILE")]
    pub approvals_seal_file: Option<PathBuf>,

    /// Where the gateway serves its Prometheus metrics (`GET /metrics`): the ledger's own
    /// (claims, completions, decisions by `<upstream>/<tool>`, the store's counts) and
    /// `ledger_mcp_calls_total` (each answer to a tools/call, by answer and tool).
    #[arg(long, env = "LEDGER_MCP_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// Where the gateway serves the operator's console (the ledger's: approvals to decide,
    /// unknown outcomes to settle, the entries): for a desktop user on the embedded store, say
    /// `127.0.0.1:7700`. Signed in with a token of `--auth-tokens-file` when it is given, else
    /// open to whoever reaches the address, as tenant `default` with the approver role.
    #[arg(long, env = "LEDGER_MCP_CONSOLE_LISTEN", conflicts_with = "ledger")]
    pub console_listen: Option<std::net::SocketAddr>,
}

/// Why the gateway could not run.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// A setting or file that cannot be used.
    #[error("{0}")]
    Config(String),
    /// The store could not be opened or migrated.
    #[error("the ledger's store: {0}")]
    Store(#[from] storage::StoreError),
}

/// Runs the gateway over this process's stdin and stdout until the client goes away or
/// `shutdown` resolves; `reloads` yields on each request to read the policy again (SIGHUP).
///
/// # Errors
/// A setting or the policy file cannot be used, the store cannot be opened, or the upstream
/// cannot be started.
pub async fn run(
    args: McpArgs,
    shutdown: impl Future<Output = ()> + Send,
    reloads: impl tokio_stream::Stream<Item = ()> + Unpin + Send + 'static,
) -> Result<(), McpError> {
    if args.command.is_empty() && args.listen.is_none() {
        return Err(McpError::Config(
            "no upstream: idempotency-ledger mcp [OPTIONS] -- COMMAND [ARGS…] (stdio), or \
             --listen ADDR --upstream URL (Streamable HTTP)"
                .into(),
        ));
    }
    let tenant = Tenant::parse(&args.tenant).map_err(|e| McpError::Config(e.to_string()))?;
    let policy = read_policy(args.mcp_policy.as_deref())?;
    let clock = Arc::new(AlignedClock::default());
    let metrics = Metrics::new(clock.clone() as Arc<dyn Clock>, &MetricsOptions::default());
    let (backend, local) = backend::open(&args, &clock, policy.len()).await?;
    let scraped = match args.metrics_listen {
        Some(addr) => serve_metrics(addr, &metrics, local.as_ref().map(|l| &l.0)).await?,
        None => Vec::new(),
    };
    let gateway = Arc::new(Gateway::new(
        backend,
        tenant,
        rules(&args),
        policy,
        args.name.clone(),
        seal(args.approvals_seal_file.as_deref())?,
        metrics.clone(),
    ));
    let console = match args.console_listen {
        Some(addr) => Some(serve_console(addr, &gateway, &metrics, &clock, &args).await?),
        None => None,
    };
    let upkeep = local.map(|(store, alignment)| {
        tokio::spawn(upkeep(gateway.clone(), store, clock.clone(), alignment))
    });
    let reloader = args
        .mcp_policy
        .clone()
        .map(|file| tokio::spawn(reload_policy(gateway.clone(), file, reloads)));
    let served = match (args.listen, &args.upstream) {
        (Some(listen), Some(upstream)) => {
            serve_http(gateway, &args, listen, upstream, shutdown).await
        }
        _ => {
            stdio::serve(
                gateway,
                args.command,
                tokio::io::stdin(),
                tokio::io::stdout(),
                shutdown,
            )
            .await
        }
    };
    for task in scraped.into_iter().chain(console).chain(upkeep) {
        task.abort();
    }
    if let Some(reloader) = reloader {
        reloader.abort();
    }
    served.map_err(McpError::Config)
}

/// How calls are governed, from the command line.
fn rules(args: &McpArgs) -> Rules {
    Rules {
        same_intent_within: args.same_intent_within,
        run_from_trace: args.run_from_trace,
        wait: args.wait,
        lease: args.lease,
        call_timeout: args.call_timeout,
        retention: args.retention,
        confirm_after: args.confirm_after,
        approvals_at_client: args.approvals_at_client,
    }
}

/// Reads the policy `file` again on each of `reloads` (SIGHUP): a file that does not parse
/// keeps the policy in force.
async fn reload_policy(
    gateway: Arc<Gateway>,
    file: PathBuf,
    mut reloads: impl tokio_stream::Stream<Item = ()> + Unpin,
) {
    use tokio_stream::StreamExt as _;
    while reloads.next().await.is_some() {
        match read_policy(Some(&file)) {
            Ok(policy) => {
                tracing::info!(lines = policy.len(), "reload: the MCP policy is in force");
                gateway.set_policy(policy);
            }
            Err(e) => tracing::error!(
                error = %e,
                "reload: the MCP policy was not taken; the one in force is kept"
            ),
        }
    }
}

/// Serves the metrics on `addr`, with the loop that refreshes the store's counts.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: &Arc<Metrics>,
    store: Option<&Arc<dyn storage::Store>>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, McpError> {
    let listener = crate::observe::http::bind(addr)
        .await
        .map_err(|e| McpError::Config(format!("cannot listen on {addr} for metrics: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| McpError::Config(e.to_string()))?;
    tracing::info!(metrics = %bound, "metrics endpoint listening");
    let served = tokio::spawn(crate::observe::http::serve(listener, metrics.clone()));
    // The store's counts are a ledger server's own to serve when it has the store.
    let refreshed = store.map(|store| {
        tokio::spawn(crate::observe::refresh_loop(
            metrics.clone(),
            store.clone(),
            || true,
            defaults::METRICS_REFRESH_INTERVAL,
        ))
    });
    Ok(std::iter::once(served).chain(refreshed).collect())
}

/// Serves the ledger's console on `addr`, on the gateway's ledger.
async fn serve_console(
    addr: std::net::SocketAddr,
    gateway: &Gateway,
    metrics: &Arc<Metrics>,
    clock: &Arc<AlignedClock>,
    args: &McpArgs,
) -> Result<tokio::task::JoinHandle<()>, McpError> {
    let credentials = crate::credentials::Credentials::load(args.auth_tokens_file.as_deref())
        .map_err(McpError::Config)?;
    let listener = crate::console::bind(addr)
        .await
        .map_err(|e| McpError::Config(format!("cannot listen on {addr} for the console: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| McpError::Config(e.to_string()))?;
    let ledger = gateway.ledger().ok_or_else(|| {
        McpError::Config("--console-listen needs the gateway's own store, not --ledger".into())
    })?;
    let console = crate::console::Console::new(
        ledger.clone(),
        metrics.clone(),
        credentials,
        clock.clone() as Arc<dyn Clock>,
        || true,
        bound.port(),
        &crate::console::Options {
            hosts: Vec::new(),
            session_idle: defaults::CONSOLE_SESSION_IDLE,
            max_result_bytes: defaults::MAX_RESULT_BYTES,
        },
    );
    let url = crate::console::url(bound);
    tracing::info!(url = %url, "operator console: open {url} in a browser");
    Ok(tokio::spawn(crate::console::serve(listener, console)))
}

/// Serves MCP clients over Streamable HTTP on `listen`, in front of `upstream`.
async fn serve_http(
    gateway: Arc<Gateway>,
    args: &McpArgs,
    listen: std::net::SocketAddr,
    upstream: &str,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), String> {
    let credentials = crate::credentials::Credentials::load(args.auth_tokens_file.as_deref())?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(
        listen = %bound,
        tenancy = %credentials.current().describe(),
        "the MCP gateway listens for clients (Streamable HTTP)"
    );
    let edge = Arc::new(http::Edge {
        gateway,
        upstream: upstream_http::HttpUpstream::new(
            upstream,
            &args.upstream_headers,
            args.upstream_ca.as_deref(),
        )?,
        credentials,
        origins: args.allowed_origins.clone(),
        loopback: http::is_loopback(bound),
        max_body: args.max_body_bytes,
        in_flight: std::sync::Mutex::default(),
        asking: Arc::default(),
    });
    http::serve(listener, http::router(edge), shutdown).await;
    Ok(())
}

/// The ledger's limits for the gateway: the shipped defaults, without the replay memory (a
/// gateway's repeats are few, and its counts are then written with each replay), and the
/// paired read's wait as the reconcile grace (the gateway's reads are its reconciliation).
fn limits(confirm_after: Duration) -> Limits {
    Limits {
        replay_memory_bytes: 0,
        reconcile_grace: confirm_after,
        ..Limits::default()
    }
}

/// The ledger's upkeep while the gateway runs: the clock kept on the database's (PostgreSQL),
/// lapsed approvals recorded, expired entries pruned.
async fn upkeep(
    gateway: Arc<Gateway>,
    store: Arc<dyn storage::Store>,
    clock: Arc<AlignedClock>,
    mut alignment: ClockAlignment,
) {
    loop {
        tokio::time::sleep(defaults::PRUNE_INTERVAL).await;
        let Some(ledger) = gateway.ledger() else {
            return;
        };
        let _ = alignment.align(&*store, &*clock).await;
        if let Err(e) = ledger
            .expire_lapsed_approvals(defaults::PRUNE_BATCH_SIZE)
            .await
        {
            tracing::warn!(error = %e, "recording lapsed approvals failed; retrying later");
        }
        if let Err(e) = ledger.prune(defaults::PRUNE_BATCH_SIZE).await {
            tracing::warn!(error = %e, "pruning failed; retrying later");
        }
    }
}

/// The policy of `file`, or none (every tool acts once but those marked read-only).
fn read_policy(file: Option<&std::path::Path>) -> Result<McpPolicy, McpError> {
    let Some(file) = file else {
        return Ok(McpPolicy::default());
    };
    let text = std::fs::read_to_string(file).map_err(|e| {
        McpError::Config(format!(
            "cannot read the MCP policy {}: {e}",
            file.display()
        ))
    })?;
    McpPolicy::parse(&text)
        .map_err(|e| McpError::Config(format!("the MCP policy {}: {e}", file.display())))
}

/// The seal of the questions asked at the client: from `file` (shared by replicas), else
/// random.
fn seal(file: Option<&Path>) -> Result<Seal, McpError> {
    let Some(file) = file else {
        return Seal::random()
            .map_err(|e| McpError::Config(format!("no randomness for the seal: {e}")));
    };
    let secret = std::fs::read(file).map_err(|e| {
        McpError::Config(format!(
            "--approvals-seal-file {}: cannot read it: {e}",
            file.display()
        ))
    })?;
    Seal::from_secret(&secret).ok_or_else(|| {
        McpError::Config(format!(
            "--approvals-seal-file {}: holds {} bytes; it needs 32 or more secret bytes \
             (head -c 32 /dev/urandom > FILE)",
            file.display(),
            secret.len()
        ))
    })
}

/// The default store: a SQLite file in the user's state directory, made if missing.
fn default_store() -> Result<String, McpError> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .ok_or_else(|| {
            McpError::Config(
                "no state directory (neither XDG_STATE_HOME nor HOME is set): pass \
                 --database-url"
                    .into(),
            )
        })?;
    let dir = base.join("idempotency-ledger");
    std::fs::create_dir_all(&dir)
        .map_err(|e| McpError::Config(format!("cannot make {}: {e}", dir.display())))?;
    Ok(format!("sqlite://{}", dir.join("mcp.db").display()))
}

/// The upstream command as the log shows it.
fn shown(command: &[OsString]) -> String {
    command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}
