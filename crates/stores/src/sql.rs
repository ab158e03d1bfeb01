//! The statements both backends run. PostgreSQL and SQLite (through sqlx, which maps `$N` to
//! SQLite's numbered parameters) accept the same text, so the claim path is written once.
//! Every statement is a single atomic statement; its `WHERE` clause is the compare-and-set,
//! the one [`cas`](crate::domain::entry::cas) names in Rust for each write.

use const_format::{concatcp, str_replace};

use crate::domain::{Entry, Tenant};

mod approvals;
mod text;

pub use approvals::*;
pub(crate) use approvals::{PAUSE_END_PLUS_RETENTION, kept};

pub(crate) use text::Text;

/// One column a claim writes: its name, its PostgreSQL type (for the multi-row insert's
/// arrays) and how an entry (with its tenant) gives its value.
pub(crate) struct Column {
    /// The column's name in `ledger_entries`.
    pub name: &'static str,
    /// Its PostgreSQL type, as `UNNEST`'s array casts name it.
    pub pg_type: &'static str,
    /// Its value for an entry of a tenant.
    pub value: for<'a> fn(&'a Tenant, &'a Entry) -> Param<'a>,
}

/// **The one list of the columns a claim writes**, in the order of every statement that writes
/// a claim ([`INSERT`], [`RESTART`], [`INSERT_REQUEST`], [`REQUEST_AGAIN`], PostgreSQL's
/// multi-row insert) and of their parameters `$1`…: those statements' column lists, their
/// placeholders and the parameters they bind ([`entry_params`]) are all built from it. A
/// column a claim writes is its migration in each backend, a field of [`Entry`] and of
/// [`EntryRow`](super::EntryRow), and one line here. `tenant` and `key` come first and
/// `arguments` last (the statements that change an entry in place set the others).
pub(crate) const CLAIM: &[Column] = &[
    col("tenant", "text", |t, _| Param::Text(t.as_str())),
    col("key", "text", |_, e| Param::Text(e.key.as_str())),
    // An entry without a run stores the empty text (the column is NOT NULL).
    col("run_id", "text", |_, e| {
        Param::Text(e.run_id.as_ref().map_or("", |r| r.as_str()))
    }),
    col("tool", "text", |_, e| Param::Text(e.tool.as_str())),
    col("fingerprint", "text", |_, e| Param::Text(&e.fingerprint)),
    col("status", "text", |_, e| Param::Text(e.status.as_str())),
    col("attempt", "int8", |_, e| Param::Int(i64::from(e.attempt))),
    col("claim_token", "text", |_, e| {
        Param::Text(e.claim_token.as_str())
    }),
    col("result", "bytea", |_, e| Param::Bytes(&e.result)),
    col("error", "text", |_, e| Param::Text(&e.error)),
    col("retryable", "bool", |_, e| Param::Flag(e.retryable)),
    col("principal", "text", |_, e| {
        Param::Text(e.principal.as_str())
    }),
    col("started_at", "int8", |_, e| Param::Int(e.started_at.0)),
    col("finished_at", "int8", |_, e| {
        Param::MaybeInt(e.finished_at.map(|m| m.0))
    }),
    col("lease_expires_at", "int8", |_, e| {
        Param::Int(e.lease_expires_at.0)
    }),
    col("retention_us", "int8", |_, e| Param::Int(e.retention.0)),
    col("expires_at", "int8", |_, e| {
        Param::MaybeInt(e.expires_at.map(|m| m.0))
    }),
    col("replay_count", "int8", |_, e| {
        Param::Int(i64::try_from(e.replay_count).unwrap_or(i64::MAX))
    }),
    col("arguments", "text", |_, e| {
        Param::MaybeText(e.arguments.as_deref())
    }),
];

/// A [`Column`] of [`CLAIM`].
const fn col(
    name: &'static str,
    pg_type: &'static str,
    value: for<'a> fn(&'a Tenant, &'a Entry) -> Param<'a>,
) -> Column {
    Column {
        name,
        pg_type,
        value,
    }
}

