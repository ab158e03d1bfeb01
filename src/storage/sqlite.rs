//! The embedded default store: one SQLite file, for one server process. WAL lets readers run
//! beside the writer; `synchronous = FULL` makes every acknowledged write survive a crash of
//! the process or the machine. Each write is one autocommit statement, which SQLite runs under
//! its write lock from the start, so no transaction ever upgrades a read lock (the source of
//! SQLITE_BUSY deadlocks).

use std::str::FromStr;

use sqlx::Connection as _;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::run_on;
use super::sql::{self, bind_entry, bind_finish, entry_columns, impl_store, unresolved_where};
use super::{
    EntryRow, Finish, Finished, FinishedRow, ListQuery, PoolOptions, StoreError, StoreResult,
    UnresolvedQuery, WriteHealth,
};
use crate::domain::{Entry, Micros};

/// A SQLite store: a cheap-to-clone pool handle.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Several connections so reads do not queue behind writes; writers serialize on
    /// SQLite's lock, waiting up to the busy timeout.
    pool: SqlitePool,
    /// Whether the disk was last found full.
    health: std::sync::Arc<WriteHealth>,
}

impl SqliteStore {
    /// Opens (creating if missing) the file `url` names, such as `sqlite://ledger.db`.
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
            .connect_with(connect)
            .await
            .map_err(StoreError::from_sqlite)?;
        Ok(SqliteStore {
            pool,
            health: std::sync::Arc::default(),
        })
    }
}

impl SqliteStore {
    /// Every statement may stay prepared: the connections are the server's own.
    fn persistent(&self) -> bool {
        true
    }

    /// Each call is one autocommit statement (or a transaction of its own): nothing to open.
    #[allow(clippy::unused_async)]
    async fn open_call(&self, _conn: &mut sqlx::SqliteConnection) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// Nothing to close: see [`SqliteStore::open_call`].
    #[allow(clippy::unused_async)]
    async fn close_call(
        &self,
        _conn: &mut sqlx::SqliteConnection,
        _ok: bool,
    ) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// Hands out unresolved entries, holding each until `$6`. SQLite runs one writer at a
    /// time and evaluates the `IN` subquery once, so the statement needs no row locks.
    const TAKE_UNRESOLVED: &str = concat!(
        "UPDATE ledger_entries SET reconcile_until = $6 WHERE (tenant, key) IN (",
        "SELECT tenant, key FROM ledger_entries WHERE ",
        unresolved_where!(),
        " ORDER BY started_at, key LIMIT $5) RETURNING ",
        entry_columns!()
    );

    /// Deletes up to `$2` finished entries past their expiry at `$1`.
    const PRUNE: &str = "DELETE FROM ledger_entries WHERE (tenant, key) IN (\
        SELECT tenant, key FROM ledger_entries WHERE expires_at <= $1 LIMIT $2)";
}

#[async_trait::async_trait]
impl super::Batches for SqliteStore {
    async fn insert_many(&self, batch: &[(String, Entry)]) -> StoreResult<Vec<bool>> {
        // One transaction, so one commit (one fsync) for the batch; IMMEDIATE takes the write
        // lock up front, so the transaction never has to upgrade a read lock. The answers
        // count only once the commit succeeded.
        run_on!(self, StoreError::from_sqlite, |conn| async {
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            let mut inserted = Vec::with_capacity(batch.len());
            for (tenant, entry) in batch {
                let done = bind_entry!(sqlx::query(sql::INSERT), tenant, entry)
                    .execute(&mut *tx)
                    .await?;
                inserted.push(done.rows_affected() == 1);
            }
            tx.commit().await?;
            Ok(inserted)
        }
        .await)
    }

    async fn finish_many(&self, batch: &[(String, Finish)]) -> StoreResult<Vec<Option<Finished>>> {
        let rows = run_on!(self, StoreError::from_sqlite, |conn| async {
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            let mut rows = Vec::with_capacity(batch.len());
            for (tenant, cmd) in batch {
                let row: Vec<FinishedRow> = bind_finish!(sqlx::query_as(sql::FINISH), tenant, cmd)
                    .fetch_all(&mut *tx)
                    .await?;
                rows.push(row);
            }
            tx.commit().await?;
            Ok(rows)
        }
        .await)?;
        rows.into_iter()
            .map(|row| {
                super::at_most_one(row, "FINISH")?
                    .map(Finished::try_from)
                    .transpose()
            })
            .collect()
    }
}

/// One server process uses the file: nothing to announce.
impl super::Announcements for SqliteStore {}

impl_store!(SqliteStore, StoreError::from_sqlite, operations: {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> StoreResult<()> {
        sqlx::migrate!("migrations/sqlite")
            .run(&self.pool)
            .await
            .map_err(|e| match e {
                sqlx::migrate::MigrateError::Execute(inner) => StoreError::from_sqlite(inner),
                other => StoreError::Internal(other.to_string()),
            })
    }

    async fn ping(&self) -> StoreResult<()> {
        run_on!(self, StoreError::from_sqlite, |conn| sqlx::query(
            "SELECT 1"
        )
        .execute(&mut *conn)
        .await)
        .map(|_| ())
    }
});
