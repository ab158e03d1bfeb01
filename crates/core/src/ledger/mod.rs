//! The ledger's use cases, driven over a [`Store`], one file each and each a method of
//! [`Ledger`]: `claim`, `complete`, `renew` (RenewLease), `lookup`, `list` (ListEntries),
//! `reconcile`, `retention` (pruning), and `find` (an entry by key, key prefix or
//! `external_ref`, for operators). Each takes its input typed (run ids, tools, keys, principals
//! and tokens parsed where the request arrived: gRPC, the console), checks what depends on the
//! ledger's settings (the arguments' JSON, durations, counts), lets the domain decide, applies
//! the store's compare-and-set write, and starts over from a fresh read when a concurrent
//! writer won the race. [`wait`] holds claims that wait for an attempt in flight; `notes` are
//! the sentences for the model; `recent` is a hint cache for the claim path; `window` numbers
//! the intents of a call that names no run (the MCP gateway's window of intent).
//!
//! Independent of gRPC, so the conformance suite runs the same calls against every backend.

mod approval;
mod claim;
mod complete;
mod double_effect;
pub mod find;
mod list;
mod lookup;
mod model_notes;
mod recent_keys;
mod reconcile;
mod renew;
mod replay_memory;
mod retention;
pub mod wait;
mod window;

pub use approval::{
    ApprovalEvent, Approvals, DecideInput, Decided, MAX_REASON_BYTES, approval_cursor,
};
pub use claim::{ClaimInput, ClaimOutput, Outcome, WaitFor};
pub use complete::{CompleteInput, CompleteOutput};
pub use double_effect::{AcknowledgeInput, MAX_NOTE_BYTES};
pub use list::{ListInput, ListOutput};
pub use lookup::LookupInput;
pub use reconcile::{
    Finding, ReconcileInput, ReconcileOutput, ResolutionInput, ResolutionOutcome, ResolutionResult,
    resolution_not_final, unfenced_resolution,
};
pub use renew::RenewInput;

use std::sync::Arc;
use std::time::Duration;

use crate::domain::canonical::JsonLimits;
use crate::domain::redact::ArgumentsPolicy;
use crate::domain::time::Clock;
use crate::domain::{ClaimToken, Entry, Key, Micros, Status, Tenant};
use crate::error::LedgerError;
use crate::storage::Store;
use recent_keys::RecentKeys;
use replay_memory::ReplayMemory;
use wait::WaitHub;

/// How often a lost compare-and-set race is retried before the call gives up. Each retry
/// follows another writer's success, so reaching this means a pathological storm.
const MAX_RACES: usize = 16;

/// How often the replay counts of repeats answered from memory are written: the most a
/// `replay_count` read on another server lags.
pub const REPLAY_COUNT_INTERVAL: Duration = Duration::from_secs(1);

/// The retry hint for an entry whose outcome is unknown: reconciliation takes a while.
const UNKNOWN_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The server's limits and defaults for requests.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Lease when a claim sets none.
    pub default_lease: Duration,
    /// Longest lease a claim may ask for.
    pub max_lease: Duration,
    /// Retention when a claim sets none.
    pub default_retention: Duration,
    /// Longest retention a claim may ask for.
    pub max_retention: Duration,
    /// Longest a claim may wait for an attempt in flight.
    pub max_wait: Duration,
    /// Size and depth limits of `arguments_json`.
    pub json: JsonLimits,
    /// Largest result (and error text) a completion may store.
    pub max_result_bytes: usize,
    /// Prefix of every entry's `external_ref`.
    pub external_ref_prefix: String,
    /// How long a reconciler holds the unresolved entries it was handed.
    pub reconcile_lease: Duration,
    /// How long an outcome stays unknown before Reconcile hands it out.
    pub reconcile_grace: Duration,
    /// How many entries Reconcile hands out when the request sets no limit.
    pub reconcile_default_limit: u32,
    /// The most entries (and resolutions) one Reconcile call handles.
    pub reconcile_max_limit: u32,
    /// How many bytes of finished entries the server remembers to answer repeats (0: none).
    pub replay_memory_bytes: u64,
    /// How often a key that claims wait on is read from a store other servers share: the
    /// wake-up bound when announcements are off (`--wait-wakeup poll`), and the safety net
    /// for missed announcements otherwise.
    pub wait_poll_interval: Duration,
    /// What of a claim's arguments is kept for audit (`--store-arguments`, `--redact-field`).
    pub arguments: ArgumentsPolicy,
    /// How long a person has to decide about a gated call (`--approval-timeout`).
    pub approval_timeout: Duration,
    /// How long an approval may go unused before it lapses (`--approval-use-within`).
    pub approval_use_within: Duration,
    /// How many entries ListEntries returns when the request sets no page size.
    pub list_default_page_size: u32,
    /// The most entries one ListEntries page holds.
    pub list_max_page_size: u32,
}

