//! Finished entries this server remembers, so that a repeat is answered without the database.
//!
//! A SUCCEEDED entry, or one FAILED for good, does not change until it expires: the state
//! table has no way out of those states but expiry (a retryable failure has one, the next
//! claim, so it is never remembered). A repeat of such a key is answered here from a copy,
//! judged on the ledger's clock (the database's, see `domain::time`) exactly as the store's
//! statements judge it ([`decide_claim`]): expired means forgotten, another fingerprint is
//! still the caller's bug. A miss reads the database as before.
//!
//! Replays answered here are counted here and written in batches by [`ReplayMemory::take_counts`]'s
//! caller ([`super::Ledger::flush_replay_counts`], at least once a second and at shutdown), so
//! `replay_count` may lag a Lookup on another server by that long, and a crash loses the counts
//! not yet written: the documented bargain.
//!
//! Bounded in bytes (`--replay-memory-bytes`): each entry weighs what it takes of the heap (its
//! strings, result and error, the copy's struct, the table's slot, the allocator's rounding:
//! [`ByBytes`]), so that the flag bounds the server's memory and not only its results;
//! `quick_cache` evicts by weight (CLOCK-Pro, scan resistant).

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use quick_cache::sync::Cache;
use quick_cache::{Equivalent, Weighter};

use crate::domain::{ClaimDecision, Entry, Key, Micros, Status, Tenant, decide_claim};
use crate::storage::ReplayCount;

/// What one remembered entry costs besides the bytes of its strings and result: the copy itself
/// (an [`Entry`] and its counters, behind an `Arc`), its key's (tenant, key) pair of strings, and the
/// cache's slot for it (its links, state and hash-table entry, about 40 bytes in quick_cache
/// 0.6).
const ENTRY_OVERHEAD: u64 = (size_of::<Remembered>() + 2 * size_of::<usize>() // Arc's counts
    + size_of::<(Tenant, Key)>()
    + 40) as u64;

/// The allocator's rounding of each heap block up to its size class, and each block's own
/// bookkeeping: mimalloc's classes waste at most an eighth; 16 bytes per block besides.
const PER_BLOCK: u64 = 16;

/// The remembered entries, and the replays answered from them that the store does not know of
/// yet. Shared by every call of one server.
pub(super) struct ReplayMemory {
    /// (tenant, key) → the finished entry; `None` when the memory is off (0 bytes).
    entries: Option<Cache<(Tenant, Key), Arc<Remembered>, ByBytes>>,
    /// The entries with replays not yet written, each once, with its tenant. An entry stays
    /// here when the cache evicts it, so its count is still written.
    unwritten: Mutex<Vec<(Tenant, Arc<Remembered>)>>,
}

/// One finished entry as the store last showed it.
struct Remembered {
    /// The entry (without the arguments kept for audit), `replay_count` as read.
    entry: Entry,
    /// Replays answered from this copy since it was read: its answers count on from
    /// `entry.replay_count`, so that one server numbers its replays one by one.
    replays: AtomicU64,
    /// Of them, those not yet written to the store. The replay that raises it from zero puts
    /// the entry on the list of unwritten counts.
    unwritten: AtomicU64,
}

/// How a remembered entry answers a repeat.
pub(super) enum Recalled {
    /// The stored result, with the replay counted.
    Replay(Entry),
    /// The stored permanent error.
    PreviouslyFailed(Entry),
    /// An explicit key came back with other arguments.
    KeyReused,
}

/// Replay counts taken from memory to be written: given back with
/// [`ReplayMemory::restore_counts`] when the write fails.
pub(super) struct TakenCounts(Vec<(Tenant, Arc<Remembered>, u64)>);

