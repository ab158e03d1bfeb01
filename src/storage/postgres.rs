//! The production store: PostgreSQL, which several server processes may share. Claims are
//! decided by the primary key, so no advisory locks or serializable transactions are needed;
//! every write is one autocommit statement, acknowledged only after it committed.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::sql::{self, bind_entry, impl_store, unresolved_where};
use super::{EntryRow, PoolOptions, StoreError, StoreResult, UnresolvedQuery, non_negative};
use crate::domain::{Entry, Micros};

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

impl PgStore {
    /// Hands out unresolved entries, holding each until `$6`. The rows are picked in a CTE,
    /// which PostgreSQL runs exactly once: a `LIMIT … FOR UPDATE SKIP LOCKED` subquery under
    /// `IN` may be re-run by the planner and pick more rows than the limit. SKIP LOCKED lets
    /// concurrent reconcilers on several servers pass each other's rows instead of waiting,
    /// and FOR UPDATE re-checks the condition on rows changed meanwhile.
    const TAKE_UNRESOLVED: &str = concat!(
        "WITH picked AS (SELECT tenant, key FROM ledger_entries WHERE ",
        unresolved_where!(),
        " ORDER BY started_at, key LIMIT $5 FOR UPDATE SKIP LOCKED) ",
        "UPDATE ledger_entries AS e SET reconcile_until = $6 FROM picked ",
        "WHERE e.tenant = picked.tenant AND e.key = picked.key RETURNING ",
        "e.key, e.run_id, e.tool, e.fingerprint, e.status, e.attempt, e.claim_token, ",
        "e.result, e.error, e.retryable, e.principal, e.started_at, e.finished_at, ",
        "e.lease_expires_at, e.retention_us, e.expires_at, e.replay_count"
    );

    /// Deletes up to `$2` finished entries past their expiry at `$1`, picked once in a CTE
    /// (see [`PgStore::TAKE_UNRESOLVED`]); the locked pick is re-checked, so a row a claim
    /// restarted meanwhile (no expiry any more) is not deleted.
    const PRUNE: &str = "WITH picked AS (SELECT tenant, key FROM ledger_entries \
        WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) \
        DELETE FROM ledger_entries AS e USING picked \
        WHERE e.tenant = picked.tenant AND e.key = picked.key";
}

/// The channel servers announce completions on; the payload is `tenant key` (tenants have no
/// whitespace, keys are printable ASCII).
const WAKE_CHANNEL: &str = "ledger_wake";

impl_store!(PgStore, {
    fn shared(&self) -> bool {
        true
    }

    async fn announce(&self, tenant: &str, key: &str) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(WAKE_CHANNEL)
            .bind(format!("{tenant} {key}"))
            .execute(&self.pool)
            .await
            .map_err(StoreError::from_sqlx)?;
        Ok(())
    }

    fn subscribe(&self) -> Option<tokio::sync::mpsc::Receiver<(String, String)>> {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let pool = self.pool.clone();
        tokio::spawn(async move {
            // One dedicated connection LISTENs; sqlx reconnects it after a failure, and the
            // waiters' own slow poll covers whatever was announced while it was down.
            loop {
                let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot LISTEN yet; retrying");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        continue;
                    }
                };
                if let Err(e) = listener.listen(WAKE_CHANNEL).await {
                    tracing::debug!(error = %e, "LISTEN failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
                loop {
                    match listener.recv().await {
                        Ok(n) => {
                            tracing::debug!(payload = n.payload(), "announcement received");
                            let Some((tenant, key)) = n.payload().split_once(' ') else {
                                continue;
                            };
                            if tx
                                .send((tenant.to_string(), key.to_string()))
                                .await
                                .is_err()
                            {
                                return; // nobody consumes announcements any more
                            }
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "LISTEN connection lost; reconnecting");
                            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                            break;
                        }
                    }
                }
            }
        });
        Some(rx)
    }

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
