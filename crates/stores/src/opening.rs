//! Opening a store: which backend a database URL names, the pool's settings, and group commit
//! in front of the backend's claims and completions.

use std::sync::Arc;

use super::sql_store::SqlStore;
use super::{Store, StoreError, StoreResult, group_commit, postgres, redact_url, sqlite};

/// Opens the store a database URL names: `postgres://` or `postgresql://` for PostgreSQL,
/// `sqlite://` (or `sqlite:`) for an embedded file, created if missing. Inserts and
/// completions are group-committed ([`group_commit::GroupCommit`]): on PostgreSQL up to
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
    Ok(open_with_writers(url, options, writers).await?.0)
}

/// [`open`] with `writers` group-commit writers of each kind, and the batches' counts.
///
/// # Errors
/// As [`open`].
pub async fn open_with_writers(
    url: &str,
    options: &PoolOptions,
    writers: usize,
) -> StoreResult<(Arc<dyn Store>, Arc<group_commit::Stats>)> {
    let store = group_commit::GroupCommit::wrap(open_backend(url, options).await?, writers);
    let stats = store.stats_handle();
    Ok((Arc::new(store), stats))
}

/// The backend a database URL names, without group commit: each write its own statement.
/// (What [`open`] wraps in a [`group_commit::GroupCommit`]; tests of the batcher start from it.)
///
/// # Errors
/// As [`open`].
pub async fn open_backend(url: &str, options: &PoolOptions) -> StoreResult<Arc<dyn Store>> {
    if is_postgres(url) {
        Ok(Arc::new(SqlStore(postgres::PgStore::connect(
            url, options,
        )?)))
    } else if url.starts_with("sqlite:") {
        Ok(Arc::new(SqlStore(
            sqlite::SqliteStore::open(url, options).await?,
        )))
    } else {
        Err(unsupported(url))
    }
}

fn unsupported(url: &str) -> StoreError {
    StoreError::Internal(format!(
        "unsupported database URL scheme in {}: use postgres:// or sqlite://",
        redact_url(url)
    ))
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// How the server reaches PostgreSQL (`--postgres-pooler`, whose parser is the server's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
        use crate::defaults as d;
        PoolOptions {
            max_connections: d::DB_MAX_CONNECTIONS,
            acquire_timeout: d::DB_ACQUIRE_TIMEOUT,
            write_batches: usize::from(d::DB_WRITE_BATCHES),
            pooler: Pooler::None,
            migrations_url: None,
            statement_timeout: d::DB_STATEMENT_TIMEOUT,
            connect_timeout: d::DB_CONNECT_TIMEOUT,
        }
    }
}
