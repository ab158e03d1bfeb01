//! The production store: PostgreSQL, which several server processes may share. Claims are
//! decided by the primary key, so no advisory locks or serializable transactions are needed;
//! every write is one autocommit statement, acknowledged only after it committed.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::run_on;
use super::sql::{self, bind_entry, bind_finish, impl_store, unresolved_where};
use super::{
    EntryRow, Finish, Finished, FinishedRow, ListQuery, PoolOptions, StoreError, StoreResult,
    UnresolvedQuery, WriteHealth,
};
use crate::domain::{Entry, Micros};

/// A PostgreSQL store: a cheap-to-clone pool handle.
#[derive(Clone, Debug)]
pub struct PgStore {
    /// Connections opened lazily, so the server starts (and reports NOT_SERVING) while the
    /// database is still down.
    pool: PgPool,
    /// One more connection, kept apart for LISTEN so that it never takes a request's place.
    listen_pool: PgPool,
    /// Whether the disk was last found full.
    health: std::sync::Arc<WriteHealth>,
}

/// A pooled connection idle longer than this is pinged before use: one that survived a
/// database restart then fails the ping, not the caller's statement. A busy connection is not
/// pinged, which saves a round trip per statement.
const PING_IF_IDLE_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Set on each of the server's sessions. Every statement the server runs is written to find
/// its rows through an index (the primary key, the expiry, unresolved and run indexes), and
/// its prepared statements keep the generic plan they got first. A plan made while the table
/// was nearly empty (a new deployment, a truncated table) may be a sequential scan, which is
/// right for a few rows and stays cached as the table grows until an ANALYZE invalidates it;
/// for a batch's `UPDATE … FROM UNNEST(…)` that scanned the whole table per batch. Off, a
/// sequential scan is only chosen where no index applies (as the planner still may). A
/// statement rather than a startup option, so connection poolers that refuse startup options
/// (PgBouncer) still connect.
pub const PLAN_SETTINGS: &str = "SET enable_seqscan = off";

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
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query(self::PLAN_SETTINGS).execute(conn).await?;
                    Ok(())
                })
            })
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(connect.clone());
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect);
        Ok(PgStore {
            pool,
            listen_pool,
            health: std::sync::Arc::default(),
        })
    }
}

/// [`entry_columns!`](super::sql) of the table aliased `e`.
macro_rules! e_entry_columns {
    () => {
        "e.key, e.run_id, e.tool, e.fingerprint, e.status, e.attempt, e.claim_token, \
         e.result, e.error, e.retryable, e.principal, e.started_at, e.finished_at, \
         e.lease_expires_at, e.retention_us, e.expires_at, e.replay_count"
    };
}

impl PgStore {
    /// Hands out unresolved entries, holding each until `$6`. The rows are picked in a CTE,
    /// which PostgreSQL runs exactly once: a `LIMIT … FOR UPDATE SKIP LOCKED` subquery under
    /// `IN` may be re-run by the planner and pick more rows than the limit. SKIP LOCKED lets
    /// concurrent reconcilers on several servers pass each other's rows instead of waiting,
    /// and FOR UPDATE re-checks the condition on rows changed meanwhile.
    pub const TAKE_UNRESOLVED: &str = concat!(
        "WITH picked AS (SELECT tenant, key FROM ledger_entries WHERE ",
        unresolved_where!(),
        " ORDER BY started_at, key LIMIT $5 FOR UPDATE SKIP LOCKED) ",
        "UPDATE ledger_entries AS e SET reconcile_until = $6 FROM picked ",
        "WHERE e.tenant = picked.tenant AND e.key = picked.key RETURNING ",
        e_entry_columns!()
    );

