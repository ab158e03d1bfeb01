//! Durable entries behind one [`Store`] trait, implemented by [`postgres::PgStore`] (production;
//! several servers may share one database) and [`sqlite::SqliteStore`] (the embedded default).
//!
//! A store makes no decisions: it applies the writes the domain chose, each one a single atomic
//! statement whose `WHERE` clause is the compare-and-set condition. The claim itself is an
//! `INSERT … ON CONFLICT DO NOTHING`: the primary key on (tenant, key) decides who wins, never a
//! read-then-write. Every write is a plain data command (an [`Entry`], a [`Finish`]), so
//! [`batch::GroupCommit`] collects the claims and completions that arrive while the store is
//! busy into one multi-row statement and one commit.
//!
//! `sqlx::Error` never leaves this module: it becomes [`StoreError`].

pub mod batch;
pub(crate) mod held;
pub mod postgres;
#[doc(hidden)]
pub mod sql;
pub mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;

use crate::domain::{Completion, Entry, Micros};

/// Why a store call failed: the cause the store could name, with the database's own words for
/// the log (never for the client). Only [`StoreError::Internal`] is a bug; every other variant
/// is a condition of the database or its host that an operator can act on, and that the
/// client is told apart by its own code and reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or did not answer in time: opening or using a
    /// connection failed, at whichever step (connect, the answer to TLS negotiation, the TLS
    /// handshake, the startup packet, authentication, a connection closed mid-statement).
    /// The caller may retry.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// No connection could be opened within the acquire timeout, and the pool kept no cause
    /// (it tries again after a refused connection, a database starting up or out of
    /// connection slots, until the timeout): what [`Operations::unreachable_cause`] finds
    /// out. Otherwise as [`StoreError::Unavailable`].
    #[error("store unavailable: {0}")]
    Unreachable(String),
    /// The database answers, but was busy: every connection the pool may open was in use by
    /// other calls until the acquire timeout (on SQLite: or another writer held its lock that
    /// long). Nothing was committed; the caller may retry.
    #[error("store busy: {0}")]
    Busy(String),
    /// The database reported an I/O error reading or writing its files; the write was not
    /// committed.
    #[error("store I/O error: {0}")]
    Io(String),
    /// The database's disk (or quota) is full; the write was not committed. Reads go on.
    #[error("store full: {0}")]
    Full(String),
    /// A deadlock or a serialization failure that the store's bounded retries did not get
    /// past; nothing was committed.
    #[error("store contention: {0}")]
    Contention(String),
    /// The connection reached a server that accepts no writes (a standby, or a file that
    /// cannot be written); the write was not committed.
    #[error("store read-only: {0}")]
    ReadOnly(String),
    /// The database reports its own files corrupt: an operator must restore them.
    #[error("store corrupt: {0}")]
    Corrupt(String),
    /// The server's settings do not fit the database it reached (a transaction pooler that
    /// `--postgres-pooler none` does not expect): the server refuses to start.
    #[error("store misconfigured: {0}")]
    Misconfigured(String),
    /// Anything else (a constraint we did not expect, a row we cannot read): a bug.
    #[error("store error: {0}")]
    Internal(String),
}

impl StoreError {
    /// A short stable name of the cause, for metrics labels and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) | StoreError::Unreachable(_) => "unavailable",
            StoreError::Busy(_) => "busy",
            StoreError::Io(_) => "io_error",
            StoreError::Full(_) => "full",
            StoreError::Contention(_) => "contention",
            StoreError::ReadOnly(_) => "read_only",
            StoreError::Corrupt(_) => "corrupt",
            StoreError::Misconfigured(_) => "misconfigured",
            StoreError::Internal(_) => "internal",
        }
    }

    /// Every kind, in the order metrics report them; `internal` last.
    pub const KINDS: [&'static str; 9] = [
        "unavailable",
        "busy",
        "io_error",
        "full",
        "contention",
        "read_only",
        "corrupt",
        "misconfigured",
        "internal",
    ];

    /// The same error with `context` before its detail (where the store was, what it did).
    pub fn context(self, context: &str) -> StoreError {
        let with = |detail: String| format!("{context}: {detail}");
        match self {
            StoreError::Unavailable(d) => StoreError::Unavailable(with(d)),
            StoreError::Unreachable(d) => StoreError::Unreachable(with(d)),
            StoreError::Busy(d) => StoreError::Busy(with(d)),
            StoreError::Io(d) => StoreError::Io(with(d)),
            StoreError::Full(d) => StoreError::Full(with(d)),
            StoreError::Contention(d) => StoreError::Contention(with(d)),
            StoreError::ReadOnly(d) => StoreError::ReadOnly(with(d)),
            StoreError::Corrupt(d) => StoreError::Corrupt(with(d)),
            StoreError::Misconfigured(d) => StoreError::Misconfigured(with(d)),
            StoreError::Internal(d) => StoreError::Internal(with(d)),
        }
    }

    /// Whether the connection that produced this error should not be used again: after an
    /// I/O error, a full disk or a read-only server, the session may hold a half-rolled-back
    /// transaction (SQLite) or point at a demoted primary (PostgreSQL).
    pub(crate) fn poisons_connection(&self) -> bool {
        matches!(
            self,
            StoreError::Io(_) | StoreError::Full(_) | StoreError::ReadOnly(_)
        )
    }

    /// The errors sqlx reports outside any database's answer while a statement runs on a
    /// live connection, the same for both backends. The link failed (an I/O error of any
    /// kind: reset, closed mid-message, timed out; a broken TLS session; SQLite's worker
    /// thread gone): unavailable. What sqlx cannot encode or decode, or a message out of
    /// place in the protocol (`Protocol`: too many parameters, a message over the protocol's
    /// size, a reply the driver did not expect), is a bug of ours or of the driver: internal.
    fn from_client(err: &sqlx::Error) -> StoreError {
        use sqlx::Error as E;
        match err {
            E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::Tls(_) | E::WorkerCrashed => {
                StoreError::Unavailable(err.to_string())
            }
            _ => StoreError::Internal(err.to_string()),
        }
    }

    /// Classifies a failure to lend a connection ([`held::Connections::acquire`]): the pool
    /// was busy, or opening a connection failed.
    pub(crate) fn from_acquire(
        err: held::AcquireError,
        classify: impl FnOnce(sqlx::Error) -> StoreError,
    ) -> StoreError {
        match err {
            held::AcquireError::Busy { waited, max } => StoreError::Busy(format!(
                "no database connection freed in time: waited {waited:?} \
                 (--db-acquire-timeout), while all {max} connections of the pool \
                 (--db-max-connections) were in use by other calls"
            )),
            held::AcquireError::Open(e) => StoreError::from_opening(e, classify),
        }
    }

    /// Classifies a failure to open a connection: always a condition of the database or of
    /// the way to it, never a bug, whichever step it died in. The database's own refusal
    /// (a wrong password, a missing database, too many connections, a pooler's words) is
    /// classified by its code with `classify` (what would be internal there is unavailable
    /// here); anything else sqlx reports there is unavailable, whatever its variant: an I/O
    /// error at connect, during the startup packet or authentication (a link reset or closed
    /// at any byte), a failed TLS handshake (`Tls`, or rustls' I/O errors), an answer that is
    /// no PostgreSQL's (`Protocol`: a proxy that accepted the connection and closed it before
    /// answering the SSLRequest is read as the byte 0x00), or a certificate or key file that
    /// cannot be read (`Configuration`). sqlx's pool timing out while it had room to open a
    /// connection is [`StoreError::Unreachable`].
    pub(crate) fn from_opening(
        err: sqlx::Error,
        classify: impl FnOnce(sqlx::Error) -> StoreError,
    ) -> StoreError {
        match err {
            sqlx::Error::PoolTimedOut => StoreError::Unreachable(
                "no connection could be opened within --db-acquire-timeout".to_string(),
            ),
            err @ sqlx::Error::Database(_) => match classify(err) {
                StoreError::Internal(detail) => StoreError::Unavailable(detail),
                other => other,
            },
            other => StoreError::Unavailable(format!("cannot open a connection: {other}")),
        }
    }
}

