//! The stores' compare-and-set writes apply exactly when the domain's predicates
//! (`domain::entry::cas`) say, on random entries, on both stores, through the unbatched
//! backend and through group commit (whose multi-row FINISH has a `WHERE` of its own).
//!
//! Each case stores a random entry under a fresh key (any status, either of two tokens and
//! fingerprints, a lease and an expiry just before, at or just after `now`), runs one write
//! with random parameters, and compares "the store wrote it" with the predicate.

use std::sync::Arc;

use idempotency_ledger::domain::entry::cas;
use idempotency_ledger::domain::{
    ClaimToken, Completion, Entry, EventKind, HistoryEvent, HoldToken, Key, Micros, Principal,
    RunId, Status, Tenant, ToolName,
};
use idempotency_ledger::storage::{Finish, Store};
use rand::rngs::Xoshiro256PlusPlus as Rng;
use rand::{SeedableRng as _, seq::IndexedRandom as _};

use crate::support::{Backend, TestDb};

const TENANT: &str = "acme";

fn tenant() -> Tenant {
    Tenant::parse(TENANT).expect("tenant")
}
const NOW: Micros = Micros(1_800_000_000_000_000);
const CASES: usize = 60;

/// One second, in the store's unit.
const S: i64 = 1_000_000;

struct Gen(Rng);

impl Gen {
    fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        *of.choose(&mut self.0).expect("a non-empty list")
    }

    /// `NOW` moved by one of -1 s, -1 µs, 0, +1 µs, +1 s: the boundaries the statements
    /// compare with `<`, `<=` and `>`.
    fn near_now(&mut self) -> Micros {
        Micros(NOW.0 + self.pick(&[-S, -1, 0, 1, S]))
    }

    fn entry(&mut self, key: String) -> Entry {
        let status = self.pick(&[
            Status::Attempting,
            Status::Succeeded,
            Status::Failed,
            Status::Unknown,
        ]);
        let resolved = status.is_resolved();
        Entry {
            key: Key::from_stored(key),
            run_id: Some(RunId::from_stored("run-p".into())),
            tool: ToolName::from_stored("issue_credit".into()),
            fingerprint: self.pick(&["f1", "f2"]).into(),
            status,
            attempt: 1,
            claim_token: ClaimToken::from_stored(self.pick(&["t1", "t2"]).into()),
            result: if status == Status::Succeeded {
                b"done".to_vec()
            } else {
                Vec::new()
            },
            error: if status == Status::Failed {
                "declined".into()
            } else {
                String::new()
            },
            retryable: status == Status::Failed && self.pick(&[false, true]),
            principal: Principal::none(),
            started_at: Micros(NOW.0 - 10 * S),
            finished_at: resolved.then_some(Micros(NOW.0 - 5 * S)),
            lease_expires_at: self.near_now(),
            retention: Micros(3600 * S),
            expires_at: resolved.then(|| self.near_now()),
            replay_count: 0,
            arguments: None,
            resolved_by: Principal::none(),
            // A claim stores no hold: an entry is first held when Reconcile hands it out.
            hold_token: HoldToken::none(),
            possible_double_effect: false,
            approval: Default::default(),
        }
    }
}

/// The five writes; each case runs one of them.
#[derive(Clone, Copy, Debug)]
enum Write {
    Replay,
    Finish,
    Renew,
    Resolve,
    Restart,
}

