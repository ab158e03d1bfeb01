//! The replay history: per tenant and per tool, claims, replays and key-reuse refusals in
//! one-minute buckets over the last hour, with the minutes the alarm was on marked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::alarm::{ReplayWindow, WindowTotals, alarm_rule};
use crate::domain::time::Clock;
use crate::domain::{Micros, Tenant};

/// Width of one bucket of the [`ReplayHistory`]: a minute.
pub const HISTORY_BUCKET: Duration = Duration::from_secs(60);

/// How many buckets the [`ReplayHistory`] keeps: an hour of minutes.
pub const HISTORY_BUCKETS: usize = 60;

/// The name of the series that tools beyond `--metrics-max-tools` are folded into, as the
/// metrics' `tool` label does.
pub const FOLDED_TOOL: &str = "other";

/// What became of one Claim, as the history counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimEvent {
    /// The claim was answered (any outcome); `replayed` when with the stored result.
    Answered {
        /// The outcome was REPLAYED.
        replayed: bool,
    },
    /// Refused: an explicit key came with another tool or other arguments.
    KeyReused,
}

/// One minute of one series.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketFigures {
    /// When the minute began.
    pub start: Micros,
    /// Claims answered in it (every outcome).
    pub claims: u64,
    /// Of them, replays.
    pub replays: u64,
    /// Claims refused in it for reusing a key with another request.
    pub key_reuse_refusals: u64,
    /// Whether the series' replay alarm was on when a claim of this minute was answered.
    pub alarm: bool,
}

impl BucketFigures {
    /// Replays per claim answered in the minute; 0 with no claim.
    pub fn ratio(&self) -> f64 {
        WindowTotals {
            claims: self.claims,
            replays: self.replays,
        }
        .ratio()
    }
}

/// The figures of one series (a tenant's total, one tool, or the tools folded together).
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesFigures {
    /// The tool; empty for the tenant's total; [`FOLDED_TOOL`] for the folded tools.
    pub tool: String,
    /// Whether this is the series of the tools beyond `--metrics-max-tools`.
    pub folded: bool,
    /// The last [`HISTORY_BUCKETS`] minutes, oldest first; the last one is the current,
    /// partial minute.
    pub buckets: Vec<BucketFigures>,
    /// The replay window (`--replay-alarm-window`) of this series now.
    pub window: WindowTotals,
    /// Whether this series' alarm is on now.
    pub alarm: bool,
}

impl SeriesFigures {
    /// Claims answered over the buckets.
    pub fn claims(&self) -> u64 {
        self.buckets.iter().map(|b| b.claims).sum()
    }

    /// Replays over the buckets.
    pub fn replays(&self) -> u64 {
        self.buckets.iter().map(|b| b.replays).sum()
    }

    /// Key-reuse refusals over the buckets.
    pub fn key_reuse_refusals(&self) -> u64 {
        self.buckets.iter().map(|b| b.key_reuse_refusals).sum()
    }

    /// Replays per claim over the buckets; 0 with no claim.
    pub fn ratio(&self) -> f64 {
        WindowTotals {
            claims: self.claims(),
            replays: self.replays(),
        }
        .ratio()
    }
}

/// What [`ReplayHistory::read`] answers: one tenant's figures on this server.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayFigures {
    /// The server's time when read.
    pub as_of: Micros,
    /// The width of a bucket ([`HISTORY_BUCKET`]).
    pub bucket: Duration,
    /// Every tool of the tenant together.
    pub total: SeriesFigures,
    /// Each tool with a claim or a refusal in the buckets, by name; the folded series last.
    pub tools: Vec<SeriesFigures>,
    /// The alarm's window (`--replay-alarm-window`).
    pub alarm_window: Duration,
    /// Claims the window must hold before zero replays raise the alarm (0: never).
    pub alarm_min_claims: u64,
}

/// One minute's counts in a series' ring.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// The minute's number since the epoch; `i64::MIN` when never used.
    minute: i64,
    claims: u64,
    replays: u64,
    refusals: u64,
    alarm: bool,
}

const EMPTY_SLOT: Slot = Slot {
    minute: i64::MIN,
    claims: 0,
    replays: 0,
    refusals: 0,
    alarm: false,
};