impl StoreError {
    /// Classifies a SQLite error by its primary result code (see [`StoreError::sqlite_code`]).
    pub(crate) fn from_sqlite(err: sqlx::Error) -> StoreError {
        match database_code(&err).and_then(|c| c.parse::<i32>().ok()) {
            Some(code) => StoreError::sqlite_code(code, err.to_string()),
            None => StoreError::from_client(&err),
        }
    }

    /// Classifies a PostgreSQL error by its SQLSTATE (see [`StoreError::sqlstate`]).
    pub(crate) fn from_postgres(err: sqlx::Error) -> StoreError {
        match database_code(&err) {
            Some(state) => StoreError::sqlstate(&state, without_source_line(err.to_string())),
            None => StoreError::from_client(&err),
        }
    }

    /// The cause a SQLite result code names, by its primary code (`code & 0xff`): sqlx reports
    /// the extended code, such as 773 SQLITE_BUSY_TIMEOUT or 531 SQLITE_CONSTRAINT_COMMITHOOK.
    pub fn sqlite_code(code: i32, detail: String) -> StoreError {
        match code & 0xff {
            // SQLITE_BUSY, SQLITE_LOCKED: another writer held the lock past the busy timeout
            // (which is the acquire timeout): the database is busy, not unreachable.
            5 | 6 => StoreError::Busy(detail),
            // SQLITE_NOMEM, SQLITE_INTERRUPT: the process is short of memory, or gave up.
            7 | 9 => StoreError::Unavailable(detail),
            // SQLITE_READONLY: the file (or its directory) cannot be written.
            8 => StoreError::ReadOnly(detail),
            // SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_PROTOCOL (WAL locking): the files failed us.
            10 | 14 | 15 => StoreError::Io(detail),
            // SQLITE_FULL: the disk (or the file-size limit) is full.
            13 => StoreError::Full(detail),
            // SQLITE_CORRUPT, SQLITE_NOTADB.
            11 | 26 => StoreError::Corrupt(detail),
            // SQLITE_CONSTRAINT and the rest: nothing the ledger's statements should meet.
            _ => StoreError::Internal(detail),
        }
    }

    /// The cause a PostgreSQL SQLSTATE names, the exact code first, then its class.
    pub fn sqlstate(state: &str, detail: String) -> StoreError {
        match state {
            // disk_full.
            "53100" => StoreError::Full(detail),
            // read_only_sql_transaction: a standby, or a primary demoted under us.
            "25006" => StoreError::ReadOnly(detail),
            // io_error, undefined_file.
            "58030" | "58P01" => StoreError::Io(detail),
            // data_corrupted, index_corrupted.
            "XX001" | "XX002" => StoreError::Corrupt(detail),
            // query_canceled (statement_timeout), lock_not_available (lock_timeout).
            "57014" | "55P03" => StoreError::Unavailable(detail),
            // invalid_catalog_name: the database does not exist (yet); insufficient_privilege:
            // the role lacks a grant. Both the operator's to mend, neither a bug.
            "3D000" | "42501" => StoreError::Unavailable(detail),
            // Class 08 connection exception, 28 invalid authorization (a wrong password, an
            // unknown role), 57P admin/crash shutdown or cannot connect now, 53 insufficient
            // resources (out of memory, too many connections).
            s if s.starts_with("08")
                || s.starts_with("28")
                || s.starts_with("57P")
                || s.starts_with("53") =>
            {
                StoreError::Unavailable(detail)
            }
            // Class 40, transaction rollback: deadlock_detected, serialization_failure.
            s if s.starts_with("40") => StoreError::Contention(detail),
            _ => StoreError::Internal(detail),
        }
    }
}