/// How many columns a claim writes: the parameters `$1`..`$CLAIM_WIDTH` of [`INSERT`].
pub(crate) const CLAIM_WIDTH: usize = CLAIM.len();

/// [`CLAIM`] but `tenant` and `key`: what a statement that changes an entry in place sets.
const IN_PLACE: &[Column] = CLAIM.split_at(2).1;

/// [`IN_PLACE`] but `arguments`: an entry's stored fields as every statement returns them.
const FIELDS_LIST: &[Column] = IN_PLACE.split_at(IN_PLACE.len() - 1).0;

static FIELDS_TEXT: Text = Text::new().names(FIELDS_LIST, "");
/// An entry's stored fields besides its key and those only some statements read or write
/// (`arguments`, and the columns of [`ENTRY_COLUMNS`] after these), in
/// [`EntryRow`](super::EntryRow)'s order.
const FIELDS: &str = FIELDS_TEXT.as_str();

static INSERT_COLUMNS_TEXT: Text = Text::new().names(CLAIM, "");
/// The columns a claim writes, in the claim's column list's order: `$1`.. of [`INSERT`].
pub const INSERT_COLUMNS: &str = INSERT_COLUMNS_TEXT.as_str();

static INSERT_VALUES_TEXT: Text = Text::new().placeholders(1, CLAIM_WIDTH);
/// [`INSERT`]'s placeholders: `$1, $2, …` one per column of [`CLAIM`].
pub(crate) const INSERT_VALUES: &str = INSERT_VALUES_TEXT.as_str();

static IN_PLACE_NAMES_TEXT: Text = Text::new().names(IN_PLACE, "");
/// The columns of [`IN_PLACE`].
pub(crate) const IN_PLACE_NAMES: &str = IN_PLACE_NAMES_TEXT.as_str();

static IN_PLACE_VALUES_TEXT: Text = Text::new().placeholders(3, IN_PLACE.len());
/// The placeholders of [`IN_PLACE`] (`$3`..), each bound as [`INSERT`] binds it.
pub(crate) const IN_PLACE_VALUES: &str = IN_PLACE_VALUES_TEXT.as_str();

static NEXT1_TEXT: Text = Text::new().placeholder(CLAIM_WIDTH + 1);
/// The first placeholder after a claim's, for the statements that bind more than a claim.
pub(crate) const NEXT1: &str = NEXT1_TEXT.as_str();
static NEXT2_TEXT: Text = Text::new().placeholder(CLAIM_WIDTH + 2);
/// The second.
pub(crate) const NEXT2: &str = NEXT2_TEXT.as_str();
static NEXT3_TEXT: Text = Text::new().placeholder(CLAIM_WIDTH + 3);
/// The third.
pub(crate) const NEXT3: &str = NEXT3_TEXT.as_str();

/// The columns of `EntryRow`, for `RETURNING` clauses: the claim's columns and those that
/// only reconciliation writes (a claim leaves them at their defaults).
pub const ENTRY_COLUMNS: &str = concatcp!(
    "key, ",
    FIELDS,
    ", resolved_by, hold_token, possible_double_effect, ",
    APPROVAL_COLUMNS
);

/// An entry's approval (migration 0008), in the order the store's row reader takes it.
pub const APPROVAL_COLUMNS: &str = "approval_state, approval_requested_at, approval_decide_by, \
    approval_decided_at, approval_decided_by, approval_reason, approval_execute_by";

/// [`ENTRY_COLUMNS`] of the table aliased `e` (in a statement whose `FROM` has columns of the
/// same names).
pub const E_ENTRY_COLUMNS: &str = concatcp!("e.", str_replace!(ENTRY_COLUMNS, ", ", ", e."));

