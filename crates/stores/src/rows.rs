//! How a stored row becomes a domain value: the entry's and the history's columns as read,
//! and the checks that a row still holds what this code writes (a status it knows, counts that
//! are not negative).

use super::{Finished, StoreError, StoreResult, UnresolvedCount};
use crate::domain::{
    Approval, ApprovalState, ClaimToken, Entry, EventKind, HistoryEvent, HoldToken, Key, Micros,
    Principal, RunId, ToolName,
};

/// Converts a stored integer to the domain's `u32`/`u64`, refusing corrupt negatives.
fn non_negative<T: TryFrom<i64>>(v: i64, what: &str) -> StoreResult<T> {
    T::try_from(v).map_err(|_| StoreError::Internal(format!("stored {what} out of range: {v}")))
}

/// The stored row shape both backends read into; converted to [`Entry`] here, once.
///
/// The text columns become the domain's types through their `from_stored` constructors,
/// which trust the stored value: it passed the request rules of the server that wrote it, and
/// checking it again against today's rules could make an old row unreadable. (Rows are read
/// with `FromRow` into plain columns, so no sqlx trait reaches the domain's types.)
#[derive(sqlx::FromRow)]
pub(crate) struct EntryRow {
    pub key: String,
    pub run_id: String,
    pub tool: String,
    pub fingerprint: String,
    pub status: String,
    pub attempt: i64,
    pub claim_token: String,
    pub result: Vec<u8>,
    pub error: String,
    pub retryable: bool,
    pub principal: String,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub lease_expires_at: i64,
    pub retention_us: i64,
    pub expires_at: Option<i64>,
    pub replay_count: i64,
    /// Read only by the statements that select it (Lookup's and the listings).
    #[sqlx(default)]
    pub arguments: Option<String>,
    pub resolved_by: String,
    pub hold_token: String,
    pub possible_double_effect: bool,
    pub approval_state: String,
    pub approval_requested_at: Option<i64>,
    pub approval_decide_by: Option<i64>,
    pub approval_decided_at: Option<i64>,
    pub approval_decided_by: String,
    pub approval_reason: String,
    pub approval_execute_by: Option<i64>,
}

impl TryFrom<EntryRow> for Entry {
    type Error = StoreError;

    fn try_from(r: EntryRow) -> StoreResult<Entry> {
        let status = crate::domain::Status::parse(&r.status)
            .ok_or_else(|| StoreError::Internal(format!("unknown stored status {}", r.status)))?;
        Ok(Entry {
            key: Key::from_stored(r.key),
            run_id: (!r.run_id.is_empty()).then(|| RunId::from_stored(r.run_id)),
            tool: ToolName::from_stored(r.tool),
            fingerprint: r.fingerprint,
            status,
            attempt: non_negative(r.attempt, "attempt")?,
            claim_token: ClaimToken::from_stored(r.claim_token),
            result: r.result,
            error: r.error,
            retryable: r.retryable,
            principal: Principal::from_stored(r.principal),
            started_at: Micros(r.started_at),
            finished_at: r.finished_at.map(Micros),
            lease_expires_at: Micros(r.lease_expires_at),
            retention: Micros(r.retention_us),
            expires_at: r.expires_at.map(Micros),
            replay_count: non_negative(r.replay_count, "replay_count")?,
            arguments: r.arguments,
            resolved_by: Principal::from_stored(r.resolved_by),
            hold_token: HoldToken::from_stored(r.hold_token),
            possible_double_effect: r.possible_double_effect,
            approval: Approval {
                state: ApprovalState::parse(&r.approval_state).ok_or_else(|| {
                    StoreError::Internal(format!(
                        "unknown stored approval state {}",
                        r.approval_state
                    ))
                })?,
                requested_at: r.approval_requested_at.map(Micros),
                decide_by: r.approval_decide_by.map(Micros),
                decided_at: r.approval_decided_at.map(Micros),
                decided_by: Principal::from_stored(r.approval_decided_by),
                reason: r.approval_reason,
                execute_by: r.approval_execute_by.map(Micros),
            },
        })
    }
}

/// A stored history row; converted to [`HistoryEvent`] here.
#[derive(sqlx::FromRow)]
pub(crate) struct HistoryRow {
    pub at: i64,
    pub attempt: i64,
    pub kind: String,
    pub principal: String,
    pub detail: String,
}

impl TryFrom<HistoryRow> for HistoryEvent {
    type Error = StoreError;

    fn try_from(r: HistoryRow) -> StoreResult<HistoryEvent> {
        Ok(HistoryEvent {
            at: Micros(r.at),
            attempt: non_negative(r.attempt, "history attempt")?,
            kind: EventKind::parse(&r.kind),
            principal: Principal::from_stored(r.principal),
            detail: r.detail,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::EntryRow;
    use crate::domain::{Entry, Status};

    fn row(run_id: &str, key: &str) -> EntryRow {
        EntryRow {
            key: key.into(),
            run_id: run_id.into(),
            tool: "t".into(),
            fingerprint: "f".into(),
            status: "ATTEMPTING".into(),
            attempt: 1,
            claim_token: "tok".into(),
            result: Vec::new(),
            error: String::new(),
            retryable: false,
            principal: String::new(),
            started_at: 1,
            finished_at: None,
            lease_expires_at: 2,
            retention_us: 3,
            expires_at: None,
            replay_count: 0,
            arguments: None,
            resolved_by: String::new(),
            hold_token: String::new(),
            possible_double_effect: false,
            approval_state: String::new(),
            approval_requested_at: None,
            approval_decide_by: None,
            approval_decided_at: None,
            approval_decided_by: String::new(),
            approval_reason: String::new(),
            approval_execute_by: None,
        }
    }

    #[test]
    fn a_stored_row_is_read_as_stored_and_an_empty_run_is_no_run() {
        let without_run = Entry::try_from(row("", "k")).expect("readable");
        assert_eq!(without_run.run_id, None);
        assert_eq!(without_run.status, Status::Attempting);
        // Today's request rules would refuse this key; a stored one is read all the same.
        let old = Entry::try_from(row("r", "order 42")).expect("readable");
        assert_eq!(
            (old.key.as_str(), old.run_id_str(), old.claim_token.as_str()),
            ("order 42", "r", "tok")
        );
        assert!(
            Entry::try_from(EntryRow {
                status: "DONE".into(),
                ..row("r", "k")
            })
            .is_err()
        );
    }
}

/// A finished row: the entry and its waiters flag.
#[derive(sqlx::FromRow)]
pub(crate) struct FinishedRow {
    #[sqlx(flatten)]
    pub entry: EntryRow,
    pub has_waiters: bool,
}

impl TryFrom<FinishedRow> for Finished {
    type Error = StoreError;

    fn try_from(r: FinishedRow) -> StoreResult<Finished> {
        Ok(Finished {
            entry: Entry::try_from(r.entry)?,
            has_waiters: r.has_waiters,
        })
    }
}

/// [`UnresolvedCount`]'s row, as `COUNT_UNRESOLVED` answers it.
#[derive(sqlx::FromRow)]
pub(crate) struct UnresolvedCountRow {
    pub unknown: i64,
    pub attempting: i64,
    pub awaiting_approval: i64,
    pub possible_double_effect: i64,
}

impl From<UnresolvedCountRow> for UnresolvedCount {
    fn from(r: UnresolvedCountRow) -> UnresolvedCount {
        UnresolvedCount {
            unknown: r.unknown,
            attempting: r.attempting,
            awaiting_approval: r.awaiting_approval,
            possible_double_effect: r.possible_double_effect,
        }
    }
}
