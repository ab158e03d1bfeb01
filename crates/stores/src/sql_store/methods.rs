//! The store's methods, written once for both SQL backends over their [`Dialect`]: each one
//! statement of [`sql`] (or the backend's own wording), run with `Dialect::execute` or
//! `Dialect::fetch_all`.

use async_trait::async_trait;

use super::super::sql::{self, Also, Param};
use super::super::{
    EntryRow, Finish, Finished, FinishedRow, HistoryRow, IntentWindow, ListQuery, PoolStats,
    ReplayCount, Store, StoreError, StoreResult, UnresolvedCount, UnresolvedCountRow,
    UnresolvedQuery,
};
use super::{Dialect, On, SqlStore, at_most_one};
use crate::domain::{
    Approval, ApprovalState, ClaimToken, Entry, HistoryEvent, Key, Micros, RunId, Tenant,
};

/// The store of a SQL backend: every statement [`sql`]'s (or the backend's own, through
/// `Dialect`), run with `Dialect::execute` or `Dialect::fetch_all`; what a backend does its
/// own way, its `Dialect`'s.
#[async_trait]
impl<D: Dialect> Store for SqlStore<D> {
    async fn insert(&self, tenant: &Tenant, entry: &Entry) -> StoreResult<bool> {
        let params = sql::entry_params(tenant, entry);
        let inserted = self.execute(sql::INSERT, &params, On::Pool).await?;
        Ok(inserted == 1)
    }

    async fn get(&self, tenant: &Tenant, key: &Key) -> StoreResult<Option<Entry>> {
        let params = [Param::Text(tenant.as_str()), Param::Text(key.as_str())];
        let rows: Vec<EntryRow> = self.fetch_all(sql::GET, &params, On::Pool).await?;
        at_most_one(rows, "GET")?.map(Entry::try_from).transpose()
    }

    async fn restart(
        &self,
        tenant: &Tenant,
        expected_token: &ClaimToken,
        next: &Entry,
    ) -> StoreResult<bool> {
        let mut params = sql::entry_params(tenant, next).to_vec();
        params.push(Param::Text(expected_token.as_str()));
        let restarted = self.execute(sql::RESTART, &params, On::Pool).await?;
        Ok(restarted == 1)
    }

    async fn finish(&self, tenant: &Tenant, cmd: &Finish) -> StoreResult<Option<Finished>> {
        let params = sql::finish_params(tenant, cmd);
        let rows: Vec<FinishedRow> = self.fetch_all(sql::FINISH, &params, On::Pool).await?;
        at_most_one(rows, "FINISH")?
            .map(Finished::try_from)
            .transpose()
    }

    async fn replay(
        &self,
        tenant: &Tenant,
        key: &Key,
        fingerprint: &str,
        now: Micros,
    ) -> StoreResult<Option<Entry>> {
        let params = [
            Param::Text(tenant.as_str()),
            Param::Text(key.as_str()),
            Param::Text(fingerprint),
            Param::Int(now.0),
        ];
        // Its own statement and, on SQLite, its own connections: see sql::REPLAY.
        let rows: Vec<EntryRow> = self.fetch_all(D::REPLAY, &params, On::Replays).await?;
        at_most_one(rows, "REPLAY")?
            .map(Entry::try_from)
            .transpose()
    }

    async fn renew(
        &self,
        tenant: &Tenant,
        key: &Key,
        token: &ClaimToken,
        lease_expires_at: Micros,
        now: Micros,
    ) -> StoreResult<Option<Entry>> {
        let params = [
            Param::Text(tenant.as_str()),
            Param::Text(key.as_str()),
            Param::Text(token.as_str()),
            Param::Int(lease_expires_at.0),
            Param::Int(now.0),
        ];
        let rows: Vec<EntryRow> = self.fetch_all(sql::RENEW, &params, On::Pool).await?;
        at_most_one(rows, "RENEW")?.map(Entry::try_from).transpose()
    }

