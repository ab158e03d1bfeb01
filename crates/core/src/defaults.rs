//! Every default of the server's settings, once and typed: the command line's defaults
//! (the server's `Settings`, whose `--help` shows them) and the `Default` of the types
//! built from them (the ledger's limits, the pool's and the metrics' options) read them
//! here, so that tests run on the shipped configuration. Durations are [`Duration`]s, so a
//! typo is a compile error, not a zero; `--help` shows each as [`shown`] writes the
//! constant, and every duration setting is read by [`parse_duration`] (the `humantime`
//! crate's syntax). Nothing here imports the rest of the crate.

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

/// `--approval-timeout`: how long a person has to decide about a gated call.
pub const APPROVAL_TIMEOUT: Duration = Duration::from_secs(72 * 3600);

/// `--approval-use-within`: how long an approval may go unused.
pub const APPROVAL_USE_WITHIN: Duration = Duration::from_secs(24 * 3600);

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

/// A duration as `--help` and docs/settings.md write a default: in the largest unit that holds
/// it whole, except that seconds go up to a minute and hours up to three days (`60s`, `15m`,
/// `72h`, `30d`, `100ms`), so each duration flag's default is written once, as its typed
/// constant. [`parse_duration`] reads the text back as the same duration (to the millisecond:
/// no setting is finer).
#[must_use]
pub fn shown(d: Duration) -> String {
    const MINUTE: u64 = 60;
    const HOUR: u64 = 3600;
    const DAY: u64 = 86_400;
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 {
        return format!("{}ms", d.as_millis());
    }
    if secs <= MINUTE || !secs.is_multiple_of(MINUTE) {
        format!("{secs}s")
    } else if !secs.is_multiple_of(HOUR) {
        format!("{}m", secs / MINUTE)
    } else if secs <= 3 * DAY || !secs.is_multiple_of(DAY) {
        format!("{}h", secs / HOUR)
    } else {
        format!("{}d", secs / DAY)
    }
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
    fn a_default_is_shown_in_its_natural_unit() {
        assert_eq!(shown(DEFAULT_LEASE), "60s");
        assert_eq!(shown(REPLAY_ALARM_WINDOW), "15m");
        assert_eq!(shown(MAX_LEASE), "1h");
        assert_eq!(shown(APPROVAL_TIMEOUT), "72h");
        assert_eq!(shown(MAX_RETENTION), "30d");
        assert_eq!(shown(WAIT_POLL_INTERVAL), "100ms");
        assert_eq!(shown(Duration::from_secs(90)), "90s");
        assert_eq!(shown(Duration::from_secs(4 * 86_400 + 3600)), "97h");
        assert_eq!(shown(Duration::from_micros(1500)), "1ms");
    }

    #[test]
    fn every_whole_millisecond_duration_is_shown_as_text_that_reads_back_as_itself() {
        // Up to about 30 years: humantime counts in nanoseconds, in a u64.
        let mut ms: u64 = 1;
        while ms < 12_000 {
            for d in [
                ms,
                ms * 1000,
                ms * 60_000 + 1,
                ms * 3_600_000,
                ms * 86_400_000,
            ] {
                let d = Duration::from_millis(d);
                assert_eq!(parse_duration(&shown(d)), Ok(d), "{}", shown(d));
            }
            ms = ms * 3 + 1;
        }
    }
}