/// Claims a key: the primary key on (tenant, key) decides among concurrent claimants.
pub const INSERT: &str = concatcp!(
    "INSERT INTO ledger_entries (",
    INSERT_COLUMNS,
    ") VALUES (",
    INSERT_VALUES,
    ") ON CONFLICT (tenant, key) DO NOTHING"
);

/// Reads one entry, with its stored arguments.
pub const GET: &str = concatcp!(
    "SELECT ",
    ENTRY_COLUMNS,
    ", arguments FROM ledger_entries WHERE tenant = $1 AND key = $2"
);

/// Starts a new attempt on a resolved entry that still carries the token the caller saw
/// ([`cas::restarts`](crate::domain::entry::cas::restarts)): the columns of [`INSERT`] but
/// the key, bound alike. The new attempt has no waiters yet (those of the last one were
/// answered by its outcome), and no hold: a finding about an earlier attempt, or about the
/// same key before it expired and started over, names a hold this attempt never had. A mark
/// of a possible double effect stays: it is about the intent, whatever attempt comes next.
pub const RESTART: &str = concatcp!(
    "UPDATE ledger_entries SET (",
    IN_PLACE_NAMES,
    ", has_waiters, resolved_by, hold_token) = (",
    IN_PLACE_VALUES,
    ", FALSE, '', '') WHERE tenant = $1 AND key = $2 AND claim_token = ",
    NEXT1,
    " AND status IN ('SUCCEEDED', 'FAILED')"
);

/// Records a claimant's outcome `$4` at `$8`, fenced by the claim token and the entry being
/// ATTEMPTING (or also UNKNOWN when `$9`). A resolved outcome sets `finished_at` and
/// `expires_at` from the entry's own retention (kept longer while its run is paused: `kept!`),
/// so the statement needs no prior read. An
/// UNKNOWN report ends the lease at `$8` if it had not ended yet: from then on the outcome is
/// unknown, and the reconcile grace counts from there (see `TAKABLE`). Returns the entry as
/// written and whether a claim waits for it. Applies as
/// [`cas::finishes`](crate::domain::entry::cas::finishes) says.
pub const FINISH: &str = concatcp!(
    "UPDATE ledger_entries AS e SET status = $4, result = $5, error = $6, retryable = $7, \
     finished_at = CASE WHEN $4 IN ('SUCCEEDED', 'FAILED') THEN $8 END, \
     expires_at = CASE WHEN $4 IN ('SUCCEEDED', 'FAILED') THEN ",
    kept!("$8 + e.retention_us"),
    " END, \
     lease_expires_at = CASE WHEN $4 = 'UNKNOWN' AND lease_expires_at > $8 THEN $8 \
     ELSE lease_expires_at END, \
     reconcile_until = NULL \
     WHERE tenant = $1 AND key = $2 AND claim_token = $3 \
     AND (status = 'ATTEMPTING' OR (status = 'UNKNOWN' AND $9)) \
     RETURNING ",
    ENTRY_COLUMNS,
    ", has_waiters"
);

/// What [`REPLAY`] sets; PostgreSQL's form puts a `FROM` clause after it (see
/// `PgStore::REPLAY`).
pub(crate) const REPLAY_SET: &str = "UPDATE ledger_entries SET replay_count = replay_count + 1";

/// Which entry [`REPLAY`] counts, and what it returns.
pub(crate) const REPLAY_WHERE: &str = concatcp!(
    " WHERE tenant = $1 AND key = $2 AND status = 'SUCCEEDED' AND fingerprint = $3 \
     AND expires_at > $4 RETURNING ",
    ENTRY_COLUMNS
);

/// Counts a replay of a result that is still there for this request: SUCCEEDED, the same
/// fingerprint `$3`, not expired at `$4`
/// ([`cas::replays`](crate::domain::entry::cas::replays)). Returns the entry with its new count. The read
/// that answers the replay and the count are one statement, so concurrent replays of a key
/// are numbered one by one. Only the count is written, so its commit need not wait for the
/// disk: SQLite runs this on a connection that does not sync its commits, PostgreSQL runs
/// `PgStore::REPLAY`, this with the commit's flush turned off.
pub const REPLAY: &str = concatcp!(REPLAY_SET, REPLAY_WHERE);

