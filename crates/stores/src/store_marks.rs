//! [`StoreMarks`]: what a store's calls found out about its database, kept for the calls after
//! them.

/// What a store's calls have found out about its database and its connections, kept for the
/// calls after them (one per store, shared by its calls, read without a lock):
/// - the **full-disk mark**: set by any statement that failed for want of space, cleared only
///   by an [`Store::probe_write`](super::Store::probe_write) that committed. While set, health reports NOT_SERVING (reads
///   still answer; writes are still tried, and fail or succeed on their own);
/// - the **stale-connection mark**: the instant before which pooled connections are not lent
///   again, set when one of them reached a server that accepts no writes;
/// - when a store call **last succeeded and last failed**: whether idle connections are proven
///   good enough to lend without the pool's checks (`connections_proven`).
#[derive(Debug, Default)]
pub struct StoreMarks {
    /// Set while the store is known to be full.
    full: std::sync::atomic::AtomicBool,
    /// Pooled connections opened at or before this instant are not lent again: one of them
    /// reached a server that accepts no writes (a standby, as during a failover), and the
    /// others were opened the same way, so they may well lead there too. Like the two below,
    /// in [`since_start`]'s microseconds (0: never).
    stale_before: std::sync::atomic::AtomicU64,
    /// When a store call last succeeded, and last failed. They decide whether
    /// [`kept_connections::Connections::acquire`](super::kept_connections::Connections::acquire) may lend a connection without the pool's checks.
    last_ok: std::sync::atomic::AtomicU64,
    last_failure: std::sync::atomic::AtomicU64,
}

/// How recently a store call must have succeeded (and none failed) for
/// [`kept_connections::Connections::acquire`](super::kept_connections::Connections::acquire) to lend a connection without the pool's checks.
pub(crate) const CONNECTIONS_PROVEN_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Microseconds since the first call of this function in the process, plus one.
fn since_start() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_micros())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

impl StoreMarks {
    /// Notes a full disk; logs the first report of an episode.
    pub(crate) fn full(&self, detail: &str) {
        if !self.full.swap(true, std::sync::atomic::Ordering::AcqRel) {
            tracing::error!(
                error = %detail,
                "the store is out of disk space: writes are refused with RESOURCE_EXHAUSTED \
                 STORE_FULL and health is NOT_SERVING until space is freed; reads keep answering"
            );
        }
    }

    /// Whether the store is known to be full.
    pub fn is_full(&self) -> bool {
        self.full.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks every connection open now as not to be lent again (see `stale_before`).
    pub(crate) fn discard_connections_open_now(&self) {
        self.stale_before
            .store(since_start(), std::sync::atomic::Ordering::Release);
    }

    /// Notes a store call that succeeded.
    pub(crate) fn call_succeeded(&self) {
        self.last_ok
            .store(since_start(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Notes a store call that failed.
    pub(crate) fn call_failed(&self) {
        self.last_failure
            .store(since_start(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the pool's idle connections are proven good: a call succeeded within
    /// [`CONNECTIONS_PROVEN_FOR`], none failed within it, and no connection was ever marked
    /// stale. Then an idle connection is lent as it is; otherwise through the pool's checks
    /// (PostgreSQL: the stale mark, and a ping for one idle a second or more).
    pub(crate) fn connections_proven(&self) -> bool {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let window = u64::try_from(CONNECTIONS_PROVEN_FOR.as_micros()).unwrap_or(u64::MAX);
        let now = since_start();
        let (ok, failed) = (self.last_ok.load(Relaxed), self.last_failure.load(Relaxed));
        ok != 0
            && now.saturating_sub(ok) < window
            && (failed == 0 || now.saturating_sub(failed) >= window)
            && self.stale_before.load(Acquire) == 0
    }

    /// Whether a connection of `age` was opened before connections were last marked stale.
    /// (One older than the process's first mark of time counts as opened at its start.)
    pub(crate) fn is_stale(&self, age: std::time::Duration) -> bool {
        let before = self.stale_before.load(std::sync::atomic::Ordering::Acquire);
        let age = u64::try_from(age.as_micros()).unwrap_or(u64::MAX);
        before != 0 && since_start().saturating_sub(age) <= before
    }

    /// Notes that a write committed again; logs the end of an episode.
    pub(crate) fn has_space(&self) {
        if self.full.swap(false, std::sync::atomic::Ordering::AcqRel) {
            tracing::warn!("the store has disk space again: writes resume");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::StoreMarks;

    /// Connections opened before the mark are stale, those opened after it are not, and a mark
    /// ends the lending of connections without the pool's checks.
    #[test]
    fn connections_opened_before_the_stale_mark_are_stale() {
        let marks = StoreMarks::default();
        assert!(!marks.is_stale(Duration::from_secs(3600)), "no mark yet");
        marks.call_succeeded();
        assert!(marks.connections_proven());
        std::thread::sleep(Duration::from_millis(2));
        marks.discard_connections_open_now();
        assert!(!marks.connections_proven(), "a mark ends it");
        assert!(
            marks.is_stale(Duration::from_millis(1)),
            "opened before the mark"
        );
        assert!(
            marks.is_stale(Duration::from_secs(3600)),
            "opened long before"
        );
        std::thread::sleep(Duration::from_millis(5));
        assert!(
            !marks.is_stale(Duration::from_millis(1)),
            "opened after the mark"
        );
    }
}
