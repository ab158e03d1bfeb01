//! The one [`Store`] trait the use cases hold (`Arc<dyn Store>`), what its methods take and
//! answer, and [`StoreError`]. Its implementations, the SQL backends and the group commit
//! around them, are the `ledger-stores` crate's: nothing here knows a database driver.

mod error;
mod values;

use async_trait::async_trait;

use crate::domain::{Approval, ClaimToken, Entry, HistoryEvent, Key, Micros, RunId, Tenant};

pub use error::{StoreError, StoreResult};
pub use values::{
    Finish, Finished, IntentWindow, ListQuery, PoolStats, ReplayCount, UnresolvedCount,
    UnresolvedQuery,
};

/// The store: everything the ledger, the server and its tasks hold one for, one trait over
/// both backends (`Arc<dyn Store>`). Its writes are the compare-and-set writes the domain
/// decides on, each a single atomic statement; its reads tell what to decide. One row per
/// (tenant, key). The stores' group commit is a store too: it wraps another and batches its
/// `insert` and `finish`.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Inserts `entry` unless (tenant, key) exists. `true` when this call inserted it: the
    /// unique constraint, not a prior read, decides among concurrent claimants.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn insert(&self, tenant: &Tenant, entry: &Entry) -> StoreResult<bool>;

    /// Reads the entry of (tenant, key), whatever its state.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn get(&self, tenant: &Tenant, key: &Key) -> StoreResult<Option<Entry>>;

    /// Replaces a resolved entry with a new attempt (`next`, same key), only if the stored entry
    /// is still resolved and still carries `expected_token`. A resolved entry's outcome never
    /// changes under one token, so (token, resolved) identifies exactly the state the caller saw.
    /// `true` when it replaced it.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn restart(
        &self,
        tenant: &Tenant,
        expected_token: &ClaimToken,
        next: &Entry,
    ) -> StoreResult<bool>;

    /// Records a claimant's outcome (see [`Finish`]) only if the entry still carries its claim
    /// token and is ATTEMPTING (or also UNKNOWN, when `cmd.also_unknown`); the store computes
    /// `finished_at` and `expires_at` from the entry's retention. The entry as written when it
    /// applied, committed before it returns.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn finish(&self, tenant: &Tenant, cmd: &Finish) -> StoreResult<Option<Finished>>;

    /// Counts a replay and returns the entry, only if it is SUCCEEDED with `fingerprint` and
    /// not expired at `now`: the whole replay in one statement. `None` otherwise (read the
    /// entry to learn why).
    ///
    /// The one write whose commit does not wait for the disk: it changes only the count, and
    /// the outcome it answers with was made durable by its Complete. So the count is
    /// committed (every server sees it; concurrent replays are numbered one by one) but not
    /// synced: a crash of the database or its machine may lose the counts of its last moments,
    /// never an outcome (see the backends' `REPLAY`).
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn replay(
        &self,
        tenant: &Tenant,
        key: &Key,
        fingerprint: &str,
        now: Micros,
    ) -> StoreResult<Option<Entry>>;

    /// Moves the lease end of the attempt holding `token` to `lease_expires_at`, only if the
    /// entry is ATTEMPTING with that token and its lease has not ended at `now`. The entry as
    /// written when it applied.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn renew(
        &self,
        tenant: &Tenant,
        key: &Key,
        token: &ClaimToken,
        lease_expires_at: Micros,
        now: Micros,
    ) -> StoreResult<Option<Entry>>;

    /// Writes a reconciler's finding (the outcome fields of `done`) only if the entry's outcome
    /// is unknown at `now` (reported UNKNOWN, or ATTEMPTING past its lease), it is still at
    /// `done.attempt`, and `done.hold_token` is still its newest hold: the fence of the finding
    /// ([`cas::resolves`](crate::domain::entry::cas::resolves)). Releases the reconcile hold,
    /// and appends `note` to the entry's history in the same transaction. `Some(has_waiters)`
    /// when it wrote them.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn resolve(
        &self,
        tenant: &Tenant,
        done: &Entry,
        now: Micros,
        note: &HistoryEvent,
    ) -> StoreResult<Option<bool>>;

    /// Appends `event` to the history of (tenant, key), if it has an entry, committed before it
    /// returns.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn append_history(
        &self,
        tenant: &Tenant,
        key: &Key,
        event: &HistoryEvent,
    ) -> StoreResult<()>;

    /// The history of (tenant, key), oldest first.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn history(&self, tenant: &Tenant, key: &Key) -> StoreResult<Vec<HistoryEvent>>;

    /// Marks the entry as a possible double effect, unless it started over at an attempt
    /// before `note.attempt`, and appends `note` to its history, in one transaction. `true`
    /// when it marked it (or it was marked already).
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn mark_double_effect(
        &self,
        tenant: &Tenant,
        key: &Key,
        note: &HistoryEvent,
    ) -> StoreResult<bool>;

    /// Clears the entry's mark of a possible double effect, only where it is set, and appends
    /// `note` to its history, in one transaction. The entry as written when it applied.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn acknowledge_double_effect(
        &self,
        tenant: &Tenant,
        key: &Key,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Entry>>;

    /// Creates `entry` (AWAITING_APPROVAL, its approval requested) unless (tenant, key) exists,
    /// with `note` in its history and every finished entry of its run kept until at least its
    /// `decide_by` plus their retention (a paused run keeps its keys), in one transaction.
    /// `true` when this call created it.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn insert_request(
        &self,
        tenant: &Tenant,
        entry: &Entry,
        note: &HistoryEvent,
    ) -> StoreResult<bool>;

    /// Replaces the entry with `next` (AWAITING_APPROVAL, a fresh request), only if it still
    /// carries `expected_token` and is awaiting, finished or failed, with `notes` in its history
    /// and its run's finished entries kept as [`Store::insert_request`] keeps them, in one
    /// transaction. `true` when it applied.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn request_again(
        &self,
        tenant: &Tenant,
        expected_token: &ClaimToken,
        next: &Entry,
        notes: &[HistoryEvent],
    ) -> StoreResult<bool>;

    /// Turns an approved entry into the attempt of `claimed` (its token, start, lease and
    /// principal), only while the approval stands unused at `claimed.started_at`, with `note`.
    /// The entry as written when it applied.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn use_approval(
        &self,
        tenant: &Tenant,
        claimed: &Entry,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Entry>>;

    /// Records a person's decision about the entry `key` with `fingerprint`, only while its
    /// request is open at `approval.decided_at`: approval (its `execute_by`), or denial (the
    /// entry DENIED and finished), with `note`, and every finished entry of its run kept at
    /// least its retention from the decision, in one transaction. The entry as written and
    /// whether a claim waits for it.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn decide(
        &self,
        tenant: &Tenant,
        key: &Key,
        fingerprint: &str,
        approval: &Approval,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Finished>>;

    /// The earliest deadline among the calls of any tenant awaiting a decision (a request's
    /// `decide_by`, an approval's `execute_by`): when the next lapse happens, if any is due.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn next_lapse(&self) -> StoreResult<Option<Micros>>;

    /// Up to `limit` entries of any tenant whose request or approval lapsed at `now`.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn lapsed_approvals(&self, now: Micros, limit: u32) -> StoreResult<Vec<(Tenant, Key)>>;

    /// Records that the request (or approval) of (tenant, key) lapsed at `at`, its deadline,
    /// only if it still awaits and has lapsed at `now`: FAILED retryable with `error`, approval
    /// EXPIRED, finished at `at` and kept for its retention from then (longer while its run
    /// is paused), with `note`, in one transaction.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn expire_approval(
        &self,
        tenant: &Tenant,
        key: &Key,
        error: &str,
        at: Micros,
        now: Micros,
        note: &HistoryEvent,
    ) -> StoreResult<Option<Finished>>;

    /// Keeps every finished entry of the run until at least `until` (ExtendRun); returns how
    /// many it extended. (A request and a decision keep their run's entries in their own
    /// transaction: see [`Store::insert_request`], [`Store::request_again`], [`Store::decide`].)
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn extend_run(&self, tenant: &Tenant, run_id: &RunId, until: Micros) -> StoreResult<u64>;

    /// Keeps every finished entry of every paused run (one of whose calls awaits a decision)
    /// until at least the run's latest deadline plus the entry's retention; returns how many it
    /// extended. The sweep's pass: every write that finishes an entry keeps it so by itself,
    /// but on a store several servers share, an entry finished in the same instant as the
    /// request that paused its run sees neither the other's write.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn keep_paused_runs(&self) -> StoreResult<u64>;

    /// The earliest expiry of the run's finished entries, if it has any.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn run_kept_until(&self, tenant: &Tenant, run_id: &RunId) -> StoreResult<Option<Micros>>;

    /// Up to `limit` of the tenant's approval events after the history id `after`, oldest
    /// first: (id, event, key).
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn approval_events(
        &self,
        tenant: &Tenant,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<(i64, HistoryEvent, Key)>>;

    /// The tenant's newest history id (0 without any).
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn last_history_id(&self, tenant: &Tenant) -> StoreResult<i64>;

    /// Counts a call of the tenant's intent `window` (the MCP gateway's call that names no run)
    /// and answers its generation: the current one if the last identical call came less than
    /// the window before, or if the current intent's entry (`key_for(generation)`) [holds the
    /// window open](IntentWindow::held_open_by); else the next; 1 for the first call.
    /// Concurrent first calls anywhere get one generation. Given `entry_for`, it also inserts
    /// `entry_for(generation)`, the call's entry in that generation's run, unless its key
    /// exists, and says whether it did. The embedded store does it all in one transaction, so
    /// a new intent's window and claim commit together.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn count_window(
        &self,
        tenant: &Tenant,
        window: &IntentWindow<'_>,
        key_for: &(dyn Fn(u64) -> Key + Send + Sync),
        entry_for: Option<&(dyn Fn(u64) -> Entry + Send + Sync)>,
    ) -> StoreResult<(u64, bool)>;

    /// Up to `limit` of the tenant's entries marked as a possible double effect, oldest
    /// first, with their stored arguments.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn double_effects(&self, tenant: &Tenant, limit: u32) -> StoreResult<Vec<Entry>>;

    /// Hands out up to `query.limit` entries whose outcome is unknown at `query.now`, oldest
    /// first, that no other reconciler holds, and holds them until `query.hold_until`. Two
    /// concurrent calls never get the same entry while the hold lasts.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn take_unresolved(
        &self,
        tenant: &Tenant,
        query: &UnresolvedQuery,
    ) -> StoreResult<Vec<Entry>>;

    /// Deletes up to `limit` finished entries whose expiry is at or before `now`, in one short
    /// statement, and returns how many. Unresolved entries have no expiry and are never
    /// deleted.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn prune(&self, now: Micros, limit: u32) -> StoreResult<u64>;

    /// A page of the tenant's entries that match `query`, by started_at and then key, with
    /// their stored arguments.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn list(&self, tenant: &Tenant, query: &ListQuery) -> StoreResult<Vec<Entry>>;

    /// Notes that a claim waits for the current attempt of (tenant, key), so that its
    /// completion is announced to other servers sharing the database.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn mark_waiting(&self, tenant: &Tenant, key: &Key) -> StoreResult<()>;

    /// Adds replays a server answered from memory to their entries' `replay_count`, each
    /// only to the attempt it replayed (its claim token) while it is SUCCEEDED. Like a replay,
    /// only a count: its commit does not wait for the disk, so a crash may lose it.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails; nothing was counted then.
    async fn count_replays(&self, counts: &[ReplayCount]) -> StoreResult<()>;

    // Group commit: what a batcher in front of the store writes a batch with.

    /// Inserts each (tenant, entry) unless its (tenant, key) exists, in as few statements and
    /// commits as the backend allows; per entry, whether this call inserted it. Within one
    /// batch the first entry of a key wins, as if they had come one by one. All or nothing:
    /// an error means none is known to be written.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn insert_many(&self, batch: &[(Tenant, Entry)]) -> StoreResult<Vec<bool>>;

    /// [`Store::finish`] for many entries at once, in as few statements and commits as the
    /// backend allows; at most one command per (tenant, key) in a batch.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails; none is known to be written then.
    async fn finish_many(&self, batch: &[(Tenant, Finish)]) -> StoreResult<Vec<Option<Finished>>>;

    // Other servers sharing the database (a no-op for a store only one server uses).

    /// Whether other servers may write to the same database (so changes must be announced or
    /// polled for, not only seen in-process).
    fn shared(&self) -> bool;

    /// Tells other servers sharing the database that (tenant, key) changed. A no-op for a
    /// store only one server uses.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn announce(&self, tenant: &Tenant, key: &Key) -> StoreResult<()>;

    /// Starts listening for other servers' announcements; each arrives as (tenant, key).
    /// `None` for a store only one server uses.
    fn subscribe(&self) -> Option<tokio::sync::mpsc::Receiver<(Tenant, Key)>>;

    // Operations: what the probe, migrations and metrics need; no entry is read or written.

    /// `"postgres"` or `"sqlite"`, for logs.
    fn backend(&self) -> &'static str;

    /// Applies this backend's migrations (idempotent; safe with several servers starting at once).
    ///
    /// # Errors
    /// `Unavailable` when the database cannot be reached; `Internal` when a migration fails.
    async fn migrate(&self) -> StoreResult<()>;

    /// Checks that the database answers (the health probe).
    ///
    /// # Errors
    /// `Unavailable` when it does not.
    async fn ping(&self) -> StoreResult<()>;

    /// The database's clock, where other servers share the store and must agree on the time
    /// (PostgreSQL); `None` for a store one server uses, whose own clock is the arbiter.
    ///
    /// # Errors
    /// As the database fails.
    async fn database_now(&self) -> StoreResult<Option<Micros>>;

    /// Why the store cannot be reached, in the database's own words, found by opening a
    /// connection of its own (a pool only says that it timed out); `None` when it can.
    async fn unreachable_cause(&self) -> Option<String>;

    /// Where the store is, for logs (never a password).
    fn location(&self) -> String;

    // Upkeep: the store's state, the same for every backend.

    /// Whether the store last reported a full disk (the stores keep it); no database call.
    fn is_full(&self) -> bool;

    /// Writes and deletes a probe row of 64 KiB, each in its own commit: whether a write of a
    /// typical size commits now. Clears [`Store::is_full`] when both did.
    ///
    /// # Errors
    /// As the database fails (`Full` while there is still no space).
    async fn probe_write(&self) -> StoreResult<()>;

    /// Counts the unresolved entries of every tenant at `now` (for the metrics gauge, which
    /// every server sharing the database reports alike): reported UNKNOWN or past their
    /// lease, and attempts still in their lease.
    ///
    /// # Errors
    /// `Unavailable` or `Internal` as the database fails.
    async fn count_unresolved(&self, now: Micros) -> StoreResult<UnresolvedCount>;

    /// How the connection pool is used right now (for the metrics gauges); no database call.
    fn pool_stats(&self) -> PoolStats;
}
