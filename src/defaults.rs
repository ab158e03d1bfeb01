//! Every default of the server's settings, once and typed: the command line's defaults
//! ([`crate::server::Settings`], whose `--help` shows them) and the `Default` of the types
//! built from them (the ledger's limits, the pool's and the metrics' options) read them
//! here, so that tests run on the shipped configuration. Durations are [`Duration`]s, so a
//! typo is a compile error, not a zero; `--help` shows each as [`shown`] writes it (derived
//! from the constant), and every duration setting is read by [`parse_duration`] (the
//! `humantime` crate's syntax). Nothing here imports the rest of the crate.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// `--listen`.
pub const LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 50051));

/// `--console-listen`: loopback only.
pub const CONSOLE_LISTEN: &str = "127.0.0.1:50053";

/// `--console-session-idle`.
pub const CONSOLE_SESSION_IDLE: Duration = Duration::from_hours(1);

/// `--database-url`.
pub const DATABASE_URL: &str = "sqlite://ledger.db";

/// `--metrics-refresh-interval`.
pub const METRICS_REFRESH_INTERVAL: Duration = Duration::from_secs(15);

/// `--metrics-max-tools`.
pub const METRICS_MAX_TOOLS: usize = 50;

/// `--replay-alarm-window`.
pub const REPLAY_ALARM_WINDOW: Duration = Duration::from_mins(15);

/// `--replay-alarm-min-claims`.
pub const REPLAY_ALARM_MIN_CLAIMS: u64 = 100;

/// `--default-lease`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// `--max-lease`.
pub const MAX_LEASE: Duration = Duration::from_hours(1);

/// `--default-retention`.
pub const DEFAULT_RETENTION: Duration = Duration::from_hours(24);

/// `--max-retention`.
pub const MAX_RETENTION: Duration = Duration::from_hours(30 * 24);

/// `--max-wait`.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// `--max-arguments-bytes`.
pub const MAX_ARGUMENTS_BYTES: usize = 1_048_576;

/// `--max-result-bytes`.
pub const MAX_RESULT_BYTES: usize = 1_048_576;

/// `--max-json-depth`.
pub const MAX_JSON_DEPTH: usize = 64;

/// `--external-ref-prefix`.
pub const EXTERNAL_REF_PREFIX: &str = "idem-";

/// `--replay-memory-bytes`: 32 MiB of remembered results.
pub const REPLAY_MEMORY_BYTES: u64 = 32 * 1024 * 1024;

/// `--reconcile-lease`.
pub const RECONCILE_LEASE: Duration = Duration::from_secs(60);

/// `--reconcile-grace`: how long an outcome stays unknown before Reconcile hands it out.
pub const RECONCILE_GRACE: Duration = Duration::from_secs(10);

/// `--reconcile-default-limit`.
pub const RECONCILE_DEFAULT_LIMIT: u32 = 100;

/// `--reconcile-max-limit`.
pub const RECONCILE_MAX_LIMIT: u32 = 1000;

/// `--wait-poll-interval`.
pub const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// `--prune-interval`.
pub const PRUNE_INTERVAL: Duration = Duration::from_secs(60);

/// `--prune-batch-size`.
pub const PRUNE_BATCH_SIZE: u32 = 500;

/// `--max-message-bytes`.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1_048_576;

/// `--request-timeout`.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// `--max-concurrent-requests`.
pub const MAX_CONCURRENT_REQUESTS: usize = 1024;

/// `--max-inflight-bytes`: 64 MiB of request messages. A call makes about five copies of
/// its message while it runs (the bytes read, the decoded request, the canonical arguments
/// kept for the store, the statement's binds, the answer), so this keeps the calls' memory
/// near 300 MiB whatever their number; see docs/performance.md for the figures.
pub const MAX_INFLIGHT_BYTES: usize = 64 * 1_048_576;

/// `--tenant-rate-limit`.
pub const TENANT_RATE_LIMIT: f64 = 0.0;

/// `--tenant-rate-burst`.
pub const TENANT_RATE_BURST: f64 = 0.0;

/// `--max-connections`.
pub const MAX_CONNECTIONS: usize = 0;

/// `--connection-idle-timeout`.
pub const CONNECTION_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// `--http2-keepalive-interval`.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);

/// `--http2-keepalive-timeout`.
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// `--db-statement-timeout`.
pub const DB_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// `--db-connect-timeout`.
pub const DB_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `--db-max-connections`.
pub const DB_MAX_CONNECTIONS: u32 = 16;

