//! The production store: PostgreSQL, which several server processes may share. Claims are
//! decided by the primary key, so no advisory locks or serializable transactions are needed;
//! every write is one autocommit statement, acknowledged only after it committed. A replay's
//! count alone commits without waiting for the WAL flush ([`PgStore::REPLAY`]).

use crate::Classify as _;
use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use const_format::concatcp;

use super::sql::{self, Also, Param};
use super::sql_store::{self, Dialect, On, Read, Row, at_most_one, run_on};
use super::{
    Finish, Finished, PoolOptions, ReplayCount, StoreError, StoreMarks, StoreResult,
    kept_connections,
};
use crate::domain::{Entry, Key, Micros, Tenant};

mod connect;
mod group_writes;
mod listen;

use connect::connect_options;

/// A PostgreSQL store: a cheap-to-clone pool handle.
#[derive(Clone, Debug)]
pub struct PgStore {
    /// Connections opened lazily, so the server starts (and reports NOT_SERVING) while the
    /// database is still down.
    pool: kept_connections::Connections<sqlx::Postgres>,
    /// One more connection, kept apart for LISTEN so that it never takes a request's place.
    listen_pool: PgPool,
    /// Whether the disk was last found full.
    marks: std::sync::Arc<StoreMarks>,
    /// How the connections are opened (for diagnosing a failure, and for migrations).
    connect: PgConnectOptions,
    /// A transaction pooler sits between the server and the database.
    pooled: bool,
    /// What every transaction starts with behind a transaction pooler: `BEGIN`, and the
    /// statement timeout when there is one. Built once, shared by the store's clones.
    begin: std::sync::Arc<str>,
    /// A direct URL for migrations, when `connect` goes through a transaction pooler.
    migrations_url: Option<String>,
    /// How long opening one connection may take.
    connect_timeout: std::time::Duration,
}

/// A pooled connection idle longer than this is pinged before use: one that survived a
/// database restart then fails the ping, not the caller's statement. A busy connection is not
/// pinged, which saves a round trip per statement. (Connections the store holds between its
/// calls, `super::kept_connections`, go back to the pool once idle this long, or when a call failed.)
const PING_IF_IDLE_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Set on each of the server's own sessions (not behind a transaction pooler, where nothing
/// is set on a session). Every statement the server runs is written to find its rows through
/// an index (the primary key, the expiry, unresolved and run indexes), and its prepared
/// statements keep the generic plan they got first. A plan made while the table was nearly
/// empty (a new deployment, a truncated table) may be a sequential scan, which is right for a
/// few rows and stays cached as the table grows until an ANALYZE invalidates it; for a
/// batch's `UPDATE … FROM UNNEST(…)` that scanned the whole table per batch. Off, a
/// sequential scan is only chosen where no index applies (as the planner still may). Behind a
/// transaction pooler every statement is unnamed, so planned with its own parameters each
/// time, and needs no such setting. `$1` is the `statement_timeout`. A statement rather than
/// a startup option, so poolers that refuse startup options (PgBouncer) still connect.
pub const SESSION_SETTINGS: &str = "SELECT set_config('enable_seqscan', 'off', false), \
    set_config('statement_timeout', $1, false)";

