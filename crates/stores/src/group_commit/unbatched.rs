//! The calls of a [`GroupCommit`] that are not batched: straight to the store it wraps.

use async_trait::async_trait;

use super::GroupCommit;
use crate::domain::{Approval, ClaimToken, Entry, HistoryEvent, Key, Micros, RunId, Tenant};
use crate::storage::{
    Finish, Finished, IntentWindow, ListQuery, PoolStats, ReplayCount, Store, StoreResult,
    UnresolvedCount, UnresolvedQuery,
};

/// `insert` and `finish` batched; the rest as the inner store answers.
#[async_trait]
impl Store for GroupCommit {
    async fn insert(&self, tenant: &Tenant, entry: &Entry) -> StoreResult<bool> {
        self.batch_insert(tenant, entry).await
    }

    async fn get(&self, tenant: &Tenant, key: &Key) -> StoreResult<Option<Entry>> {
        self.inner.get(tenant, key).await
    }

    async fn restart(
        &self,
        tenant: &Tenant,
        expected_token: &ClaimToken,
        next: &Entry,
    ) -> StoreResult<bool> {
        self.inner.restart(tenant, expected_token, next).await
    }

    async fn finish(&self, tenant: &Tenant, cmd: &Finish) -> StoreResult<Option<Finished>> {
        self.batch_finish(tenant, cmd).await
    }

    async fn replay(
        &self,
        tenant: &Tenant,
        key: &Key,
        fingerprint: &str,
        now: Micros,
    ) -> StoreResult<Option<Entry>> {
        self.inner.replay(tenant, key, fingerprint, now).await
    }

    async fn renew(
        &self,
        tenant: &Tenant,
        key: &Key,
        token: &ClaimToken,
        lease_expires_at: Micros,
        now: Micros,
    ) -> StoreResult<Option<Entry>> {
        self.inner
            .renew(tenant, key, token, lease_expires_at, now)
            .await
    }

    async fn resolve(
        &self,
        tenant: &Tenant,
        done: &Entry,
        now: Micros,
        note: &HistoryEvent,
    ) -> StoreResult<Option<bool>> {
        self.inner.resolve(tenant, done, now, note).await
    }

    async fn append_history(
        &self,
        tenant: &Tenant,
        key: &Key,
        event: &HistoryEvent,
    ) -> StoreResult<()> {
        self.inner.append_history(tenant, key, event).await
    }

    async fn history(&self, tenant: &Tenant, key: &Key) -> StoreResult<Vec<HistoryEvent>> {
        self.inner.history(tenant, key).await
    }

    async fn mark_double_effect(
        &self,
        tenant: &Tenant,
        key: &Key,
        note: &HistoryEvent,
    ) -> StoreResult<bool> {
        self.inner.mark_double_effect(tenant, key, note).await
    }

