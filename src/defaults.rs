//! Every default of the server's settings, once: the command line's defaults
//! ([`crate::server::Settings`], whose `--help` shows them) and the `Default` of the types
//! built from them (the ledger's limits, the pool's and the metrics' options) read them
//! here, so that tests run on the shipped configuration. Durations are written as
//! `--help` and docs/settings.md write them, and read with [`parse_duration`] (the one reader of
//! every duration setting). Nothing here imports the rest of the crate.

use std::time::Duration;

/// `--listen`.
pub const LISTEN: &str = "127.0.0.1:50051";

/// `--console-listen`: loopback only.
pub const CONSOLE_LISTEN: &str = "127.0.0.1:50053";

/// `--console-session-idle`.
pub const CONSOLE_SESSION_IDLE: &str = "1h";

/// `--database-url`.
pub const DATABASE_URL: &str = "sqlite://ledger.db";

/// `--metrics-refresh-interval`.
pub const METRICS_REFRESH_INTERVAL: &str = "15s";

/// `--metrics-max-tools`.
pub const METRICS_MAX_TOOLS: usize = 50;

/// `--replay-alarm-window`.
pub const REPLAY_ALARM_WINDOW: &str = "15m";

/// `--replay-alarm-min-claims`.
pub const REPLAY_ALARM_MIN_CLAIMS: u64 = 100;

/// `--default-lease`.
pub const DEFAULT_LEASE: &str = "60s";

/// `--max-lease`.
pub const MAX_LEASE: &str = "1h";

/// `--default-retention`.
pub const DEFAULT_RETENTION: &str = "24h";

/// `--max-retention`.
pub const MAX_RETENTION: &str = "30d";

/// `--max-wait`.
pub const MAX_WAIT: &str = "30s";

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
pub const RECONCILE_LEASE: &str = "60s";

/// `--reconcile-default-limit`.
pub const RECONCILE_DEFAULT_LIMIT: u32 = 100;

/// `--reconcile-max-limit`.
pub const RECONCILE_MAX_LIMIT: u32 = 1000;

/// `--wait-poll-interval`.
pub const WAIT_POLL_INTERVAL: &str = "100ms";

/// `--prune-interval`.
pub const PRUNE_INTERVAL: &str = "60s";

/// `--prune-batch-size`.
pub const PRUNE_BATCH_SIZE: u32 = 500;

/// `--max-message-bytes`.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1_048_576;

/// `--request-timeout`.
pub const REQUEST_TIMEOUT: &str = "60s";

/// `--max-concurrent-requests`.
pub const MAX_CONCURRENT_REQUESTS: usize = 1024;

/// `--tenant-rate-limit`.
pub const TENANT_RATE_LIMIT: f64 = 0.0;

/// `--tenant-rate-burst`.
pub const TENANT_RATE_BURST: f64 = 0.0;

/// `--max-connections`.
pub const MAX_CONNECTIONS: usize = 0;

/// `--connection-idle-timeout`.
pub const CONNECTION_IDLE_TIMEOUT: &str = "60s";

/// `--http2-keepalive-interval`.
pub const HTTP2_KEEPALIVE_INTERVAL: &str = "20s";

/// `--http2-keepalive-timeout`.
pub const HTTP2_KEEPALIVE_TIMEOUT: &str = "10s";

/// `--db-statement-timeout`.
pub const DB_STATEMENT_TIMEOUT: &str = "10s";

/// `--db-connect-timeout`.
pub const DB_CONNECT_TIMEOUT: &str = "5s";

/// `--db-max-connections`.
pub const DB_MAX_CONNECTIONS: u32 = 16;

/// `--db-write-batches`.
pub const DB_WRITE_BATCHES: u16 = 2;

/// `--db-acquire-timeout`.
pub const DB_ACQUIRE_TIMEOUT: &str = "3s";

/// `--health-probe-interval`.
pub const HEALTH_PROBE_INTERVAL: &str = "1s";

/// `--shutdown-grace`.
pub const SHUTDOWN_GRACE: &str = "10s";

/// The largest page ListEntries returns, and the page size when a request sets none (the
/// server's and the inspection command's).
pub const LIST_MAX_PAGE_SIZE: u32 = 1000;
/// See [`LIST_MAX_PAGE_SIZE`].
pub const LIST_DEFAULT_PAGE_SIZE: u32 = 100;

/// With `--wait-wakeup listen`, watched keys are still read this often, for announcements
/// missed while the listening connection was down.
pub const LISTEN_SAFETY_POLL: &str = "1s";

/// Parses `500ms`, `60s`, `15m`, `24h`, `30d` (an integer and a unit; a bare number is seconds).
///
/// # Errors
/// A message naming the accepted forms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration such as 500ms, 60s, 15m, 24h or 30d"))?;
    let seconds = |factor: u64| {
        n.checked_mul(factor)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("`{text}` is too long"))
    };
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => seconds(1),
        "m" => seconds(60),
        "h" => seconds(3600),
        "d" => seconds(86_400),
        _ => Err(format!(
            "`{text}` has an unknown unit `{unit}`: use ms, s, m, h or d"
        )),
    }
}

/// A default duration written as [`DEFAULT_LEASE`] is; a unit test holds that every one parses.
pub fn duration(text: &str) -> Duration {
    parse_duration(text).unwrap_or_default()
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
        assert!(parse_duration("1.5h").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("10 years").is_err());
    }

    #[test]
    fn every_default_duration_parses() {
        for text in [
            METRICS_REFRESH_INTERVAL,
            REPLAY_ALARM_WINDOW,
            DEFAULT_LEASE,
            MAX_LEASE,
            DEFAULT_RETENTION,
            MAX_RETENTION,
            MAX_WAIT,
            RECONCILE_LEASE,
            WAIT_POLL_INTERVAL,
            PRUNE_INTERVAL,
            REQUEST_TIMEOUT,
            CONNECTION_IDLE_TIMEOUT,
            HTTP2_KEEPALIVE_INTERVAL,
            HTTP2_KEEPALIVE_TIMEOUT,
            DB_STATEMENT_TIMEOUT,
            DB_CONNECT_TIMEOUT,
            DB_ACQUIRE_TIMEOUT,
            HEALTH_PROBE_INTERVAL,
            SHUTDOWN_GRACE,
        ] {
            assert!(parse_duration(text).is_ok(), "{text}");
        }
        assert_eq!(duration(DEFAULT_LEASE), Duration::from_secs(60));
    }
}