/// This build's migrations.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// Brings a database that applied a migration as first released to its current form
/// ([`super::migrations`]), before the migrator compares checksums; in one transaction, so that
/// of two servers starting together the second finds nothing to do.
async fn upgrade_edited_migrations(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let (migrated,): (bool,) = sqlx::query_as("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *tx)
        .await?;
    if !migrated {
        return Ok(());
    }
    super::migrations::upgrade::<sqlx::Postgres>(
        &mut tx,
        &MIGRATOR,
        sqlx::postgres::PgQueryResult::rows_affected,
    )
    .await?;
    tx.commit().await
}

/// [`SESSION_SETTINGS`] without the statement timeout (`--db-statement-timeout 0`).
pub const PLAN_SETTING: &str = "SELECT set_config('enable_seqscan', 'off', false)";

/// How long migrations wait for their advisory lock (another server migrating, or a session
/// a pooler kept) before start-up says so, instead of waiting for ever.
const MIGRATION_LOCK_TIMEOUT: &str = "15s";

/// Set on the migration connection: the lock timeout, and no NOTICE for every `IF NOT EXISTS`
/// the migrator runs (the log said `relation "_sqlx_migrations" already exists` at every start).
const MIGRATION_SETTINGS: &str = "SELECT set_config('lock_timeout', $1, false), \
    set_config('client_min_messages', 'warning', false)";

/// The migrations already applied, to compare with this build's.
const APPLIED_MIGRATIONS: &str =
    "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version";

/// Whether this session's link to the server is encrypted, and with what.
const SESSION_SSL: &str =
    "SELECT ssl, COALESCE(version, '') FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

/// Sets, reads and resets a placeholder setting that nothing else uses: when the value set on
/// one of our connections shows on another, the two share a server session, as behind a
/// transaction pooler (a fresh session of a server of its own starts without it). Simple
/// queries, so that no prepared statement is involved (behind a pooler, the second
/// connection's would meet the first's on the shared session).
const SESSION_PROBE_SET: &str = "SET idempotency_ledger.session_probe = 'set-by-another-session'";
const SESSION_PROBE_GET: &str =
    "SELECT COALESCE(current_setting('idempotency_ledger.session_probe', true), '')";
const SESSION_PROBE_RESET: &str = "RESET idempotency_ledger.session_probe";

/// [`PgStore::INSERT_MANY`]'s text, built from the claim's column list ([`sql::CLAIM`]).
static INSERT_MANY_TEXT: sql::Text = sql::Text::new()
    .push("INSERT INTO ledger_entries (")
    .names(sql::CLAIM, "")
    .push(") SELECT * FROM UNNEST(")
    .arrays(sql::CLAIM)
    .push(") ON CONFLICT (tenant, key) DO NOTHING RETURNING claim_token");

impl PgStore {
    /// Adds replay counts (`$1` tenants, `$2` keys, `$3` tokens, `$4` counts, in (tenant, key)
    /// order) in one statement whose commit does not wait for the WAL flush, as
    /// [`PgStore::REPLAY`]'s: [`sql::ADD_REPLAYS`] for many rows.
    pub const ADD_REPLAYS_MANY: &str = "WITH no_flush_wait AS \
        (SELECT set_config('synchronous_commit', 'off', true)) \
        UPDATE ledger_entries AS e SET replay_count = e.replay_count + c.n \
        FROM no_flush_wait, UNNEST($1::text[], $2::text[], $3::text[], $4::int8[]) \
            AS c(tenant, key, claim_token, n) \
        WHERE e.tenant = c.tenant AND e.key = c.key AND e.claim_token = c.claim_token \
        AND e.status = 'SUCCEEDED'";

    /// [`sql::REPLAY`], whose commit does not wait for the WAL to reach the disk: the one-row
    /// CTE turns `synchronous_commit` off for the statement's own transaction (`set_config`
    /// with `is_local`, as `SET LOCAL`), which is the autocommit statement itself, or behind a
    /// transaction pooler the store's `BEGIN … COMMIT` around it. No session setting, no extra
    /// round trip. What that risks: a crash of the database (or a failover) may lose the counts
    /// committed in its last moments (at most three `wal_writer_delay`s, 600 ms by default,
    /// before the WAL writer flushes them), never an outcome: an outcome's commit is
    /// synchronous, and flushing it flushes every commit before it. The count stays exact
    /// otherwise: the statement reads the entry it answers from and counts under the row's
    /// lock, so concurrent replays of a key, on any server, are numbered one by one.
    pub const REPLAY: &str = concatcp!(
        "WITH no_flush_wait AS (SELECT set_config('synchronous_commit', 'off', true)) ",
        sql::REPLAY_SET,
        " FROM no_flush_wait",
        sql::REPLAY_WHERE
    );

    /// Takes the tenant `$1`'s history lock until the transaction ends, before its history rows
    /// take their ids: so those ids are taken in the order their transactions commit, and a
    /// watcher reading the history by id (WatchApprovals' cursor) never passes an id that a
    /// transaction still open could take (an identity's next value is taken before the commit,
    /// so without it a later id can become visible first). Transaction-scoped: it holds behind
    /// a transaction pooler, and only writers of one tenant's history wait for each other, for
    /// the time of their commit.
    pub const HISTORY_IN_COMMIT_ORDER: &str =
        "SELECT pg_advisory_xact_lock(hashtext('ledger_history'), hashtext($1))";

    /// Whether the server reached a standby: it accepts no writes.
    const IN_RECOVERY: &str = "SELECT pg_is_in_recovery()";

    /// The database's clock, in microseconds since the epoch (`clock_timestamp()`, which moves
    /// within a transaction, unlike `now()`).
    const DATABASE_NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8";

    /// Hands out unresolved entries, holding each until `$6` under the new hold `$8`. The rows
    /// are picked in a CTE, which PostgreSQL runs exactly once: a `LIMIT … FOR UPDATE SKIP
    /// LOCKED` subquery under `IN` may be re-run by the planner and pick more rows than the
    /// limit. SKIP LOCKED lets
    /// concurrent reconcilers on several servers pass each other's rows instead of waiting,
    /// and FOR UPDATE re-checks the condition on rows changed meanwhile.
    pub const TAKE_UNRESOLVED: &str = concatcp!(
        "WITH picked AS (SELECT tenant, key FROM ledger_entries WHERE ",
        sql::UNRESOLVED_WHERE,
        " ORDER BY started_at, key LIMIT $5 FOR UPDATE SKIP LOCKED) ",
        "UPDATE ledger_entries AS e SET reconcile_until = $6, hold_token = $8 FROM picked ",
        "WHERE e.tenant = picked.tenant AND e.key = picked.key RETURNING ",
        sql::E_ENTRY_COLUMNS
    );

    /// Claims many keys in one statement: one array per column, so the statement is the same
    /// for every batch size and stays prepared. Rows go in array order, so the first entry
    /// of a key wins; the others meet the conflict. Returns the tokens of the inserted rows.
    pub const INSERT_MANY: &str = INSERT_MANY_TEXT.as_str();

    /// [`sql::FINISH`] for many entries in one statement (one per key: see the batcher).
    pub const FINISH_MANY: &str = concatcp!(
        "UPDATE ledger_entries AS e SET status = v.status, result = v.result, \
         error = v.error, retryable = v.retryable, \
         finished_at = CASE WHEN v.status IN ('SUCCEEDED', 'FAILED') THEN v.now END, \
         expires_at = CASE WHEN v.status IN ('SUCCEEDED', 'FAILED') THEN ",
        sql::kept!("v.now + e.retention_us"),
        " END, \
         lease_expires_at = CASE WHEN v.status = 'UNKNOWN' AND e.lease_expires_at > v.now \
         THEN v.now ELSE e.lease_expires_at END, reconcile_until = NULL \
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], \
         $7::bool[], $8::int8[], $9::bool[]) \
         AS v(tenant, key, claim_token, status, result, error, retryable, now, also_unknown) \
         WHERE e.tenant = v.tenant AND e.key = v.key AND e.claim_token = v.claim_token \
         AND (e.status = 'ATTEMPTING' OR (e.status = 'UNKNOWN' AND v.also_unknown)) \
         RETURNING ",
        sql::E_ENTRY_COLUMNS,
        ", e.has_waiters"
    );

    /// Deletes up to `$2` finished entries past their expiry at `$1`, picked once in a CTE
    /// (see [`PgStore::TAKE_UNRESOLVED`]); the locked pick is re-checked, so a row a claim
    /// restarted meanwhile (no expiry any more) is not deleted. An entry of a run that awaits
    /// a person's decision is kept ([`sql::NOT_PAUSED`]).
    pub const PRUNE: &str = concatcp!(
        "WITH picked AS (SELECT tenant, key FROM ledger_entries AS e \
        WHERE expires_at <= $1 AND ",
        sql::NOT_PAUSED,
        " LIMIT $2 FOR UPDATE SKIP LOCKED) \
        DELETE FROM ledger_entries AS e USING picked \
        WHERE e.tenant = picked.tenant AND e.key = picked.key"
    );
}

impl Dialect for PgStore {
    const REPLAY: &str = PgStore::REPLAY;
    const TAKE_UNRESOLVED: &str = PgStore::TAKE_UNRESOLVED;
    const PRUNE: &str = PgStore::PRUNE;
    const BACKEND: &str = "postgres";

    type DB = sqlx::Postgres;

    fn classify(err: sqlx::Error) -> StoreError {
        StoreError::from_postgres(err)
    }

    fn marks(&self) -> &StoreMarks {
        &self.marks
    }

    fn pool(&self) -> &kept_connections::Connections<sqlx::Postgres> {
        &self.pool
    }

    /// Starts what one store call runs in: behind a transaction pooler, a transaction, so
    /// that sqlx's Parse and its Bind (two round trips) reach the same server connection.
    async fn open_call(&self, conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
        if self.pooled {
            sqlx::raw_sql(sqlx::AssertSqlSafe(self.begin.clone()))
                .execute(conn)
                .await?;
        }
        Ok(())
    }

    /// Ends what [`Dialect::open_call`] started: commits after `ok`, else rolls back (so the
    /// pooler gets its server connection back clean). The commit's result is the call's.
    async fn close_call(&self, conn: &mut sqlx::PgConnection, ok: bool) -> Result<(), sqlx::Error> {
        if self.pooled {
            let end = if ok { "COMMIT" } else { "ROLLBACK" };
            sqlx::raw_sql(end).execute(conn).await?;
        }
        Ok(())
    }

    /// One pool for every statement, replays included; statements stay prepared unless a
    /// transaction pooler sits in between.
    async fn execute(
        &self,
        statement: &'static str,
        params: &[Param<'_>],
        _on: On,
    ) -> StoreResult<u64> {
        let read: Read<_, _> = |bound, conn| Box::pin(bound.execute(conn));
        let done =
            sql_store::statement(self, &self.pool, self.persistent(), statement, params, read)
                .await?;
        Ok(done.rows_affected())
    }

    async fn fetch_all<R: Row>(
        &self,
        statement: &'static str,
        params: &[Param<'_>],
        _on: On,
    ) -> StoreResult<Vec<R>> {
        let read: Read<_, Vec<R>> =
            |bound, conn| Box::pin(bound.try_map(|row| R::from_row(&row)).fetch_all(conn));
        sql_store::statement(self, &self.pool, self.persistent(), statement, params, read).await
    }

    /// The statement and the history row in one transaction: the call's own behind a
    /// transaction pooler (see [`Dialect::open_call`]), else one begun here.
    async fn write_noted<R: Row>(
        &self,
        statement: &'static str,
        params: &[Param<'_>],
        also: &[Also<'_>],
        notes: &[[Param<'_>; 7]],
    ) -> StoreResult<Vec<R>> {
        let persistent = self.persistent();
        let written = Written {
            statement,
            params,
            also,
            notes,
            persistent,
        };
        let written = &written;
        run_on(self, &self.pool, move |mut conn| async move {
            let result: Result<_, sqlx::Error> = async {
                if self.pooled {
                    write_then_note(&mut conn, written).await
                } else {
                    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                    let rows = write_then_note(&mut tx, written).await?;
                    tx.commit().await?;
                    Ok(rows)
                }
            }
            .await;
            (conn, result)
        })
        .await
    }

    /// Adds replay counts in one statement ([`PgStore::ADD_REPLAYS_MANY`]).
    async fn write_replay_counts(&self, counts: &[ReplayCount]) -> StoreResult<()> {
        let tenants: Vec<&str> = counts.iter().map(|c| c.tenant.as_str()).collect();
        let keys: Vec<&str> = counts.iter().map(|c| c.key.as_str()).collect();
        let tokens: Vec<&str> = counts.iter().map(|c| c.claim_token.as_str()).collect();
        let ns: Vec<i64> = counts
            .iter()
            .map(|c| i64::try_from(c.count).unwrap_or(i64::MAX))
            .collect();
        // Borrowed by each try of the statement.
        let (tenants, keys, tokens, ns) = (&tenants, &keys, &tokens, &ns);
        run_on(self, &self.pool, move |mut conn| async move {
            let result: Result<_, sqlx::Error> = async {
                sqlx::query(Self::ADD_REPLAYS_MANY)
                    .bind(tenants)
                    .bind(keys)
                    .bind(tokens)
                    .bind(ns)
                    .persistent(self.persistent())
                    .execute(&mut *conn)
                    .await
            }
            .await;
            (conn, result)
        })
        .await?;
        Ok(())
    }

    async fn migrate(&self) -> StoreResult<()> {
        // Migrations take a session advisory lock (so servers starting together migrate
        // once), on a connection of their own: a direct one, since a transaction pooler
        // cannot hold a session lock.
        let direct = match (self.pooled, &self.migrations_url) {
            (false, _) => {
                self.check_sessions_are_ours().await?;
                Some(self.connect.clone())
            }
            (true, Some(url)) => Some(connect_options(url)?),
            (true, None) => None,
        };
        match direct {
            Some(options) => {
                let at = format!(
                    "migrating host={} port={} database={} user={}",
                    options.get_host(),
                    options.get_port(),
                    options.get_database().unwrap_or(""),
                    options.get_username()
                );
                let mut conn = self.connect_once(&options).await.map_err(|e| {
                    StoreError::from_opening(e, StoreError::from_postgres).context(&at)
                })?;
                let migrated = Self::migrate_on(&mut conn)
                    .await
                    .map_err(|e| e.context(&at));
                let _ = sqlx::Connection::close(conn).await;
                migrated?;
            }
            None => self.check_migrations().await?,
        }
        self.log_encryption().await;
        Ok(())
    }

    async fn ping(&self) -> StoreResult<()> {
        // A standby answers reads, so a plain `SELECT 1` would call it healthy; the ledger's
        // every call may write.
        let rows: Vec<(bool,)> = self.fetch_all(Self::IN_RECOVERY, &[], On::Pool).await?;
        let in_recovery = rows.first().is_some_and(|(in_recovery,)| *in_recovery);
        if in_recovery {
            // This connection, and the others opened the same way, lead to a standby.
            self.marks.discard_connections_open_now();
            return Err(StoreError::ReadOnly(format!(
                "the database at {} is a standby in recovery: it accepts no writes",
                self.describe()
            )));
        }
        Ok(())
    }

    async fn database_now(&self) -> StoreResult<Option<Micros>> {
        let rows: Vec<(i64,)> = self.fetch_all(Self::DATABASE_NOW, &[], On::Pool).await?;
        match at_most_one(rows, "DATABASE_NOW")? {
            Some((now,)) => Ok(Some(Micros(now))),
            None => Err(StoreError::Internal("DATABASE_NOW returned no row".into())),
        }
    }

    async fn unreachable_cause(&self) -> Option<String> {
        // The pool reports only that it timed out; a connection of our own says why.
        match self.connect_once(&self.connect).await {
            Ok(conn) => {
                let _ = sqlx::Connection::close(conn).await;
                None
            }
            Err(e) => Some(format!("{e} ({})", self.describe())),
        }
    }

    fn location(&self) -> String {
        self.describe()
    }

    async fn insert_many(&self, batch: &[(Tenant, Entry)]) -> StoreResult<Vec<bool>> {
        group_writes::insert_many(self, batch).await
    }

    async fn finish_many(&self, batch: &[(Tenant, Finish)]) -> StoreResult<Vec<Option<Finished>>> {
        group_writes::finish_many(self, batch).await
    }

    fn shared(&self) -> bool {
        true
    }

    async fn announce(&self, tenant: &Tenant, key: &Key) -> StoreResult<()> {
        listen::announce(self, tenant, key).await
    }

    fn subscribe(&self) -> Option<tokio::sync::mpsc::Receiver<(Tenant, Key)>> {
        listen::subscribe(self)
    }
}

/// What [`Dialect::write_noted`] writes, borrowed by each try.
struct Written<'a, 'p> {
    statement: &'static str,
    params: &'a [Param<'p>],
    also: &'a [Also<'p>],
    notes: &'a [[Param<'p>; 7]],
    persistent: bool,
}

/// [`Dialect::write_noted`]'s statements, on a connection already in a transaction: the write,
/// then (when it applied) what goes with it, then the history rows, their ids taken under
/// [`PgStore::HISTORY_IN_COMMIT_ORDER`].
async fn write_then_note<R: Row>(
    conn: &mut sqlx::PgConnection,
    w: &Written<'_, '_>,
) -> Result<Vec<R>, sqlx::Error> {
    let args = sql::arguments::<sqlx::Postgres>(w.params.iter().copied())?;
    let rows: Vec<R> = sqlx::query_as_with(w.statement, args)
        .persistent(w.persistent)
        .fetch_all(&mut *conn)
        .await?;
    if rows.is_empty() {
        return Ok(rows);
    }
    for also in w.also {
        let args = sql::arguments::<sqlx::Postgres>(also.params.iter().copied())?;
        sqlx::query_with(also.statement, args)
            .persistent(w.persistent)
            .execute(&mut *conn)
            .await?;
    }
    if let Some(first) = w.notes.first() {
        // The tenant is every note's first parameter.
        let args = sql::arguments::<sqlx::Postgres>([first[0]])?;
        sqlx::query_with(PgStore::HISTORY_IN_COMMIT_ORDER, args)
            .persistent(w.persistent)
            .execute(&mut *conn)
            .await?;
    }
    for note in w.notes {
        let args = sql::arguments::<sqlx::Postgres>(note.iter().copied())?;
        sqlx::query_with(sql::APPEND_HISTORY, args)
            .persistent(w.persistent)
            .execute(&mut *conn)
            .await?;
    }
    Ok(rows)
}
