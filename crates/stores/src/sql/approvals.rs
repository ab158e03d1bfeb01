//! The statements of approvals and of paused runs: a call that awaits a person's decision,
//! its decision, its lapse, and the keys a paused run keeps (every finish writes its expiry
//! through `kept!`); and the history read by id (WatchApprovals).

use const_format::concatcp;

use super::{
    APPROVAL_COLUMNS, ENTRY_COLUMNS, IN_PLACE_NAMES, IN_PLACE_VALUES, INSERT_COLUMNS,
    INSERT_VALUES, NEXT1, NEXT2, NEXT3,
};

/// The latest deadline among the other calls of the run of the entry aliased `e` that await a
/// person's decision (a request's `decide_by`, an approval's `execute_by`), plus `e`'s own
/// retention: until when a paused run keeps `e`. The partial index of awaiting entries by run
/// (migration 0010) finds them, so a write outside any pause pays one probe of a near-empty
/// index, however many calls the run made. Followed by `> (expiry))`; see `kept!`.
pub(crate) const PAUSE_END_PLUS_RETENTION: &str = "(SELECT MAX(COALESCE(p.approval_execute_by, \
    p.approval_decide_by)) + e.retention_us FROM ledger_entries AS p \
    WHERE p.tenant = e.tenant AND p.run_id = e.run_id AND e.run_id <> '' AND p.key <> e.key \
    AND p.status = 'AWAITING_APPROVAL' \
    AND COALESCE(p.approval_execute_by, p.approval_decide_by) + e.retention_us > ";

/// The expiry `$expiry` (SQL text) of the entry aliased `e` that a write finishes, or later
/// while its run is paused: no entry of a run expires while another call of the run awaits a
/// decision, whether it finished before the pause or during it ([`PAUSE_END_PLUS_RETENTION`]).
/// Every statement that finishes an entry writes its expiry through it.
macro_rules! kept {
    ($expiry:expr) => {
        concatcp!(
            "COALESCE(",
            $crate::sql::PAUSE_END_PLUS_RETENTION,
            "(",
            $expiry,
            ")), (",
            $expiry,
            "))"
        )
    };
}
pub(crate) use kept;

/// Creates a call that awaits a person's decision: the columns of [`INSERT`](super::INSERT) (status
/// AWAITING_APPROVAL) and its request, asked at the first parameter after the claim's, to be
/// decided by the second. The primary key
/// decides among concurrent claimants, as for a claim. Returns the key when it inserted.
pub const INSERT_REQUEST: &str = concatcp!(
    "INSERT INTO ledger_entries (",
    INSERT_COLUMNS,
    ", approval_state, approval_requested_at, approval_decide_by) VALUES (",
    INSERT_VALUES,
    ", 'REQUESTED', ",
    NEXT1,
    ", ",
    NEXT2,
    ") ON CONFLICT (tenant, key) DO NOTHING RETURNING key"
);

/// Asks a person again about an entry whose request (or approval) lapsed, or that an expired
/// request left FAILED retryable, or that expired and starts over gated: the columns of
/// [`INSERT`](super::INSERT) but the key (from `$3`, the entry as it now awaits), a fresh request asked at
/// the second parameter after the claim's, to be decided by the third, only if the entry
/// still carries the token of the first it was read
/// with. Returns the key when it applied.
pub const REQUEST_AGAIN: &str = concatcp!(
    "UPDATE ledger_entries SET (",
    IN_PLACE_NAMES,
    ", has_waiters, resolved_by, hold_token, ",
    APPROVAL_COLUMNS,
    ") = (",
    IN_PLACE_VALUES,
    ", FALSE, '', '', 'REQUESTED', ",
    NEXT2,
    ", ",
    NEXT3,
    ", NULL, '', '', NULL) WHERE tenant = $1 AND key = $2 AND claim_token = ",
    NEXT1,
    " AND status IN ('AWAITING_APPROVAL', 'FAILED', 'SUCCEEDED', 'DENIED') RETURNING key"
);