/// Adds `$4` replays to the count of the attempt holding token `$3`, while it is SUCCEEDED
/// (the replays a server answered from memory; see `ledger::replay_memory`).
pub const ADD_REPLAYS: &str = "UPDATE ledger_entries SET replay_count = replay_count + $4 \
    WHERE tenant = $1 AND key = $2 AND claim_token = $3 AND status = 'SUCCEEDED'";

/// Extends the lease of the attempt holding token `$3` to `$4`, only while it is ATTEMPTING
/// and its lease has not ended at `$5` ([`cas::renews`](crate::domain::entry::cas::renews)). Returns the entry as written.
pub const RENEW: &str = concatcp!(
    "UPDATE ledger_entries SET lease_expires_at = $4 \
     WHERE tenant = $1 AND key = $2 AND claim_token = $3 AND status = 'ATTEMPTING' \
     AND lease_expires_at > $5 RETURNING ",
    ENTRY_COLUMNS
);

/// Records what a reconciler found about attempt `$11` under the hold `$12`, fenced by the
/// outcome being unknown at `$9` (reported UNKNOWN, or an attempt past its lease), the entry
/// still being at that attempt, and that hold still being its newest
/// ([`cas::resolves`](crate::domain::entry::cas::resolves)): a late finding about an earlier
/// attempt, or from a holder whose entry was handed out again since, changes nothing. `$10`
/// is who resolved it (the Reconcile's principal); `$8` its expiry, kept longer while its run is
/// paused (`kept!`). Returns whether a claim waits for it.
pub const RESOLVE: &str = concatcp!(
    "UPDATE ledger_entries AS e SET status = $3, result = $4, \
    error = $5, retryable = $6, finished_at = $7, expires_at = ",
    kept!("$8"),
    ", reconcile_until = NULL, \
    resolved_by = $10 \
    WHERE tenant = $1 AND key = $2 \
    AND (status = 'UNKNOWN' OR (status = 'ATTEMPTING' AND lease_expires_at <= $9)) \
    AND attempt = $11 AND hold_token = $12 \
    RETURNING has_waiters"
);

/// Appends an event to an entry's history ([`HistoryEvent`](crate::domain::HistoryEvent)):
/// tenant `$1`, key `$2`, at `$3`, attempt `$4`, kind `$5`, principal `$6`, detail `$7`.
pub const APPEND_HISTORY: &str = "INSERT INTO ledger_history \
    (tenant, key, at, attempt, kind, principal, detail) VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// An entry's history, oldest first.
pub const HISTORY: &str = "SELECT at, attempt, kind, principal, detail FROM ledger_history \
    WHERE tenant = $1 AND key = $2 ORDER BY id";

/// Marks a possible double effect on the entry, unless it started over since at an earlier
/// attempt than `$3` (the attempt the finding observed). Returns the entry's key.
pub const MARK_DOUBLE_EFFECT: &str = "UPDATE ledger_entries SET possible_double_effect = TRUE \
    WHERE tenant = $1 AND key = $2 AND attempt >= $3 RETURNING key";

/// Clears the mark of a possible double effect, only where it is set. Returns the entry.
/// (`IS TRUE` rather than the bare column: the bare one lets PostgreSQL's generic plan take
/// the partial index of marked entries instead of the primary key.)
pub const ACKNOWLEDGE_DOUBLE_EFFECT: &str = concatcp!(
    "UPDATE ledger_entries SET possible_double_effect = FALSE \
     WHERE tenant = $1 AND key = $2 AND possible_double_effect IS TRUE RETURNING ",
    ENTRY_COLUMNS
);