/// What a store's calls have found out about its database and its connections, kept for the
/// calls after them (one per store, shared by its calls, read without a lock):
/// - the **full-disk mark**: set by any statement that failed for want of space, cleared only
///   by an [`Operations::probe_write`] that committed. While set, health reports NOT_SERVING (reads
///   still answer; writes are still tried, and fail or succeed on their own);
/// - the **stale-connection mark**: the instant before which pooled connections are not lent
///   again, set when one of them reached a server that accepts no writes;
/// - when a store call **last succeeded and last failed**: whether idle connections are proven
///   good enough to lend without the pool's checks (`connections_proven`).
#[derive(Debug, Default)]
pub struct StoreMarks {
    /// Set while the store is known to be full.
    full: std::sync::atomic::AtomicBool,
    /// Pooled connections opened at or before this instant are not lent again: one of them
    /// reached a server that accepts no writes (a standby, as during a failover), and the
    /// others were opened the same way, so they may well lead there too. Like the two below,
    /// in [`since_start`]'s microseconds (0: never).
    stale_before: std::sync::atomic::AtomicU64,
    /// When a store call last succeeded, and last failed. They decide whether
    /// [`held::Connections::acquire`] may lend a connection without the pool's checks.
    last_ok: std::sync::atomic::AtomicU64,
    last_failure: std::sync::atomic::AtomicU64,
}

/// How recently a store call must have succeeded (and none failed) for
/// [`held::Connections::acquire`] to lend a connection without the pool's checks.
pub(crate) const CONNECTIONS_PROVEN_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Microseconds since the first call of this function in the process, plus one.
fn since_start() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_micros())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

impl StoreMarks {
    /// Notes a full disk; logs the first report of an episode.
    fn full(&self, detail: &str) {
        if !self.full.swap(true, std::sync::atomic::Ordering::AcqRel) {
            tracing::error!(
                error = %detail,
                "the store is out of disk space: writes are refused with RESOURCE_EXHAUSTED \
                 STORE_FULL and health is NOT_SERVING until space is freed; reads keep answering"
            );
        }
    }

