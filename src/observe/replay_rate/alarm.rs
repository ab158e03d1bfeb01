//! The replay alarm: claims and replays over a sliding window of the ledger's clock, the
//! gauges read from it at each scrape, and the warning logged once per window while it is on.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

use crate::domain::Micros;
use crate::domain::time::Clock;

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
pub(super) fn alarm_rule(min_claims: u64, totals: WindowTotals) -> bool {
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
    use std::sync::atomic::AtomicI64;

    use super::super::manual_clock::Manual;
    use super::*;

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
