//! The statements both backends run. PostgreSQL and SQLite (through sqlx, which maps `$N` to
//! SQLite's numbered parameters) accept the same text, so the claim path is written once.
//! Every statement is a single atomic statement; its `WHERE` clause is the compare-and-set,
//! the one [`cas`](crate::domain::entry::cas) names in Rust for each write.

/// The columns of [`EntryRow`](super::EntryRow), for `RETURNING` clauses.
macro_rules! entry_columns {
    () => {
        "key, run_id, tool, fingerprint, status, attempt, claim_token, result, error, \
         retryable, principal, started_at, finished_at, lease_expires_at, retention_us, \
         expires_at, replay_count, resolved_by"
    };
}

/// Claims a key: the primary key on (tenant, key) decides among concurrent claimants.
pub const INSERT: &str = "INSERT INTO ledger_entries (tenant, key, run_id, tool, \
    fingerprint, status, attempt, claim_token, result, error, retryable, principal, started_at, \
    finished_at, lease_expires_at, retention_us, expires_at, replay_count, arguments) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
    $19) ON CONFLICT (tenant, key) DO NOTHING";

/// Reads one entry, with its stored arguments.
pub const GET: &str = concat!(
    "SELECT ",
    entry_columns!(),
    ", arguments FROM ledger_entries WHERE tenant = $1 AND key = $2"
);

/// Starts a new attempt on a resolved entry that still carries the token the caller saw
/// ([`cas::restarts`](crate::domain::entry::cas::restarts)). The
/// new attempt has no waiters yet (those of the last one were answered by its outcome).
pub const RESTART: &str = "UPDATE ledger_entries SET run_id = $3, tool = $4, \
    fingerprint = $5, status = $6, attempt = $7, claim_token = $8, result = $9, error = $10, \
    retryable = $11, principal = $12, started_at = $13, finished_at = $14, \
    lease_expires_at = $15, retention_us = $16, expires_at = $17, replay_count = $18, \
    arguments = $19, has_waiters = FALSE, resolved_by = '' \
    WHERE tenant = $1 AND key = $2 AND claim_token = $20 \
    AND status IN ('SUCCEEDED', 'FAILED')";

/// Records a claimant's outcome `$4` at `$8`, fenced by the claim token and the entry being
/// ATTEMPTING (or also UNKNOWN when `$9`). A resolved outcome sets `finished_at` and
/// `expires_at` from the entry's own retention, so the statement needs no prior read.
/// Returns the entry as written and whether a claim waits for it. Applies as
/// [`cas::finishes`](crate::domain::entry::cas::finishes) says.
pub const FINISH: &str = concat!(
    "UPDATE ledger_entries SET status = $4, result = $5, error = $6, retryable = $7, \
     finished_at = CASE WHEN $4 IN ('SUCCEEDED', 'FAILED') THEN $8 END, \
     expires_at = CASE WHEN $4 IN ('SUCCEEDED', 'FAILED') THEN $8 + retention_us END, \
     reconcile_until = NULL \
     WHERE tenant = $1 AND key = $2 AND claim_token = $3 \
     AND (status = 'ATTEMPTING' OR (status = 'UNKNOWN' AND $9)) \
     RETURNING ",
    entry_columns!(),
    ", has_waiters"
);

/// [`REPLAY`] with `$from` (a `FROM` clause, or nothing) after its `SET`: PostgreSQL's form
/// joins the one-row CTE that sets its commit apart (see `PgStore::REPLAY`).
macro_rules! replay_update {
    ($from:expr) => {
        concat!(
            "UPDATE ledger_entries SET replay_count = replay_count + 1",
            $from,
            " WHERE tenant = $1 AND key = $2 AND status = 'SUCCEEDED' AND fingerprint = $3 \
             AND expires_at > $4 RETURNING ",
            $crate::storage::sql::entry_columns!()
        )
    };
}

/// Counts a replay of a result that is still there for this request: SUCCEEDED, the same
/// fingerprint `$3`, not expired at `$4`
/// ([`cas::replays`](crate::domain::entry::cas::replays)). Returns the entry with its new count. The read
/// that answers the replay and the count are one statement, so concurrent replays of a key
/// are numbered one by one. Only the count is written, so its commit need not wait for the
/// disk: SQLite runs this on a connection that does not sync its commits, PostgreSQL runs
/// `PgStore::REPLAY`, this with the commit's flush turned off.
pub const REPLAY: &str = replay_update!("");

