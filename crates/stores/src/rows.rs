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

impl<'r, R> sqlx::FromRow<'r, R> for EntryRow
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    /// The fields in [`sql::ENTRY_COLUMNS`](crate::sql::ENTRY_COLUMNS)'s order, each found
    /// where the statement lists it ([`Cursor`]).
    fn from_row(row: &'r R) -> Result<EntryRow, sqlx::Error> {
        let mut c = Cursor { row, next: 0 };
        Ok(EntryRow {
            key: c.get("key")?,
            run_id: c.get("run_id")?,
            tool: c.get("tool")?,
            fingerprint: c.get("fingerprint")?,
            status: c.get("status")?,
            attempt: c.get("attempt")?,
            claim_token: c.get("claim_token")?,
            result: c.get("result")?,
            error: c.get("error")?,
            retryable: c.get("retryable")?,
            principal: c.get("principal")?,
            started_at: c.get("started_at")?,
            finished_at: c.get("finished_at")?,
            lease_expires_at: c.get("lease_expires_at")?,
            retention_us: c.get("retention_us")?,
            expires_at: c.get("expires_at")?,
            replay_count: c.get("replay_count")?,
            arguments: c.get_if_selected("arguments")?,
            resolved_by: c.get("resolved_by")?,
            hold_token: c.get("hold_token")?,
            possible_double_effect: c.get("possible_double_effect")?,
            approval_state: c.get("approval_state")?,
            approval_requested_at: c.get("approval_requested_at")?,
            approval_decide_by: c.get("approval_decide_by")?,
            approval_decided_at: c.get("approval_decided_at")?,
            approval_decided_by: c.get("approval_decided_by")?,
            approval_reason: c.get("approval_reason")?,
            approval_execute_by: c.get("approval_execute_by")?,
        })
    }
}

/// Reads a row's columns by position, where the statement lists them in the order they are
/// asked for (every statement lists [`sql::ENTRY_COLUMNS`](crate::sql::ENTRY_COLUMNS) so):
/// a name compared at the expected place, where sqlx's read by name hashed each name into the
/// row's map of them, on every row of every call. A column listed elsewhere is found by a scan
/// of the row's names; the value is then read by sqlx with its usual type check.
struct Cursor<'r, R> {
    row: &'r R,
    /// Where the next column is expected: just after the last one found.
    next: usize,
}

impl<'r, R> Cursor<'r, R>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
{
    /// Where the row has the column `name`, if it has it.
    fn position(&mut self, name: &str) -> Option<usize> {
        use sqlx::Column as _;
        let columns = self.row.columns();
        let at = match columns.get(self.next) {
            Some(column) if column.name() == name => self.next,
            _ => columns.iter().position(|column| column.name() == name)?,
        };
        self.next = at + 1;
        Some(at)
    }

    /// The column `name`, which the statement must select.
    fn get<T>(&mut self, name: &'static str) -> Result<T, sqlx::Error>
    where
        T: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        let at = self
            .position(name)
            .ok_or_else(|| sqlx::Error::ColumnNotFound(name.to_owned()))?;
        self.row.try_get(at)
    }

    /// The column `name`, or `None` from a statement that does not select it.
    fn get_if_selected<T>(&mut self, name: &'static str) -> Result<Option<T>, sqlx::Error>
    where
        T: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        match self.position(name) {
            Some(at) => self.row.try_get(at),
            None => Ok(None),
        }
    }
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

    /// A row as every statement lists it: [`sql::ENTRY_COLUMNS`](crate::sql::ENTRY_COLUMNS)'s
    /// order, without `arguments`.
    const IN_ORDER: &str = "SELECT 'k' AS key, 'r' AS run_id, 't' AS tool, 'f' AS fingerprint, \
        'SUCCEEDED' AS status, 2 AS attempt, 'tok' AS claim_token, x'00ff' AS result, \
        'e' AS error, 1 AS retryable, 'p' AS principal, 10 AS started_at, 11 AS finished_at, \
        12 AS lease_expires_at, 13 AS retention_us, 14 AS expires_at, 3 AS replay_count, \
        'rb' AS resolved_by, 'h' AS hold_token, 1 AS possible_double_effect, \
        'APPROVED' AS approval_state, 5 AS approval_requested_at, 6 AS approval_decide_by, \
        NULL AS approval_decided_at, 'a' AS approval_decided_by, 'why' AS approval_reason, \
        NULL AS approval_execute_by";