/// Up to `$2` of tenant `$1`'s entries marked as a possible double effect, oldest first (the
/// partial index of migration 0007).
pub const DOUBLE_EFFECTS: &str = concatcp!(
    "SELECT ",
    ENTRY_COLUMNS,
    ", arguments FROM ledger_entries WHERE tenant = $1 AND possible_double_effect \
     ORDER BY started_at, key LIMIT $2"
);

/// Notes that a claim waits for this attempt (or for this call's decision), so its completion
/// (or the decision) is announced to other servers.
pub const MARK_WAITING: &str = "UPDATE ledger_entries SET has_waiters = TRUE \
    WHERE tenant = $1 AND key = $2 AND status IN ('ATTEMPTING', 'AWAITING_APPROVAL') \
    AND NOT has_waiters";

/// Counts a call at `$3` in tenant `$1`'s intent window of the call `$2` (migration 0009) and
/// returns its generation: the first call's is 1; a call less than `$4` after the last one (or
/// any call when `$5`, a call of it being unresolved) keeps the generation, a later one takes
/// the next. The primary key serializes concurrent calls, so they get one generation.
pub const INTENT_GENERATION: &str = "INSERT INTO ledger_intent_windows \
    (tenant, fingerprint, generation, last_seen) VALUES ($1, $2, 1, $3) \
    ON CONFLICT (tenant, fingerprint) DO UPDATE SET \
    generation = ledger_intent_windows.generation + CASE \
        WHEN NOT $5 AND ledger_intent_windows.last_seen + $4 <= $3 THEN 1 ELSE 0 END, \
    last_seen = CASE WHEN ledger_intent_windows.last_seen > $3 \
        THEN ledger_intent_windows.last_seen ELSE $3 END \
    RETURNING generation";

/// The current generation of tenant `$1`'s intent window of the call `$2` and when the last
/// identical call came, if any did.
pub const CURRENT_INTENT: &str = "SELECT generation, last_seen FROM ledger_intent_windows \
    WHERE tenant = $1 AND fingerprint = $2";

/// Upserts the write probe's row (see migration 0005).
pub const PROBE_WRITE: &str = "INSERT INTO ledger_write_probe (id, filler) VALUES (1, $1) \
    ON CONFLICT (id) DO UPDATE SET filler = excluded.filler";

/// Deletes the write probe's row again.
pub const PROBE_DELETE: &str = "DELETE FROM ledger_write_probe WHERE id = 1";

/// Counts every tenant's unresolved entries at `$1`, split by what callers are told: UNKNOWN
/// (reported, or an attempt past its lease), ATTEMPTING (in its lease) and AWAITING_APPROVAL
/// (a person has been asked, and the request or approval has not lapsed: a lapsed one reads as
/// a retryable failure, recorded or not). `expires_at IS NULL`
/// is exactly "unresolved" (the CHECK constraint resolved_entries_expire) and matches the
/// partial index `ledger_entries_unresolved_by_start`, so the count reads only the backlog.
/// SUM over CASE rather than FILTER: the same text runs on both backends. Also the entries
/// marked as a possible double effect, resolved or not (their own partial index).
pub const COUNT_UNRESOLVED: &str = "SELECT \
    COALESCE(SUM(CASE WHEN status = 'UNKNOWN' OR (status = 'ATTEMPTING' AND lease_expires_at <= $1) \
        THEN 1 ELSE 0 END), 0) AS unknown, \
    COALESCE(SUM(CASE WHEN status = 'ATTEMPTING' AND lease_expires_at > $1 THEN 1 ELSE 0 END), 0) \
        AS attempting, \
    COALESCE(SUM(CASE WHEN status = 'AWAITING_APPROVAL' \
        AND COALESCE(approval_execute_by, approval_decide_by) > $1 THEN 1 ELSE 0 END), 0) \
        AS awaiting_approval, \
    (SELECT COUNT(*) FROM ledger_entries WHERE possible_double_effect) \
        AS possible_double_effect \
    FROM ledger_entries WHERE expires_at IS NULL";