    async fn resolve(
        &self,
        tenant: &Tenant,
        done: &Entry,
        now: Micros,
        note: &HistoryEvent,
    ) -> StoreResult<Option<bool>> {
        let params = [
            Param::Text(tenant.as_str()),
            Param::Text(done.key.as_str()),
            Param::Text(done.status.as_str()),
            Param::Bytes(&done.result),
            Param::Text(&done.error),
            Param::Flag(done.retryable),
            Param::MaybeInt(done.finished_at.map(|m| m.0)),
            Param::MaybeInt(done.expires_at.map(|m| m.0)),
            Param::Int(now.0),
            Param::Text(done.resolved_by.as_str()),
            Param::Int(i64::from(done.attempt)),
            Param::Text(done.hold_token.as_str()),
        ];
        let note = [sql::history_params(tenant, &done.key, note)];
        let rows: Vec<(bool,)> = self.write_noted(sql::RESOLVE, &params, &[], &note).await?;
        Ok(at_most_one(rows, "RESOLVE")?.map(|(has_waiters,)| has_waiters))
    }

    async fn append_history(
        &self,
        tenant: &Tenant,
        key: &Key,
        event: &HistoryEvent,
    ) -> StoreResult<()> {
        // Through write_noted, so that its id is taken in commit order like every other.
        let params = [Param::Text(tenant.as_str()), Param::Text(key.as_str())];
        let note = [sql::history_params(tenant, key, event)];
        let _: Vec<(String,)> = self
            .write_noted(sql::ENTRY_KEY, &params, &[], &note)
            .await?;
        Ok(())
    }

    async fn history(&self, tenant: &Tenant, key: &Key) -> StoreResult<Vec<HistoryEvent>> {
        let params = [Param::Text(tenant.as_str()), Param::Text(key.as_str())];
        let rows: Vec<HistoryRow> = self.fetch_all(sql::HISTORY, &params, On::Pool).await?;
        rows.into_iter().map(HistoryEvent::try_from).collect()
    }

    async fn mark_double_effect(
        &self,
        tenant: &Tenant,
        key: &Key,
        note: &HistoryEvent,
    ) -> StoreResult<bool> {
        let params = [
            Param::Text(tenant.as_str()),
            Param::Text(key.as_str()),
            Param::Int(i64::from(note.attempt)),
        ];
        let history = [sql::history_params(tenant, key, note)];
        let rows: Vec<(String,)> = self
            .write_noted(sql::MARK_DOUBLE_EFFECT, &params, &[], &history)
            .await?;
        Ok(at_most_one(rows, "MARK_DOUBLE_EFFECT")?.is_some())
    }

