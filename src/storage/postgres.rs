//! The production store: PostgreSQL, which several server processes may share. Claims are
//! decided by the primary key, so no advisory locks or serializable transactions are needed;
//! every write is one autocommit statement, acknowledged only after it committed.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::sql::{self, bind_entry, impl_store};
use super::{EntryRow, PoolOptions, StoreError, StoreResult, non_negative};
use crate::domain::Entry;

/// A PostgreSQL store: a cheap-to-clone pool handle.
#[derive(Clone, Debug)]
pub struct PgStore {
    /// Connections opened lazily, so the server starts (and reports NOT_SERVING) while the
    /// database is still down.
    pool: PgPool,
}

impl PgStore {
    /// Prepares a pool for `url` without connecting yet.
    ///
    /// # Errors
    /// `Internal` when the URL cannot be parsed.
    pub fn connect(url: &str, options: &PoolOptions) -> StoreResult<PgStore> {
        let connect = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Internal(format!("invalid PostgreSQL URL: {e}")))?
            .application_name("idempotency-ledger");
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            // A connection that survived a database restart is checked before reuse, so the
            // first call after an outage does not fail on a dead socket.
            .test_before_acquire(true)
            .connect_lazy_with(connect);
        Ok(PgStore { pool })
    }
}

impl_store!(PgStore, {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> StoreResult<()> {
        // sqlx takes an advisory lock, so servers starting together migrate once.
        sqlx::migrate!("migrations/postgres")
            .run(&self.pool)
            .await
            .map_err(|e| match e {
                sqlx::migrate::MigrateError::Execute(inner) => StoreError::from_sqlx(inner),
                other => StoreError::Internal(other.to_string()),
            })
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(StoreError::from_sqlx)
    }
});