/// Takes an approval to act, once: the entry awaiting a decision becomes the attempt of the
/// claim holding token `$3`, started at `$4` with its lease until `$5`, by principal `$6`,
/// only while it is APPROVED and the approval's `execute_by` is after `$4`. Returns the entry
/// as written.
pub const USE_APPROVAL: &str = concatcp!(
    "UPDATE ledger_entries SET status = 'ATTEMPTING', claim_token = $3, started_at = $4, \
     lease_expires_at = $5, principal = $6, approval_state = 'USED' \
     WHERE tenant = $1 AND key = $2 AND status = 'AWAITING_APPROVAL' \
     AND approval_state = 'APPROVED' AND approval_execute_by > $4 RETURNING ",
    ENTRY_COLUMNS
);

/// Which entry a decision applies to: tenant `$1`, key `$2`, fingerprint `$3` (the arguments
/// the person was shown), awaiting a decision on a request still open at `$4`.
const DECIDABLE: &str = " WHERE tenant = $1 AND key = $2 AND fingerprint = $3 \
    AND status = 'AWAITING_APPROVAL' AND approval_state = 'REQUESTED' \
    AND approval_decide_by > $4 RETURNING ";

/// Records an approval at `$4` by `$5` with reason `$6`, to be used by `$7`. Returns the entry
/// as written and whether a claim waits for it.
pub const APPROVE: &str = concatcp!(
    "UPDATE ledger_entries SET approval_state = 'APPROVED', approval_decided_at = $4, \
     approval_decided_by = $5, approval_reason = $6, approval_execute_by = $7",
    DECIDABLE,
    ENTRY_COLUMNS,
    ", has_waiters"
);

/// Records a denial at `$4` by `$5` with reason `$6`: the entry is DENIED, finished, with the
/// reason as its error, kept for its retention (longer while another call of its run awaits a
/// decision: `kept!`). Returns the entry as written and whether a
/// claim waits for it.
pub const DENY: &str = concatcp!(
    "UPDATE ledger_entries AS e SET status = 'DENIED', approval_state = 'DENIED', \
     approval_decided_at = $4, approval_decided_by = $5, approval_reason = $6, error = $6, \
     finished_at = $4, expires_at = ",
    kept!("$4 + e.retention_us"),
    ", reconcile_until = NULL",
    DECIDABLE,
    ENTRY_COLUMNS,
    ", has_waiters"
);

/// Up to `$2` entries of any tenant whose request went undecided, or whose approval went
/// unused, past its deadline at `$1`, earliest deadline first: a lapse recorded late keeps
/// its run's other entries as it would have when it happened (a call of the run still
/// awaiting then is still awaiting when the earlier lapse is recorded). The partial index of
/// awaiting entries.
pub const LAPSED_APPROVALS: &str = concatcp!(
    "SELECT tenant, key FROM ledger_entries \
     WHERE status = 'AWAITING_APPROVAL' AND approval_state IN ('REQUESTED', 'APPROVED') AND ",
    AWAITING_UNTIL,
    " <= $1 ORDER BY ",
    AWAITING_UNTIL,
    ", tenant, key LIMIT $2"
);

/// The deadline of an entry awaiting a decision: its request's `decide_by`, or its approval's
/// `execute_by` once approved (which a new request clears).
pub(crate) const AWAITING_UNTIL: &str = "COALESCE(approval_execute_by, approval_decide_by)";

/// The earliest deadline among the calls of any tenant awaiting a decision (NULL when none
/// waits): when the sweep records the next lapse. The partial index of awaiting entries.
pub const NEXT_LAPSE: &str = concatcp!(
    "SELECT MIN(",
    AWAITING_UNTIL,
    ") FROM ledger_entries WHERE status = 'AWAITING_APPROVAL' \
     AND approval_state IN ('REQUESTED', 'APPROVED')"
);

/// Records that the request (or approval) of tenant `$1`'s key `$2` lapsed at `$5`, its
/// deadline, if it still awaits and has lapsed at `$4`: nothing was done, so the entry is
/// FAILED, retryable, with error `$3` and its approval EXPIRED (the next claim asks again),
/// finished at the deadline and kept for its retention from then (`kept!`). Returns the entry
/// as written and whether a claim waits for it.
pub const EXPIRE_APPROVAL: &str = concatcp!(
    "UPDATE ledger_entries AS e SET status = 'FAILED', retryable = TRUE, error = $3, \
     finished_at = $5, expires_at = ",
    kept!("$5 + e.retention_us"),
    ", approval_state = 'EXPIRED' \
     WHERE tenant = $1 AND key = $2 AND status = 'AWAITING_APPROVAL' \
     AND approval_state IN ('REQUESTED', 'APPROVED') AND ",
    AWAITING_UNTIL,
    " <= $4 AND ",
    AWAITING_UNTIL,
    " = $5 RETURNING ",
    ENTRY_COLUMNS,
    ", has_waiters"
);