    async fn acknowledge_double_effect(
        &self,
        tenant: &Tenant,
        key: &Key,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Entry>> {
        let params = [Param::Text(tenant.as_str()), Param::Text(key.as_str())];
        let history = [sql::history_params(tenant, key, note)];
        let rows: Vec<EntryRow> = self
            .write_noted(sql::ACKNOWLEDGE_DOUBLE_EFFECT, &params, &[], &history)
            .await?;
        at_most_one(rows, "ACKNOWLEDGE_DOUBLE_EFFECT")?
            .map(Entry::try_from)
            .transpose()
    }

    async fn insert_request(
        &self,
        tenant: &Tenant,
        entry: &Entry,
        note: &HistoryEvent,
    ) -> StoreResult<bool> {
        let mut params = sql::entry_params(tenant, entry).to_vec();
        params.push(Param::MaybeInt(entry.approval.requested_at.map(|m| m.0)));
        params.push(Param::MaybeInt(entry.approval.decide_by.map(|m| m.0)));
        let notes = [sql::history_params(tenant, &entry.key, note)];
        let keep = [keep_run(tenant, &entry.key, entry.approval.decide_by)];
        let rows: Vec<(String,)> = self
            .write_noted(sql::INSERT_REQUEST, &params, &keep, &notes)
            .await?;
        Ok(at_most_one(rows, "INSERT_REQUEST")?.is_some())
    }

    async fn request_again(
        &self,
        tenant: &Tenant,
        expected_token: &ClaimToken,
        next: &Entry,
        notes: &[HistoryEvent],
    ) -> StoreResult<bool> {
        let mut params = sql::entry_params(tenant, next).to_vec();
        params.push(Param::Text(expected_token.as_str()));
        params.push(Param::MaybeInt(next.approval.requested_at.map(|m| m.0)));
        params.push(Param::MaybeInt(next.approval.decide_by.map(|m| m.0)));
        let notes: Vec<[Param<'_>; 7]> = notes
            .iter()
            .map(|n| sql::history_params(tenant, &next.key, n))
            .collect();
        let keep = [keep_run(tenant, &next.key, next.approval.decide_by)];
        let rows: Vec<(String,)> = self
            .write_noted(sql::REQUEST_AGAIN, &params, &keep, &notes)
            .await?;
        Ok(at_most_one(rows, "REQUEST_AGAIN")?.is_some())
    }

    async fn use_approval(
        &self,
        tenant: &Tenant,
        claimed: &Entry,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Entry>> {
        let params = [
            Param::Text(tenant.as_str()),
            Param::Text(claimed.key.as_str()),
            Param::Text(claimed.claim_token.as_str()),
            Param::Int(claimed.started_at.0),
            Param::Int(claimed.lease_expires_at.0),
            Param::Text(claimed.principal.as_str()),
        ];
        let notes = [sql::history_params(tenant, &claimed.key, note)];
        let rows: Vec<EntryRow> = self
            .write_noted(sql::USE_APPROVAL, &params, &[], &notes)
            .await?;
        at_most_one(rows, "USE_APPROVAL")?
            .map(Entry::try_from)
            .transpose()
    }

    async fn decide(
        &self,
        tenant: &Tenant,
        key: &Key,
        fingerprint: &str,
        approval: &Approval,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Finished>> {
        let decided_at = approval.decided_at.unwrap_or(note.at);
        let mut params = vec![
            Param::Text(tenant.as_str()),
            Param::Text(key.as_str()),
            Param::Text(fingerprint),
            Param::Int(decided_at.0),
            Param::Text(approval.decided_by.as_str()),
            Param::Text(&approval.reason),
        ];
        let statement = if approval.state == ApprovalState::Approved {
            params.push(Param::MaybeInt(approval.execute_by.map(|m| m.0)));
            sql::APPROVE
        } else {
            sql::DENY
        };
        let notes = [sql::history_params(tenant, key, note)];
        let keep = [keep_run(tenant, key, Some(decided_at))];
        let rows: Vec<FinishedRow> = self.write_noted(statement, &params, &keep, &notes).await?;
        at_most_one(rows, "DECIDE")?
            .map(Finished::try_from)
            .transpose()
    }

    async fn lapsed_approvals(&self, now: Micros, limit: u32) -> StoreResult<Vec<(Tenant, Key)>> {
        let params = [Param::Int(now.0), Param::Int(i64::from(limit))];
        let rows: Vec<(String, String)> = self
            .fetch_all(sql::LAPSED_APPROVALS, &params, On::Pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(tenant, key)| (Tenant::from_stored(tenant), Key::from_stored(key)))
            .collect())
    }

    async fn expire_approval(
        &self,
        tenant: &Tenant,
        key: &Key,
        error: &str,
        at: Micros,
        now: Micros,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Finished>> {
        let params = [
            Param::Text(tenant.as_str()),
            Param::Text(key.as_str()),
            Param::Text(error),
            Param::Int(now.0),
            Param::Int(at.0),
        ];
        let notes = [sql::history_params(tenant, key, note)];
        let rows: Vec<FinishedRow> = self
            .write_noted(sql::EXPIRE_APPROVAL, &params, &[], &notes)
            .await?;
        at_most_one(rows, "EXPIRE_APPROVAL")?
            .map(Finished::try_from)
            .transpose()
    }

    async fn extend_run(&self, tenant: &Tenant, run_id: &RunId, until: Micros) -> StoreResult<u64> {
        let params = [
            Param::Text(tenant.as_str()),
            Param::Text(run_id.as_str()),
            Param::Int(until.0),
        ];
        self.execute(sql::EXTEND_RUN_UNTIL, &params, On::Pool).await
    }

    async fn count_window(
        &self,
        tenant: &Tenant,
        window: &IntentWindow<'_>,
        key_for: &(dyn Fn(u64) -> Key + Send + Sync),
        entry_for: Option<&(dyn Fn(u64) -> Entry + Send + Sync)>,
    ) -> StoreResult<(u64, bool)> {
        Dialect::count_window(&self.0, tenant, window, key_for, entry_for).await
    }

    async fn next_lapse(&self) -> StoreResult<Option<Micros>> {
        let rows: Vec<(Option<i64>,)> = self.fetch_all(sql::NEXT_LAPSE, &[], On::Pool).await?;
        Ok(at_most_one(rows, "NEXT_LAPSE")?.and_then(|(at,)| at.map(Micros)))
    }

    async fn keep_paused_runs(&self) -> StoreResult<u64> {
        self.execute(sql::KEEP_PAUSED_RUNS, &[], On::Pool).await
    }

    async fn run_kept_until(&self, tenant: &Tenant, run_id: &RunId) -> StoreResult<Option<Micros>> {
        let params = [Param::Text(tenant.as_str()), Param::Text(run_id.as_str())];
        let rows: Vec<(Option<i64>,)> = self
            .fetch_all(sql::RUN_KEPT_UNTIL, &params, On::Pool)
            .await?;
        Ok(at_most_one(rows, "RUN_KEPT_UNTIL")?.and_then(|(at,)| at.map(Micros)))
    }

    async fn approval_events(
        &self,
        tenant: &Tenant,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<(i64, HistoryEvent, Key)>> {
        let params = [
            Param::Text(tenant.as_str()),
            Param::Int(after),
            Param::Int(i64::from(limit)),
        ];
        let rows: Vec<(i64, i64, String, String, String)> = self
            .fetch_all(sql::APPROVAL_EVENTS, &params, On::Pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, at, kind, principal, key)| {
                (
                    id,
                    HistoryEvent {
                        at: Micros(at),
                        attempt: 0,
                        kind: crate::domain::EventKind::parse(&kind),
                        principal: crate::domain::Principal::from_stored(principal),
                        detail: String::new(),
                    },
                    Key::from_stored(key),
                )
            })
            .collect())
    }

    async fn last_history_id(&self, tenant: &Tenant) -> StoreResult<i64> {
        let rows: Vec<(i64,)> = self
            .fetch_all(
                sql::LAST_HISTORY_ID,
                &[Param::Text(tenant.as_str())],
                On::Pool,
            )
            .await?;
        Ok(at_most_one(rows, "LAST_HISTORY_ID")?.map_or(0, |(id,)| id))
    }

    async fn double_effects(&self, tenant: &Tenant, limit: u32) -> StoreResult<Vec<Entry>> {
        let params = [Param::Text(tenant.as_str()), Param::Int(i64::from(limit))];
        let rows: Vec<EntryRow> = self
            .fetch_all(sql::DOUBLE_EFFECTS, &params, On::Pool)
            .await?;
        rows.into_iter().map(Entry::try_from).collect()
    }

    async fn take_unresolved(
        &self,
        tenant: &Tenant,
        query: &UnresolvedQuery,
    ) -> StoreResult<Vec<Entry>> {
        let tool = query.tool.as_ref().map_or("", |t| t.as_str());
        let mut entries = Vec::with_capacity(query.keys.len());
        if query.keys.is_empty() {
            let params = [
                Param::Text(tenant.as_str()),
                Param::Int(query.now.0),
                Param::Int(query.started_before.0),
                Param::Text(tool),
                Param::Int(i64::from(query.limit)),
                Param::Int(query.hold_until.0),
                Param::Int(query.unknown_before.0),
                Param::Text(query.hold_token.as_str()),
            ];
            let rows: Vec<EntryRow> = self
                .fetch_all(D::TAKE_UNRESOLVED, &params, On::Pool)
                .await?;
            for row in rows {
                entries.push(Entry::try_from(row)?);
            }
        } else {
            // The named keys only, each its own primary-key update.
            for key in &query.keys {
                let params = [
                    Param::Text(tenant.as_str()),
                    Param::Int(query.now.0),
                    Param::Int(query.started_before.0),
                    Param::Text(tool),
                    Param::Text(key.as_str()),
                    Param::Int(query.hold_until.0),
                    Param::Int(query.unknown_before.0),
                    Param::Text(query.hold_token.as_str()),
                ];
                let rows: Vec<EntryRow> = self.fetch_all(sql::TAKE_KEY, &params, On::Pool).await?;
                if let Some(row) = at_most_one(rows, "TAKE_KEY")? {
                    entries.push(Entry::try_from(row)?);
                }
            }
        }
        // RETURNING follows no ORDER BY: restore oldest first.
        entries.sort_by(|a, b| (a.started_at, &a.key).cmp(&(b.started_at, &b.key)));
        Ok(entries)
    }

    async fn prune(&self, now: Micros, limit: u32) -> StoreResult<u64> {
        let params = [Param::Int(now.0), Param::Int(i64::from(limit))];
        self.execute(D::PRUNE, &params, On::Pool).await
    }

    async fn list(&self, tenant: &Tenant, query: &ListQuery) -> StoreResult<Vec<Entry>> {
        let (after_started, after_key) = query
            .after
            .as_ref()
            .map_or((i64::MIN, ""), |(started, key)| (started.0, key.as_str()));
        let run_id = query.run_id.as_ref().map_or("", |r| r.as_str());
        let params = [
            Param::Text(tenant.as_str()),
            Param::Text(run_id),
            Param::Text(query.tool.as_ref().map_or("", |t| t.as_str())),
            Param::Text(query.status.map_or("", |s| s.as_str())),
            Param::Int(query.started_from.0),
            Param::Int(query.started_before.0),
            Param::Int(after_started),
            Param::Text(after_key),
            Param::Int(i64::from(query.limit)),
            Param::Int(query.now.0),
            Param::Flag(query.possible_double_effect),
        ];
        // The run's own statement when there is a run, so its plan can use the run index.
        let rows: Vec<EntryRow> = if query.run_id.is_none() {
            self.fetch_all(sql::LIST, &params, On::Pool).await?
        } else {
            self.fetch_all(sql::LIST_RUN, &params, On::Pool).await?
        };
        rows.into_iter().map(Entry::try_from).collect()
    }

    async fn mark_waiting(&self, tenant: &Tenant, key: &Key) -> StoreResult<()> {
        let params = [Param::Text(tenant.as_str()), Param::Text(key.as_str())];
        self.execute(sql::MARK_WAITING, &params, On::Pool).await?;
        Ok(())
    }

    async fn count_replays(&self, counts: &[ReplayCount]) -> StoreResult<()> {
        if counts.is_empty() {
            return Ok(());
        }
        self.write_replay_counts(counts).await
    }

    fn is_full(&self) -> bool {
        self.marks().is_full()
    }

    async fn probe_write(&self) -> StoreResult<()> {
        let filler = super::super::probe_filler();
        self.execute(sql::PROBE_WRITE, &[Param::Bytes(&filler)], On::Pool)
            .await?;
        self.execute(sql::PROBE_DELETE, &[], On::Pool).await?;
        self.marks().has_space();
        Ok(())
    }

    async fn count_unresolved(&self, now: Micros) -> StoreResult<UnresolvedCount> {
        let rows: Vec<UnresolvedCountRow> = self
            .fetch_all(sql::COUNT_UNRESOLVED, &[Param::Int(now.0)], On::Pool)
            .await?;
        at_most_one(rows, "COUNT_UNRESOLVED")?
            .map(UnresolvedCount::from)
            .ok_or_else(|| StoreError::Internal("COUNT_UNRESOLVED returned no row".into()))
    }

    fn pool_stats(&self) -> PoolStats {
        self.pool().stats()
    }

    // What each backend does its own way: see `Dialect`.

    async fn insert_many(&self, batch: &[(Tenant, Entry)]) -> StoreResult<Vec<bool>> {
        Dialect::insert_many(&self.0, batch).await
    }

    async fn finish_many(&self, batch: &[(Tenant, Finish)]) -> StoreResult<Vec<Option<Finished>>> {
        Dialect::finish_many(&self.0, batch).await
    }

    fn shared(&self) -> bool {
        Dialect::shared(&self.0)
    }

    async fn announce(&self, tenant: &Tenant, key: &Key) -> StoreResult<()> {
        Dialect::announce(&self.0, tenant, key).await
    }

    fn subscribe(&self) -> Option<tokio::sync::mpsc::Receiver<(Tenant, Key)>> {
        Dialect::subscribe(&self.0)
    }

    fn backend(&self) -> &'static str {
        D::BACKEND
    }

    async fn migrate(&self) -> StoreResult<()> {
        Dialect::migrate(&self.0).await
    }

    async fn ping(&self) -> StoreResult<()> {
        Dialect::ping(&self.0).await
    }

    async fn database_now(&self) -> StoreResult<Option<Micros>> {
        Dialect::database_now(&self.0).await
    }

    async fn unreachable_cause(&self) -> Option<String> {
        Dialect::unreachable_cause(&self.0).await
    }

    fn location(&self) -> String {
        Dialect::location(&self.0)
    }
}

/// [`sql::EXTEND_RUN_OF_KEY`] for the run of tenant's `key`, from `from` (a request's
/// `decide_by`, a decision's time): what a request or a decision runs in its own transaction.
fn keep_run<'a>(tenant: &'a Tenant, key: &'a Key, from: Option<Micros>) -> Also<'a> {
    Also {
        statement: sql::EXTEND_RUN_OF_KEY,
        params: vec![
            Param::Text(tenant.as_str()),
            Param::Text(key.as_str()),
            Param::MaybeInt(from.map(|m| m.0)),
        ],
    }
}