    /// Claims many keys in one statement: one array per column, so the statement is the same
    /// for every batch size and stays prepared. Rows go in array order, so the first entry
    /// of a key wins; the others meet the conflict. Returns the tokens of the inserted rows.
    pub const INSERT_MANY: &str = "INSERT INTO ledger_entries (tenant, key, run_id, tool, \
        fingerprint, status, attempt, claim_token, result, error, retryable, principal, \
        started_at, finished_at, lease_expires_at, retention_us, expires_at, replay_count, \
        arguments) \
        SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
        $6::text[], $7::int8[], $8::text[], $9::bytea[], $10::text[], $11::bool[], $12::text[], \
        $13::int8[], $14::int8[], $15::int8[], $16::int8[], $17::int8[], $18::int8[], \
        $19::text[]) \
        ON CONFLICT (tenant, key) DO NOTHING RETURNING claim_token";

    /// [`sql::FINISH`] for many entries in one statement (one per key: see the batcher).
    pub const FINISH_MANY: &str = concat!(
        "UPDATE ledger_entries AS e SET status = v.status, result = v.result, \
         error = v.error, retryable = v.retryable, \
         finished_at = CASE WHEN v.status IN ('SUCCEEDED', 'FAILED') THEN v.now END, \
         expires_at = CASE WHEN v.status IN ('SUCCEEDED', 'FAILED') \
         THEN v.now + e.retention_us END, reconcile_until = NULL \
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], \
         $7::bool[], $8::int8[], $9::bool[]) \
         AS v(tenant, key, claim_token, status, result, error, retryable, now, also_unknown) \
         WHERE e.tenant = v.tenant AND e.key = v.key AND e.claim_token = v.claim_token \
         AND (e.status = 'ATTEMPTING' OR (e.status = 'UNKNOWN' AND v.also_unknown)) \
         RETURNING ",
        e_entry_columns!(),
        ", e.has_waiters"
    );

    /// Deletes up to `$2` finished entries past their expiry at `$1`, picked once in a CTE
    /// (see [`PgStore::TAKE_UNRESOLVED`]); the locked pick is re-checked, so a row a claim
    /// restarted meanwhile (no expiry any more) is not deleted.
    pub const PRUNE: &str = "WITH picked AS (SELECT tenant, key FROM ledger_entries \
        WHERE expires_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED) \
        DELETE FROM ledger_entries AS e USING picked \
        WHERE e.tenant = picked.tenant AND e.key = picked.key";
}

/// The channel servers announce completions on; the payload is `tenant key` (tenants have no
/// whitespace, keys are printable ASCII).
const WAKE_CHANNEL: &str = "ledger_wake";

