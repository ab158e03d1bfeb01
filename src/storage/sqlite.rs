//! The embedded default store: one SQLite file, for one server process. WAL lets readers run
//! beside the writer; `synchronous = FULL` makes every acknowledged write survive a crash of
//! the process or the machine. Each write is one autocommit statement, which SQLite runs under
//! its write lock from the start, so no transaction ever upgrades a read lock (the source of
//! SQLITE_BUSY deadlocks).
//!
//! Replays are the exception, and only for their count: they run on a connection of their own
//! with `synchronous = NORMAL`, whose commits are written to the WAL but not synced
//! ([`SqliteStore::open`] says why that is safe).

use std::str::FromStr;

use sqlx::Connection as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::run_on;
use super::sql::{self, bind_entry, bind_finish, entry_columns, impl_store, unresolved_where};
use super::{
    EntryRow, Finish, Finished, FinishedRow, ListQuery, PoolOptions, StoreError, StoreMarks,
    StoreResult, UnresolvedQuery,
};
use crate::domain::{Entry, Micros};

/// A SQLite store: a cheap-to-clone pool handle.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Several connections so reads do not queue behind writes; writers serialize on
    /// SQLite's lock, waiting up to the busy timeout.
    pool: super::held::Connections<sqlx::Sqlite>,
    /// The one connection replays are counted on, with `synchronous = NORMAL` (see
    /// [`SqliteStore::open`]). One is enough: SQLite writes one at a time, and replays then
    /// queue here rather than in each other's busy handlers.
    replays: super::held::Connections<sqlx::Sqlite>,
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
            pool: super::held::Connections::new(pool),
            replays: super::held::Connections::new(replays),
            marks: std::sync::Arc::default(),
        })
    }
}

impl SqliteStore {
    /// Adds replay counts in one transaction on the connection that does not sync its commits
    /// (the replay pool): counts only, like a replay's own.
    async fn write_replay_counts(&self, counts: &[super::ReplayCount]) -> StoreResult<()> {
        run_on!(self, StoreError::from_sqlite, pool: self.replays, |conn| async {
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            for c in counts {
                sqlx::query(sql::ADD_REPLAYS)
                    .bind(&c.tenant)
                    .bind(&c.key)
                    .bind(&c.claim_token)
                    .bind(i64::try_from(c.count).unwrap_or(i64::MAX))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        }
        .await)
    }

    /// [`sql::REPLAY`], as it is.
    const REPLAY: &str = sql::REPLAY;

    /// Where replays are counted: the connection that does not sync (see [`SqliteStore::open`]).
    fn replay_pool(&self) -> &super::held::Connections<sqlx::Sqlite> {
        &self.replays
    }

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
            .run(self.pool.pool())
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
        assert_eq!(synchronous(store.replay_pool().pool()).await, 1);
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(store.replay_pool().pool())
            .await
            .expect("PRAGMA journal_mode");
        // NORMAL keeps the file consistent through a power cut only in WAL mode.
        assert_eq!(journal, "wal");
    }
}