/// `--db-write-batches`.
pub const DB_WRITE_BATCHES: u16 = 2;

/// `--db-acquire-timeout`.
pub const DB_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// `--health-probe-interval`.
pub const HEALTH_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The operator commands' `--timeout`.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// `--shutdown-grace`.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The largest page ListEntries returns, and the page size when a request sets none (the
/// server's and the inspection command's).
pub const LIST_MAX_PAGE_SIZE: u32 = 1000;
/// See [`LIST_MAX_PAGE_SIZE`].
pub const LIST_DEFAULT_PAGE_SIZE: u32 = 100;

/// With `--wait-wakeup listen`, watched keys are still read this often, for announcements
/// missed while the listening connection was down.
pub const LISTEN_SAFETY_POLL: Duration = Duration::from_secs(1);

/// Reads a duration setting: the `humantime` crate's syntax (`500ms`, `60s`, `15m`, `24h`,
/// `30d`, and also `1h30m`, `1.5h`, `90min`, `2days`), and a bare number as seconds, as the
/// settings have always taken it; without blanks.
///
/// # Errors
/// A message naming the text and what is wrong with it.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    // humantime reads `15 minutes` and `1h 30m`; a blank inside is refused, as it always was,
    // so that `entries --since "15 minutes"` stays an error rather than a guess.
    if text.contains(char::is_whitespace) {
        return Err(format!(
            "`{text}`: write a duration without blanks (90m, 1h30m)"
        ));
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map(Duration::from_secs)
            .map_err(|_| format!("`{text}` is too long"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration such as 500ms, 60s, 15m, 24h or 30d: {e}"))
}

/// The defaults as `--help` and docs/settings.md write them, each derived from its typed
/// constant in the unit chosen here; a unit test holds that each reads back as its constant
/// (a unit too coarse for the value would not).
pub mod shown {
    use std::time::Duration;

    use const_format::formatcp;

    const fn millis(d: Duration) -> u128 {
        d.as_millis()
    }
    const fn secs(d: Duration) -> u64 {
        d.as_secs()
    }
    const fn mins(d: Duration) -> u64 {
        d.as_secs() / 60
    }
    const fn hours(d: Duration) -> u64 {
        d.as_secs() / 3600
    }
    const fn days(d: Duration) -> u64 {
        d.as_secs() / 86_400
    }

    /// `--console-session-idle`.
    pub const CONSOLE_SESSION_IDLE: &str = formatcp!("{}h", hours(super::CONSOLE_SESSION_IDLE));
    /// `--metrics-refresh-interval`.
    pub const METRICS_REFRESH_INTERVAL: &str =
        formatcp!("{}s", secs(super::METRICS_REFRESH_INTERVAL));
    /// `--replay-alarm-window`.
    pub const REPLAY_ALARM_WINDOW: &str = formatcp!("{}m", mins(super::REPLAY_ALARM_WINDOW));
    /// `--default-lease`.
    pub const DEFAULT_LEASE: &str = formatcp!("{}s", secs(super::DEFAULT_LEASE));
    /// `--max-lease`.
    pub const MAX_LEASE: &str = formatcp!("{}h", hours(super::MAX_LEASE));
    /// `--default-retention`.
    pub const DEFAULT_RETENTION: &str = formatcp!("{}h", hours(super::DEFAULT_RETENTION));
    /// `--max-retention`.
    pub const MAX_RETENTION: &str = formatcp!("{}d", days(super::MAX_RETENTION));
    /// `--max-wait`.
    pub const MAX_WAIT: &str = formatcp!("{}s", secs(super::MAX_WAIT));
    /// `--reconcile-lease`.
    pub const RECONCILE_LEASE: &str = formatcp!("{}s", secs(super::RECONCILE_LEASE));
    /// `--reconcile-grace`.
    pub const RECONCILE_GRACE: &str = formatcp!("{}s", secs(super::RECONCILE_GRACE));
    /// `--wait-poll-interval`.
    pub const WAIT_POLL_INTERVAL: &str = formatcp!("{}ms", millis(super::WAIT_POLL_INTERVAL));
    /// `--prune-interval`.
    pub const PRUNE_INTERVAL: &str = formatcp!("{}s", secs(super::PRUNE_INTERVAL));
    /// `--request-timeout`.
    pub const REQUEST_TIMEOUT: &str = formatcp!("{}s", secs(super::REQUEST_TIMEOUT));
    /// `--connection-idle-timeout`.
    pub const CONNECTION_IDLE_TIMEOUT: &str =
        formatcp!("{}s", secs(super::CONNECTION_IDLE_TIMEOUT));
    /// `--http2-keepalive-interval`.
    pub const HTTP2_KEEPALIVE_INTERVAL: &str =
        formatcp!("{}s", secs(super::HTTP2_KEEPALIVE_INTERVAL));
    /// `--http2-keepalive-timeout`.
    pub const HTTP2_KEEPALIVE_TIMEOUT: &str =
        formatcp!("{}s", secs(super::HTTP2_KEEPALIVE_TIMEOUT));
    /// `--db-statement-timeout`.
    pub const DB_STATEMENT_TIMEOUT: &str = formatcp!("{}s", secs(super::DB_STATEMENT_TIMEOUT));
    /// `--db-connect-timeout`.
    pub const DB_CONNECT_TIMEOUT: &str = formatcp!("{}s", secs(super::DB_CONNECT_TIMEOUT));
    /// `--db-acquire-timeout`.
    pub const DB_ACQUIRE_TIMEOUT: &str = formatcp!("{}s", secs(super::DB_ACQUIRE_TIMEOUT));
    /// `--health-probe-interval`.
    pub const HEALTH_PROBE_INTERVAL: &str = formatcp!("{}s", secs(super::HEALTH_PROBE_INTERVAL));
    /// The operator commands' `--timeout`.
    pub const CLIENT_TIMEOUT: &str = formatcp!("{}s", secs(super::CLIENT_TIMEOUT));
    /// `--shutdown-grace`.
    pub const SHUTDOWN_GRACE: &str = formatcp!("{}s", secs(super::SHUTDOWN_GRACE));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_the_docs_write_them() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(2_592_000)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("10 years").is_err());
        assert!(parse_duration("15 minutes").is_err());
        assert!(parse_duration("99999999999999999999").is_err());
        // What humantime reads beyond the forms above (docs/settings.md says so).
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("90min"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2days"), Ok(Duration::from_secs(172_800)));
    }

    #[test]
    fn every_shown_default_reads_back_as_its_constant() {
        for (text, value) in [
            (shown::CONSOLE_SESSION_IDLE, CONSOLE_SESSION_IDLE),
            (shown::METRICS_REFRESH_INTERVAL, METRICS_REFRESH_INTERVAL),
            (shown::REPLAY_ALARM_WINDOW, REPLAY_ALARM_WINDOW),
            (shown::DEFAULT_LEASE, DEFAULT_LEASE),
            (shown::MAX_LEASE, MAX_LEASE),
            (shown::DEFAULT_RETENTION, DEFAULT_RETENTION),
            (shown::MAX_RETENTION, MAX_RETENTION),
            (shown::MAX_WAIT, MAX_WAIT),
            (shown::RECONCILE_LEASE, RECONCILE_LEASE),
            (shown::RECONCILE_GRACE, RECONCILE_GRACE),
            (shown::WAIT_POLL_INTERVAL, WAIT_POLL_INTERVAL),
            (shown::PRUNE_INTERVAL, PRUNE_INTERVAL),
            (shown::REQUEST_TIMEOUT, REQUEST_TIMEOUT),
            (shown::CONNECTION_IDLE_TIMEOUT, CONNECTION_IDLE_TIMEOUT),
            (shown::HTTP2_KEEPALIVE_INTERVAL, HTTP2_KEEPALIVE_INTERVAL),
            (shown::HTTP2_KEEPALIVE_TIMEOUT, HTTP2_KEEPALIVE_TIMEOUT),
            (shown::DB_STATEMENT_TIMEOUT, DB_STATEMENT_TIMEOUT),
            (shown::DB_CONNECT_TIMEOUT, DB_CONNECT_TIMEOUT),
            (shown::DB_ACQUIRE_TIMEOUT, DB_ACQUIRE_TIMEOUT),
            (shown::HEALTH_PROBE_INTERVAL, HEALTH_PROBE_INTERVAL),
            (shown::CLIENT_TIMEOUT, CLIENT_TIMEOUT),
            (shown::SHUTDOWN_GRACE, SHUTDOWN_GRACE),
        ] {
            assert_eq!(parse_duration(text), Ok(value), "{text}");
        }
        assert_eq!(shown::DEFAULT_LEASE, "60s");
        assert_eq!(shown::MAX_RETENTION, "30d");
        assert_eq!(shown::WAIT_POLL_INTERVAL, "100ms");
    }
}