impl_store!(PgStore, StoreError::from_postgres, {
    fn shared(&self) -> bool {
        true
    }

    async fn insert_many(&self, batch: &[(String, Entry)]) -> StoreResult<Vec<bool>> {
        // Rows go in (tenant, key) order, so that two batches sharing keys lock them in the
        // same order and cannot deadlock; the sort is stable, so the first entry of a key
        // still wins.
        let rows = in_key_order(batch, |e| &e.key);
        let col = |f: fn(&Entry) -> String| rows.iter().map(|(_, e)| f(e)).collect::<Vec<_>>();
        let int = |f: fn(&Entry) -> i64| rows.iter().map(|(_, e)| f(e)).collect::<Vec<_>>();
        let opt = |f: fn(&Entry) -> Option<i64>| rows.iter().map(|(_, e)| f(e)).collect::<Vec<_>>();
        let tenants: Vec<&str> = rows.iter().map(|(t, _)| t.as_str()).collect();
        let keys = col(|e| e.key.clone());
        let run_ids = col(|e| e.run_id.clone());
        let tools = col(|e| e.tool.clone());
        let fingerprints = col(|e| e.fingerprint.clone());
        let statuses = col(|e| e.status.as_str().to_string());
        let attempts = int(|e| i64::from(e.attempt));
        let tokens = col(|e| e.claim_token.clone());
        let results: Vec<Vec<u8>> = rows.iter().map(|(_, e)| e.result.clone()).collect();
        let errors = col(|e| e.error.clone());
        let retryables: Vec<bool> = rows.iter().map(|(_, e)| e.retryable).collect();
        let principals = col(|e| e.principal.clone());
        let started = int(|e| e.started_at.0);
        let finished = opt(|e| e.finished_at.map(|m| m.0));
        let leases = int(|e| e.lease_expires_at.0);
        let retentions = int(|e| e.retention.0);
        let expires = opt(|e| e.expires_at.map(|m| m.0));
        let replays = int(|e| i64::try_from(e.replay_count).unwrap_or(i64::MAX));
        let arguments: Vec<Option<String>> =
            rows.iter().map(|(_, e)| e.arguments.clone()).collect();
        let inserted: Vec<String> =
            run_on!(self, StoreError::from_postgres, |conn| sqlx::query_scalar(
                Self::INSERT_MANY
            )
            .bind(&tenants)
            .bind(&keys)
            .bind(&run_ids)
            .bind(&tools)
            .bind(&fingerprints)
            .bind(&statuses)
            .bind(&attempts)
            .bind(&tokens)
            .bind(&results)
            .bind(&errors)
            .bind(&retryables)
            .bind(&principals)
            .bind(&started)
            .bind(&finished)
            .bind(&leases)
            .bind(&retentions)
            .bind(&expires)
            .bind(&replays)
            .bind(&arguments)
            .fetch_all(&mut *conn)
            .await)?;
        let inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
        Ok(batch
            .iter()
            .map(|(_, e)| inserted.contains(&e.claim_token))
            .collect())
    }

    async fn finish_many(&self, batch: &[(String, Finish)]) -> StoreResult<Vec<Option<Finished>>> {
        // In (tenant, key) order, as insert_many, so two batches cannot deadlock.
        let cmds = in_key_order(batch, |c| &c.key);
        let col = |f: fn(&Finish) -> String| cmds.iter().map(|(_, c)| f(c)).collect::<Vec<_>>();
        let tenants: Vec<&str> = cmds.iter().map(|(t, _)| t.as_str()).collect();
        let keys = col(|c| c.key.clone());
        let tokens = col(|c| c.claim_token.clone());
        let statuses = col(|c| c.completion.status.status().as_str().to_string());
        let results: Vec<Vec<u8>> = cmds
            .iter()
            .map(|(_, c)| c.completion.result.clone())
            .collect();
        let errors = col(|c| c.completion.error.clone());
        let retryables: Vec<bool> = cmds.iter().map(|(_, c)| c.completion.retryable).collect();
        let nows: Vec<i64> = cmds.iter().map(|(_, c)| c.now.0).collect();
        let also_unknown: Vec<bool> = cmds.iter().map(|(_, c)| c.also_unknown).collect();
        let rows: Vec<FinishedRow> =
            run_on!(self, StoreError::from_postgres, |conn| sqlx::query_as(
                Self::FINISH_MANY
            )
            .bind(&tenants)
            .bind(&keys)
            .bind(&tokens)
            .bind(&statuses)
            .bind(&results)
            .bind(&errors)
            .bind(&retryables)
            .bind(&nows)
            .bind(&also_unknown)
            .fetch_all(&mut *conn)
            .await)?;
        // Tokens are unique, so they tell which command each written row answers.
        let mut written: std::collections::HashMap<String, Finished> = rows
            .into_iter()
            .map(|r| Finished::try_from(r).map(|f| (f.entry.claim_token.clone(), f)))
            .collect::<StoreResult<_>>()?;
        Ok(batch
            .iter()
            .map(|(_, c)| written.remove(&c.claim_token))
            .collect())
    }

    async fn announce(&self, tenant: &str, key: &str) -> StoreResult<()> {
        let payload = format!("{tenant} {key}");
        run_on!(self, StoreError::from_postgres, |conn| sqlx::query(
            "SELECT pg_notify($1, $2)"
        )
        .bind(WAKE_CHANNEL)
        .bind(&payload)
        .execute(&mut *conn)
        .await)?;
        Ok(())
    }

    fn subscribe(&self) -> Option<tokio::sync::mpsc::Receiver<(String, String)>> {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let pool = self.listen_pool.clone();
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
                sqlx::migrate::MigrateError::Execute(inner) => StoreError::from_postgres(inner),
                other => StoreError::Internal(other.to_string()),
            })
    }

    async fn ping(&self) -> StoreResult<()> {
        run_on!(self, StoreError::from_postgres, |conn| sqlx::query(
            "SELECT 1"
        )
        .execute(&mut *conn)
        .await)
        .map(|_| ())
    }
});

/// The rows of `batch` sorted by (tenant, key), stably: the order in which a multi-row
/// statement takes their row locks, the same for every batch.
fn in_key_order<T>(batch: &[(String, T)], key: fn(&T) -> &String) -> Vec<&(String, T)> {
    let mut rows: Vec<&(String, T)> = batch.iter().collect();
    rows.sort_by(|a, b| (&a.0, key(&a.1)).cmp(&(&b.0, key(&b.1))));
    rows
}