impl Default for Limits {
    /// The shipped defaults ([`crate::defaults`]), as a server started without flags runs.
    fn default() -> Self {
        use crate::defaults as d;
        Limits {
            default_lease: d::DEFAULT_LEASE,
            max_lease: d::MAX_LEASE,
            default_retention: d::DEFAULT_RETENTION,
            max_retention: d::MAX_RETENTION,
            max_wait: d::MAX_WAIT,
            json: JsonLimits {
                max_bytes: d::MAX_ARGUMENTS_BYTES,
                max_depth: d::MAX_JSON_DEPTH,
            },
            max_result_bytes: d::MAX_RESULT_BYTES,
            external_ref_prefix: d::EXTERNAL_REF_PREFIX.to_string(),
            reconcile_lease: d::RECONCILE_LEASE,
            reconcile_grace: d::RECONCILE_GRACE,
            reconcile_default_limit: d::RECONCILE_DEFAULT_LIMIT,
            reconcile_max_limit: d::RECONCILE_MAX_LIMIT,
            replay_memory_bytes: d::REPLAY_MEMORY_BYTES,
            wait_poll_interval: d::LISTEN_SAFETY_POLL.max(d::WAIT_POLL_INTERVAL),
            arguments: ArgumentsPolicy::default(),
            approval_timeout: d::APPROVAL_TIMEOUT,
            approval_use_within: d::APPROVAL_USE_WITHIN,
            list_default_page_size: d::LIST_DEFAULT_PAGE_SIZE,
            list_max_page_size: d::LIST_MAX_PAGE_SIZE,
        }
    }
}

/// An entry as a caller is shown it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryView {
    /// The stored entry.
    pub entry: Entry,
    /// The status callers are told (an attempt past its lease reads as unknown).
    pub status: Status,
    /// The deterministic reference for external systems.
    pub external_ref: String,
}

/// The ledger: a cheap-to-clone handle over a store, a clock and the server's limits.
#[derive(Clone)]
pub struct Ledger {
    /// Where entries live.
    store: Arc<dyn Store>,
    /// Where time comes from (manual in tests).
    clock: Arc<dyn Clock>,
    /// Defaults and limits for requests.
    limits: Arc<Limits>,
    /// The claims waiting on this server for attempts in flight.
    waits: Arc<WaitHub>,
    /// Keys this server recently saw succeed: a hint for the claim path, never a decision.
    recent_keys: Arc<RecentKeys>,
    /// Finished entries this server remembers, to answer repeats without the store.
    memory: Arc<ReplayMemory>,
    /// The approval policy in force, and the signal to watchers of approval events.
    approvals: Arc<Approvals>,
    /// Held for writing while replay counts go from memory to the store, and for reading
    /// while a Lookup or a listing reads the store and adds the counts not yet written: so
    /// that those see each replay this server answered exactly once, never in both places
    /// nor in neither.
    counts_in_flight: Arc<tokio::sync::RwLock<()>>,
}