/// Adds `$4` replays to the count of the attempt holding token `$3`, while it is SUCCEEDED
/// (the replays a server answered from memory; see `ledger::memory`).
pub const ADD_REPLAYS: &str = "UPDATE ledger_entries SET replay_count = replay_count + $4 \
    WHERE tenant = $1 AND key = $2 AND claim_token = $3 AND status = 'SUCCEEDED'";

/// Extends the lease of the attempt holding token `$3` to `$4`, only while it is ATTEMPTING
/// and its lease has not ended at `$5` ([`cas::renews`](crate::domain::entry::cas::renews)). Returns the entry as written.
pub const RENEW: &str = concat!(
    "UPDATE ledger_entries SET lease_expires_at = $4 \
     WHERE tenant = $1 AND key = $2 AND claim_token = $3 AND status = 'ATTEMPTING' \
     AND lease_expires_at > $5 RETURNING ",
    entry_columns!()
);

/// Records what a reconciler found, fenced by the outcome being unknown at `$9` (reported
/// UNKNOWN, or an attempt past its lease); no token, since the answer concerns the intent,
/// whichever attempt made it happen ([`cas::resolves`](crate::domain::entry::cas::resolves)).
/// `$10` is who resolved it (the Reconcile's principal).
pub const RESOLVE: &str = "UPDATE ledger_entries SET status = $3, result = $4, \
    error = $5, retryable = $6, finished_at = $7, expires_at = $8, reconcile_until = NULL, \
    resolved_by = $10 \
    WHERE tenant = $1 AND key = $2 \
    AND (status = 'UNKNOWN' OR (status = 'ATTEMPTING' AND lease_expires_at <= $9)) \
    RETURNING has_waiters";

/// Notes that a claim waits for this attempt, so its completion is announced to other servers.
pub const MARK_WAITING: &str = "UPDATE ledger_entries SET has_waiters = TRUE \
    WHERE tenant = $1 AND key = $2 AND status = 'ATTEMPTING' AND NOT has_waiters";

/// Upserts the write probe's row (see migration 0005).
pub const PROBE_WRITE: &str = "INSERT INTO ledger_write_probe (id, filler) VALUES (1, $1) \
    ON CONFLICT (id) DO UPDATE SET filler = excluded.filler";

/// Deletes the write probe's row again.
pub const PROBE_DELETE: &str = "DELETE FROM ledger_write_probe WHERE id = 1";

/// Counts every tenant's unresolved entries at `$1`, split by what callers are told: UNKNOWN
/// (reported, or an attempt past its lease) and ATTEMPTING (in its lease). `expires_at IS NULL`
/// is exactly "unresolved" (the CHECK constraint resolved_entries_expire) and matches the
/// partial index `ledger_entries_unresolved_by_start`, so the count reads only the backlog.
/// SUM over CASE rather than FILTER: the same text runs on both backends.
pub const COUNT_UNRESOLVED: &str = "SELECT \
    COALESCE(SUM(CASE WHEN status = 'ATTEMPTING' AND lease_expires_at > $1 THEN 0 ELSE 1 END), 0) \
        AS unknown, \
    COALESCE(SUM(CASE WHEN status = 'ATTEMPTING' AND lease_expires_at > $1 THEN 1 ELSE 0 END), 0) \
        AS attempting \
    FROM ledger_entries WHERE expires_at IS NULL";

/// The unresolved entries a reconciler may take at `$2`: outcome unknown, started at or before
/// `$3`, of tool `$4` (or any when empty), not held by another reconciler. `expires_at IS NULL`
/// (true of every unresolved entry) is what lets the pick use the partial index
/// `ledger_entries_unresolved_by_start`; no statement on one entry says it, so their plans keep
/// to the primary key (migration 0003).
macro_rules! unresolved_where {
    () => {
        "tenant = $1 AND expires_at IS NULL \
         AND (status = 'UNKNOWN' OR (status = 'ATTEMPTING' AND lease_expires_at <= $2)) \
         AND started_at <= $3 AND ($4 = '' OR tool = $4) \
         AND (reconcile_until IS NULL OR reconcile_until <= $2)"
    };
}

/// Takes one named unresolved entry (key `$5`) for a reconciler until `$6`, on the conditions
/// of `unresolved_where!` (at `$2`, started by `$3`, of tool `$4`): a Reconcile with `keys`
/// settles these entries and takes no other. A statement on one entry: it does not say
/// `expires_at IS NULL` (the status test implies it), so that its plan keeps to the primary key
/// rather than the unresolved index (migration 0003; tests/api/plans.rs).
pub const TAKE_KEY: &str = concat!(
    "UPDATE ledger_entries SET reconcile_until = $6 \
     WHERE tenant = $1 AND key = $5 \
     AND (status = 'UNKNOWN' OR (status = 'ATTEMPTING' AND lease_expires_at <= $2)) \
     AND started_at <= $3 AND ($4 = '' OR tool = $4) \
     AND (reconcile_until IS NULL OR reconcile_until <= $2) RETURNING ",
    entry_columns!()
);