    /// Whether the store is known to be full.
    pub fn is_full(&self) -> bool {
        self.full.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks every connection open now as not to be lent again (see `stale_before`).
    pub(crate) fn discard_connections_open_now(&self) {
        self.stale_before
            .store(since_start(), std::sync::atomic::Ordering::Release);
    }

    /// Notes a store call that succeeded.
    pub(crate) fn call_succeeded(&self) {
        self.last_ok
            .store(since_start(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Notes a store call that failed.
    fn call_failed(&self) {
        self.last_failure
            .store(since_start(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the pool's idle connections are proven good: a call succeeded within
    /// [`CONNECTIONS_PROVEN_FOR`], none failed within it, and no connection was ever marked
    /// stale. Then an idle connection is lent as it is; otherwise through the pool's checks
    /// (PostgreSQL: the stale mark, and a ping for one idle a second or more).
    pub(crate) fn connections_proven(&self) -> bool {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let window = u64::try_from(CONNECTIONS_PROVEN_FOR.as_micros()).unwrap_or(u64::MAX);
        let now = since_start();
        let (ok, failed) = (self.last_ok.load(Relaxed), self.last_failure.load(Relaxed));
        ok != 0
            && now.saturating_sub(ok) < window
            && (failed == 0 || now.saturating_sub(failed) >= window)
            && self.stale_before.load(Acquire) == 0
    }

    /// Whether a connection of `age` was opened before connections were last marked stale.
    /// (One older than the process's first mark of time counts as opened at its start.)
    pub(crate) fn is_stale(&self, age: std::time::Duration) -> bool {
        let before = self.stale_before.load(std::sync::atomic::Ordering::Acquire);
        let age = u64::try_from(age.as_micros()).unwrap_or(u64::MAX);
        before != 0 && since_start().saturating_sub(age) <= before
    }

    /// Notes that a write committed again; logs the end of an episode.
    fn has_space(&self) {
        if self.full.swap(false, std::sync::atomic::Ordering::AcqRel) {
            tracing::warn!("the store has disk space again: writes resume");
        }
    }
}

/// 64 KiB of fresh random bytes for the write probe (random, so that no compression makes the
/// write smaller than what it stands for).
fn probe_filler() -> Vec<u8> {
    let mut filler = vec![0u8; 64 * 1024];
    let mut rng = crate::splitmix::SplitMix64(crate::splitmix::jitter(u64::MAX));
    for chunk in filler.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next().to_le_bytes()[..chunk.len()]);
    }
    filler
}

/// How often a statement that met a deadlock or a serialization failure is tried again before
/// the call answers [`StoreError::Contention`]. Each statement is atomic, so a failed try
/// left nothing behind.
const CONTENTION_RETRIES: u32 = 4;

/// Runs `$body` (one statement, or one transaction, on the connection `$conn` taken from
/// `$store.pool` for it) and classifies its error with `$classify`; evaluates to a
/// [`StoreResult`]. A macro rather than a function taking a closure: a closure over a borrowed
/// connection cannot be shown `Send` for every lifetime, which `async_trait` needs.
///
/// This is where the storage module keeps its first rule: **an acknowledgement means
/// committed.** `$body` must read its statement to the end (`execute`, `fetch_all`: never
/// `fetch_optional`, which stops SQLite after the first row and so never sees the error its
/// autocommit COMMIT reports at the statement's end) and, for a transaction, end with the
/// result of `commit()`. So an `Ok` here is a committed write, and a commit that failed is the
/// write's error. What happens after an error is [`after_failure`]'s.
///
/// `pool: $pool` takes the connection from `$pool` instead (SQLite counts replays on
/// connections of their own: see [`sqlite::SqliteStore`]).
macro_rules! run_on {
    ($store:expr, $classify:expr, |$conn:ident| $body:expr) => {
        $crate::storage::run_on!($store, $classify, pool: $store.pool, |$conn| $body)
    };
    ($store:expr, $classify:expr, pool: $pool:expr, |$conn:ident| $body:expr) => {{
        let mut tries = 0u32;
        loop {
            let $crate::storage::held::Lent {
                #[allow(unused_mut)]
                conn: mut $conn,
                taken_at,
                in_use,
            } = $pool
                .acquire(&$store.marks)
                .await
                .map_err(|e| $crate::storage::StoreError::from_acquire(e, $classify))?;
            let mut broken = false;
            let result = match $store.open_call(&mut *$conn).await {
                Ok(()) => {
                    let result = $body;
                    match ($store.close_call(&mut *$conn, result.is_ok()).await, result) {
                        (Ok(()), result) => result,
                        // The COMMIT failed: so did the call.
                        (Err(e), Ok(_)) => Err(e),
                        // The ROLLBACK after an error failed: the session is in an unknown state.
                        (Err(_), Err(e)) => {
                            broken = true;
                            Err(e)
                        }
                    }
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(done) => {
                    $store.marks.call_succeeded();
                    $pool.keep($crate::storage::held::Lent {
                        conn: $conn,
                        taken_at,
                        in_use,
                    });
                    break Ok(done);
                }
                Err(e) => {
                    if broken || $crate::storage::breaks_connection(&e) {
                        $conn.close_on_drop();
                    }
                    let error = $classify(e);
                    // No longer this call's: a waiter that times out now is not kept out by it.
                    drop(in_use);
                    if let Err(e) =
                        $crate::storage::after_failure(error, $conn, &$store.marks, &mut tries)
                            .await
                    {
                        break Err(e);
                    }
                }
            }
        }
    }};
}
pub(crate) use run_on;

/// Whether `error` means the connection itself is gone or unusable (its socket failed, its TLS
/// session broke, the server sent what the protocol does not allow, or it shut the session
/// down): such a connection is closed, never lent again, so that after a failover no
/// connection to the old primary lingers in the pool.
pub(crate) fn breaks_connection(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        // 57P01..57P03: the server is shutting down or cannot take the session.
        sqlx::Error::Database(db) => db.code().is_some_and(|c| c.starts_with("57P")),
        _ => false,
    }
}

/// After a statement failed with `error` on `conn`: a connection whose error says its session
/// may be broken (an I/O error, a full disk, a read-only server) is closed rather than
/// returned to the pool; a full disk is noted in `marks`; a deadlock or serialization failure
/// is tried again (`Ok`, after a short jittered pause), a bounded number of times, then
/// answered [`StoreError::Contention`]. Each statement is atomic, so a failed try left nothing
/// behind.
///
/// # Errors
/// `error`, when it is not to be tried again.
pub(crate) async fn after_failure<DB: sqlx::Database>(
    error: StoreError,
    mut conn: sqlx::pool::PoolConnection<DB>,
    marks: &StoreMarks,
    tries: &mut u32,
) -> StoreResult<()> {
    marks.call_failed();
    if error.poisons_connection() {
        conn.close_on_drop();
    }
    drop(conn);
    match error {
        StoreError::Full(detail) => {
            marks.full(&detail);
            Err(StoreError::Full(detail))
        }
        StoreError::ReadOnly(detail) => {
            marks.discard_connections_open_now();
            Err(StoreError::ReadOnly(detail))
        }
        StoreError::Contention(detail) if *tries < CONTENTION_RETRIES => {
            *tries += 1;
            tracing::debug!(error = %detail, tries = *tries, "write conflicted; trying again");
            let jitter = crate::splitmix::jitter(2_000 << *tries);
            tokio::time::sleep(std::time::Duration::from_micros(jitter)).await;
            Ok(())
        }
        StoreError::Contention(detail) => Err(StoreError::Contention(format!(
            "{detail} (after {tries} retries)"
        ))),
        other => Err(other),
    }
}

/// The one row a write statement with `RETURNING` gave, if any, read to the end (see
/// [`run_on`]); more than one row for one key is a bug.
pub(crate) fn at_most_one<T>(mut rows: Vec<T>, what: &str) -> StoreResult<Option<T>> {
    match rows.len() {
        0 | 1 => Ok(rows.pop()),
        n => Err(StoreError::Internal(format!(
            "{what} returned {n} rows for one key"
        ))),
    }
}

/// sqlx ends a PostgreSQL error with ` at line N`, the line of PostgreSQL's own C source that
/// raised it, which reads as a line of the operator's file (`pg_hba.conf rejects connection …
/// at line 476`): it is left out of what the log shows.
fn without_source_line(mut detail: String) -> String {
    if let Some(at) = detail.rfind(" at line ")
        && detail[at + " at line ".len()..]
            .bytes()
            .all(|b| b.is_ascii_digit())
    {
        detail.truncate(at);
    }
    detail
}

/// The database's own error code (SQLSTATE, or SQLite's extended result code), if the error
/// is the database's answer.
fn database_code(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// Result alias for store calls.
pub type StoreResult<T> = Result<T, StoreError>;

/// The entries of the ledger: the compare-and-set writes the domain decides on, and the reads
/// that tell what to decide. One row per (tenant, key). What the use cases need.
#[async_trait]
pub trait Entries: Send + Sync + 'static {
    /// Inserts `entry` unless (tenant, key) exists. `true` when this call inserted it: the
    /// unique constraint, not a prior read, decides among concurrent claimants.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn insert(&self, tenant: &str, entry: &Entry) -> StoreResult<bool>;

    /// Reads the entry of (tenant, key), whatever its state.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn get(&self, tenant: &str, key: &str) -> StoreResult<Option<Entry>>;

    /// Replaces a resolved entry with a new attempt (`next`, same key), only if the stored entry
    /// is still resolved and still carries `expected_token`. A resolved entry's outcome never
    /// changes under one token, so (token, resolved) identifies exactly the state the caller saw.
    /// `true` when it replaced it.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn restart(&self, tenant: &str, expected_token: &str, next: &Entry) -> StoreResult<bool>;

    /// Records a claimant's outcome (see [`Finish`]) only if the entry still carries its claim
    /// token and is ATTEMPTING (or also UNKNOWN, when `cmd.also_unknown`); the store computes
    /// `finished_at` and `expires_at` from the entry's retention. The entry as written when it
    /// applied, committed before it returns.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn finish(&self, tenant: &str, cmd: &Finish) -> StoreResult<Option<Finished>>;

    /// Counts a replay and returns the entry, only if it is SUCCEEDED with `fingerprint` and
    /// not expired at `now`: the whole replay in one statement. `None` otherwise (read the
    /// entry to learn why).
    ///
    /// The one write whose commit does not wait for the disk: it changes only the count, and
    /// the outcome it answers with was made durable by its Complete. So the count is
    /// committed (every server sees it; concurrent replays are numbered one by one) but not
    /// synced: a crash of the database or its machine may lose the counts of its last moments,
    /// never an outcome (see the backends' `REPLAY`).
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn replay(
        &self,
        tenant: &str,
        key: &str,
        fingerprint: &str,
        now: Micros,
    ) -> StoreResult<Option<Entry>>;

    /// Moves the lease end of the attempt holding `token` to `lease_expires_at`, only if the
    /// entry is ATTEMPTING with that token and its lease has not ended at `now`. The entry as
    /// written when it applied.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn renew(
        &self,
        tenant: &str,
        key: &str,
        token: &str,
        lease_expires_at: Micros,
        now: Micros,
    ) -> StoreResult<Option<Entry>>;

    /// Writes a reconciler's finding (the outcome fields of `done`) only if the entry's outcome
    /// is unknown at `now`: reported UNKNOWN, or ATTEMPTING past its lease. Releases the
    /// reconcile hold. `Some(has_waiters)` when it wrote them.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn resolve(&self, tenant: &str, done: &Entry, now: Micros) -> StoreResult<Option<bool>>;

    /// Hands out up to `query.limit` entries whose outcome is unknown at `query.now`, oldest
    /// first, that no other reconciler holds, and holds them until `query.hold_until`. Two
    /// concurrent calls never get the same entry while the hold lasts.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn take_unresolved(
        &self,
        tenant: &str,
        query: &UnresolvedQuery,
    ) -> StoreResult<Vec<Entry>>;

    /// Deletes up to `limit` finished entries whose expiry is at or before `now`, in one short
    /// statement, and returns how many. Unresolved entries have no expiry and are never
    /// deleted.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn prune(&self, now: Micros, limit: u32) -> StoreResult<u64>;

    /// A page of the tenant's entries that match `query`, by started_at and then key, with
    /// their stored arguments.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn list(&self, tenant: &str, query: &ListQuery) -> StoreResult<Vec<Entry>>;

    /// Notes that a claim waits for the current attempt of (tenant, key), so that its
    /// completion is announced to other servers sharing the database.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn mark_waiting(&self, tenant: &str, key: &str) -> StoreResult<()>;

    /// Adds replays a server answered from memory to their entries' `replay_count`, each
    /// only to the attempt it replayed (its claim token) while it is SUCCEEDED. Like a replay,
    /// only a count: its commit does not wait for the disk, so a crash may lose it.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails; nothing was counted then.
    async fn count_replays(&self, counts: &[ReplayCount]) -> StoreResult<()>;
}

/// The multi-row forms of the two writes that are group-committed ([`batch::GroupCommit`]):
/// what a backend offers to a batcher. A batcher is not one itself, so it cannot wrap another.
#[async_trait]
pub trait Batches: Entries {
    /// Inserts each (tenant, entry) unless its (tenant, key) exists, in as few statements and
    /// commits as the backend allows; per entry, whether this call inserted it. Within one
    /// batch the first entry of a key wins, as if they had come one by one. All or nothing:
    /// an error means none is known to be written.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn insert_many(&self, batch: &[(String, Entry)]) -> StoreResult<Vec<bool>>;

    /// [`Entries::finish`] for many entries at once, in as few statements and commits as the
    /// backend allows; at most one command per (tenant, key) in a batch.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails; none is known to be written then.
    async fn finish_many(&self, batch: &[(String, Finish)]) -> StoreResult<Vec<Option<Finished>>>;
}

/// Telling other servers that share the database that an entry changed (for their waiting
/// claims). A no-op for a store only one server uses.
#[async_trait]
pub trait Announcements: Send + Sync + 'static {
    /// Whether other servers may write to the same database (so changes must be announced or
    /// polled for, not only seen in-process).
    fn shared(&self) -> bool {
        false
    }

    /// Tells other servers sharing the database that (tenant, key) changed. A no-op for a
    /// store only one server uses.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn announce(&self, _tenant: &str, _key: &str) -> StoreResult<()> {
        Ok(())
    }

    /// Starts listening for other servers' announcements; each arrives as (tenant, key).
    /// `None` for a store only one server uses.
    fn subscribe(&self) -> Option<tokio::sync::mpsc::Receiver<(String, String)>> {
        None
    }
}

/// What the server's probe, migrations and metrics need of a store: no entry is read or
/// written here.
#[async_trait]
pub trait Operations: Send + Sync + 'static {
    /// `"postgres"` or `"sqlite"`, for logs.
    fn backend(&self) -> &'static str;

