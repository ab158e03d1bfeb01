//! The embedded default store: one SQLite file, for one server process. WAL lets readers run
//! beside the writer; `synchronous = FULL` makes every acknowledged write survive a crash of
//! the process or the machine. Each write is one autocommit statement, which SQLite runs under
//! its write lock from the start, so no transaction ever upgrades a read lock (the source of
//! SQLITE_BUSY deadlocks).
//!
//! Replays are the exception, and only for their count: they run on a connection of their own
//! with `synchronous = NORMAL`, whose commits are written to the WAL but not synced
//! ([`SqliteStore::open`] says why that is safe).

use crate::Classify as _;
use std::str::FromStr;

use sqlx::Connection as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use const_format::concatcp;

use super::sql::{self, Also, Param};
use super::sql_store::window as sql_window;
use super::sql_store::{self, Dialect, On, Read, Row, at_most_one, run_on};
use super::{
    EntryRow, Finish, Finished, FinishedRow, IntentWindow, PoolOptions, ReplayCount, StoreError,
    StoreMarks, StoreResult, kept_connections,
};
use crate::domain::{Entry, Key, Micros, Tenant};

/// A SQLite store: a cheap-to-clone pool handle.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Several connections so reads do not queue behind writes; writers serialize on
    /// SQLite's lock, waiting up to the busy timeout.
    pool: kept_connections::Connections<sqlx::Sqlite>,
    /// The one connection replays are counted on, with `synchronous = NORMAL` (see
    /// [`SqliteStore::open`]). One is enough: SQLite writes one at a time, and replays then
    /// queue here rather than in each other's busy handlers.
    replays: kept_connections::Connections<sqlx::Sqlite>,
    /// Whether the disk was last found full.
    marks: std::sync::Arc<StoreMarks>,
}

impl SqliteStore {
    /// Opens (creating if missing) the file `url` names, such as `sqlite://ledger.db`.
    ///
    /// Replays are counted on a connection with `synchronous = NORMAL` (SQLite's setting is
    /// per connection; SQLite has none per transaction): its commits go to the WAL file but
    /// do not sync it, so a replay never waits for the disk. A crash of the process loses none
    /// of them (the WAL is written before the commit returns); a crash of the machine or a
    /// power cut may lose the counts committed since the WAL was last synced, which the next
    /// claim, completion or checkpoint does. Never an outcome: those commit with `FULL`, and
    /// syncing the WAL makes every commit before them durable too; the WAL is replayed in
    /// order, so what a crash takes is a tail of replay counts, never a hole.
    ///
    /// # Errors
    /// `Internal` for a malformed URL; `Io`, `ReadOnly`, `Full` or `Unavailable` when the file
    /// cannot be opened.
    pub async fn open(url: &str, options: &PoolOptions) -> StoreResult<SqliteStore> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Internal(format!("invalid SQLite URL: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(options.acquire_timeout);
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect.clone())
            .await
            .map_err(|e| StoreError::from_opening(e, StoreError::from_sqlite))?;
        // Opened when the first replay comes, after the main pool created the file.
        let replays = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect.synchronous(SqliteSynchronous::Normal));
        Ok(SqliteStore {
            pool: kept_connections::Connections::new(pool),
            replays: kept_connections::Connections::new(replays),
            marks: std::sync::Arc::default(),
        })
    }
}

impl SqliteStore {
    /// The connections `on` names: replays are counted on the one that does not sync (see
    /// [`SqliteStore::open`]).
    fn connections(&self, on: On) -> &kept_connections::Connections<sqlx::Sqlite> {
        match on {
            On::Pool => &self.pool,
            On::Replays => &self.replays,
        }
    }
}

impl Dialect for SqliteStore {
    /// [`sql::REPLAY`], as it is, on the connection that does not sync.
    const REPLAY: &str = sql::REPLAY;
    const BACKEND: &str = "sqlite";