/// The filters and cursor of a listing (see [`LIST`]): tool `$3` (any when empty), status `$4`
/// as Lookup reports it at `$10` (any when empty; an attempt past its lease is UNKNOWN),
/// started in [`$5`, `$6`), and after the cursor (`$7` started_at, `$8` key) in the listing's
/// order, by started_at and then key.
macro_rules! list_filter {
    () => {
        "($3 = '' OR tool = $3) \
         AND ($4 = '' \
              OR (status = $4 AND (status <> 'ATTEMPTING' OR lease_expires_at > $10)) \
              OR ($4 = 'UNKNOWN' AND status = 'ATTEMPTING' AND lease_expires_at <= $10)) \
         AND started_at >= $5 AND started_at < $6 \
         AND (started_at > $7 OR (started_at = $7 AND key > $8)) \
         ORDER BY started_at, key LIMIT $9"
    };
}

/// A page of one run's entries (run `$2`), with their stored arguments; see `list_filter!`.
/// The run's own statement, so that its plan can use the (tenant, run_id, started_at, key)
/// index: a generic plan cannot when the run is an optional filter.
pub const LIST_RUN: &str = concat!(
    "SELECT ",
    entry_columns!(),
    ", arguments FROM ledger_entries WHERE tenant = $1 AND run_id = $2 AND ",
    list_filter!()
);

/// A page of a tenant's entries of any run (`$2` is empty), with their stored arguments; see
/// `list_filter!`.
pub const LIST: &str = concat!(
    "SELECT ",
    entry_columns!(),
    ", arguments FROM ledger_entries WHERE tenant = $1 AND $2 = '' AND ",
    list_filter!()
);

/// Binds an [`Entry`](crate::domain::Entry)'s columns as `$1`..`$19` in [`INSERT`]'s order.
macro_rules! bind_entry {
    ($query:expr, $tenant:expr, $e:expr) => {
        $query
            .bind($tenant)
            .bind(&$e.key)
            .bind(&$e.run_id)
            .bind(&$e.tool)
            .bind(&$e.fingerprint)
            .bind($e.status.as_str())
            .bind(i64::from($e.attempt))
            .bind(&$e.claim_token)
            .bind(&$e.result)
            .bind(&$e.error)
            .bind($e.retryable)
            .bind(&$e.principal)
            .bind($e.started_at.0)
            .bind($e.finished_at.map(|m| m.0))
            .bind($e.lease_expires_at.0)
            .bind($e.retention.0)
            .bind($e.expires_at.map(|m| m.0))
            .bind(i64::try_from($e.replay_count).unwrap_or(i64::MAX))
            .bind(&$e.arguments)
    };
}

/// Binds a [`Finish`](super::Finish) as [`FINISH`]'s `$1`..`$9`.
macro_rules! bind_finish {
    ($query:expr, $tenant:expr, $cmd:expr) => {
        $query
            .bind($tenant)
            .bind(&$cmd.key)
            .bind(&$cmd.claim_token)
            .bind($cmd.completion.status.status().as_str())
            .bind(&$cmd.completion.result)
            .bind(&$cmd.completion.error)
            .bind($cmd.completion.retryable)
            .bind($cmd.now.0)
            .bind($cmd.also_unknown)
    };
}