    /// Applies this backend's migrations (idempotent; safe with several servers starting at once).
    ///
    /// # Errors
    /// `Unavailable` when the database cannot be reached; `Internal` when a migration fails.
    async fn migrate(&self) -> StoreResult<()>;

    /// Checks that the database answers (the health probe).
    ///
    /// # Errors
    /// `Unavailable` when it does not.
    async fn ping(&self) -> StoreResult<()>;

    /// Whether the store last reported a full disk (see [`StoreMarks`]); no database call.
    fn is_full(&self) -> bool;

    /// Writes and deletes a probe row of 64 KiB, each in its own commit: whether a write of a
    /// typical size commits now. Clears [`Operations::is_full`] when both did.
    ///
    /// # Errors
    /// As the database fails (`Full` while there is still no space).
    async fn probe_write(&self) -> StoreResult<()>;

    /// The database's clock, where other servers share the store and must agree on the time
    /// (PostgreSQL); `None` for a store one server uses, whose own clock is the arbiter.
    ///
    /// # Errors
    /// As the database fails.
    async fn database_now(&self) -> StoreResult<Option<Micros>> {
        Ok(None)
    }

    /// Why the store cannot be reached, in the database's own words, found by opening a
    /// connection of its own (a pool only says that it timed out); `None` when it can.
    async fn unreachable_cause(&self) -> Option<String> {
        None
    }