/// Which entries a reconciler may take at `$2`, after the tenant: outcome unknown since `$7`
/// at the latest (the end of its lease, which a claimant's UNKNOWN report sets to the time of
/// the report, at or before `$7` = `$2` minus the reconcile grace: an action may still be
/// landing in the outside world right after its lease ended, and a read then could miss it),
/// started at or before `$3`, of tool `$4` (or any when empty), not held by another
/// reconciler.
const TAKABLE: &str = "status IN ('UNKNOWN', 'ATTEMPTING') AND lease_expires_at <= $7 \
     AND started_at <= $3 AND ($4 = '' OR tool = $4) \
     AND (reconcile_until IS NULL OR reconcile_until <= $2)";

/// The unresolved entries of tenant `$1` a reconciler may take ([`TAKABLE`]). `expires_at IS
/// NULL` (true of every unresolved entry) is what lets the pick use the partial index
/// `ledger_entries_unresolved_by_start`; no statement on one entry says it, so their plans keep
/// to the primary key (migration 0003).
pub(crate) const UNRESOLVED_WHERE: &str =
    concatcp!("tenant = $1 AND expires_at IS NULL AND ", TAKABLE);

/// Takes one named unresolved entry (key `$5`) for a reconciler until `$6` under the new hold
/// `$8`, on the conditions of `TAKABLE` (at `$2`, started by `$3`, of tool `$4`, unknown since
/// `$7`): a Reconcile with `keys` settles these entries and takes no other. A statement on one entry: it does not say `expires_at IS
/// NULL` (the status test implies it), so that its plan keeps to the primary key rather than
/// the unresolved index (migration 0003; tests/api/plans.rs).
pub const TAKE_KEY: &str = concatcp!(
    "UPDATE ledger_entries SET reconcile_until = $6, hold_token = $8 \
     WHERE tenant = $1 AND key = $5 AND ",
    TAKABLE,
    " RETURNING ",
    ENTRY_COLUMNS
);

/// The filters and cursor of a listing (see [`LIST`]): tool `$3` (any when empty), status `$4`
/// as Lookup reports it at `$10` (any when empty; an attempt past its lease is UNKNOWN, a call
/// whose request or approval lapsed is FAILED),
/// started in [`$5`, `$6`), marked as a possible double effect when `$11`, and after the
/// cursor (`$7` started_at, `$8` key) in the listing's order, by started_at and then key.
const LIST_FILTER: &str = "($3 = '' OR tool = $3) \
     AND (NOT $11 OR possible_double_effect) \
     AND ($4 = '' \
          OR (status = $4 AND (status <> 'ATTEMPTING' OR lease_expires_at > $10) \
              AND (status <> 'AWAITING_APPROVAL' \
                   OR COALESCE(approval_execute_by, approval_decide_by) > $10)) \
          OR ($4 = 'UNKNOWN' AND status = 'ATTEMPTING' AND lease_expires_at <= $10) \
          OR ($4 = 'FAILED' AND status = 'AWAITING_APPROVAL' \
              AND COALESCE(approval_execute_by, approval_decide_by) <= $10)) \
     AND started_at >= $5 AND started_at < $6 \
     AND (started_at > $7 OR (started_at = $7 AND key > $8)) \
     ORDER BY started_at, key LIMIT $9";

/// A page of one run's entries (run `$2`), with their stored arguments; see `LIST_FILTER`.
/// The run's own statement, so that its plan can use the (tenant, run_id, started_at, key)
/// index: a generic plan cannot when the run is an optional filter.
pub const LIST_RUN: &str = concatcp!(
    "SELECT ",
    ENTRY_COLUMNS,
    ", arguments FROM ledger_entries WHERE tenant = $1 AND run_id = $2 AND ",
    LIST_FILTER
);

