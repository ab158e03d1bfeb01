//! What the two SQL backends share, written once: the [`Store`](super::Store) implemented over a
//! [`Dialect`] (the few things a backend says its own way: its name, the statements it words
//! differently, and how it runs one statement), and [`run_on`], where every statement and
//! transaction of either backend runs. The store's methods over it are in [`methods`].

mod methods;
pub(crate) mod window;

use crate::Classify as _;
use sqlx::pool::PoolConnection;

use super::sql::{Also, Param};
use super::{
    Finish, Finished, IntentWindow, ReplayCount, StoreError, StoreMarks, StoreResult,
    kept_connections,
};
use crate::domain::{Entry, Key, Micros, Tenant};

/// A SQL backend as a [`Store`](super::Store): the store's methods, written once over its
/// [`Dialect`] (in [`methods`]).
pub(crate) struct SqlStore<D>(pub(crate) D);

impl<D> std::ops::Deref for SqlStore<D> {
    type Target = D;

    fn deref(&self) -> &D {
        &self.0
    }
}

/// Which of a backend's connections a statement runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum On {
    /// The pool every statement uses.
    Pool,
    /// Where replays are counted (SQLite: a connection that does not sync its commits).
    Replays,
}

/// A row type both backends read.
pub(crate) trait Row:
    for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
    + for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
    + Send
    + Unpin
    + 'static
{
}

impl<T> Row for T where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
        + for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
        + Send
        + Unpin
        + 'static
{
}