    /// Where the store is, for logs (never a password).
    fn location(&self) -> String {
        String::new()
    }

    /// Counts the unresolved entries of every tenant at `now` (for the metrics gauge, which
    /// every server sharing the database reports alike): reported UNKNOWN or past their
    /// lease, and attempts still in their lease.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn count_unresolved(&self, now: Micros) -> StoreResult<UnresolvedCount>;

    /// How the connection pool is used right now (for the metrics gauges); no database call.
    fn pool_stats(&self) -> PoolStats;
}

/// Everything the server holds a store for: what [`open`] returns.
pub trait Store: Entries + Announcements + Operations {}

impl<T: Entries + Announcements + Operations + ?Sized> Store for T {}

/// What a backend (PostgreSQL, SQLite) offers: a store that can also write batches.
pub trait Backend: Store + Batches {}

impl<T: Store + Batches + ?Sized> Backend for T {}

/// The unresolved entries of the whole store, by the status callers would be told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct UnresolvedCount {
    /// Reported UNKNOWN, or ATTEMPTING past its lease: waiting for a reconciler.
    pub unknown: i64,
    /// ATTEMPTING within its lease: a claimant is acting now.
    pub attempting: i64,
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
    pub key: String,
    /// The claimant's token: the write's fence.
    pub claim_token: String,
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

/// Which of a tenant's entries a listing asks for, and where the page starts.
#[derive(Clone, Debug)]
pub struct ListQuery {
    /// Only this run's entries; any run when empty.
    pub run_id: String,
    /// Only this tool's entries; any tool when empty.
    pub tool: String,
    /// Only entries in this state as Lookup reports it at `now`.
    pub status: Option<crate::domain::Status>,
    /// Only entries whose current attempt started at or after this.
    pub started_from: Micros,
    /// Only entries whose current attempt started before this.
    pub started_before: Micros,
    /// Only entries after this (started_at, key) in the listing's order: the page cursor.
    pub after: Option<(Micros, String)>,
    /// At most this many entries.
    pub limit: u32,
    /// The time an attempt's lease is judged at.
    pub now: Micros,
}

/// Replays of one entry answered from a server's memory, to be added to its count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayCount {
    /// The entry's tenant.
    pub tenant: String,
    /// The entry's key.
    pub key: String,
    /// The attempt that was replayed.
    pub claim_token: String,
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
    /// Only entries of this tool; empty for every tool.
    pub tool: String,
    /// At most this many entries.
    pub limit: u32,
    /// The reconcile hold ends here.
    pub hold_until: Micros,
    /// Only these keys (each if unresolved and not held), at most `limit` of them; any
    /// unresolved entry when empty.
    pub keys: Vec<String>,
}

/// Opens the store a database URL names: `postgres://` or `postgresql://` for PostgreSQL,
/// `sqlite://` (or `sqlite:`) for an embedded file, created if missing. Inserts and
/// completions are group-committed ([`batch::GroupCommit`]): on PostgreSQL up to
/// `options.write_batches` batches of each kind at once (at most half the pool), on SQLite (one
/// writer at a time anyway) one.
///
/// # Errors
/// `Internal` for an unsupported or malformed URL; `Unavailable` when the database cannot be
/// opened.
pub async fn open(url: &str, options: &PoolOptions) -> StoreResult<Arc<dyn Store>> {
    let writers = if is_postgres(url) {
        options
            .write_batches
            .min(options.max_connections as usize / 2)
            .max(1)
    } else {
        1
    };
    let backend = open_backend(url, options).await?;
    Ok(Arc::new(batch::GroupCommit::new(backend, writers)))
}

