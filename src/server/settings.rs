//! The server's settings: every one a flag with an environment variable of the same meaning
//! (the command line, [`crate::cli`], flattens them into `serve`, `migrate`, and the top level
//! for `serve` without its name; none is global, so the operator's commands do not take them).
//! The doc comment of each field is its `--help` text, so `idempotency-ledger --help` is the
//! configuration reference (docs/settings.md is checked against it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, FromArgMatches as _};

use crate::console::Listen;
use crate::defaults;
use crate::defaults::parse_duration;
use crate::observe::telemetry::LogFormat;
use crate::storage::Pooler;

mod built;

/// How waiters learn of completions on other servers.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeup {
    /// PostgreSQL LISTEN/NOTIFY.
    Listen,
    /// Reading each watched key at an interval.
    Poll,
}

/// What of a claim's arguments the server keeps for audit.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreArguments {
    /// Nothing: ListEntries and Lookup show no arguments.
    None,
    /// The canonical arguments with members named like secrets replaced by `"[REDACTED]"`.
    Redacted,
    /// The canonical arguments, whole.
    Full,
}

/// Every setting of the server.
#[derive(Args, Debug, Clone)]
pub struct Settings {
    /// Address the gRPC server listens on (port 0 picks a free port; the log names it).
    #[arg(
        long,
        env = "LEDGER_LISTEN",
        default_value_t = defaults::LISTEN,
    )]
    pub listen: SocketAddr,

    /// The store: `sqlite://PATH` for the embedded file (created if missing), or
    /// `postgres://USER:PASSWORD@HOST:PORT/DB` for PostgreSQL, the production store that
    /// several servers may share.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = defaults::DATABASE_URL,
    )]
    pub database_url: String,

    /// File of credentials, one per line: `<tenant> <token> [approver[=NAME]]`; `#` starts a
    /// comment. Callers send `authorization: Bearer <token>`. A credential with the third
    /// column may decide about calls awaiting approval (Decide), recorded as NAME (or
    /// `approver:` and a digest of its token). Without it the server has one tenant, `default`,
    /// needs no credential, and lets every caller decide. Health and reflection never need
    /// one. Re-read on SIGHUP: a file that does not parse leaves the credentials in force.
    #[arg(long, env = "LEDGER_AUTH_TOKENS_FILE")]
    pub auth_tokens_file: Option<PathBuf>,

    /// File of approval rules: which calls wait for a person's decision. One rule a line,
    /// `<tenant|*> <tool>` (always) or `<tenant|*> <tool> <json-pointer> <>|>=> <number>` (only
    /// when that argument passes the bound, as `* issue_refund /amount > 100`); `#` starts a
    /// comment; a tenant's own rules for a tool replace the `*` ones. Re-read on SIGHUP: a file
    /// that does not parse leaves the rules in force, and the log names its line.
    #[arg(long, env = "LEDGER_APPROVAL_POLICY")]
    pub approval_policy: Option<PathBuf>,

    /// How long a person has to decide about a gated call; undecided after it, the request
    /// lapses and the next claim of the call asks again.
    #[arg(long, env = "LEDGER_APPROVAL_TIMEOUT", default_value = defaults::shown(defaults::APPROVAL_TIMEOUT), value_parser = parse_duration)]
    pub approval_timeout: Duration,

    /// How long an approval may go unused; unused after it, it lapses and the next claim asks
    /// again.
    #[arg(long, env = "LEDGER_APPROVAL_USE_WITHIN", default_value = defaults::shown(defaults::APPROVAL_USE_WITHIN), value_parser = parse_duration)]
    pub approval_use_within: Duration,

    /// PEM certificate chain to serve TLS with (needs --tls-key). Plaintext without it.
    /// Re-read on SIGHUP with --tls-key and --tls-client-ca, for new connections; files that
    /// do not parse, or a key that does not match, leave the certificate in force.
    #[arg(long, env = "LEDGER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "LEDGER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Log format on stderr: `text` (one line per event) or `json` (one object per line, with
    /// the call span's fields). `RUST_LOG` chooses what is logged (default `info`).
    #[arg(
        long,
        env = "LEDGER_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
    )]
    pub log_format: LogFormat,

    /// Address of a Prometheus text endpoint (`GET /metrics`). Off when unset.
    #[arg(long, env = "LEDGER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Where the operator's console listens (HTTP: server-rendered pages, no JavaScript), as
    /// `IP:PORT`, or `off`. Unset: 127.0.0.1:50053, loopback only; a server that finds that
    /// default port taken starts without a console and says so, while an address given here
    /// must bind. It speaks plain HTTP: reach it from elsewhere through an SSH tunnel or a TLS
    /// proxy rather than by listening wider. With --auth-tokens-file it asks for a tenant's
    /// token and shows that tenant's entries only.
    #[arg(long, env = "LEDGER_CONSOLE_LISTEN", value_name = "ADDRESS|off", value_parser = Listen::parse)]
    pub console_listen: Option<Listen>,

    /// A host name the console answers to besides IP addresses and `localhost` (the name of a
    /// proxy in front of it, say). A request for any other name is refused, so that a web page
    /// cannot reach the console through a DNS name of its own (DNS rebinding). Repeat the
    /// flag, or separate names with commas.
    #[arg(
        long = "console-host",
        env = "LEDGER_CONSOLE_HOSTS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub console_hosts: Vec<String>,

    /// How long a console session lasts without a request (it lasts 12 hours at most).
    #[arg(long, env = "LEDGER_CONSOLE_SESSION_IDLE", default_value = defaults::shown(defaults::CONSOLE_SESSION_IDLE), value_parser = parse_duration)]
    pub console_session_idle: Duration,

    /// How often the metrics gauges read from the store (unresolved entries of every tenant,
    /// the same figure on every server sharing it) are refreshed, and the replay alarm is
    /// checked. Only with --metrics-listen.
    #[arg(long, env = "LEDGER_METRICS_REFRESH_INTERVAL", default_value = defaults::shown(defaults::METRICS_REFRESH_INTERVAL), value_parser = parse_duration)]
    pub metrics_refresh_interval: Duration,

    /// How many distinct tool names get their own `tool` label value in the metrics; later
    /// ones count as `other`, so that the series stay bounded.
    #[arg(
        long,
        env = "LEDGER_METRICS_MAX_TOOLS",
        default_value_t = defaults::METRICS_MAX_TOOLS,
    )]
    pub metrics_max_tools: usize,

    /// The sliding window of the replay ratio and the replay alarm (it slides by 1/60 of its
    /// length).
    #[arg(long, env = "LEDGER_REPLAY_ALARM_WINDOW", default_value = defaults::shown(defaults::REPLAY_ALARM_WINDOW), value_parser = parse_duration)]
    pub replay_alarm_window: Duration,

    /// Claims the replay window must hold before "not one replay" raises the alarm (a gauge
    /// and a warning logged once per window); 0 turns the alarm off.
    #[arg(
        long,
        env = "LEDGER_REPLAY_ALARM_MIN_CLAIMS",
        default_value_t = defaults::REPLAY_ALARM_MIN_CLAIMS,
    )]
    pub replay_alarm_min_claims: u64,

    /// Lease of a claim that sets none: how long the claimant may take before its attempt
    /// counts as unknown.
    #[arg(long, env = "LEDGER_DEFAULT_LEASE", default_value = defaults::shown(defaults::DEFAULT_LEASE), value_parser = parse_duration)]
    pub default_lease: Duration,

    /// Longest lease a claim may ask for; longer is INVALID_ARGUMENT.
    #[arg(long, env = "LEDGER_MAX_LEASE", default_value = defaults::shown(defaults::MAX_LEASE), value_parser = parse_duration)]
    pub max_lease: Duration,

    /// How long a finished entry is kept (and replayed) when the claim sets no retention.
    #[arg(long, env = "LEDGER_DEFAULT_RETENTION", default_value = defaults::shown(defaults::DEFAULT_RETENTION), value_parser = parse_duration)]
    pub default_retention: Duration,

    /// Longest retention a claim may ask for; longer is INVALID_ARGUMENT.
    #[arg(long, env = "LEDGER_MAX_RETENTION", default_value = defaults::shown(defaults::MAX_RETENTION), value_parser = parse_duration)]
    pub max_retention: Duration,

    /// Longest a claim may wait for an attempt in flight (a longer wait is shortened to this).
    #[arg(long, env = "LEDGER_MAX_WAIT", default_value = defaults::shown(defaults::MAX_WAIT), value_parser = parse_duration)]
    pub max_wait: Duration,

    /// Largest `arguments_json`, in bytes; larger is INVALID_ARGUMENT (ARGUMENTS_TOO_LARGE).
    #[arg(
        long,
        env = "LEDGER_MAX_ARGUMENTS_BYTES",
        default_value_t = defaults::MAX_ARGUMENTS_BYTES,
    )]
    pub max_arguments_bytes: usize,

    /// Largest result (and error text) a Complete may store, in bytes; larger is
    /// INVALID_ARGUMENT (RESULT_TOO_LARGE) and changes nothing.
    #[arg(
        long,
        env = "LEDGER_MAX_RESULT_BYTES",
        default_value_t = defaults::MAX_RESULT_BYTES,
    )]
    pub max_result_bytes: usize,

    /// Deepest nesting of objects and arrays in `arguments_json`; deeper is INVALID_ARGUMENT
    /// (JSON_TOO_DEEP).
    #[arg(
        long,
        env = "LEDGER_MAX_JSON_DEPTH",
        default_value_t = defaults::MAX_JSON_DEPTH,
    )]
    pub max_json_depth: usize,

    /// Prefix of every entry's `external_ref` (followed by 16 hex characters of the key).
    #[arg(
        long,
        env = "LEDGER_EXTERNAL_REF_PREFIX",
        default_value = defaults::EXTERNAL_REF_PREFIX,
    )]
    pub external_ref_prefix: String,

    /// What of each claim's arguments is kept for audit (ListEntries, Lookup): `none`,
    /// `redacted` (canonical JSON with members named like secrets replaced by `"[REDACTED]"` at
    /// any depth) or `full`. Keys and fingerprints always use the whole arguments.
    #[arg(
        long,
        env = "LEDGER_STORE_ARGUMENTS",
        value_enum,
        default_value_t = StoreArguments::Redacted,
    )]
    pub store_arguments: StoreArguments,

    /// A member name to redact besides the defaults (password, passwd, secret, client_secret,
    /// token, access_token, refresh_token, api_key, authorization, cookie, private_key,
    /// card_number, cvv, cvc). Repeat the flag, or separate names with commas. Names match
    /// whole, in any case, ignoring `_` and `-` (`apiKey` is `api_key`).
    #[arg(
        long = "redact-field",
        env = "LEDGER_REDACT_FIELDS",
        value_delimiter = ','
    )]
    pub redact_fields: Vec<String>,

    /// How long a reconciler holds the unresolved entries a Reconcile handed it; other
    /// reconcilers get them again only after it passed.
    #[arg(long, env = "LEDGER_RECONCILE_LEASE", default_value = defaults::shown(defaults::RECONCILE_LEASE), value_parser = parse_duration)]
    pub reconcile_lease: Duration,

    /// How long an outcome stays unknown before Reconcile hands it out (counted from the end
    /// of the attempt's lease, or from its claimant's UNKNOWN report): an action may still be
    /// landing in the outside world right after, and a reconciler's "not found" read then
    /// could miss it. 0s hands it out at once.
    #[arg(long, env = "LEDGER_RECONCILE_GRACE", default_value = defaults::shown(defaults::RECONCILE_GRACE), value_parser = parse_duration)]
    pub reconcile_grace: Duration,

    /// How many entries Reconcile hands out when the request sets no limit.
    #[arg(
        long,
        env = "LEDGER_RECONCILE_DEFAULT_LIMIT",
        default_value_t = defaults::RECONCILE_DEFAULT_LIMIT,
    )]
    pub reconcile_default_limit: u32,

    /// How many bytes of memory the finished entries take (their results, errors and strings,
    /// with the bookkeeping: about 900 bytes for an entry with a small result) that this server
    /// remembers to answer repeats without a database round trip; 0 turns the memory off. A repeat of a key that is not remembered reads the database as before; the replay
    /// counts of repeats answered from memory reach the database within a second.
    #[arg(
        long,
        env = "LEDGER_REPLAY_MEMORY_BYTES",
        default_value_t = defaults::REPLAY_MEMORY_BYTES
    )]
    pub replay_memory_bytes: u64,

    /// The most entries one Reconcile hands out (a larger limit is shortened to this) and the
    /// most resolutions it accepts.
    #[arg(
        long,
        env = "LEDGER_RECONCILE_MAX_LIMIT",
        default_value_t = defaults::RECONCILE_MAX_LIMIT,
    )]
    pub reconcile_max_limit: u32,

    /// How claims waiting on one server learn of a completion on another server sharing the
    /// PostgreSQL database: `listen` (LISTEN/NOTIFY on a dedicated connection, with a 1 s poll
    /// as a safety net) or `poll` (one read per watched key every --wait-poll-interval). When
    /// unset: `listen`, or `poll` with `--postgres-pooler transaction`, which cannot LISTEN
    /// (asking for `listen` there is refused at start-up). Waiters on the same server are
    /// always woken in-process.
    #[arg(long, env = "LEDGER_WAIT_WAKEUP", value_enum)]
    pub wait_wakeup: Option<Wakeup>,

    /// The poll interval of `--wait-wakeup poll`.
    #[arg(long, env = "LEDGER_WAIT_POLL_INTERVAL", default_value = defaults::shown(defaults::WAIT_POLL_INTERVAL), value_parser = parse_duration)]
    pub wait_poll_interval: Duration,

    /// How often finished entries past their retention are deleted.
    #[arg(long, env = "LEDGER_PRUNE_INTERVAL", default_value = defaults::shown(defaults::PRUNE_INTERVAL), value_parser = parse_duration)]
    pub prune_interval: Duration,

    /// How many expired entries one delete statement removes; small batches keep pruning from
    /// holding up claims.
    #[arg(
        long,
        env = "LEDGER_PRUNE_BATCH_SIZE",
        default_value_t = defaults::PRUNE_BATCH_SIZE,
    )]
    pub prune_batch_size: u32,

    /// CA certificate (PEM) that client certificates must be signed by: with it, the server
    /// requires mutual TLS (needs --tls-cert and --tls-key).
    #[arg(long, env = "LEDGER_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Largest gRPC message the server reads or writes, in bytes; a larger request is refused
    /// with RESOURCE_EXHAUSTED before it is decoded.
    #[arg(long, env = "LEDGER_MAX_MESSAGE_BYTES", default_value_t = defaults::MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,

    /// The longest any call may take, whatever its own deadline (DEADLINE_EXCEEDED after it).
    /// Keep it above --max-wait.
    #[arg(long, env = "LEDGER_REQUEST_TIMEOUT", default_value = defaults::shown(defaults::REQUEST_TIMEOUT), value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Most ledger calls running at once; more are shed at once with RESOURCE_EXHAUSTED
    /// (reason OVERLOADED) and a retry hint, instead of queueing without bound.
    #[arg(
        long,
        env = "LEDGER_MAX_CONCURRENT_REQUESTS",
        default_value_t = defaults::MAX_CONCURRENT_REQUESTS,
    )]
    pub max_concurrent_requests: usize,

    /// Most bytes of request messages the ledger calls running at once may hold between them;
    /// a call that would go over is shed before its request is read, with RESOURCE_EXHAUSTED
    /// (reason OVERLOADED) and a retry hint. A call larger than the whole budget runs when
    /// nothing else holds any. Each call makes a few copies of its message while it runs, so
    /// the memory it bounds is a few times this.
    #[arg(
        long,
        env = "LEDGER_MAX_INFLIGHT_BYTES",
        default_value_t = defaults::MAX_INFLIGHT_BYTES,
    )]
    pub max_inflight_bytes: usize,

    /// Calls a second each tenant may make on average (0: no limit); more are refused with
    /// RESOURCE_EXHAUSTED (reason RATE_LIMITED) and a retry hint.
    #[arg(
        long,
        env = "LEDGER_TENANT_RATE_LIMIT",
        default_value_t = defaults::TENANT_RATE_LIMIT,
    )]
    pub tenant_rate_limit: f64,

    /// Calls a tenant may make at once before its rate limit applies (0: one second's worth).
    #[arg(
        long,
        env = "LEDGER_TENANT_RATE_BURST",
        default_value_t = defaults::TENANT_RATE_BURST,
    )]
    pub tenant_rate_burst: f64,

    /// Most client connections open at once; 0 derives it from the open-files limit (which
    /// the server raises to its hard limit at start-up), less a reserve for the database pool
    /// and files. At the limit the oldest connection that never sent a byte is closed to make
    /// room, and a new connection is refused while every open one is live.
    #[arg(
        long,
        env = "LEDGER_MAX_CONNECTIONS",
        default_value_t = defaults::MAX_CONNECTIONS,
    )]
    pub max_connections: usize,

    /// A client connection from which nothing was read for this long is closed (a client
    /// that connected and never spoke, or a dead peer). Live HTTP/2 clients answer the
    /// server's keepalive pings, so they never reach it; must exceed
    /// --http2-keepalive-interval plus --http2-keepalive-timeout.
    #[arg(long, env = "LEDGER_CONNECTION_IDLE_TIMEOUT", default_value = defaults::shown(defaults::CONNECTION_IDLE_TIMEOUT), value_parser = parse_duration)]
    pub connection_idle_timeout: Duration,

    /// How often the server pings a client connection from which nothing was read (HTTP/2
    /// PING), so that dead peers are found and live ones keep talking.
    #[arg(long, env = "LEDGER_HTTP2_KEEPALIVE_INTERVAL", default_value = defaults::shown(defaults::HTTP2_KEEPALIVE_INTERVAL), value_parser = parse_duration)]
    pub http2_keepalive_interval: Duration,

    /// How long the server waits for the answer to its ping before closing the connection.
    #[arg(long, env = "LEDGER_HTTP2_KEEPALIVE_TIMEOUT", default_value = defaults::shown(defaults::HTTP2_KEEPALIVE_TIMEOUT), value_parser = parse_duration)]
    pub http2_keepalive_timeout: Duration,

    /// How the server reaches PostgreSQL: `none` (directly, or through a pooler in session
    /// mode, which gives each of its connections a server connection of its own) or
    /// `transaction` (PgBouncer or another pooler in transaction mode, where a server
    /// connection is ours for one transaction only: every statement runs unnamed inside its own
    /// transaction, nothing is set on the session, waiters poll instead of LISTEN, and
    /// migrations run only through --migrations-database-url or `migrate` against a direct
    /// URL). With `none`, start-up refuses a store that turns out to share sessions between
    /// connections.
    #[arg(
        long,
        env = "LEDGER_POSTGRES_POOLER",
        value_parser = pooler_parser(),
        default_value = "none",
    )]
    pub postgres_pooler: Pooler,

    /// PostgreSQL: a direct URL (not through a transaction pooler) for the migrations that
    /// run at start-up, with --postgres-pooler transaction. Without it, such a server only
    /// checks that the migrations were applied (`idempotency-ledger migrate` against a direct
    /// URL applies them).
    #[arg(long, env = "LEDGER_MIGRATIONS_DATABASE_URL")]
    pub migrations_database_url: Option<String>,

    /// PostgreSQL: the longest one statement of the server may run (`statement_timeout`);
    /// a longer one is cancelled and answered UNAVAILABLE. 0 leaves the database's own
    /// setting.
    #[arg(long, env = "LEDGER_DB_STATEMENT_TIMEOUT", default_value = defaults::shown(defaults::DB_STATEMENT_TIMEOUT), value_parser = parse_duration)]
    pub db_statement_timeout: Duration,

    /// How long opening one database connection may take before it counts as failed.
    #[arg(long, env = "LEDGER_DB_CONNECT_TIMEOUT", default_value = defaults::shown(defaults::DB_CONNECT_TIMEOUT), value_parser = parse_duration)]
    pub db_connect_timeout: Duration,

    /// Most database connections this server opens.
    #[arg(
        long,
        env = "LEDGER_DB_MAX_CONNECTIONS",
        default_value_t = defaults::DB_MAX_CONNECTIONS,
    )]
    pub db_max_connections: u32,

    /// PostgreSQL: group-commit batches of each kind (claims, completions) written at once
    /// (at most half of --db-max-connections). Fewer: larger batches, less database time per
    /// call; more: lower latency while the database has idle cores.
    #[arg(
        long,
        env = "LEDGER_DB_WRITE_BATCHES",
        default_value_t = defaults::DB_WRITE_BATCHES,
        value_parser = clap::value_parser!(u16).range(1..),
    )]
    pub db_write_batches: u16,

    /// How long a call waits for a database connection before answering UNAVAILABLE:
    /// STORE_BUSY when every connection was in use by other calls, STORE_UNAVAILABLE when
    /// none could be opened. On SQLite, also how long a write waits for the database's lock.
    #[arg(long, env = "LEDGER_DB_ACQUIRE_TIMEOUT", default_value = defaults::shown(defaults::DB_ACQUIRE_TIMEOUT), value_parser = parse_duration)]
    pub db_acquire_timeout: Duration,

    /// How often the health probe checks the database.
    #[arg(long, env = "LEDGER_HEALTH_PROBE_INTERVAL", default_value = defaults::shown(defaults::HEALTH_PROBE_INTERVAL), value_parser = parse_duration)]
    pub health_probe_interval: Duration,

    /// How long in-flight calls may finish after SIGTERM or SIGINT before the server exits.
    #[arg(long, env = "LEDGER_SHUTDOWN_GRACE", default_value = defaults::shown(defaults::SHUTDOWN_GRACE), value_parser = parse_duration)]
    pub shutdown_grace: Duration,
}