/// One series: its minutes, and its own replay window for the alarm.
#[derive(Debug)]
struct Series {
    window: ReplayWindow,
    slots: [Slot; HISTORY_BUCKETS],
}

impl Series {
    fn new(window: Duration) -> Series {
        Series {
            window: ReplayWindow::new(window),
            slots: [EMPTY_SLOT; HISTORY_BUCKETS],
        }
    }

    fn slot(&mut self, minute: i64) -> &mut Slot {
        let slot = &mut self.slots[minute.rem_euclid(HISTORY_BUCKETS as i64) as usize];
        if slot.minute != minute {
            *slot = Slot {
                minute,
                ..EMPTY_SLOT
            };
        }
        slot
    }

    fn record(&mut self, now: Micros, event: ClaimEvent, min_claims: u64) {
        let minute = now.0.div_euclid(bucket_micros());
        match event {
            ClaimEvent::Answered { replayed } => {
                self.window.record(now, replayed);
                // Added up (the costly part) only while the alarm could still mark this minute.
                let marked = self.slot(minute).alarm;
                let on = !marked
                    && min_claims > 0
                    && !self.window.has_replay(now)
                    && alarm_rule(min_claims, self.window.totals(now));
                let slot = self.slot(minute);
                slot.claims += 1;
                slot.replays += u64::from(replayed);
                slot.alarm |= on;
            }
            ClaimEvent::KeyReused => self.slot(minute).refusals += 1,
        }
    }

    /// Whether a claim or a refusal was counted in the hour that ends at `minute`.
    fn active(&self, minute: i64) -> bool {
        let first = minute - HISTORY_BUCKETS as i64 + 1;
        self.slots
            .iter()
            .any(|s| (first..=minute).contains(&s.minute) && (s.claims > 0 || s.refusals > 0))
    }

    fn figures(&self, tool: &str, folded: bool, now: Micros, min_claims: u64) -> SeriesFigures {
        let minute = now.0.div_euclid(bucket_micros());
        let buckets = (minute - HISTORY_BUCKETS as i64 + 1..=minute)
            .map(|m| {
                let slot = self.slots[m.rem_euclid(HISTORY_BUCKETS as i64) as usize];
                let start = Micros(m.saturating_mul(bucket_micros()));
                if slot.minute == m {
                    BucketFigures {
                        start,
                        claims: slot.claims,
                        replays: slot.replays,
                        key_reuse_refusals: slot.refusals,
                        alarm: slot.alarm,
                    }
                } else {
                    BucketFigures {
                        start,
                        ..BucketFigures::default()
                    }
                }
            })
            .collect();
        let window = self.window.totals(now);
        SeriesFigures {
            tool: tool.to_string(),
            folded,
            buckets,
            window,
            alarm: alarm_rule(min_claims, window),
        }
    }
}

fn bucket_micros() -> i64 {
    Micros::from_duration(HISTORY_BUCKET).0
}

/// One tenant's series.
#[derive(Debug)]
struct TenantHistory {
    total: Series,
    /// At most `max_tools` tools by name.
    named: HashMap<String, Series>,
    /// The tools beyond them, together.
    folded: Option<Series>,
}

/// The replay-rate history of one server: per tenant, its total and each tool's series in
/// one-minute buckets over the last hour, and each series' own replay window for the alarm
/// (the same rule as [`ReplayAlarm`](super::ReplayAlarm)'s, applied to that series' claims alone: a tool whose
/// callers regenerate keys shows up even while other tools replay).
///
/// Bounded: per tenant, `max_tools` named series (`--metrics-max-tools`; later tools count
/// in one folded series, as the metrics' `tool` label does) of fixed size; tenants are the
/// configured credentials' (or `default`).
pub struct ReplayHistory {
    clock: Arc<dyn Clock>,
    max_tools: usize,
    window: Duration,
    min_claims: u64,
    tenants: Mutex<HashMap<String, TenantHistory>>,
}

impl std::fmt::Debug for ReplayHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayHistory")
            .field("max_tools", &self.max_tools)
            .finish_non_exhaustive()
    }
}