impl TakenCounts {
    /// The counts as the store writes them, in (tenant, key) order: the order every writer
    /// locks rows in.
    pub(super) fn counts(&self) -> Vec<ReplayCount> {
        let mut counts: Vec<ReplayCount> = self
            .0
            .iter()
            .map(|(tenant, r, n)| ReplayCount {
                tenant: tenant.clone(),
                key: r.entry.key.clone(),
                claim_token: r.entry.claim_token.clone(),
                count: *n,
            })
            .collect();
        counts.sort_by(|a, b| (a.tenant.as_str(), &a.key).cmp(&(b.tenant.as_str(), &b.key)));
        counts
    }

    /// Whether there is nothing to write.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Weighs an entry by the memory it takes: [`ENTRY_OVERHEAD`], and each heap block it owns (the
/// key's two strings and the entry's strings and result) with the allocator's rounding. The
/// copies are made by `clone`, so each block is as long as its contents.
#[derive(Clone)]
struct ByBytes;

impl Weighter<(Tenant, Key), Arc<Remembered>> for ByBytes {
    fn weight(&self, (tenant, key): &(Tenant, Key), value: &Arc<Remembered>) -> u64 {
        let e = &value.entry;
        let blocks = [
            tenant.as_str().len(),
            key.as_str().len(),
            e.key.as_str().len(),
            e.run_id_str().len(),
            e.tool.as_str().len(),
            e.fingerprint.len(),
            e.claim_token.as_str().len(),
            e.result.len(),
            e.error.len(),
            e.principal.as_str().len(),
            e.resolved_by.as_str().len(),
        ];
        let heap: u64 = blocks
            .iter()
            .filter(|&&n| n > 0) // an empty String or Vec allocates nothing
            .map(|&n| {
                let n = n as u64;
                n + n / 8 + PER_BLOCK
            })
            .sum();
        ENTRY_OVERHEAD + heap
    }
}

/// A borrowed (tenant, key), hashed as the owned pair is, so that a lookup allocates nothing.
struct Named<'a>(&'a str, &'a str);

impl<'a> Named<'a> {
    fn of(tenant: &'a Tenant, key: &'a Key) -> Named<'a> {
        Named(tenant.as_str(), key.as_str())
    }
}

impl Hash for Named<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `(Tenant, Key)` hashes: each element in order, each (derived) as its one `String`,
        // which hashes as its `str`.
        self.0.hash(state);
        self.1.hash(state);
    }
}

impl Equivalent<(Tenant, Key)> for Named<'_> {
    fn equivalent(&self, owned: &(Tenant, Key)) -> bool {
        self.0 == owned.0.as_str() && self.1 == owned.1.as_str()
    }
}

impl ReplayMemory {
    /// A memory of at most `bytes` (0: off; nothing is remembered and every repeat reads the
    /// store).
    pub(super) fn new(bytes: u64) -> ReplayMemory {
        let entries = (bytes > 0).then(|| {
            // The estimate only sizes the table up front; the weight is the bound.
            let estimated = usize::try_from(bytes / (ENTRY_OVERHEAD + 512))
                .unwrap_or(usize::MAX)
                .clamp(16, 1 << 20);
            Cache::with_weighter(estimated, bytes, ByBytes)
        });
        ReplayMemory {
            entries,
            unwritten: Mutex::default(),
        }
    }

    /// Remembers `entry` as the store holds it, if it is finished for good (SUCCEEDED, or
    /// FAILED and not retryable) and expires; anything else is left to the store.
    pub(super) fn remember(&self, tenant: &Tenant, entry: &Entry) {
        let Some(entries) = &self.entries else { return };
        let finished = match entry.status {
            Status::Succeeded => true,
            Status::Failed => !entry.retryable,
            // A denial is answered from the store: it is rare, and its note is the denial's.
            Status::Attempting | Status::Unknown | Status::AwaitingApproval | Status::Denied => {
                false
            }
        };
        if !finished || entry.expires_at.is_none() {
            return;
        }
        // The copy already here holds the counts of its replays: keep it (a repeat that read the
        // store meanwhile was counted there).
        if entries
            .get(&Named::of(tenant, &entry.key))
            .is_some_and(|r| r.entry.claim_token == entry.claim_token)
        {
            return;
        }
        let entry = Entry {
            arguments: None,
            ..entry.clone()
        };
        entries.insert(
            (tenant.clone(), entry.key.clone()),
            Arc::new(Remembered {
                entry,
                replays: AtomicU64::new(0),
                unwritten: AtomicU64::new(0),
            }),
        );
    }

