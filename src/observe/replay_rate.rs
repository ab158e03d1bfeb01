//! The replay rate: the claims this server answered, and how many of them were replays.
//!
//! - [`ReplayAlarm`]: the alarm over a sliding window of the ledger's clock
//!   (`--replay-alarm-window`); the gauges read from it (`ledger_replay_window_claims`,
//!   `ledger_replay_window_replays`, `ledger_replay_ratio`, `ledger_replay_alarm`); and the
//!   warning logged once per window while the alarm is on.
//! - [`ReplayHistory`]: the figures the operator's console draws and the `ReplayRate` RPC
//!   answers: per tenant and per tool, claims, replays and key-reuse refusals in one-minute
//!   buckets over the last hour ([`HISTORY_BUCKETS`] of [`HISTORY_BUCKET`]), with the minutes in
//!   which the alarm was on marked. Kept in memory, per server: a restart starts it empty, and
//!   servers sharing a database each count the claims they answered.
//!
//! A window with plenty of claims and not one replay usually means that callers derive a new
//! key on every retry, so the ledger deduplicates nothing. The window counts whole claims, and
//! the gauges are computed from those integer counts at each scrape, so they are exact for the
//! claims answered in the window (no decay, no sampling). It is cut into [`WINDOW_SLICES`]
//! slices and slides by one slice at a time: it holds the current slice and the ones before it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use crate::domain::time::Clock;
use crate::domain::{Micros, Tenant};

/// How many slices the window is cut into: it slides by 1/60 of its length.
pub const WINDOW_SLICES: usize = 60;

/// Claims and replays over a sliding window of a clock's time, cut into [`WINDOW_SLICES`]
/// slices.
#[derive(Debug)]
pub struct ReplayWindow {
    /// Length of one slice, in microseconds (at least 1).
    slice: i64,
    /// Ring of (slice number, claims, replays).
    slices: [(i64, u64, u64); WINDOW_SLICES],
    /// The slice of the latest replay counted (`i64::MIN`: none yet).
    latest_replay: i64,
}

/// What the replay window holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowTotals {
    /// Claims answered in the window (every outcome).
    pub claims: u64,
    /// Of them, replays.
    pub replays: u64,
}

impl WindowTotals {
    /// Replays per claim answered; 0 with no claim.
    pub fn ratio(self) -> f64 {
        if self.claims == 0 {
            0.0
        } else {
            self.replays as f64 / self.claims as f64
        }
    }
}

impl ReplayWindow {
    /// An empty window of `length`.
    pub fn new(length: Duration) -> ReplayWindow {
        let slice = (Micros::from_duration(length).0 / WINDOW_SLICES as i64).max(1);
        ReplayWindow {
            slice,
            slices: [(i64::MIN, 0, 0); WINDOW_SLICES],
            latest_replay: i64::MIN,
        }
    }

    /// The window's length, a whole number of slices.
    pub fn length(&self) -> Micros {
        Micros(self.slice * WINDOW_SLICES as i64)
    }

    /// Counts a claim answered at `now`.
    pub fn record(&mut self, now: Micros, replayed: bool) {
        let n = now.0.div_euclid(self.slice);
        let slot = &mut self.slices[n.rem_euclid(WINDOW_SLICES as i64) as usize];
        if slot.0 != n {
            *slot = (n, 0, 0);
        }
        slot.1 += 1;
        slot.2 += u64::from(replayed);
        if replayed {
            self.latest_replay = self.latest_replay.max(n);
        }
    }

    /// Whether a replay was counted in the window that ends at `now` (the alarm is then off).
    pub fn has_replay(&self, now: Micros) -> bool {
        let n = now.0.div_euclid(self.slice);
        (n - WINDOW_SLICES as i64 + 1..=n).contains(&self.latest_replay)
    }

    /// The claims and replays in the window that ends at `now`.
    pub fn totals(&self, now: Micros) -> WindowTotals {
        let n = now.0.div_euclid(self.slice);
        let first = n - WINDOW_SLICES as i64 + 1;
        self.slices
            .iter()
            .filter(|s| (first..=n).contains(&s.0))
            .fold(WindowTotals::default(), |t, s| WindowTotals {
                claims: t.claims + s.1,
                replays: t.replays + s.2,
            })
    }
}

/// The alarm's rule: at least `min_claims` claims in the window and not one replay; never with
/// `min_claims` 0.
fn alarm_rule(min_claims: u64, totals: WindowTotals) -> bool {
    min_claims > 0 && totals.claims >= min_claims && totals.replays == 0
}

/// The window and what the alarm last said, behind one lock.
#[derive(Debug)]
struct AlarmState {
    window: ReplayWindow,
    /// When the warning was last logged; `None` while the alarm is off.
    warned_at: Option<Micros>,
}