impl ReplayHistory {
    /// An empty history on `clock`: `max_tools` named tools per tenant, and the alarm's
    /// `window` and `min_claims` (0: never).
    pub fn new(
        clock: Arc<dyn Clock>,
        max_tools: usize,
        window: Duration,
        min_claims: u64,
    ) -> ReplayHistory {
        ReplayHistory {
            clock,
            max_tools,
            window,
            min_claims,
            tenants: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, TenantHistory>> {
        // A poisoned lock only means a panic elsewhere mid-update of plain counters.
        self.tenants.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts what became of a claim of `tool` by `tenant`, now.
    pub fn record(&self, tenant: &Tenant, tool: &str, event: ClaimEvent) {
        let now = self.clock.now();
        let mut tenants = self.lock();
        let history = match tenants.get_mut(tenant.as_str()) {
            Some(history) => history,
            None => tenants
                .entry(tenant.as_str().to_string())
                .or_insert_with(|| TenantHistory {
                    total: Series::new(self.window),
                    named: HashMap::new(),
                    folded: None,
                }),
        };
        history.total.record(now, event, self.min_claims);
        let series = if let Some(series) = history.named.get_mut(tool) {
            series
        } else if history.named.len() < self.max_tools && tool != FOLDED_TOOL {
            history
                .named
                .entry(tool.to_string())
                .or_insert_with(|| Series::new(self.window))
        } else {
            history
                .folded
                .get_or_insert_with(|| Series::new(self.window))
        };
        series.record(now, event, self.min_claims);
    }

    /// `tenant`'s figures now: its total, and each tool (only `tool` when given) with a claim
    /// or a refusal in the last hour.
    pub fn read(&self, tenant: &Tenant, tool: Option<&str>) -> ReplayFigures {
        let now = self.clock.now();
        let minute = now.0.div_euclid(bucket_micros());
        let tenants = self.lock();
        let empty = Series::new(self.window);
        let (total, tools) = match tenants.get(tenant.as_str()) {
            None => (empty.figures("", false, now, self.min_claims), Vec::new()),
            Some(history) => {
                let mut named: Vec<(&String, &Series)> = history
                    .named
                    .iter()
                    .filter(|(name, series)| {
                        tool.is_none_or(|t| t == name.as_str()) && series.active(minute)
                    })
                    .collect();
                named.sort_unstable_by(|a, b| a.0.cmp(b.0));
                let mut tools: Vec<SeriesFigures> = named
                    .into_iter()
                    .map(|(name, series)| series.figures(name, false, now, self.min_claims))
                    .collect();
                if let Some(folded) = &history.folded
                    && tool.is_none_or(|t| t == FOLDED_TOOL)
                    && folded.active(minute)
                {
                    tools.push(folded.figures(FOLDED_TOOL, true, now, self.min_claims));
                }
                (
                    history.total.figures("", false, now, self.min_claims),
                    tools,
                )
            }
        };
        ReplayFigures {
            as_of: now,
            bucket: HISTORY_BUCKET,
            total,
            tools,
            alarm_window: self.window,
            alarm_min_claims: self.min_claims,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicI64;

    use super::super::manual_clock::Manual;
    use super::*;

    fn history(max_tools: usize, min_claims: u64) -> (Arc<Manual>, ReplayHistory) {
        // On a minute's boundary, so that the test's minutes are the buckets.
        let clock = Arc::new(Manual(AtomicI64::new(1_000_020 * 60_000_000)));
        let history = ReplayHistory::new(
            clock.clone(),
            max_tools,
            Duration::from_secs(300),
            min_claims,
        );
        (clock, history)
    }

    const ANSWERED: ClaimEvent = ClaimEvent::Answered { replayed: false };
    const REPLAYED: ClaimEvent = ClaimEvent::Answered { replayed: true };

    fn tenant(name: &str) -> Tenant {
        Tenant::from_stored(name.to_string())
    }

    #[test]
    fn the_history_counts_each_tenants_tools_by_the_minute() {
        let (clock, history) = history(10, 0);
        let acme = tenant("acme");
        history.record(&acme, "credit", ANSWERED);
        history.record(&acme, "credit", REPLAYED);
        history.record(&acme, "credit", ClaimEvent::KeyReused);
        clock.advance(60);
        history.record(&acme, "ticket", ANSWERED);
        history.record(&tenant("globex"), "mail", ANSWERED);

        let figures = history.read(&acme, None);
        assert_eq!(figures.bucket, HISTORY_BUCKET);
        assert_eq!(figures.total.buckets.len(), HISTORY_BUCKETS);
        let [.., before, now] = figures.total.buckets.as_slice() else {
            panic!("buckets")
        };
        assert_eq!(
            (before.claims, before.replays, before.key_reuse_refusals),
            (2, 1, 1)
        );
        assert_eq!((now.claims, now.replays), (1, 0));
        assert_eq!(now.start.0 - before.start.0, 60_000_000);
        assert_eq!(now.start.0 % 60_000_000, 0);
        assert!(now.start <= figures.as_of);
        assert_eq!((figures.total.claims(), figures.total.replays()), (3, 1));
        let tools: Vec<&str> = figures.tools.iter().map(|s| s.tool.as_str()).collect();
        assert_eq!(
            tools,
            ["credit", "ticket"],
            "by name; globex's mail is not acme's"
        );
        assert!((figures.tools[0].ratio() - 0.5).abs() < 1e-12);
        assert_eq!(history.read(&acme, Some("ticket")).tools.len(), 1);
        assert!(history.read(&acme, Some("mail")).tools.is_empty());
        assert_eq!(history.read(&tenant("nobody"), None).total.claims(), 0);
    }

    #[test]
    fn a_minute_leaves_the_history_an_hour_later() {
        let (clock, history) = history(10, 0);
        let acme = tenant("acme");
        history.record(&acme, "credit", ANSWERED);
        clock.advance(59 * 60);
        assert_eq!(history.read(&acme, None).total.claims(), 1);
        assert_eq!(history.read(&acme, None).tools.len(), 1);
        clock.advance(60);
        let figures = history.read(&acme, None);
        assert_eq!(figures.total.claims(), 0);
        assert!(
            figures.tools.is_empty(),
            "a tool without claims in the hour is left out"
        );
        // Its ring slot is reused for the new minute, not added to.
        history.record(&acme, "credit", ANSWERED);
        assert_eq!(history.read(&acme, None).total.claims(), 1);
    }

    #[test]
    fn tools_beyond_the_limit_fold_into_other_per_tenant() {
        let (_, history) = history(2, 0);
        let acme = tenant("acme");
        for tool in ["a", "b", "c", "other", "d", "a"] {
            history.record(&acme, tool, ANSWERED);
        }
        history.record(&tenant("globex"), "z", ANSWERED);
        let figures = history.read(&acme, None);
        let series: Vec<(&str, bool, u64)> = figures
            .tools
            .iter()
            .map(|s| (s.tool.as_str(), s.folded, s.claims()))
            .collect();
        assert_eq!(
            series,
            [("a", false, 2), ("b", false, 1), ("other", true, 3)]
        );
        assert_eq!(history.read(&tenant("globex"), None).tools[0].tool, "z");
    }

    #[test]
    fn the_alarm_is_marked_per_series_in_the_minutes_it_was_on() {
        let (clock, history) = history(10, 3);
        let acme = tenant("acme");
        for _ in 0..3 {
            history.record(&acme, "fresh_keys", ANSWERED);
        }
        history.record(&acme, "replays", ANSWERED);
        history.record(&acme, "replays", REPLAYED);
        clock.advance(60);
        history.record(&acme, "fresh_keys", ANSWERED);
        let figures = history.read(&acme, None);
        let fresh = &figures.tools[0];
        assert_eq!(fresh.tool, "fresh_keys");
        assert!(fresh.alarm, "four claims, no replay in its window");
        assert_eq!(
            fresh.window,
            WindowTotals {
                claims: 4,
                replays: 0
            }
        );
        let marked: Vec<bool> = fresh.buckets[58..].iter().map(|b| b.alarm).collect();
        assert_eq!(marked, [true, true]);
        assert!(!figures.tools[1].alarm && figures.tools[1].buckets.iter().all(|b| !b.alarm));
        assert!(!figures.total.alarm, "the tenant as a whole replays");
        // Past the window without claims: off, and the marks stay where they fired.
        clock.advance(301);
        let figures = history.read(&acme, None);
        assert!(!figures.tools[0].alarm);
        assert_eq!(
            figures.tools[0].buckets.iter().filter(|b| b.alarm).count(),
            2
        );
    }
}