    /// How a remembered entry of `key` answers a claim with `fingerprint` at `now`: `None`
    /// when nothing is remembered (or it expired: then it is forgotten), and the store decides.
    pub(super) fn recall(
        &self,
        tenant: &Tenant,
        key: &Key,
        fingerprint: &str,
        now: Micros,
    ) -> Option<Recalled> {
        let entries = self.entries.as_ref()?;
        let found = entries.get(&Named::of(tenant, key))?;
        match decide_claim(&found.entry, fingerprint, now) {
            ClaimDecision::Replay => {
                let answered = found.replays.fetch_add(1, Ordering::Relaxed) + 1;
                let entry = Entry {
                    replay_count: found.entry.replay_count.saturating_add(answered),
                    ..found.entry.clone()
                };
                self.add_unwritten(tenant, found, 1);
                Some(Recalled::Replay(entry))
            }
            ClaimDecision::PreviouslyFailed => {
                Some(Recalled::PreviouslyFailed(found.entry.clone()))
            }
            ClaimDecision::KeyReused => Some(Recalled::KeyReused),
            // Expired (or, which cannot be, not finished): forget it; the store decides.
            ClaimDecision::StartOver
            | ClaimDecision::Retry
            | ClaimDecision::InProgress
            | ClaimDecision::AwaitingApproval
            | ClaimDecision::UseApproval
            | ClaimDecision::RequestAgain
            | ClaimDecision::Denied => {
                entries.remove(&Named::of(tenant, key));
                None
            }
        }
    }

    /// Adds `n` unwritten replays to `remembered`, listing it when it had none.
    fn add_unwritten(&self, tenant: &Tenant, remembered: Arc<Remembered>, n: u64) {
        if remembered.unwritten.fetch_add(n, Ordering::AcqRel) == 0 {
            self.unwritten
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((tenant.clone(), remembered));
        }
    }

    /// The replays of `entry` answered here and not yet written: a Lookup on this server adds
    /// them, so that it shows the replays this server answered (those taken for a write in
    /// progress excepted, for that write's short while).
    pub(super) fn unwritten(&self, tenant: &Tenant, entry: &Entry) -> u64 {
        let Some(entries) = &self.entries else {
            return 0;
        };
        entries
            .get(&Named::of(tenant, &entry.key))
            .filter(|r| r.entry.claim_token == entry.claim_token)
            .map_or(0, |r| r.unwritten.load(Ordering::Acquire))
    }