/// The replay window of one server, on its clock, and the alarm read from it. Registered in
/// the server's registry as a collector, so its gauges are computed when scraped.
pub struct ReplayAlarm {
    /// The ledger's clock: the window slides on it (tests move it by hand).
    clock: Arc<dyn Clock>,
    /// Claims needed in the window before zero replays raise the alarm; 0 turns it off.
    min_claims: u64,
    state: Mutex<AlarmState>,
}

impl std::fmt::Debug for ReplayAlarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayAlarm")
            .field("min_claims", &self.min_claims)
            .finish_non_exhaustive()
    }
}

impl ReplayAlarm {
    /// An empty window of `window` on `clock`, whose alarm needs `min_claims` (0: never).
    pub fn new(clock: Arc<dyn Clock>, window: Duration, min_claims: u64) -> ReplayAlarm {
        ReplayAlarm {
            clock,
            min_claims,
            state: Mutex::new(AlarmState {
                window: ReplayWindow::new(window),
                warned_at: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, AlarmState> {
        // A poisoned lock only means a panic elsewhere mid-update of plain counters.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a claim answered now.
    pub fn record(&self, replayed: bool) {
        let now = self.clock.now();
        self.lock().window.record(now, replayed);
    }

    fn is_on(&self, totals: WindowTotals) -> bool {
        alarm_rule(self.min_claims, totals)
    }

    /// The window's totals now, and whether the alarm is on: at least `min_claims` claims and
    /// not one replay.
    pub fn read(&self) -> (WindowTotals, bool) {
        let totals = self.lock().window.totals(self.clock.now());
        (totals, self.is_on(totals))
    }

    /// Logs the alarm's warning if it is on and was not logged within the last window, so an
    /// alarm that stays on warns once per window. Returns whether it warned.
    pub fn warn_if_on(&self) -> bool {
        let now = self.clock.now();
        let mut state = self.lock();
        let totals = state.window.totals(now);
        if !self.is_on(totals) {
            state.warned_at = None;
            return false;
        }
        let length = state.window.length();
        if state.warned_at.is_some_and(|at| now.minus(at) < length) {
            return false;
        }
        state.warned_at = Some(now);
        drop(state);
        tracing::warn!(
            claims = totals.claims,
            replays = totals.replays,
            window = ?length.to_duration(),
            "replay alarm: claims in the window but not one replay; callers may be \
             regenerating keys on retry, so the ledger deduplicates nothing"
        );
        true
    }
}

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
/// (the same rule as [`ReplayAlarm`]'s, applied to that series' claims alone: a tool whose
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

/// Encodes one gauge family of a single series.
fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: impl EncodeGaugeValue,
) -> Result<(), std::fmt::Error> {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

impl Collector for ReplayAlarm {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // One reading for the four, so they agree with each other.
        let (totals, on) = self.read();
        gauge(
            &mut encoder,
            "ledger_replay_window_claims",
            "Claims answered on this server in the replay window (--replay-alarm-window).",
            totals.claims,
        )?;
        gauge(
            &mut encoder,
            "ledger_replay_window_replays",
            "Of them, replays.",
            totals.replays,
        )?;
        gauge(
            &mut encoder,
            "ledger_replay_ratio",
            "Replays per claim answered in the replay window (0 when there was no claim).",
            totals.ratio(),
        )?;
        gauge(
            &mut encoder,
            "ledger_replay_alarm",
            "1 when the replay window holds at least --replay-alarm-min-claims claims and not \
             one replay: callers may be regenerating keys on retry.",
            i64::from(on),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};

    use super::*;

    /// A clock moved by hand.
    struct Manual(AtomicI64);

    impl Clock for Manual {
        fn now(&self) -> Micros {
            Micros(self.0.load(Ordering::SeqCst))
        }
    }

    impl Manual {
        fn advance(&self, seconds: i64) {
            self.0.fetch_add(seconds * 1_000_000, Ordering::SeqCst);
        }
    }

    fn alarm(min_claims: u64) -> (Arc<Manual>, ReplayAlarm) {
        let clock = Arc::new(Manual(AtomicI64::new(1_000_000_000)));
        let alarm = ReplayAlarm::new(clock.clone(), Duration::from_secs(60), min_claims);
        (clock, alarm)
    }

    #[test]
    fn the_replay_window_slides_and_forgets_old_slices() {
        let mut w = ReplayWindow::new(Duration::from_secs(60));
        let t0 = Micros(1_000_000_000);
        w.record(t0, false);
        w.record(t0, true);
        w.record(t0.plus(Micros(30_000_000)), false);
        let at = |s: i64| w.totals(t0.plus(Micros(s * 1_000_000)));
        assert_eq!(
            at(30),
            WindowTotals {
                claims: 3,
                replays: 1
            }
        );
        // 60 s later the first slice has left the window; the claim at 30 s has not.
        assert_eq!(
            at(60),
            WindowTotals {
                claims: 1,
                replays: 0
            }
        );
        assert_eq!(at(120), WindowTotals::default());
    }

    #[test]
    fn the_window_says_it_holds_a_replay_exactly_when_its_totals_count_one() {
        // The claim path's shortcut (`has_replay`) against the window's own sum, over claims
        // and replays spread across several window lengths.
        let mut w = ReplayWindow::new(Duration::from_secs(60));
        let mut now = Micros(1_000_000_000);
        let mut seen_both = (false, false);
        for i in 0u64..2_000 {
            now = now.plus(Micros(((i * 7_919) % 3_000) as i64 * 1_000));
            w.record(now, i % 97 == 0 || (i / 400) % 2 == 1 && i % 5 == 0);
            for later in [0, 30_000_000, 59_000_000, 61_000_000] {
                let at = now.plus(Micros(later));
                let counted = w.totals(at).replays > 0;
                assert_eq!(w.has_replay(at), counted, "claim {i}, {later} µs later");
                seen_both = (seen_both.0 || counted, seen_both.1 || !counted);
            }
        }
        assert_eq!(seen_both, (true, true), "both answers were met");
    }

    #[test]
    fn the_ratio_is_replays_per_claim_and_zero_without_claims() {
        let totals = WindowTotals {
            claims: 4,
            replays: 1,
        };
        assert!((totals.ratio() - 0.25).abs() < 1e-12);
        assert_eq!(WindowTotals::default().ratio(), 0.0);
    }

    #[test]
    fn the_window_counts_exactly_what_was_recorded_however_many_claims() {
        let (_, alarm) = alarm(0);
        for i in 0..10_000 {
            alarm.record(i % 7 == 0);
        }
        let (totals, _) = alarm.read();
        assert_eq!(
            totals,
            WindowTotals {
                claims: 10_000,
                replays: 1_429
            }
        );
    }

    #[test]
    fn the_alarm_needs_the_minimum_of_claims_and_no_replay() {
        let (clock, alarm) = alarm(3);
        alarm.record(false);
        alarm.record(false);
        assert!(!alarm.read().1, "two claims are not enough traffic");
        alarm.record(false);
        assert!(alarm.read().1, "three claims, no replay");
        alarm.record(true);
        assert!(!alarm.read().1, "one replay turns it off");
        // A window later the replay has left, and so has everything else.
        clock.advance(61);
        assert_eq!(alarm.read(), (WindowTotals::default(), false));
    }

    #[test]
    fn a_minimum_of_zero_turns_the_alarm_off() {
        let (_, alarm) = alarm(0);
        for _ in 0..1000 {
            alarm.record(false);
        }
        assert!(!alarm.read().1);
        assert!(!alarm.warn_if_on());
    }

    #[test]
    fn an_alarm_that_stays_on_warns_once_per_window() {
        let (clock, alarm) = alarm(2);
        assert!(!alarm.warn_if_on(), "off: nothing to say");
        alarm.record(false);
        alarm.record(false);
        assert!(alarm.warn_if_on());
        // Still on, within the window: quiet. Claims keep the window busy as time passes.
        for _ in 0..5 {
            clock.advance(10);
            alarm.record(false);
            assert!(!alarm.warn_if_on());
        }
        // A window after the warning, still on: it warns again.
        clock.advance(10);
        alarm.record(false);
        assert!(alarm.warn_if_on());
    }

    #[test]
    fn an_alarm_that_turned_off_warns_at_once_when_it_turns_on_again() {
        let (clock, alarm) = alarm(2);
        alarm.record(false);
        alarm.record(false);
        assert!(alarm.warn_if_on());
        alarm.record(true);
        assert!(!alarm.warn_if_on(), "off after a replay");
        // The replay leaves the window; new claims without replays turn it on again.
        clock.advance(61);
        alarm.record(false);
        alarm.record(false);
        assert!(alarm.warn_if_on());
    }

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

    #[test]
    fn the_gauges_are_read_from_the_window_when_scraped() {
        let (clock, alarm) = alarm(2);
        let mut registry = prometheus_client::registry::Registry::default();
        let alarm = Arc::new(alarm);
        registry.register_collector(Box::new(alarm.clone()));
        let scrape = || {
            let mut text = String::new();
            prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
                .expect("encode");
            text
        };
        alarm.record(false);
        alarm.record(false);
        alarm.record(false);
        alarm.record(true);
        let text = scrape();
        for line in [
            "# TYPE ledger_replay_window_claims gauge\nledger_replay_window_claims 4\n",
            "ledger_replay_window_replays 1\n",
            "ledger_replay_ratio 0.25\n",
            "ledger_replay_alarm 0\n",
        ] {
            assert!(text.contains(line), "no {line:?} in:\n{text}");
        }
        clock.advance(61);
        let text = scrape();
        assert!(text.contains("ledger_replay_window_claims 0\n"), "{text}");
    }
}