/// A page of a tenant's entries of any run (`$2` is empty), with their stored arguments; see
/// `LIST_FILTER`.
pub const LIST: &str = concatcp!(
    "SELECT ",
    ENTRY_COLUMNS,
    ", arguments FROM ledger_entries WHERE tenant = $1 AND $2 = '' AND ",
    LIST_FILTER
);

/// A statement a write runs after it, in its transaction, when the write applied (see
/// `Dialect::write_noted`): its text and parameters.
pub(crate) struct Also<'a> {
    /// The statement.
    pub statement: &'static str,
    /// Its parameters, `$1`…
    pub params: Vec<Param<'a>>,
}

/// A database that takes every type an entry's columns bind as (both backends), borrowed
/// for `'a`.
pub(crate) trait Columns<'a>: sqlx::Database {
    /// Adds `value` as the next parameter to `args`.
    ///
    /// # Errors
    /// When the value cannot be encoded (a bug).
    fn add(args: &mut Self::Arguments, value: Param<'a>) -> Result<(), sqlx::error::BoxDynError>;
}

/// One parameter of a statement, of the types an entry's columns take.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Param<'a> {
    Text(&'a str),
    MaybeText(Option<&'a str>),
    Bytes(&'a [u8]),
    Int(i64),
    MaybeInt(Option<i64>),
    Flag(bool),
}

impl<'a, DB> Columns<'a> for DB
where
    DB: sqlx::Database,
    &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    Option<&'a str>: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    &'a [u8]: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    bool: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    fn add(args: &mut DB::Arguments, value: Param<'a>) -> Result<(), sqlx::error::BoxDynError> {
        use sqlx::Arguments as _;
        match value {
            Param::Text(v) => args.add(v),
            Param::MaybeText(v) => args.add(v),
            Param::Bytes(v) => args.add(v),
            Param::Int(v) => args.add(v),
            Param::MaybeInt(v) => args.add(v),
            Param::Flag(v) => args.add(v),
        }
    }
}

/// The arguments of a statement: `params` in order, as `$1`, `$2`, ….
///
/// # Errors
/// `sqlx::Error::Encode` when a value cannot be encoded (a bug).
pub(crate) fn arguments<'a, DB: Columns<'a>>(
    params: impl IntoIterator<Item = Param<'a>>,
) -> Result<DB::Arguments, sqlx::Error> {
    let mut args = DB::Arguments::default();
    for param in params {
        DB::add(&mut args, param).map_err(sqlx::Error::Encode)?;
    }
    Ok(args)
}

/// An entry's columns with its tenant, as [`CLAIM`] gives them (`$1`..`$CLAIM_WIDTH`).
pub(crate) fn entry_params<'a>(tenant: &'a Tenant, e: &'a Entry) -> [Param<'a>; CLAIM_WIDTH] {
    std::array::from_fn(|i| (CLAIM[i].value)(tenant, e))
}

/// A [`Finish`](super::Finish) as [`FINISH`]'s `$1`..`$9`.
pub(crate) fn finish_params<'a>(tenant: &'a Tenant, cmd: &'a super::Finish) -> [Param<'a>; 9] {
    use Param::{Bytes, Flag, Int, Text};
    [
        Text(tenant.as_str()),
        Text(cmd.key.as_str()),
        Text(cmd.claim_token.as_str()),
        Text(cmd.completion.status().as_str()),
        Bytes(cmd.completion.result()),
        Text(cmd.completion.error()),
        Flag(cmd.completion.retryable()),
        Int(cmd.now.0),
        Flag(cmd.also_unknown),
    ]
}

