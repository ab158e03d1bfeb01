//! What the store's methods take and answer besides entries: a claimant's outcome and its
//! record, a listing's and a reconciler's query, replay counts, and the store's own figures.

use crate::domain::{
    ClaimToken, Completion, Entry, HoldToken, Key, Micros, RunId, Tenant, ToolName,
};

/// The unresolved entries of the whole store, by the status callers would be told, and the
/// entries marked as a possible double effect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnresolvedCount {
    /// Reported UNKNOWN, or ATTEMPTING past its lease: waiting for a reconciler.
    pub unknown: i64,
    /// ATTEMPTING within its lease: a claimant is acting now.
    pub attempting: i64,
    /// Awaiting a person's decision.
    pub awaiting_approval: i64,
    /// Marked as a possible double effect and not yet acknowledged, resolved or not.
    pub possible_double_effect: i64,
}

/// A snapshot of a store's connection pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Connections open and lent to a statement now.
    pub in_use: u32,
    /// Connections open and idle.
    pub idle: u32,
    /// The most connections the pool opens (`--db-max-connections`).
    pub max: u32,
}

/// A claimant's outcome to record.
#[derive(Clone, Debug)]
pub struct Finish {
    /// The entry's key.
    pub key: Key,
    /// The claimant's token: the write's fence.
    pub claim_token: ClaimToken,
    /// What happened.
    pub completion: Completion,
    /// When it is recorded (`finished_at`).
    pub now: Micros,
    /// Whether an entry the claimant already reported UNKNOWN may be resolved too (otherwise
    /// only ATTEMPTING: the fast path, which needs no prior read).
    pub also_unknown: bool,
}

/// An outcome as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    /// The entry after the write.
    pub entry: Entry,
    /// Whether a claim (on some server) waits for this entry.
    pub has_waiters: bool,
}

/// Which of a tenant's entries a listing asks for, and where the page starts.
#[derive(Clone, Debug)]
pub struct ListQuery {
    /// Only this run's entries; any run when `None`.
    pub run_id: Option<RunId>,
    /// Only this tool's entries; any tool when `None`.
    pub tool: Option<ToolName>,
    /// Only entries in this state as Lookup reports it at `now`.
    pub status: Option<crate::domain::Status>,
    /// Only entries whose current attempt started at or after this.
    pub started_from: Micros,
    /// Only entries whose current attempt started before this.
    pub started_before: Micros,
    /// Only entries after this (started_at, key) in the listing's order: the page cursor.
    pub after: Option<(Micros, Key)>,
    /// At most this many entries.
    pub limit: u32,
    /// The time an attempt's lease is judged at.
    pub now: Micros,
    /// Only entries marked as a possible double effect.
    pub possible_double_effect: bool,
}

/// Replays of one entry answered from a server's memory, to be added to its count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayCount {
    /// The entry's tenant.
    pub tenant: Tenant,
    /// The entry's key.
    pub key: Key,
    /// The attempt that was replayed.
    pub claim_token: ClaimToken,
    /// How many replays.
    pub count: u64,
}

/// Which unresolved entries a reconciler asks for, and how long it holds them.
#[derive(Clone, Debug)]
pub struct UnresolvedQuery {
    /// The current instant: leases and holds are compared with it.
    pub now: Micros,
    /// Only entries whose current attempt started at or before this instant.
    pub started_before: Micros,
    /// Only entries of this tool; `None` for every tool.
    pub tool: Option<ToolName>,
    /// At most this many entries.
    pub limit: u32,
    /// The reconcile hold ends here.
    pub hold_until: Micros,
    /// Only these keys (each if unresolved and not held), at most `limit` of them; any
    /// unresolved entry when empty.
    pub keys: Vec<Key>,
    /// Only entries whose outcome has been unknown since this instant or earlier (their
    /// lease's end): `now` minus the reconcile grace.
    pub unknown_before: Micros,
    /// The hold the entries are handed out under, replacing any earlier one: what their
    /// findings must name.
    pub hold_token: HoldToken,
}

/// A call's window of intent as [`Store::count_window`](super::Store::count_window)
/// counts it: the call (its fingerprint, in a tenant), when it came, and the window.
#[derive(Clone, Copy, Debug)]
pub struct IntentWindow<'a> {
    /// The call: its tool and canonical arguments' fingerprint.
    pub fingerprint: &'a str,
    /// When the call came.
    pub now: Micros,
    /// How long after the last identical call a call is still the same intent.
    pub within: Micros,
}

impl IntentWindow<'_> {
    /// Whether the window ended before this call: the last identical call came at
    /// `last_seen`, `within` or more before it.
    pub fn ended(&self, last_seen: Micros) -> bool {
        last_seen.0.saturating_add(self.within.0) <= self.now.0
    }

    /// Whether `entry`, the current intent's, holds its window open whatever the time: an
    /// outcome nobody knows yet (in flight, unknown, awaiting a decision) is never acted on
    /// again as a new intent.
    pub fn held_open_by(&self, entry: Option<Entry>) -> bool {
        entry.is_some_and(|e| {
            matches!(
                e.as_of(self.now).status,
                crate::domain::Status::Attempting
                    | crate::domain::Status::Unknown
                    | crate::domain::Status::AwaitingApproval
            )
        })
    }
}