impl Ledger {
    /// A ledger over `store`. Waiting claims are woken in-process by completions on this server;
    /// on a store other servers share, a watched key is also read every
    /// `limits.wait_poll_interval`.
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, limits: Limits) -> Ledger {
        let poll = store.shared().then_some(limits.wait_poll_interval);
        Ledger {
            waits: Arc::new(WaitHub::new(store.clone(), clock.clone(), poll)),
            recent_keys: Arc::new(RecentKeys::default()),
            memory: Arc::new(ReplayMemory::new(limits.replay_memory_bytes)),
            approvals: Arc::new(Approvals::new(crate::domain::Policy::none())),
            counts_in_flight: Arc::default(),
            store,
            clock,
            limits: Arc::new(limits),
        }
    }

    /// Wakes this server's waiters on the changes other servers announce (PostgreSQL
    /// LISTEN/NOTIFY); without it, they learn of them by polling only. Call once, inside the
    /// runtime. The relay is the caller's to stop: aborting the task returned drops the
    /// store's subscription, and with it the store's listening connection.
    pub fn listen_for_announcements(&self) -> Option<tokio::task::JoinHandle<()>> {
        let mut announcements = self.store.subscribe()?;
        let waits = self.waits.clone();
        Some(tokio::spawn(async move {
            while let Some((tenant, key)) = announcements.recv().await {
                waits.wake(&tenant, &key);
            }
        }))
    }

    /// Writes the replay counts of repeats answered from memory since the last call; the
    /// server calls it every [`REPLAY_COUNT_INTERVAL`] and once more at shutdown. Returns how
    /// many entries' counts were written.
    ///
    /// # Errors
    /// As the store fails. Counts the store refused before committing anything are kept for
    /// the next call; counts whose write may have committed all the same (its connection lost
    /// mid-statement) are dropped and logged, since writing them again could count a replay
    /// twice: a count may run behind after such a failure, as after a crash, never ahead.
    pub async fn flush_replay_counts(&self) -> Result<usize, LedgerError> {
        let _writing = self.counts_in_flight.write().await;
        let taken = self.memory.take_counts();
        if taken.is_empty() {
            return Ok(0);
        }
        let counts = taken.counts();
        match self.store.count_replays(&counts).await {
            Ok(()) => Ok(counts.len()),
            Err(e) => {
                if e.may_have_committed() {
                    tracing::warn!(
                        error = %e,
                        entries = counts.len(),
                        "replay counts dropped: their write failed in a way that may have \
                         committed them, so they are not written again"
                    );
                } else {
                    self.memory.restore_counts(taken);
                }
                Err(e.into())
            }
        }
    }

    /// The bytes of finished entries this server remembers now.
    pub fn replay_memory_bytes(&self) -> u64 {
        self.memory.weight()
    }

    /// The waiting claims of this server.
    pub fn waits(&self) -> &WaitHub {
        &self.waits
    }

    /// The store, for health probes and migrations.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// After an entry left ATTEMPTING/UNKNOWN: wake this server's waiters, and announce it to
    /// other servers when some claim waits for it. The outcome is already committed, so a
    /// failed announcement only delays waiters until their poll.
    async fn changed(&self, tenant: &Tenant, key: &Key, has_waiters: bool) {
        self.waits.wake(tenant, key);
        if has_waiters
            && self.store.shared()
            && let Err(e) = self.store.announce(tenant, key).await
        {
            tracing::warn!(error = %e, "could not announce a completion to other servers");
        }
    }

    /// The deterministic external reference of `key`: the prefix plus 16 hex characters, the
    /// key's own when it is a derived (64 lowercase hex) key, else those of sha256(key).
    pub fn external_ref(&self, key: &Key) -> String {
        external_ref(&self.limits.external_ref_prefix, key)
    }

    /// An entry as Claim, Complete and Reconcile answer it: about its outcome, without the
    /// arguments kept for audit (which only some of their statements read back).
    fn view(&self, mut entry: Entry, now: Micros) -> EntryView {
        entry.arguments = None;
        self.audit_view(entry, now)
    }

    /// `entry` as the store holds it, plus the replays of it this server answered from memory
    /// and has not written yet: so that what a caller reads on this server counts every
    /// replay this server answered.
    fn with_unwritten_replays(&self, tenant: &Tenant, mut entry: Entry) -> Entry {
        entry.replay_count = entry
            .replay_count
            .saturating_add(self.memory.unwritten(tenant, &entry));
        entry
    }

    /// An entry as Lookup and ListEntries show it: with the arguments kept for audit, and as
    /// it reads at `now` (a lapsed request reads lapsed before the lapse is recorded).
    fn audit_view(&self, entry: Entry, now: Micros) -> EntryView {
        let entry = entry.as_of(now);
        EntryView {
            status: entry.effective_status(now),
            external_ref: self.external_ref(&entry.key),
            entry,
        }
    }
}