/// Keeps every finished entry of the run of tenant `$1`'s key `$2` until at least `$3` plus its
/// own retention: run in the transaction of a request (`$3` its `decide_by`) and of a decision
/// (`$3` its time), so that no failure between two writes can shorten a paused run's keys.
/// (The run index finds the run's entries.)
pub const EXTEND_RUN_OF_KEY: &str = "UPDATE ledger_entries SET expires_at = $3 + retention_us \
    WHERE tenant = $1 AND run_id = (SELECT k.run_id FROM ledger_entries AS k \
    WHERE k.tenant = $1 AND k.key = $2) AND run_id <> '' AND expires_at IS NOT NULL \
    AND expires_at < $3 + retention_us";

/// Keeps every finished entry of every paused run (one of whose calls awaits a decision) until
/// at least the run's latest deadline plus the entry's retention: the sweep's pass, for an
/// entry that finished in the same instant as the request that paused its run (on PostgreSQL,
/// neither statement sees the other's uncommitted row). Returns how many it extended.
pub const KEEP_PAUSED_RUNS: &str = concatcp!(
    "UPDATE ledger_entries AS e SET expires_at = p.until + e.retention_us \
     FROM (SELECT tenant, run_id, MAX(",
    AWAITING_UNTIL,
    ") AS until FROM ledger_entries WHERE status = 'AWAITING_APPROVAL' AND run_id <> '' \
     GROUP BY tenant, run_id) AS p \
     WHERE e.tenant = p.tenant AND e.run_id = p.run_id AND e.expires_at IS NOT NULL \
     AND e.expires_at < p.until + e.retention_us"
);

/// Tenant `$1`'s key `$2`, if it has an entry: the write a history event alone is appended
/// after ([`APPEND_HISTORY`](super::APPEND_HISTORY) needs its entry).
pub const ENTRY_KEY: &str = "SELECT key FROM ledger_entries WHERE tenant = $1 AND key = $2";

/// Keeps every finished entry of tenant `$1`'s run `$2` until at least `$3` (ExtendRun).
pub const EXTEND_RUN_UNTIL: &str = "UPDATE ledger_entries SET expires_at = $3 \
    WHERE run_id = $2 AND tenant = $1 AND $2 <> '' AND expires_at IS NOT NULL \
    AND expires_at < $3";

/// The earliest expiry of tenant `$1`'s run `$2`'s finished entries (NULL without any).
pub const RUN_KEPT_UNTIL: &str = "SELECT MIN(expires_at) FROM ledger_entries \
    WHERE run_id = $2 AND tenant = $1 AND expires_at IS NOT NULL";

/// An entry (aliased `e`) whose run does not await a person's decision: a paused run keeps
/// its keys, whatever their expiry, so that its retries after the decision still replay. (The
/// run index finds the run's other entries.)
pub const NOT_PAUSED: &str = "NOT EXISTS (SELECT 1 FROM ledger_entries AS p \
    WHERE p.run_id = e.run_id AND p.tenant = e.tenant AND e.run_id <> '' \
    AND p.status = 'AWAITING_APPROVAL')";

/// Tenant `$1`'s approval events after id `$2`, oldest first, at most `$3` (WatchApprovals).
pub const APPROVAL_EVENTS: &str = "SELECT id, at, kind, principal, key FROM ledger_history \
    WHERE tenant = $1 AND id > $2 AND kind IN ('approval_requested', 'approval_approved', \
    'approval_denied', 'approval_expired', 'approval_used') ORDER BY id LIMIT $3";

/// The newest history id of tenant `$1` (0 without any): where a watch from now starts.
pub const LAST_HISTORY_ID: &str =
    "SELECT COALESCE(MAX(id), 0) FROM ledger_history WHERE tenant = $1";