    /// Takes the unwritten counts, to be written.
    pub(super) fn take_counts(&self) -> TakenCounts {
        let listed = std::mem::take(
            &mut *self
                .unwritten
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        TakenCounts(
            listed
                .into_iter()
                .filter_map(|(tenant, r)| {
                    // A replay after this swap lists the entry again, for the next write.
                    let n = r.unwritten.swap(0, Ordering::AcqRel);
                    (n > 0).then_some((tenant, r, n))
                })
                .collect(),
        )
    }

    /// Puts back counts whose write failed, for the next try.
    pub(super) fn restore_counts(&self, failed: TakenCounts) {
        for (tenant, r, n) in failed.0 {
            self.add_unwritten(&tenant, r, n);
        }
    }

    /// The bytes the remembered entries weigh now (for the metrics and tests).
    pub(super) fn weight(&self) -> u64 {
        self.entries.as_ref().map_or(0, Cache::weight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::domain::{ClaimToken, Principal};

    const NOW: Micros = Micros(1_000_000_000);

    fn t(name: &str) -> Tenant {
        Tenant::from_stored(name.to_string())
    }

    fn k(key: &str) -> Key {
        Key::from_stored(key.to_string())
    }

    fn finished(key: &str, status: Status, retryable: bool, result: &[u8]) -> Entry {
        Entry {
            key: k(key),
            run_id: Some(crate::domain::RunId::from_stored("run".into())),
            tool: crate::domain::ToolName::from_stored("tool".into()),
            fingerprint: "fp".into(),
            status,
            attempt: 1,
            claim_token: ClaimToken::from_stored("tok".into()),
            result: result.to_vec(),
            error: String::new(),
            retryable,
            principal: Principal::none(),
            started_at: NOW,
            finished_at: Some(NOW),
            lease_expires_at: NOW,
            retention: Micros(60_000_000),
            expires_at: Some(NOW.plus(Micros(60_000_000))),
            replay_count: 3,
            arguments: Some("{}".into()),
            resolved_by: Principal::none(),
            hold_token: crate::domain::HoldToken::none(),
            possible_double_effect: false,
            approval: crate::domain::Approval::default(),
        }
    }

    #[test]
    fn a_success_replays_from_memory_counting_on_from_the_stored_count() {
        let memory = ReplayMemory::new(1 << 20);
        memory.remember(&t("t"), &finished("k", Status::Succeeded, false, b"r"));
        for n in 4..7 {
            let Some(Recalled::Replay(e)) = memory.recall(&t("t"), &k("k"), "fp", NOW) else {
                panic!("a replay");
            };
            assert_eq!((e.replay_count, e.result.as_slice()), (n, &b"r"[..]));
            assert_eq!(e.arguments, None, "arguments are not kept in memory");
        }
        let e = finished("k", Status::Succeeded, false, b"");
        assert_eq!(memory.unwritten(&t("t"), &e), 3);
        let taken = memory.take_counts();
        let counts = taken.counts();
        assert_eq!(counts.len(), 1);
        assert_eq!(
            (counts[0].count, counts[0].claim_token.as_str()),
            (3, "tok")
        );
        assert_eq!(memory.unwritten(&t("t"), &e), 0);
        assert!(memory.take_counts().is_empty(), "taken once");
        memory.restore_counts(taken);
        let again = memory.take_counts().counts();
        assert_eq!(again[0].count, 3, "a failed write is tried again");
        // A replay while a write is under way is listed for the next one.
        let taken = memory.take_counts();
        assert!(taken.is_empty());
        memory.recall(&t("t"), &k("k"), "fp", NOW);
        memory.restore_counts(taken);
        assert_eq!(memory.take_counts().counts()[0].count, 1);
    }

    #[test]
    fn remembering_the_same_attempt_again_keeps_the_copy_that_holds_its_counts() {
        let memory = ReplayMemory::new(1 << 20);
        let e = finished("k", Status::Succeeded, false, b"r");
        memory.remember(&t("t"), &e);
        memory.recall(&t("t"), &k("k"), "fp", NOW);
        memory.remember(
            &t("t"),
            &Entry {
                replay_count: 9,
                ..e.clone()
            },
        );
        assert_eq!(
            memory.unwritten(&t("t"), &e),
            1,
            "the count is still there to read"
        );
        // Another attempt of the key (it expired and was claimed again) replaces it.
        let next = Entry {
            claim_token: ClaimToken::from_stored("tok-2".into()),
            ..e.clone()
        };
        memory.remember(&t("t"), &next);
        assert_eq!(memory.unwritten(&t("t"), &next), 0);
        assert_eq!(
            memory.take_counts().counts()[0].claim_token,
            "tok",
            "still written"
        );
    }

    #[test]
    fn only_what_cannot_change_is_remembered() {
        let memory = ReplayMemory::new(1 << 20);
        memory.remember(&t("t"), &finished("retryable", Status::Failed, true, b""));
        memory.remember(&t("t"), &finished("unknown", Status::Unknown, false, b""));
        let mut open = finished("open", Status::Succeeded, false, b"");
        open.expires_at = None;
        memory.remember(&t("t"), &open);
        for key in ["retryable", "unknown", "open"] {
            assert!(
                memory.recall(&t("t"), &k(key), "fp", NOW).is_none(),
                "{key}"
            );
        }
        memory.remember(&t("t"), &finished("failed", Status::Failed, false, b""));
        assert!(matches!(
            memory.recall(&t("t"), &k("failed"), "fp", NOW),
            Some(Recalled::PreviouslyFailed(_))
        ));
        assert!(memory.take_counts().is_empty(), "a failure is no replay");
    }

    #[test]
    fn tenants_keys_fingerprints_and_expiry_are_kept_apart() {
        let memory = ReplayMemory::new(1 << 20);
        let e = finished("k", Status::Succeeded, false, b"r");
        memory.remember(&t("t"), &e);
        assert!(memory.recall(&t("other"), &k("k"), "fp", NOW).is_none());
        assert!(matches!(
            memory.recall(&t("t"), &k("k"), "another-fp", NOW),
            Some(Recalled::KeyReused)
        ));
        let Some(expiry) = e.expires_at else {
            panic!("expires")
        };
        assert!(
            memory.recall(&t("t"), &k("k"), "fp", expiry).is_none(),
            "expired"
        );
        assert!(
            memory.recall(&t("t"), &k("k"), "fp", NOW).is_none(),
            "and forgotten"
        );
    }

    #[test]
    fn an_entry_weighs_at_least_the_memory_it_takes_and_not_much_more() {
        // Entries shaped like the service's: hex keys and fingerprints, a token, a small result.
        const N: usize = 2_000;
        let entries: Vec<Entry> = (0..N)
            .map(|i| Entry {
                key: k(&format!("{i:064x}")),
                run_id: Some(crate::domain::RunId::from_stored(format!("run-{i:012x}"))),
                tool: crate::domain::ToolName::from_stored("issue_credit".into()),
                fingerprint: format!("{:064x}", i * 7),
                claim_token: ClaimToken::from_stored(format!("tok-{i:040x}")),
                principal: Principal::from_stored("tenant-a".into()),
                ..finished("", Status::Succeeded, false, br#"{"credit_id":"cr-001"}"#)
            })
            .collect();
        let memory = ReplayMemory::new(64 << 20);
        let tenant = t("tenant-a");
        let before = crate::counting_alloc::live_bytes();
        for e in &entries {
            memory.remember(&tenant, e);
        }
        let taken = u64::try_from(crate::counting_alloc::live_bytes() - before).expect("grew");
        let weight = memory.weight();
        // What the allocator was asked for; its rounding and bookkeeping come on top, which the
        // weight counts too.
        assert!(weight >= taken, "weight {weight} < {taken} bytes taken");
        assert!(
            weight <= taken * 2,
            "weight {weight} is more than twice the {taken} bytes taken"
        );
    }

    #[test]
    fn the_memory_holds_at_most_its_bytes_and_nothing_when_off() {
        let memory = ReplayMemory::new(64 * 1024);
        for i in 0..200 {
            memory.remember(
                &t("t"),
                &finished(&format!("k{i}"), Status::Succeeded, false, &[7; 1024]),
            );
        }
        assert!(memory.weight() <= 64 * 1024, "{}", memory.weight());
        assert!(
            memory.weight() > 32 * 1024,
            "it does hold: {}",
            memory.weight()
        );
        let off = ReplayMemory::new(0);
        off.remember(&t("t"), &finished("k", Status::Succeeded, false, b"r"));
        assert!(off.recall(&t("t"), &k("k"), "fp", NOW).is_none());
    }
}