impl Settings {
    /// The documented defaults: settings as if no flag were given, whatever the environment
    /// holds (an exported `DATABASE_URL` or `LEDGER_*` variable does not leak in).
    pub fn defaults() -> Settings {
        let command = Settings::augment_args(clap::Command::new("idempotency-ledger"))
            .mut_args(|arg| arg.env(None));
        let matches = command.get_matches_from(["idempotency-ledger"]);
        // Every flag has a default, so this parses whenever the defaults do (a test holds it).
        Settings::from_arg_matches(&matches).expect("the built-in defaults parse")
    }
}

/// `--postgres-pooler`'s values, described as `--help` lists them (the stores crate's
/// [`Pooler`] knows no command line).
fn pooler_parser() -> impl clap::builder::TypedValueParser<Value = Pooler> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new([
        PossibleValue::new("none").help(
            "Directly, or through a pooler in session mode, which gives each of the server's \
             connections a server connection of its own",
        ),
        PossibleValue::new("transaction").help(
            "Through a pooler in transaction mode (PgBouncer's `pool_mode = transaction`), \
             where a server connection is the server's for one transaction only",
        ),
    ])
    .map(|value| match value.as_str() {
        "transaction" => Pooler::Transaction,
        _ => Pooler::None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Limits;
    use crate::storage::PoolOptions;

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let s = Settings::defaults();
        assert_eq!(s.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(s.database_url, "sqlite://ledger.db");
        assert_eq!(s.default_lease, Duration::from_secs(60));
        assert_eq!(s.max_lease, Duration::from_secs(3600));
        assert_eq!(s.default_retention, Duration::from_secs(86_400));
        assert_eq!(s.max_retention, Duration::from_secs(30 * 86_400));
        assert_eq!(s.max_wait, Duration::from_secs(30));
        assert_eq!(
            (s.max_arguments_bytes, s.max_result_bytes, s.max_json_depth),
            (1_048_576, 1_048_576, 64)
        );
        assert_eq!(s.external_ref_prefix, "idem-");
        assert_eq!(s.max_inflight_bytes, 64 * 1_048_576);
        assert_eq!(
            s.console_address(),
            Some(("127.0.0.1:50053".parse().expect("addr"), false))
        );
        assert_eq!(s.console_session_idle, Duration::from_secs(3600));
        assert!(s.auth_tokens_file.is_none() && s.tls_cert.is_none());
        assert!(s.validate().is_ok());
    }

    #[test]
    fn the_listen_flag_defaults_to_its_typed_constant() {
        // The duration flags' defaults are their constants shown by `defaults::shown`, which
        // reads back as itself (its own tests); the address is written out for clap.
        assert_eq!(Settings::defaults().listen, defaults::LISTEN);
    }

    #[test]
    fn the_types_built_from_the_defaults_are_the_shipped_configuration() {
        // Built from the command line's defaults, and from the `Default` impls tests use.
        let s = Settings::defaults();
        assert_eq!(
            format!("{:?}", s.limits()),
            format!("{:?}", Limits::default())
        );
        assert_eq!(
            format!("{:?}", s.pool()),
            format!("{:?}", PoolOptions::default())
        );
    }

    #[test]
    fn the_defaults_ignore_the_environment() {
        // What `Settings::defaults()` must not read: sqlx's own DATABASE_URL convention and any
        // LEDGER_* variable an operator's shell exports (tests call it beside such a shell).
        // The flags' environment variables are cleared, not the process's: no other test is
        // disturbed.
        let command = Settings::augment_args(clap::Command::new("x"));
        let with_env: Vec<String> = command
            .get_arguments()
            .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
            .collect();
        assert!(
            with_env.contains(&"DATABASE_URL".to_string()),
            "{with_env:?}"
        );
        assert!(
            with_env.len() > 40,
            "every setting has a variable: {with_env:?}"
        );
        let stripped = Settings::augment_args(clap::Command::new("x")).mut_args(|a| a.env(None));
        assert!(stripped.get_arguments().all(|a| a.get_env().is_none()));
    }
}