/// The backend a database URL names, without group commit: each write its own statement.
/// (What [`open`] batches; tests of the batcher start from it.)
///
/// # Errors
/// As [`open`].
pub async fn open_backend(url: &str, options: &PoolOptions) -> StoreResult<Arc<dyn Backend>> {
    if is_postgres(url) {
        Ok(Arc::new(postgres::PgStore::connect(url, options)?))
    } else if url.starts_with("sqlite:") {
        Ok(Arc::new(sqlite::SqliteStore::open(url, options).await?))
    } else {
        Err(StoreError::Internal(format!(
            "unsupported database URL scheme in {}: use postgres:// or sqlite://",
            redact_url(url)
        )))
    }
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// How the server reaches PostgreSQL (`--postgres-pooler`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// Directly, or through a pooler in session mode, which gives each of the server's
    /// connections a server connection of its own.
    #[default]
    None,
    /// Through a pooler in transaction mode (PgBouncer's `pool_mode = transaction`), where a
    /// server connection is the server's for one transaction only.
    Transaction,
}

/// Connection pool settings shared by both backends.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Most connections the pool opens.
    pub max_connections: u32,
    /// How long a call waits for a connection before the database counts as unavailable.
    pub acquire_timeout: std::time::Duration,
    /// PostgreSQL: how many group-commit batches of each kind (claims, completions) are written
    /// at once. Fewer means larger batches and less database time per call.
    pub write_batches: usize,
    /// PostgreSQL: whether a transaction pooler sits between the server and the database.
    pub pooler: Pooler,
    /// PostgreSQL: a direct URL for migrations, when the store's goes through a pooler.
    pub migrations_url: Option<String>,
    /// PostgreSQL: `statement_timeout` of the server's statements (zero: the database's).
    pub statement_timeout: std::time::Duration,
    /// How long opening one connection may take.
    pub connect_timeout: std::time::Duration,
}

impl Default for PoolOptions {
    /// The shipped defaults ([`crate::defaults`]).
    fn default() -> Self {
        use crate::defaults::{self as d, duration};
        PoolOptions {
            max_connections: d::DB_MAX_CONNECTIONS,
            acquire_timeout: duration(d::DB_ACQUIRE_TIMEOUT),
            write_batches: usize::from(d::DB_WRITE_BATCHES),
            pooler: Pooler::None,
            migrations_url: None,
            statement_timeout: duration(d::DB_STATEMENT_TIMEOUT),
            connect_timeout: duration(d::DB_CONNECT_TIMEOUT),
        }
    }
}

/// The URL with any password replaced by `***`, for logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{tail}")
            } else {
                format!("{scheme}://{user}@{host}{tail}")
            }
        }
        None => url.to_string(),
    }
}

/// Converts a stored integer to the domain's `u32`/`u64`, refusing corrupt negatives.
pub(crate) fn non_negative<T: TryFrom<i64>>(v: i64, what: &str) -> StoreResult<T> {
    T::try_from(v).map_err(|_| StoreError::Internal(format!("stored {what} out of range: {v}")))
}

/// The stored row shape both backends read into; converted to [`Entry`] here, once.
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
}

impl TryFrom<EntryRow> for Entry {
    type Error = StoreError;

