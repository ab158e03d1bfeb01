//! The embedded default store: one SQLite file, for one server process. WAL lets readers run
//! beside the writer; `synchronous = FULL` makes every acknowledged write survive a crash of
//! the process or the machine. Each write is one autocommit statement, which SQLite runs under
//! its write lock from the start, so no transaction ever upgrades a read lock (the source of
//! SQLITE_BUSY deadlocks).

use std::str::FromStr;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::sql::{self, bind_entry, impl_store};
use super::{EntryRow, PoolOptions, StoreError, StoreResult, non_negative};
use crate::domain::Entry;

/// A SQLite store: a cheap-to-clone pool handle.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Several connections so reads do not queue behind writes; writers serialize on
    /// SQLite's lock, waiting up to the busy timeout.
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the file `url` names, such as `sqlite://ledger.db`.
    ///
    /// # Errors
    /// `Internal` for a malformed URL; `Unavailable` when the file cannot be opened.
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
            .map_err(StoreError::from_sqlx)?;
        Ok(SqliteStore { pool })
    }
}

impl_store!(SqliteStore, {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> StoreResult<()> {
        sqlx::migrate!("migrations/sqlite")
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Internal(e.to_string()))
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(StoreError::from_sqlx)
    }
});