    /// The same columns in the opposite order, with `arguments` among them.
    const REORDERED: &str = "SELECT NULL AS approval_execute_by, 'why' AS approval_reason, \
        'a' AS approval_decided_by, NULL AS approval_decided_at, 6 AS approval_decide_by, \
        5 AS approval_requested_at, 'APPROVED' AS approval_state, \
        1 AS possible_double_effect, 'h' AS hold_token, 'rb' AS resolved_by, \
        '{\"a\":1}' AS arguments, 3 AS replay_count, 14 AS expires_at, 13 AS retention_us, \
        12 AS lease_expires_at, 11 AS finished_at, 10 AS started_at, 'p' AS principal, \
        1 AS retryable, 'e' AS error, x'00ff' AS result, 'tok' AS claim_token, 2 AS attempt, \
        'SUCCEEDED' AS status, 'f' AS fingerprint, 't' AS tool, 'r' AS run_id, 'k' AS key";

    /// [`IN_ORDER`] without `hold_token`.
    const MISSING: &str = "SELECT 'k' AS key, 'r' AS run_id, 't' AS tool, 'f' AS fingerprint, \
        'SUCCEEDED' AS status, 2 AS attempt, 'tok' AS claim_token, x'00ff' AS result, \
        'e' AS error, 1 AS retryable, 'p' AS principal, 10 AS started_at, 11 AS finished_at, \
        12 AS lease_expires_at, 13 AS retention_us, 14 AS expires_at, 3 AS replay_count, \
        'rb' AS resolved_by, 1 AS possible_double_effect, 'APPROVED' AS approval_state, \
        5 AS approval_requested_at, 6 AS approval_decide_by, NULL AS approval_decided_at, \
        'a' AS approval_decided_by, 'why' AS approval_reason, NULL AS approval_execute_by";

    #[tokio::test]
    async fn a_row_is_read_by_its_column_names_in_any_order() {
        use sqlx::{Column as _, Connection as _, Row as _};
        let mut db = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .expect("in-memory SQLite");
        let row = sqlx::query(self::IN_ORDER)
            .fetch_one(&mut db)
            .await
            .expect("row");
        let names: Vec<&str> = row.columns().iter().map(|c| c.name()).collect();
        assert_eq!(
            names.join(", "),
            crate::sql::ENTRY_COLUMNS,
            "the statements' order"
        );
        let in_order = Entry::try_from(
            sqlx::query_as::<_, EntryRow>(self::IN_ORDER)
                .fetch_one(&mut db)
                .await
                .expect("in order"),
        )
        .expect("entry");
        assert_eq!(
            (
                in_order.key.as_str(),
                in_order.run_id_str(),
                in_order.result.as_slice()
            ),
            ("k", "r", &[0x00, 0xff][..])
        );
        assert_eq!(
            (
                in_order.replay_count,
                in_order.lease_expires_at.0,
                in_order.hold_token.as_str()
            ),
            (3, 12, "h")
        );
        assert_eq!(in_order.arguments, None, "not selected");
        let reordered = Entry::try_from(
            sqlx::query_as::<_, EntryRow>(self::REORDERED)
                .fetch_one(&mut db)
                .await
                .expect("reordered"),
        )
        .expect("entry");
        assert_eq!(reordered.arguments.as_deref(), Some(r#"{"a":1}"#));
        assert_eq!(
            Entry {
                arguments: None,
                ..reordered
            },
            in_order,
            "the same fields, wherever listed"
        );
        match sqlx::query_as::<_, EntryRow>(self::MISSING)
            .fetch_one(&mut db)
            .await
        {
            Err(sqlx::Error::ColumnNotFound(name)) => assert_eq!(name, "hold_token"),
            other => panic!("a missing column is an error: {:?}", other.map(|_| ())),
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