    async fn acknowledge_double_effect(
        &self,
        tenant: &Tenant,
        key: &Key,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Entry>> {
        self.inner
            .acknowledge_double_effect(tenant, key, note)
            .await
    }

    async fn insert_request(
        &self,
        tenant: &Tenant,
        entry: &Entry,
        note: &HistoryEvent,
    ) -> StoreResult<bool> {
        self.inner.insert_request(tenant, entry, note).await
    }

    async fn request_again(
        &self,
        tenant: &Tenant,
        expected_token: &ClaimToken,
        next: &Entry,
        notes: &[HistoryEvent],
    ) -> StoreResult<bool> {
        self.inner
            .request_again(tenant, expected_token, next, notes)
            .await
    }

    async fn use_approval(
        &self,
        tenant: &Tenant,
        claimed: &Entry,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Entry>> {
        self.inner.use_approval(tenant, claimed, note).await
    }

    async fn decide(
        &self,
        tenant: &Tenant,
        key: &Key,
        fingerprint: &str,
        approval: &Approval,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Finished>> {
        self.inner
            .decide(tenant, key, fingerprint, approval, note)
            .await
    }

    async fn lapsed_approvals(&self, now: Micros, limit: u32) -> StoreResult<Vec<(Tenant, Key)>> {
        self.inner.lapsed_approvals(now, limit).await
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
        self.inner
            .expire_approval(tenant, key, error, at, now, note)
            .await
    }

    async fn extend_run(&self, tenant: &Tenant, run_id: &RunId, until: Micros) -> StoreResult<u64> {
        self.inner.extend_run(tenant, run_id, until).await
    }

    /// Not batched: its transaction holds the window's count and the entry together.
    async fn count_window(
        &self,
        tenant: &Tenant,
        window: &IntentWindow<'_>,
        key_for: &(dyn Fn(u64) -> Key + Send + Sync),
        entry_for: Option<&(dyn Fn(u64) -> Entry + Send + Sync)>,
    ) -> StoreResult<(u64, bool)> {
        self.inner
            .count_window(tenant, window, key_for, entry_for)
            .await
    }

    async fn next_lapse(&self) -> StoreResult<Option<Micros>> {
        self.inner.next_lapse().await
    }

    async fn keep_paused_runs(&self) -> StoreResult<u64> {
        self.inner.keep_paused_runs().await
    }

    async fn run_kept_until(&self, tenant: &Tenant, run_id: &RunId) -> StoreResult<Option<Micros>> {
        self.inner.run_kept_until(tenant, run_id).await
    }

    async fn approval_events(
        &self,
        tenant: &Tenant,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<(i64, HistoryEvent, Key)>> {
        self.inner.approval_events(tenant, after, limit).await
    }

    async fn last_history_id(&self, tenant: &Tenant) -> StoreResult<i64> {
        self.inner.last_history_id(tenant).await
    }

    async fn double_effects(&self, tenant: &Tenant, limit: u32) -> StoreResult<Vec<Entry>> {
        self.inner.double_effects(tenant, limit).await
    }

    async fn take_unresolved(
        &self,
        tenant: &Tenant,
        query: &UnresolvedQuery,
    ) -> StoreResult<Vec<Entry>> {
        self.inner.take_unresolved(tenant, query).await
    }

    async fn prune(&self, now: Micros, limit: u32) -> StoreResult<u64> {
        self.inner.prune(now, limit).await
    }

    async fn list(&self, tenant: &Tenant, query: &ListQuery) -> StoreResult<Vec<Entry>> {
        self.inner.list(tenant, query).await
    }

    async fn mark_waiting(&self, tenant: &Tenant, key: &Key) -> StoreResult<()> {
        self.inner.mark_waiting(tenant, key).await
    }

    async fn count_replays(&self, counts: &[ReplayCount]) -> StoreResult<()> {
        self.inner.count_replays(counts).await
    }

    async fn insert_many(&self, batch: &[(Tenant, Entry)]) -> StoreResult<Vec<bool>> {
        self.inner.insert_many(batch).await
    }

    async fn finish_many(&self, batch: &[(Tenant, Finish)]) -> StoreResult<Vec<Option<Finished>>> {
        self.inner.finish_many(batch).await
    }

    fn shared(&self) -> bool {
        self.inner.shared()
    }

    async fn announce(&self, tenant: &Tenant, key: &Key) -> StoreResult<()> {
        self.inner.announce(tenant, key).await
    }

    fn subscribe(&self) -> Option<tokio::sync::mpsc::Receiver<(Tenant, Key)>> {
        self.inner.subscribe()
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn migrate(&self) -> StoreResult<()> {
        self.inner.migrate().await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }

    async fn database_now(&self) -> StoreResult<Option<Micros>> {
        self.inner.database_now().await
    }

    async fn unreachable_cause(&self) -> Option<String> {
        self.inner.unreachable_cause().await
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn is_full(&self) -> bool {
        self.inner.is_full()
    }

    async fn probe_write(&self) -> StoreResult<()> {
        self.inner.probe_write().await
    }

    async fn count_unresolved(&self, now: Micros) -> StoreResult<UnresolvedCount> {
        self.inner.count_unresolved(now).await
    }

    fn pool_stats(&self) -> PoolStats {
        self.inner.pool_stats()
    }
}
