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

mod alarm;
mod history;
#[cfg(test)]
mod manual_clock;

pub use alarm::{ReplayAlarm, ReplayWindow, WINDOW_SLICES, WindowTotals};
pub use history::{
    BucketFigures, ClaimEvent, FOLDED_TOOL, HISTORY_BUCKET, HISTORY_BUCKETS, ReplayFigures,
    ReplayHistory, SeriesFigures,
};