/// The requested duration, or the default when unset; zero and above-maximum are refused.
fn bounded(
    field: &'static str,
    asked: Option<Duration>,
    default: Duration,
    max: Duration,
) -> Result<Duration, LedgerError> {
    match asked {
        None => Ok(default),
        // Time is kept in whole microseconds: less than one would be stored as zero.
        Some(d) if d < Duration::from_micros(1) => Err(LedgerError::invalid(
            field,
            "must be at least 1 microsecond; leave it unset for the server's default",
        )),
        Some(d) if d > max => Err(LedgerError::invalid(
            field,
            format!("{d:?} is above the server's maximum of {max:?}"),
        )),
        Some(d) => Ok(d),
    }
}

/// A fresh 128-bit random claim token, hex.
fn new_claim_token() -> Result<ClaimToken, LedgerError> {
    ClaimToken::random()
        .map_err(|e| LedgerError::Internal(format!("no randomness for a claim token: {e}")))
}

/// See [`Ledger::external_ref`].
pub fn external_ref(prefix: &str, key: &Key) -> String {
    let key = key.as_str();
    let derived = key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    // Every answer carries one: two pushes, where `format!` ran its machinery per call.
    let mut reference = String::with_capacity(prefix.len() + 16);
    reference.push_str(prefix);
    if derived {
        reference.push_str(&key[..16]);
    } else {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(key.as_bytes());
        reference.push_str(&hex::encode(&digest[..8]));
    }
    reference
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_refs_take_the_derived_keys_prefix_or_hash_an_explicit_key() {
        let key = |k: &str| Key::from_stored(k.to_string());
        let derived = key(&"0123456789abcdef".repeat(4));
        assert_eq!(external_ref("idem-", &derived), "idem-0123456789abcdef");
        let explicit = external_ref("x-", &key("wf-1:step-2"));
        assert_eq!(explicit.len(), 2 + 16);
        assert_eq!(explicit, external_ref("x-", &key("wf-1:step-2")));
        assert_ne!(explicit, external_ref("x-", &key("wf-1:step-3")));
    }

    #[test]
    fn durations_default_when_unset_and_are_refused_out_of_range() {
        let d = Duration::from_secs(60);
        let max = Duration::from_secs(3600);
        assert_eq!(bounded("lease", None, d, max).ok(), Some(d));
        assert!(bounded("lease", Some(Duration::ZERO), d, max).is_err());
        assert!(bounded("lease", Some(Duration::from_nanos(999)), d, max).is_err());
        assert!(bounded("lease", Some(Duration::from_micros(1)), d, max).is_ok());
        assert!(bounded("lease", Some(max + Duration::from_micros(1)), d, max).is_err());
        assert_eq!(bounded("lease", Some(max), d, max).ok(), Some(max));
    }

    #[test]
    fn claim_tokens_are_fresh_each_time() {
        let a = new_claim_token().ok();
        let b = new_claim_token().ok();
        assert_eq!(a.as_ref().map(|t| t.as_str().len()), Some(32));
        assert_ne!(a, b);
    }
}