/// What a SQL backend states once, and the [`Store`](super::Store) is then implemented from
/// (in [`methods`], for both backends at once): the statements it words its own way, how it
/// runs one statement and one call on a connection, and what only it can do (its batches'
/// statements, announcements to other servers, migrations, its clock).
pub(crate) trait Dialect: Send + Sync + 'static {
    /// The database.
    type DB: sqlx::Database;

    /// Counts a replay ([`sql::REPLAY`], or the backend's form of it).
    const REPLAY: &'static str;
    /// Hands out unresolved entries, holding each until `$6` (see the backends' own).
    const TAKE_UNRESOLVED: &'static str;
    /// Deletes up to `$2` finished entries past their expiry at `$1`.
    const PRUNE: &'static str;
    /// `"postgres"` or `"sqlite"`, for logs.
    const BACKEND: &'static str;

    /// Classifies the database's error.
    fn classify(err: sqlx::Error) -> StoreError;

    /// What the store's calls found out about its database.
    fn marks(&self) -> &StoreMarks;

    /// The pool every statement uses (but, on SQLite, replays).
    fn pool(&self) -> &kept_connections::Connections<Self::DB>;

    /// Starts what one store call runs in (behind a transaction pooler, a transaction).
    fn open_call(
        &self,
        conn: &mut <Self::DB as sqlx::Database>::Connection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Ends what [`Dialect::open_call`] started: commits after `ok`, else rolls back. The
    /// commit's result is the call's.
    fn close_call(
        &self,
        conn: &mut <Self::DB as sqlx::Database>::Connection,
        ok: bool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Runs `statement` with `params` on a connection of `on` through [`run_on`], read to the
    /// end: how many rows it affected.
    fn execute(
        &self,
        statement: &'static str,
        params: &[Param<'_>],
        on: On,
    ) -> impl Future<Output = StoreResult<u64>> + Send;

    /// Runs `statement` with `params` on a connection of `on` through [`run_on`]: every row it
    /// returned (never only the first: see [`run_on`]).
    fn fetch_all<R: Row>(
        &self,
        statement: &'static str,
        params: &[Param<'_>],
        on: On,
    ) -> impl Future<Output = StoreResult<Vec<R>>> + Send;

    /// Runs `statement` with `params` and, when it returned a row, the statements `also`, then
    /// appends the history events `notes` (each [`sql::APPEND_HISTORY`]'s parameters), all in
    /// the same transaction: a write, what goes with it and the record of why it was made commit
    /// together or not at all. The history's ids are taken in commit order (PostgreSQL: under a
    /// lock per tenant held until the commit), so that a reader by id ([`sql::APPROVAL_EVENTS`])
    /// never passes an id that a transaction still open can take. Every row the statement
    /// returned.
    fn write_noted<R: Row>(
        &self,
        statement: &'static str,
        params: &[Param<'_>],
        also: &[Also<'_>],
        notes: &[[Param<'_>; 7]],
    ) -> impl Future<Output = StoreResult<Vec<R>>> + Send;

    /// Adds replay counts, as the backend commits a count: without waiting for the disk.
    fn write_replay_counts(
        &self,
        counts: &[ReplayCount],
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// [`Store::insert_many`](super::Store::insert_many), in the backend's fewest statements.
    fn insert_many(
        &self,
        batch: &[(Tenant, Entry)],
    ) -> impl Future<Output = StoreResult<Vec<bool>>> + Send;

    /// [`Store::finish_many`](super::Store::finish_many), in the backend's fewest statements.
    fn finish_many(
        &self,
        batch: &[(Tenant, Finish)],
    ) -> impl Future<Output = StoreResult<Vec<Option<Finished>>>> + Send;

    /// [`Store::count_window`](super::Store::count_window): by default a statement at a time
    /// ([`window::in_steps`]).
    fn count_window(
        &self,
        tenant: &Tenant,
        window: &IntentWindow<'_>,
        key_for: &(dyn Fn(u64) -> Key + Send + Sync),
        entry_for: Option<&(dyn Fn(u64) -> Entry + Send + Sync)>,
    ) -> impl Future<Output = StoreResult<(u64, bool)>> + Send
    where
        Self: Sized,
    {
        window::in_steps(self, tenant, window, key_for, entry_for)
    }

    /// [`Store::shared`](super::Store::shared).
    fn shared(&self) -> bool;

    /// [`Store::announce`](super::Store::announce).
    fn announce(&self, tenant: &Tenant, key: &Key) -> impl Future<Output = StoreResult<()>> + Send;

    /// [`Store::subscribe`](super::Store::subscribe).
    fn subscribe(&self) -> Option<tokio::sync::mpsc::Receiver<(Tenant, Key)>>;

    /// [`Store::migrate`](super::Store::migrate).
    fn migrate(&self) -> impl Future<Output = StoreResult<()>> + Send;

    /// [`Store::ping`](super::Store::ping).
    fn ping(&self) -> impl Future<Output = StoreResult<()>> + Send;

    /// [`Store::database_now`](super::Store::database_now).
    fn database_now(&self) -> impl Future<Output = StoreResult<Option<Micros>>> + Send;

    /// [`Store::unreachable_cause`](super::Store::unreachable_cause).
    fn unreachable_cause(&self) -> impl Future<Output = Option<String>> + Send;

    /// [`Store::location`](super::Store::location).
    fn location(&self) -> String;
}

/// A statement as [`statement`] runs it, with its arguments bound.
type Bound<'q, DB> = sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>;

/// How [`statement`] reads a statement to its end on a connection: what it did, or its rows.
pub(crate) type Read<DB, T> =
    for<'c> fn(
        Bound<'c, DB>,
        &'c mut <DB as sqlx::Database>::Connection,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'c>>;

/// Runs `statement` with `params` through [`run_on`] on a connection of `connections`, read to
/// the end by `read`. `persistent`: whether the statement stays prepared on the connection
/// (not behind a transaction pooler). Written once for both backends, which give only what
/// differs: the connections and `persistent` (see [`Dialect::execute`], [`Dialect::fetch_all`]).
///
/// # Errors
/// What [`run_on`] answers.
pub(crate) async fn statement<S, T>(
    store: &S,
    connections: &kept_connections::Connections<S::DB>,
    persistent: bool,
    statement: &'static str,
    params: &[Param<'_>],
    read: Read<S::DB, T>,
) -> StoreResult<T>
where
    S: Dialect,
    S::DB: sqlx::database::HasStatementCache,
    for<'a> S::DB: super::sql::Columns<'a>,
    <S::DB as sqlx::Database>::Arguments: sqlx::IntoArguments<S::DB>,
    T: Send,
{
    run_on(store, connections, move |mut conn| async move {
        let result = match super::sql::arguments::<S::DB>(params.iter().copied()) {
            Ok(args) => {
                let bound = sqlx::query_with(statement, args).persistent(persistent);
                read(bound, &mut *conn).await
            }
            Err(e) => Err(e),
        };
        (conn, result)
    })
    .await
}

/// How often a statement that met a deadlock or a serialization failure is tried again before
/// the call answers [`StoreError::Contention`]. Each statement is atomic, so a failed try
/// left nothing behind.
const CONTENTION_RETRIES: u32 = 4;

/// Runs `body` (one statement, or one transaction, on a connection taken from `pool` for it)
/// and classifies its error as the store's backend does, trying again after contention.
/// `body` takes the connection and gives it back with its result, rather than borrowing it:
/// a future that borrows its argument cannot be shown `Send` for every lifetime, which the
/// store's `async_trait` methods need.
///
/// This is where the storage module keeps its first rule: **an acknowledgement means
/// committed.** `body` must read its statement to the end (`execute`, `fetch_all`: never
/// `fetch_optional`, which stops SQLite after the first row and so never sees the error its
/// autocommit COMMIT reports at the statement's end) and, for a transaction, end with the
/// result of `commit()`. So an `Ok` here is a committed write, and a commit that failed is the
/// write's error. What happens after an error is [`after_failure`]'s.
///
/// # Errors
/// The classified error of the last try.
pub(crate) async fn run_on<S, T, F, Fut>(
    store: &S,
    pool: &kept_connections::Connections<S::DB>,
    body: F,
) -> StoreResult<T>
where
    S: Dialect,
    F: Fn(PoolConnection<S::DB>) -> Fut,
    Fut: Future<Output = (PoolConnection<S::DB>, Result<T, sqlx::Error>)> + Send,
{
    let mut tries = 0u32;
    loop {
        let kept_connections::Lent {
            mut conn,
            taken_at,
            in_use,
        } = pool
            .acquire(store.marks())
            .await
            .map_err(|e| StoreError::from_acquire(e, S::classify))?;
        let mut broken = false;
        let result = match store.open_call(&mut *conn).await {
            Ok(()) => {
                let (back, result) = body(conn).await;
                conn = back;
                match (store.close_call(&mut *conn, result.is_ok()).await, result) {
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
                store.marks().call_succeeded();
                pool.keep(kept_connections::Lent {
                    conn,
                    taken_at,
                    in_use,
                });
                return Ok(done);
            }
            Err(e) => {
                if broken || breaks_connection(&e) {
                    conn.close_on_drop();
                }
                let error = S::classify(e);
                // No longer this call's: a waiter that times out now is not kept out by it.
                drop(in_use);
                after_failure(error, conn, store.marks(), &mut tries).await?;
            }
        }
    }
}
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
            let jitter = rand::RngExt::random_range(&mut rand::rng(), 0..2_000u64 << *tries);
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