    /// SQLite runs one writer at a time and evaluates the `IN` subquery once, so the statement
    /// needs no row locks.
    const TAKE_UNRESOLVED: &str = concatcp!(
        "UPDATE ledger_entries SET reconcile_until = $6, hold_token = $8 \
         WHERE (tenant, key) IN (",
        "SELECT tenant, key FROM ledger_entries WHERE ",
        sql::UNRESOLVED_WHERE,
        " ORDER BY started_at, key LIMIT $5) RETURNING ",
        sql::ENTRY_COLUMNS
    );

    /// Kept: the entries of a run that awaits a person's decision ([`sql::NOT_PAUSED`]).
    const PRUNE: &str = concatcp!(
        "DELETE FROM ledger_entries WHERE (tenant, key) IN (\
        SELECT tenant, key FROM ledger_entries AS e WHERE expires_at <= $1 AND ",
        sql::NOT_PAUSED,
        " LIMIT $2)"
    );

    /// Every statement stays prepared: the connections are the server's own.
    async fn execute(
        &self,
        statement: &'static str,
        params: &[Param<'_>],
        on: On,
    ) -> StoreResult<u64> {
        let read: Read<_, _> = |bound, conn| Box::pin(bound.execute(conn));
        let done =
            sql_store::statement(self, self.connections(on), true, statement, params, read).await?;
        Ok(done.rows_affected())
    }

    async fn fetch_all<R: Row>(
        &self,
        statement: &'static str,
        params: &[Param<'_>],
        on: On,
    ) -> StoreResult<Vec<R>> {
        let read: Read<_, Vec<R>> =
            |bound, conn| Box::pin(bound.try_map(|row| R::from_row(&row)).fetch_all(conn));
        sql_store::statement(self, self.connections(on), true, statement, params, read).await
    }

    /// The statement, what goes with it and the history rows in one transaction, which takes
    /// the write lock up front (`IMMEDIATE`), as the batches' do: one writer at a time, so the
    /// history's ids are taken in commit order.
    async fn write_noted<R: Row>(
        &self,
        statement: &'static str,
        params: &[Param<'_>],
        also: &[Also<'_>],
        notes: &[[Param<'_>; 7]],
    ) -> StoreResult<Vec<R>> {
        run_on(self, &self.pool, move |mut conn| async move {
            let result: Result<_, sqlx::Error> = async {
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                let args = sql::arguments::<sqlx::Sqlite>(params.iter().copied())?;
                let rows: Vec<R> = sqlx::query_as_with(statement, args)
                    .fetch_all(&mut *tx)
                    .await?;
                if !rows.is_empty() {
                    for also in also {
                        let args = sql::arguments::<sqlx::Sqlite>(also.params.iter().copied())?;
                        sqlx::query_with(also.statement, args)
                            .execute(&mut *tx)
                            .await?;
                    }
                    for note in notes {
                        let args = sql::arguments::<sqlx::Sqlite>(note.iter().copied())?;
                        sqlx::query_with(sql::APPEND_HISTORY, args)
                            .execute(&mut *tx)
                            .await?;
                    }
                }
                tx.commit().await?;
                Ok(rows)
            }
            .await;
            (conn, result)
        })
        .await
    }

    /// [`Store::count_window`](crate::storage::Store::count_window) in one transaction
    /// (`IMMEDIATE`: the write lock up front, so nothing changes the window between its read
    /// and its count): a new intent's window and its entry commit together, in one sync.
    async fn count_window(
        &self,
        tenant: &Tenant,
        window: &IntentWindow<'_>,
        key_for: &(dyn Fn(u64) -> Key + Send + Sync),
        entry_for: Option<&(dyn Fn(u64) -> Entry + Send + Sync)>,
    ) -> StoreResult<(u64, bool)> {
        run_on(self, &self.pool, move |mut conn| async move {
            let result: Result<_, sqlx::Error> = async {
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                let call = [
                    Param::Text(tenant.as_str()),
                    Param::Text(window.fingerprint),
                ];
                let current: Vec<(i64, i64)> =
                    sqlx::query_as_with(sql::CURRENT_INTENT, sql::arguments::<sqlx::Sqlite>(call)?)
                        .fetch_all(&mut *tx)
                        .await?;
                let keep = match current.first() {
                    Some(&(stored, last_seen)) if window.ended(Micros(last_seen)) => {
                        let key = key_for(sql_window::generation(stored).map_err(bug)?);
                        let at = [Param::Text(tenant.as_str()), Param::Text(key.as_str())];
                        let rows: Vec<EntryRow> =
                            sqlx::query_as_with(sql::GET, sql::arguments::<sqlx::Sqlite>(at)?)
                                .fetch_all(&mut *tx)
                                .await?;
                        let entry = rows.into_iter().next().map(Entry::try_from);
                        window.held_open_by(entry.transpose().map_err(bug)?)
                    }
                    _ => false,
                };
                let count = sql_window::counting(
                    tenant,
                    window.fingerprint,
                    window.now,
                    window.within,
                    keep,
                );
                let counted: Vec<(i64,)> = sqlx::query_as_with(
                    sql::INTENT_GENERATION,
                    sql::arguments::<sqlx::Sqlite>(count)?,
                )
                .fetch_all(&mut *tx)
                .await?;
                let stored = counted.first().map_or(0, |(g,)| *g);
                let generation = sql_window::generation(stored).map_err(bug)?;
                let mut inserted = false;
                if let Some(entry_for) = entry_for {
                    let entry = entry_for(generation);
                    let args = sql::arguments::<sqlx::Sqlite>(sql::entry_params(tenant, &entry))?;
                    let done = sqlx::query_with(sql::INSERT, args)
                        .execute(&mut *tx)
                        .await?;
                    inserted = done.rows_affected() == 1;
                }
                tx.commit().await?;
                Ok((generation, inserted))
            }
            .await;
            (conn, result)
        })
        .await
    }

    /// Adds replay counts in one transaction on the connection that does not sync its commits
    /// (the replay pool): counts only, like a replay's own.
    async fn write_replay_counts(&self, counts: &[ReplayCount]) -> StoreResult<()> {
        run_on(self, &self.replays, move |mut conn| async move {
            let result: Result<_, sqlx::Error> = async {
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                for c in counts {
                    let params = [
                        Param::Text(c.tenant.as_str()),
                        Param::Text(c.key.as_str()),
                        Param::Text(c.claim_token.as_str()),
                        Param::Int(i64::try_from(c.count).unwrap_or(i64::MAX)),
                    ];
                    let args = sql::arguments::<sqlx::Sqlite>(params)?;
                    sqlx::query_with(sql::ADD_REPLAYS, args)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await
            }
            .await;
            (conn, result)
        })
        .await
    }

    type DB = sqlx::Sqlite;

    fn classify(err: sqlx::Error) -> StoreError {
        StoreError::from_sqlite(err)
    }

    fn marks(&self) -> &StoreMarks {
        &self.marks
    }

    fn pool(&self) -> &kept_connections::Connections<sqlx::Sqlite> {
        &self.pool
    }

    /// Each call is one autocommit statement (or a transaction of its own): nothing to open.
    async fn open_call(&self, _conn: &mut sqlx::SqliteConnection) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// Nothing to close: see [`SqliteStore::open_call`].
    async fn close_call(
        &self,
        _conn: &mut sqlx::SqliteConnection,
        _ok: bool,
    ) -> Result<(), sqlx::Error> {
        Ok(())
    }

    async fn insert_many(&self, batch: &[(Tenant, Entry)]) -> StoreResult<Vec<bool>> {
        // One transaction, so one commit (one fsync) for the batch; IMMEDIATE takes the write
        // lock up front, so the transaction never has to upgrade a read lock. The answers
        // count only once the commit succeeded.
        run_on(self, &self.pool, move |mut conn| async move {
            let result: Result<_, sqlx::Error> = async {
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                let mut inserted = Vec::with_capacity(batch.len());
                for (tenant, entry) in batch {
                    let args = sql::arguments::<sqlx::Sqlite>(sql::entry_params(tenant, entry))?;
                    let done = sqlx::query_with(sql::INSERT, args)
                        .execute(&mut *tx)
                        .await?;
                    inserted.push(done.rows_affected() == 1);
                }
                tx.commit().await?;
                Ok(inserted)
            }
            .await;
            (conn, result)
        })
        .await
    }

    async fn finish_many(&self, batch: &[(Tenant, Finish)]) -> StoreResult<Vec<Option<Finished>>> {
        let rows = run_on(self, &self.pool, move |mut conn| async move {
            let result: Result<_, sqlx::Error> = async {
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                let mut rows = Vec::with_capacity(batch.len());
                for (tenant, cmd) in batch {
                    let args = sql::arguments::<sqlx::Sqlite>(sql::finish_params(tenant, cmd))?;
                    let row: Vec<FinishedRow> = sqlx::query_as_with(sql::FINISH, args)
                        .fetch_all(&mut *tx)
                        .await?;
                    rows.push(row);
                }
                tx.commit().await?;
                Ok(rows)
            }
            .await;
            (conn, result)
        })
        .await?;
        rows.into_iter()
            .map(|row| {
                at_most_one(row, "FINISH")?
                    .map(Finished::try_from)
                    .transpose()
            })
            .collect()
    }

    // One server process uses the file: nothing to announce.

    fn shared(&self) -> bool {
        false
    }

    async fn announce(&self, _tenant: &Tenant, _key: &Key) -> StoreResult<()> {
        Ok(())
    }

    fn subscribe(&self) -> Option<tokio::sync::mpsc::Receiver<(Tenant, Key)>> {
        None
    }

    async fn migrate(&self) -> StoreResult<()> {
        self.upgrade_edited_migrations()
            .await
            .map_err(StoreError::from_sqlite)?;
        MIGRATOR.run(self.pool.pool()).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(inner) => StoreError::from_sqlite(inner),
            other => StoreError::Internal(other.to_string()),
        })
    }

    async fn ping(&self) -> StoreResult<()> {
        self.execute("SELECT 1", &[], On::Pool).await.map(|_| ())
    }

    /// One server uses the file: its own clock is the arbiter.
    async fn database_now(&self) -> StoreResult<Option<Micros>> {
        Ok(None)
    }

    /// A file has no unreachable cause beyond its error.
    async fn unreachable_cause(&self) -> Option<String> {
        None
    }

    fn location(&self) -> String {
        String::new()
    }
}

/// This build's migrations.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

impl SqliteStore {
    /// Brings a database that applied a migration as first released to its current form
    /// ([`super::migrations`]), before the migrator compares checksums.
    async fn upgrade_edited_migrations(&self) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.pool().begin().await?;
        let (migrated,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
        )
        .fetch_one(&mut *tx)
        .await?;
        if migrated == 0 {
            return Ok(());
        }
        super::migrations::upgrade::<sqlx::Sqlite>(
            &mut tx,
            &MIGRATOR,
            sqlx::sqlite::SqliteQueryResult::rows_affected,
        )
        .await?;
        tx.commit().await
    }
}

/// A store error met inside a transaction, as the transaction's error (it rolls back).
fn bug(e: StoreError) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(e))
}

#[cfg(test)]
mod plans;

#[cfg(test)]
mod tests {
    use super::SqliteStore;
    use crate::storage::PoolOptions;

    async fn synchronous(pool: &sqlx::SqlitePool) -> i64 {
        sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(pool)
            .await
            .expect("PRAGMA synchronous")
    }

    #[tokio::test]
    async fn replays_count_on_a_connection_that_does_not_sync_and_the_rest_on_ones_that_do() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let store = SqliteStore::open(&url, &PoolOptions::default())
            .await
            .expect("open");
        // 2 is FULL: every claim and completion syncs the WAL before it answers.
        assert_eq!(synchronous(store.pool.pool()).await, 2);
        // 1 is NORMAL: a replay's count is written to the WAL, not synced.
        assert_eq!(synchronous(store.replays.pool()).await, 1);
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(store.replays.pool())
            .await
            .expect("PRAGMA journal_mode");
        // NORMAL keeps the file consistent through a power cut only in WAL mode.
        assert_eq!(journal, "wal");
    }
}