/// Implements [`Store`](super::Store) for a type with a `pool` field, a `replay_pool()` (where
/// replays are counted) and a `REPLAY` statement: the backend-specific
/// methods given as `$own`, plus the methods whose SQL both backends share, every statement
/// run through [`run_on`](super::run_on) with the backend's error classifier `$classify`, and
/// read to the end (`execute` or `fetch_all`, never `fetch_optional`: see `run_on`). A macro
/// rather than generics over `sqlx::Database`: the bounds those need are longer than the
/// code. It emits the whole `impl` so that `async_trait` sees every method.
macro_rules! impl_store {
    ($ty:ty, $classify:expr, operations: { $($own:tt)* }) => {
        #[async_trait::async_trait]
        impl super::Entries for $ty {

        async fn insert(&self, tenant: &str, entry: &Entry) -> StoreResult<bool> {
            let done = run_on!(self, $classify, |conn| {
                bind_entry!(sqlx::query(sql::INSERT), tenant, entry)
                    .persistent(self.persistent())
                    .execute(&mut *conn)
                    .await
            })?;
            Ok(done.rows_affected() == 1)
        }

        async fn get(&self, tenant: &str, key: &str) -> StoreResult<Option<Entry>> {
            let rows: Vec<EntryRow> = run_on!(self, $classify, |conn| {
                sqlx::query_as(sql::GET)
                    .bind(tenant)
                    .bind(key)
                    .persistent(self.persistent())
                    .fetch_all(&mut *conn)
                    .await
            })?;
            super::at_most_one(rows, "GET")?
                .map(Entry::try_from)
                .transpose()
        }

        async fn restart(
            &self,
            tenant: &str,
            expected_token: &str,
            next: &Entry,
        ) -> StoreResult<bool> {
            let done = run_on!(self, $classify, |conn| {
                bind_entry!(sqlx::query(sql::RESTART), tenant, next)
                    .bind(expected_token)
                    .persistent(self.persistent())
                    .execute(&mut *conn)
                    .await
            })?;
            Ok(done.rows_affected() == 1)
        }

        async fn finish(&self, tenant: &str, cmd: &Finish) -> StoreResult<Option<Finished>> {
            let rows: Vec<FinishedRow> = run_on!(self, $classify, |conn| {
                bind_finish!(sqlx::query_as(sql::FINISH), tenant, cmd)
                    .persistent(self.persistent())
                    .fetch_all(&mut *conn)
                    .await
            })?;
            super::at_most_one(rows, "FINISH")?
                .map(Finished::try_from)
                .transpose()
        }

        async fn replay(
            &self,
            tenant: &str,
            key: &str,
            fingerprint: &str,
            now: Micros,
        ) -> StoreResult<Option<Entry>> {
            // Its own statement and, on SQLite, its own connections: see sql::REPLAY.
            let rows: Vec<EntryRow> = run_on!(self, $classify, pool: self.replay_pool(), |conn| {
                sqlx::query_as(Self::REPLAY)
                    .bind(tenant)
                    .bind(key)
                    .bind(fingerprint)
                    .bind(now.0)
                    .persistent(self.persistent())
                    .fetch_all(&mut *conn)
                    .await
            })?;
            super::at_most_one(rows, "REPLAY")?
                .map(Entry::try_from)
                .transpose()
        }

        async fn renew(
            &self,
            tenant: &str,
            key: &str,
            token: &str,
            lease_expires_at: Micros,
            now: Micros,
        ) -> StoreResult<Option<Entry>> {
            let rows: Vec<EntryRow> = run_on!(self, $classify, |conn| {
                sqlx::query_as(sql::RENEW)
                    .bind(tenant)
                    .bind(key)
                    .bind(token)
                    .bind(lease_expires_at.0)
                    .bind(now.0)
                    .persistent(self.persistent())
                    .fetch_all(&mut *conn)
                    .await
            })?;
            super::at_most_one(rows, "RENEW")?
                .map(Entry::try_from)
                .transpose()
        }

        async fn resolve(
            &self,
            tenant: &str,
            done: &Entry,
            now: Micros,
        ) -> StoreResult<Option<bool>> {
            let rows: Vec<bool> = run_on!(self, $classify, |conn| {
                sqlx::query_scalar(sql::RESOLVE)
                    .bind(tenant)
                    .bind(&done.key)
                    .bind(done.status.as_str())
                    .bind(&done.result)
                    .bind(&done.error)
                    .bind(done.retryable)
                    .bind(done.finished_at.map(|m| m.0))
                    .bind(done.expires_at.map(|m| m.0))
                    .bind(now.0)
                    .bind(&done.resolved_by)
                    .persistent(self.persistent())
                    .fetch_all(&mut *conn)
                    .await
            })?;
            super::at_most_one(rows, "RESOLVE")
        }

        async fn take_unresolved(
            &self,
            tenant: &str,
            query: &UnresolvedQuery,
        ) -> StoreResult<Vec<Entry>> {
            if !query.keys.is_empty() {
                // The named keys only, each its own primary-key update.
                let mut entries = Vec::with_capacity(query.keys.len());
                for key in &query.keys {
                    let rows: Vec<EntryRow> = run_on!(self, $classify, |conn| {
                        sqlx::query_as(sql::TAKE_KEY)
                            .bind(tenant)
                            .bind(query.now.0)
                            .bind(query.started_before.0)
                            .bind(&query.tool)
                            .bind(key)
                            .bind(query.hold_until.0)
                            .persistent(self.persistent())
                            .fetch_all(&mut *conn)
                            .await
                    })?;
                    if let Some(row) = super::at_most_one(rows, "TAKE_KEY")? {
                        entries.push(Entry::try_from(row)?);
                    }
                }
                entries.sort_by(|a, b| (a.started_at, &a.key).cmp(&(b.started_at, &b.key)));
                return Ok(entries);
            }
            let rows: Vec<EntryRow> = run_on!(self, $classify, |conn| {
                sqlx::query_as(Self::TAKE_UNRESOLVED)
                    .bind(tenant)
                    .bind(query.now.0)
                    .bind(query.started_before.0)
                    .bind(&query.tool)
                    .bind(i64::from(query.limit))
                    .bind(query.hold_until.0)
                    .persistent(self.persistent())
                    .fetch_all(&mut *conn)
                    .await
            })?;
            let mut entries = rows
                .into_iter()
                .map(Entry::try_from)
                .collect::<StoreResult<Vec<Entry>>>()?;
            // RETURNING follows no ORDER BY: restore oldest first.
            entries.sort_by(|a, b| (a.started_at, &a.key).cmp(&(b.started_at, &b.key)));
            Ok(entries)
        }

        async fn prune(&self, now: Micros, limit: u32) -> StoreResult<u64> {
            let done = run_on!(self, $classify, |conn| {
                sqlx::query(Self::PRUNE)
                    .bind(now.0)
                    .bind(i64::from(limit))
                    .persistent(self.persistent())
                    .execute(&mut *conn)
                    .await
            })?;
            Ok(done.rows_affected())
        }

        async fn list(&self, tenant: &str, query: &ListQuery) -> StoreResult<Vec<Entry>> {
            let (after_started, after_key) = query
                .after
                .as_ref()
                .map_or((i64::MIN, ""), |(started, key)| (started.0, key.as_str()));
            let rows: Vec<EntryRow> = run_on!(self, $classify, |conn| {
                // The run's own statement when there is a run, so its plan can use the run index.
                let select = if query.run_id.is_empty() {
                    sqlx::query_as(sql::LIST)
                } else {
                    sqlx::query_as(sql::LIST_RUN)
                };
                select
                    .bind(tenant)
                    .bind(&query.run_id)
                    .bind(&query.tool)
                    .bind(query.status.map_or("", |s| s.as_str()))
                    .bind(query.started_from.0)
                    .bind(query.started_before.0)
                    .bind(after_started)
                    .bind(after_key)
                    .bind(i64::from(query.limit))
                    .bind(query.now.0)
                    .persistent(self.persistent())
                    .fetch_all(&mut *conn)
                    .await
            })?;
            rows.into_iter().map(Entry::try_from).collect()
        }

        async fn count_replays(&self, counts: &[super::ReplayCount]) -> StoreResult<()> {
            if counts.is_empty() {
                return Ok(());
            }
            self.write_replay_counts(counts).await
        }

        async fn mark_waiting(&self, tenant: &str, key: &str) -> StoreResult<()> {
            run_on!(self, $classify, |conn| {
                sqlx::query(sql::MARK_WAITING)
                    .bind(tenant)
                    .bind(key)
                    .persistent(self.persistent())
                    .execute(&mut *conn)
                    .await
            })?;
            Ok(())
        }

        }

        #[async_trait::async_trait]
        impl super::Operations for $ty {
        $($own)*

        async fn count_unresolved(&self, now: Micros) -> StoreResult<super::UnresolvedCount> {
            run_on!(self, $classify, |conn| {
                sqlx::query_as(sql::COUNT_UNRESOLVED)
                    .bind(now.0)
                    .persistent(self.persistent())
                    .fetch_one(&mut *conn)
                    .await
            })
        }

        fn is_full(&self) -> bool {
            self.marks.is_full()
        }

        async fn probe_write(&self) -> StoreResult<()> {
            let filler = super::probe_filler();
            run_on!(self, $classify, |conn| async {
                sqlx::query(sql::PROBE_WRITE)
                    .bind(&filler)
                    .persistent(self.persistent())
                    .execute(&mut *conn)
                    .await?;
                sqlx::query(sql::PROBE_DELETE)
                    .persistent(self.persistent())
                    .execute(&mut *conn)
                    .await
            }
            .await)?;
            self.marks.has_space();
            Ok(())
        }

        fn pool_stats(&self) -> super::PoolStats {
            // Connections the store holds between its calls are idle too.
            let size = self.pool.pool().size();
            let idle = u32::try_from(self.pool.pool().num_idle() + self.pool.held())
                .unwrap_or(u32::MAX)
                .min(size);
            super::PoolStats {
                in_use: size - idle,
                idle,
                max: self.pool.pool().options().get_max_connections(),
            }
        }

        }
    };
}

pub(crate) use {
    bind_entry, bind_finish, entry_columns, impl_store, replay_update, unresolved_where,
};