    fn try_from(r: EntryRow) -> StoreResult<Entry> {
        let status = crate::domain::Status::parse(&r.status)
            .ok_or_else(|| StoreError::Internal(format!("unknown stored status {}", r.status)))?;
        Ok(Entry {
            key: r.key,
            run_id: r.run_id,
            tool: r.tool,
            fingerprint: r.fingerprint,
            status,
            attempt: non_negative(r.attempt, "attempt")?,
            claim_token: r.claim_token,
            result: r.result,
            error: r.error,
            retryable: r.retryable,
            principal: r.principal,
            started_at: Micros(r.started_at),
            finished_at: r.finished_at.map(Micros),
            lease_expires_at: Micros(r.lease_expires_at),
            retention: Micros(r.retention_us),
            expires_at: r.expires_at.map(Micros),
            replay_count: non_negative(r.replay_count, "replay_count")?,
            arguments: r.arguments,
            resolved_by: r.resolved_by,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{StoreError, StoreMarks, redact_url};

    /// Connections opened before the mark are stale, those opened after it are not, and a mark
    /// ends the lending of connections without the pool's checks.
    #[test]
    fn connections_opened_before_the_stale_mark_are_stale() {
        let marks = StoreMarks::default();
        assert!(!marks.is_stale(Duration::from_secs(3600)), "no mark yet");
        marks.call_succeeded();
        assert!(marks.connections_proven());
        std::thread::sleep(Duration::from_millis(2));
        marks.discard_connections_open_now();
        assert!(!marks.connections_proven(), "a mark ends it");
        assert!(
            marks.is_stale(Duration::from_millis(1)),
            "opened before the mark"
        );
        assert!(
            marks.is_stale(Duration::from_secs(3600)),
            "opened long before"
        );
        std::thread::sleep(Duration::from_millis(5));
        assert!(
            !marks.is_stale(Duration::from_millis(1)),
            "opened after the mark"
        );
    }

    #[test]
    fn sqlite_errors_are_classified_by_their_primary_code() {
        let kind = |code| StoreError::sqlite_code(code, String::new()).kind();
        // Extended codes of the same primary code classify alike.
        for busy in [
            5, 261, /* BUSY_RECOVERY */
            517, /* BUSY_SNAPSHOT */
            773, /* BUSY_TIMEOUT */
        ] {
            assert_eq!(kind(busy), "busy", "{busy}");
        }
        assert_eq!(kind(6), "busy", "LOCKED");
        assert_eq!(kind(7), "unavailable", "NOMEM");
        assert_eq!(kind(13), "full", "FULL");
        for io in [
            10, 266,  /* IOERR_READ */
            778,  /* IOERR_WRITE */
            1290, /* IOERR_FSYNC */
            14,
        ] {
            assert_eq!(kind(io), "io_error", "{io}");
        }
        assert_eq!(kind(8), "read_only", "READONLY");
        assert_eq!(kind(1032), "read_only", "READONLY_DBMOVED");
        assert_eq!(kind(11), "corrupt", "CORRUPT");
        assert_eq!(kind(26), "corrupt", "NOTADB");
        // A constraint the ledger did not expect is a bug, commit hook included: its code
        // 531 must not be read as PostgreSQL's class 53.
        for constraint in [
            19, 531, /* CONSTRAINT_COMMITHOOK */
            787, /* FOREIGNKEY */
            1555,
        ] {
            assert_eq!(kind(constraint), "internal", "{constraint}");
        }
        assert_eq!(kind(1), "internal", "SQLITE_ERROR");
    }

    #[test]
    fn the_source_line_sqlx_appends_is_left_out() {
        assert_eq!(
            super::without_source_line("pg_hba.conf rejects connection at line 476".into()),
            "pg_hba.conf rejects connection"
        );
        assert_eq!(
            super::without_source_line("a value at line five".into()),
            "a value at line five"
        );
    }

    #[test]
    fn postgres_errors_are_classified_by_their_sqlstate() {
        let kind = |state| StoreError::sqlstate(state, String::new()).kind();
        assert_eq!(kind("53100"), "full");
        assert_eq!(kind("53200"), "unavailable", "out_of_memory");
        assert_eq!(kind("53300"), "unavailable", "too_many_connections");
        assert_eq!(kind("40001"), "contention", "serialization_failure");
        assert_eq!(kind("40P01"), "contention", "deadlock_detected");
        assert_eq!(kind("25006"), "read_only");
        assert_eq!(kind("58030"), "io_error");
        assert_eq!(kind("XX001"), "corrupt");
        assert_eq!(kind("08006"), "unavailable", "connection_failure");
        assert_eq!(kind("57P01"), "unavailable", "admin_shutdown");
        assert_eq!(kind("57014"), "unavailable", "statement_timeout");
        assert_eq!(kind("23505"), "internal", "unique_violation");
        assert_eq!(kind("42P01"), "internal", "undefined_table");
        assert_eq!(kind("28P01"), "unavailable", "invalid_password");
        assert_eq!(kind("3D000"), "unavailable", "a missing database");
        assert_eq!(kind("42501"), "unavailable", "insufficient_privilege");
    }

    /// Whatever sqlx reports while a connection is being opened is the store being
    /// unavailable, by the variant and never its text: the answer 0x00 a proxy's closed
    /// connection makes of `SSLRequest` (a `Protocol` error) included.
    #[test]
    fn every_failure_to_open_a_connection_is_unavailable() {
        use std::io::{Error as IoError, ErrorKind};
        let opening = |e: sqlx::Error| StoreError::from_opening(e, StoreError::from_postgres);
        let failures = [
            sqlx::Error::Io(IoError::from(ErrorKind::ConnectionRefused)),
            sqlx::Error::Io(IoError::from(ErrorKind::ConnectionReset)),
            sqlx::Error::Io(IoError::new(ErrorKind::UnexpectedEof, "at EOF")),
            sqlx::Error::Io(IoError::from(ErrorKind::TimedOut)),
            // rustls' alerts and bad records come as InvalidData.
            sqlx::Error::Io(IoError::from(ErrorKind::InvalidData)),
            sqlx::Error::Protocol("unexpected response from SSLRequest: 0x00".into()),
            sqlx::Error::Protocol("anything else".into()),
            sqlx::Error::Tls("server does not support TLS".into()),
            sqlx::Error::Configuration("no keys found pem file".into()),
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
        ];
        for failure in failures {
            let what = format!("{failure:?}");
            let error = opening(failure);
            assert!(
                matches!(error, StoreError::Unavailable(_)),
                "{what} -> {error:?}"
            );
        }
        assert!(matches!(
            opening(sqlx::Error::PoolTimedOut),
            StoreError::Unreachable(_)
        ));
    }

    /// On a live connection the same variants split: the link failing is unavailable, what
    /// the driver could not encode or decode (a message over the protocol's size, too many
    /// parameters, a row of the wrong shape) is a bug.
    #[test]
    fn on_a_live_connection_only_the_link_failing_is_unavailable() {
        use std::io::{Error as IoError, ErrorKind};
        for link in [
            sqlx::Error::Io(IoError::from(ErrorKind::ConnectionReset)),
            sqlx::Error::Io(IoError::new(ErrorKind::UnexpectedEof, "at EOF")),
            sqlx::Error::Io(IoError::from(ErrorKind::BrokenPipe)),
            sqlx::Error::Tls("bad record mac".into()),
            sqlx::Error::WorkerCrashed,
        ] {
            let what = format!("{link:?}");
            assert_eq!(
                StoreError::from_postgres(link).kind(),
                "unavailable",
                "{what}"
            );
        }
        for bug in [
            sqlx::Error::Protocol("message size out of range for protocol".into()),
            sqlx::Error::RowNotFound,
            sqlx::Error::ColumnNotFound("status".into()),
        ] {
            let what = format!("{bug:?}");
            assert_eq!(StoreError::from_postgres(bug).kind(), "internal", "{what}");
        }
    }

    #[test]
    fn passwords_never_reach_the_log() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/ledger"),
            "postgres://app:***@db:5432/ledger"
        );
        assert_eq!(
            redact_url("postgres://app@db/ledger"),
            "postgres://app@db/ledger"
        );
        assert_eq!(redact_url("sqlite://ledger.db"), "sqlite://ledger.db");
        assert_eq!(redact_url("postgres://u:p@ss@h/d"), "postgres://u:***@h/d");
    }
}