/// Runs `write` with random parameters against `stored` (already in `store`); whether the
/// store applied it, and whether the domain says it should have.
async fn run_case(
    store: &dyn Store,
    g: &mut Gen,
    write: Write,
    stored: &Entry,
) -> (bool, bool, String) {
    let token = ClaimToken::from_stored(g.pick(&["t1", "t2"]).to_string());
    let token = &token;
    let fingerprint = g.pick(&["f1", "f2"]);
    let key = &stored.key;
    match write {
        Write::Replay => {
            let wrote = store
                .replay(&tenant(), key, fingerprint, NOW)
                .await
                .expect("replay")
                .is_some();
            (
                wrote,
                cas::replays(stored, fingerprint, NOW),
                format!("fingerprint {fingerprint}"),
            )
        }
        Write::Finish => {
            let also_unknown = g.pick(&[false, true]);
            let cmd = Finish {
                key: key.clone(),
                claim_token: token.clone(),
                completion: Completion::success(b"ok".to_vec()),
                now: NOW,
                also_unknown,
            };
            let wrote = store
                .finish(&tenant(), &cmd)
                .await
                .expect("finish")
                .is_some();
            (
                wrote,
                cas::finishes(stored, token, also_unknown),
                format!("token {token}, also_unknown {also_unknown}"),
            )
        }
        Write::Renew => {
            let wrote = store
                .renew(&tenant(), key, token, Micros(NOW.0 + 60 * S), NOW)
                .await
                .expect("renew")
                .is_some();
            (
                wrote,
                cas::renews(stored, token, NOW),
                format!("token {token}"),
            )
        }
        Write::Resolve => {
            // The finding's fence: mostly the stored attempt and the stored (empty) hold, now
            // and then another of either (so that this case still applies often enough for
            // the whole run to apply more than it refuses half the time).
            let attempt = g.pick(&[1, 1, 1, 1, 1, 1, 1, 2]);
            let hold =
                HoldToken::from_stored(g.pick(&["", "", "", "", "", "", "", "h1"]).to_string());
            let done = Entry {
                attempt,
                hold_token: hold.clone(),
                ..Completion::Failed {
                    error: "never sent".into(),
                    retryable: false,
                }
                .apply_to(stored, NOW)
            };
            let note = HistoryEvent {
                at: NOW,
                attempt,
                kind: EventKind::FindingApplied,
                principal: Principal::none(),
                detail: String::new(),
            };
            let wrote = store
                .resolve(&tenant(), &done, NOW, &note)
                .await
                .expect("resolve")
                .is_some();
            (
                wrote,
                cas::resolves(stored, attempt, &hold, NOW),
                format!("attempt {attempt}, hold {hold:?}"),
            )
        }
        Write::Restart => {
            let next = Entry {
                status: Status::Attempting,
                attempt: stored.attempt + 1,
                claim_token: ClaimToken::from_stored("t3".into()),
                result: Vec::new(),
                error: String::new(),
                retryable: false,
                finished_at: None,
                expires_at: None,
                lease_expires_at: Micros(NOW.0 + 60 * S),
                ..stored.clone()
            };
            let wrote = store
                .restart(&tenant(), token, &next)
                .await
                .expect("restart");
            (
                wrote,
                cas::restarts(stored, token),
                format!("token {token}"),
            )
        }
    }
}

async fn agree(store: Arc<dyn Store>, label: &str, seed: u64) {
    let mut g = Gen(Rng::seed_from_u64(seed));
    let mut applied = [0usize; 2];
    for case in 0..CASES {
        for write in [
            Write::Replay,
            Write::Finish,
            Write::Renew,
            Write::Resolve,
            Write::Restart,
        ] {
            let stored = g.entry(format!("{label}-{write:?}-{case}"));
            assert!(
                store.insert(&tenant(), &stored).await.expect("insert"),
                "a fresh key"
            );
            let (wrote, should, params) = run_case(store.as_ref(), &mut g, write, &stored).await;
            assert_eq!(
                wrote,
                should,
                "{label}, seed {seed}: {write:?} ({params}) on {stored:?}: the store {} it, \
                 the domain says it {}",
                if wrote { "applied" } else { "refused" },
                if should { "applies" } else { "does not" },
            );
            applied[usize::from(wrote)] += 1;
        }
    }
    // Random cases that never apply (or always do) would prove little.
    assert!(
        applied[0] > CASES / 2 && applied[1] > CASES / 2,
        "{label}: refused {}, applied {}",
        applied[0],
        applied[1]
    );
}

fn seed() -> u64 {
    std::env::var("PREDICATES_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stores_writes_apply_exactly_when_the_domain_says() {
    let seed = seed();
    eprintln!("PREDICATES_SEED={seed}");
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend);
        let direct: Arc<dyn Store> = db.backend(4).await;
        agree(direct, &format!("{backend:?} backend"), seed).await;
        let batched: Arc<dyn Store> = db.store(4).await;
        agree(batched, &format!("{backend:?} group commit"), seed ^ 1).await;
    }
}
