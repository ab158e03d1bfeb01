//! Instants and durations as whole microseconds: the one unit both stores keep, so PostgreSQL
//! and SQLite compare times identically and tests can move a clock by hand.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds: an instant since the Unix epoch, or a duration, by context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Micros(pub i64);

impl Micros {
    /// The current wall-clock instant.
    pub fn now() -> Micros {
        // A clock before 1970 is a broken machine; reading it as the epoch keeps us total.
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Micros::from_duration(since)
    }

    /// A duration in microseconds, saturating at `i64::MAX` (about 292,000 years).
    pub fn from_duration(d: Duration) -> Micros {
        Micros(i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
    }

    /// The duration this value stands for; negative values read as zero.
    pub fn to_duration(self) -> Duration {
        Duration::from_micros(u64::try_from(self.0).unwrap_or(0))
    }

    /// `self + d`, saturating instead of overflowing.
    pub fn plus(self, d: Micros) -> Micros {
        Micros(self.0.saturating_add(d.0))
    }

    /// `self - other`, saturating instead of overflowing.
    pub fn minus(self, other: Micros) -> Micros {
        Micros(self.0.saturating_sub(other.0))
    }
}

/// `at` as RFC 3339 in UTC, to the second (`2026-12-03T15:30:00Z`): for the sentences written
/// for the model and for people, where a fraction would only be noise. An instant outside the
/// years 1970 to 9999 (never a real one here) reads as the nearer end.
#[must_use]
pub fn rfc3339(at: Micros) -> String {
    /// 9999-12-31T23:59:59Z, the last second RFC 3339's four-digit years can write.
    const LAST: u64 = 253_402_300_799;
    let secs = u64::try_from(at.0.div_euclid(1_000_000))
        .unwrap_or(0)
        .min(LAST);
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// Where the ledger reads the time. Production uses the wall clock, aligned to the database's
/// when several servers share one ([`AlignedClock`]); tests move a manual one to expire leases
/// and retention without sleeping.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Micros;

    /// Follows a reference clock that reads `offset` ahead of this machine's wall clock (the
    /// database's, as the health probe measures it). Clocks that do not follow one (the wall
    /// clock itself, a test's manual clock) ignore it.
    fn follow(&self, _offset: Micros) {}
}

/// The system's wall clock, as it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        Micros::now()
    }
}

/// The system's wall clock moved by the offset of a reference clock: servers sharing one
/// PostgreSQL database all follow the database's clock, so that leases, reconciliation and
/// retention compare instants on one clock however far their own clocks drift apart (NTP
/// fails in practice; the arbiter must not depend on it). The offset starts at zero and is
/// measured by the health probe before the server serves.
#[derive(Debug, Default)]
pub struct AlignedClock {
    /// Microseconds to add to the wall clock.
    offset: std::sync::atomic::AtomicI64,
}

impl Clock for AlignedClock {
    fn now(&self) -> Micros {
        Micros::now().plus(Micros(
            self.offset.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }

    fn follow(&self, offset: Micros) {
        self.offset
            .store(offset.0, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod rfc3339_tests {
    use super::{Micros, rfc3339};

    #[test]
    fn instants_print_as_rfc3339_in_utc() {
        assert_eq!(rfc3339(Micros(0)), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(Micros(1_796_311_800_999_999)),
            "2026-12-03T15:30:00Z"
        );
        assert_eq!(rfc3339(Micros(951_782_400_000_000)), "2000-02-29T00:00:00Z");
        assert_eq!(
            rfc3339(Micros(-1)),
            "1970-01-01T00:00:00Z",
            "before 1970: its start"
        );
        assert_eq!(
            rfc3339(Micros(i64::MAX)),
            "9999-12-31T23:59:59Z",
            "after 9999: its end"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip_through_micros() {
        let d = Duration::from_millis(1500);
        assert_eq!(Micros::from_duration(d), Micros(1_500_000));
        assert_eq!(Micros(1_500_000).to_duration(), d);
        assert_eq!(Micros(-5).to_duration(), Duration::ZERO);
    }

    #[test]
    fn an_aligned_clock_reads_the_reference_and_a_wall_clock_ignores_it() {
        let aligned = AlignedClock::default();
        let ahead = Micros::from_duration(Duration::from_secs(600));
        aligned.follow(ahead);
        let gap = aligned.now().minus(Micros::now());
        assert!(
            gap.0 > ahead.0 - 1_000_000 && gap.0 <= ahead.0,
            "10 minutes ahead: {gap:?}"
        );
        let wall = SystemClock;
        wall.follow(ahead);
        assert!(wall.now().minus(Micros::now()).0 < 1_000_000);
    }

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        assert_eq!(Micros(i64::MAX).plus(Micros(1)), Micros(i64::MAX));
        assert_eq!(Micros(i64::MIN).minus(Micros(1)), Micros(i64::MIN));
    }
}