/// A history event of (tenant, key) as [`APPEND_HISTORY`]'s `$1`..`$7`.
pub(crate) fn history_params<'a>(
    tenant: &'a Tenant,
    key: &'a crate::domain::Key,
    event: &'a crate::domain::HistoryEvent,
) -> [Param<'a>; 7] {
    use Param::{Int, Text};
    [
        Text(tenant.as_str()),
        Text(key.as_str()),
        Int(event.at.0),
        Int(i64::from(event.attempt)),
        Text(event.kind.as_str()),
        Text(event.principal.as_str()),
        Text(&event.detail),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::domain::{
        Approval, ClaimToken, HoldToken, Key, Micros, Principal, RunId, Status, ToolName,
    };

    /// An entry with every optional field set (`full`) or none.
    fn entry(full: bool) -> Entry {
        Entry {
            key: Key::from_stored("k".into()),
            run_id: full.then(|| RunId::from_stored("run".into())),
            tool: ToolName::from_stored("tool".into()),
            fingerprint: "fp".into(),
            status: Status::Attempting,
            attempt: 1,
            claim_token: ClaimToken::from_stored("t".into()),
            result: b"r".to_vec(),
            error: String::new(),
            retryable: full,
            principal: Principal::none(),
            started_at: Micros(1),
            finished_at: full.then_some(Micros(2)),
            lease_expires_at: Micros(3),
            retention: Micros(4),
            expires_at: full.then_some(Micros(5)),
            replay_count: 0,
            arguments: full.then(|| "{}".to_owned()),
            resolved_by: Principal::none(),
            hold_token: HoldToken::none(),
            possible_double_effect: false,
            approval: Approval::default(),
        }
    }

    /// The PostgreSQL type a parameter of this kind binds as.
    fn pg_type(p: Param<'_>) -> &'static str {
        match p {
            Param::Text(_) | Param::MaybeText(_) => "text",
            Param::Bytes(_) => "bytea",
            Param::Int(_) | Param::MaybeInt(_) => "int8",
            Param::Flag(_) => "bool",
        }
    }

    /// The distinct `$n` of a statement.
    fn placeholders(statement: &str) -> BTreeSet<usize> {
        statement
            .split('$')
            .skip(1)
            .filter_map(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().ok()
            })
            .collect()
    }

    #[test]
    fn every_claim_column_gives_one_kind_of_value_the_type_its_array_is_cast_to() {
        let tenant = crate::domain::Tenant::default_tenant();
        let (full, bare) = (entry(true), entry(false));
        for column in CLAIM {
            let (a, b) = (
                (column.value)(&tenant, &full),
                (column.value)(&tenant, &bare),
            );
            assert_eq!(
                std::mem::discriminant(&a),
                std::mem::discriminant(&b),
                "{}",
                column.name
            );
            assert_eq!(pg_type(a), column.pg_type, "{}", column.name);
        }
    }

    #[test]
    fn every_statement_that_writes_a_claim_names_each_column_and_numbers_its_parameters() {
        let names = |columns: &[Column]| columns.iter().map(|c| c.name).collect::<Vec<_>>();
        let upto = |n: usize| (1..=n).collect::<BTreeSet<_>>();
        let many = crate::storage::postgres::PgStore::INSERT_MANY;
        for (statement, columns, parameters) in [
            (INSERT, CLAIM, CLAIM_WIDTH),
            (many, CLAIM, CLAIM_WIDTH),
            (INSERT_REQUEST, CLAIM, CLAIM_WIDTH + 2),
            (RESTART, IN_PLACE, CLAIM_WIDTH + 1),
            (REQUEST_AGAIN, IN_PLACE, CLAIM_WIDTH + 3),
        ] {
            for name in names(columns) {
                assert!(
                    statement.contains(&format!(" {name},"))
                        || statement.contains(&format!("({name},"))
                        || statement.contains(&format!(" {name})")),
                    "{name} missing from {statement}"
                );
            }
            assert_eq!(placeholders(statement), upto(parameters), "{statement}");
        }
        assert_eq!(
            entry_params(&crate::domain::Tenant::default_tenant(), &entry(true)).len(),
            CLAIM_WIDTH
        );
        assert!(INSERT.ends_with(&format!(
            "${CLAIM_WIDTH}) ON CONFLICT (tenant, key) DO NOTHING"
        )));
    }
}
