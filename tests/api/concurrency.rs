//! Exactly one winner: many claimants of one key on separate connections, on both stores, and
//! two server processes sharing one PostgreSQL database over a few hundred contended keys.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idempotency_ledger::domain::FinalStatus;
use idempotency_ledger::domain::Tenant;
use idempotency_ledger::domain::time::SystemClock;
use idempotency_ledger::ledger::{CompleteInput, Ledger, Limits, Outcome};
use idempotency_ledger::storage::Store as _;
use tokio::sync::Barrier;

use crate::support::{Backend, TestDb};

const CLAIMANTS: usize = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_simultaneous_claims_of_one_key_give_one_claimed_on_sqlite() {
    one_winner_among_simultaneous_claims(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_simultaneous_claims_of_one_key_give_one_claimed_on_postgres() {
    one_winner_among_simultaneous_claims(Backend::Postgres).await;
}

/// Each claimant has its own store (its own pool of one connection), and all are released at
/// once by a barrier, several rounds over fresh keys.
async fn one_winner_among_simultaneous_claims(backend: Backend) {
    let db = TestDb::new(backend);
    let mut ledgers = Vec::with_capacity(CLAIMANTS);
    for _ in 0..CLAIMANTS {
        ledgers.push(Ledger::new(
            db.store(1).await,
            Arc::new(SystemClock),
            Limits::default(),
        ));
    }
    for round in 0..5 {
        let barrier = Arc::new(Barrier::new(CLAIMANTS));
        let mut tasks = Vec::new();
        for ledger in &ledgers {
            let ledger = ledger.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                let input = crate::support::typed::claim_input(
                    &format!("round-{round}"),
                    "issue_credit",
                    r#"{"amount":5}"#,
                );
                barrier.wait().await;
                ledger.claim(&Tenant::default_tenant(), input).await
            }));
        }
        let mut outcomes: HashMap<String, usize> = HashMap::new();
        let mut winner = None;
        for task in tasks {
            let out = task.await.expect("join").expect("every claim answers");
            if out.outcome == Outcome::Claimed {
                winner = Some(out.clone());
            }
            *outcomes.entry(format!("{:?}", out.outcome)).or_default() += 1;
        }
        assert_eq!(
            outcomes.get("Claimed"),
            Some(&1),
            "round {round}: {outcomes:?}"
        );
        assert_eq!(
            outcomes.get("InProgress"),
            Some(&(CLAIMANTS - 1)),
            "round {round}: {outcomes:?}"
        );
        // The winner's token is the stored one: it completes, and everyone then replays.
        let winner = winner.expect("one winner");
        ledgers[0]
            .complete(
                &Tenant::default_tenant(),
                CompleteInput {
                    key: winner.entry.entry.key.clone(),
                    claim_token: winner.claim_token.clone().expect("token"),
                    status: FinalStatus::Succeeded,
                    result: b"ok".to_vec(),
                    error: String::new(),
                    retryable: false,
                },
            )
            .await
            .expect("winner completes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_simultaneous_claims_of_one_key_give_one_claimed_through_pgbouncer() {
    one_winner_among_simultaneous_claims(Backend::PgBouncer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_server_processes_on_one_postgres_give_one_winner_per_key() {
    two_servers_give_one_winner_per_key(&TestDb::new(Backend::Postgres)).await;
}

/// The same race with both servers behind one PgBouncer in transaction mode (the second
/// server starting on the same pooler is part of it: named prepared statements of the first
/// once kept it from starting). Afterwards, plain clients of the same pool see none of the
/// servers' session state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_server_processes_behind_pgbouncer_give_one_winner_per_key_and_leave_no_session_state()
{
    let db = TestDb::new(Backend::PgBouncer);
    two_servers_give_one_winner_per_key(&db).await;
    crate::pooler::assert_no_session_state_left(&db).await;
}

async fn two_servers_give_one_winner_per_key(db: &TestDb) {
    use crate::support::{ServerProcess, claim_req};
    use idempotency_ledger::grpc::pb;

    let pooled = [
        "--postgres-pooler",
        "transaction",
        "--migrations-database-url",
        &db.direct_url,
    ];
    let extra: &[&str] = if db.backend == Backend::PgBouncer {
        &pooled
    } else {
        &[]
    };
    let a = ServerProcess::start(&db.url, extra).await;
    let b = ServerProcess::start(&db.url, extra).await;
    const KEYS: usize = 300;
    const CLIENTS_PER_KEY: usize = 4;
    let mut tasks = Vec::new();
    for client in 0..CLIENTS_PER_KEY {
        // Clients alternate between the two servers; each sweeps every key.
        let mut ledger = if client % 2 == 0 {
            a.client().await
        } else {
            b.client().await
        };
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for k in 0..KEYS {
                // Start at a different offset per client, so that the races are spread out.
                let k = (k + client * KEYS / CLIENTS_PER_KEY) % KEYS;
                let out = ledger
                    .claim(claim_req(
                        "shared-run",
                        "open_ticket",
                        &format!("{{\"n\":{k}}}"),
                    ))
                    .await
                    .expect("claim answers")
                    .into_inner();
                if out.outcome() == pb::Outcome::Claimed {
                    won.push(k);
                }
            }
            won
        }));
    }
    let mut winners: HashMap<usize, usize> = HashMap::new();
    for task in tasks {
        for k in task.await.expect("join") {
            *winners.entry(k).or_default() += 1;
        }
    }
    assert_eq!(winners.len(), KEYS, "every key was won by someone");
    let doubled: Vec<_> = winners.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubled.is_empty(),
        "keys with more than one winner: {doubled:?}"
    );
    drop((a, b));
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_claims_through_one_server_are_batched_and_one_key_has_one_winner_on_sqlite() {
    one_batcher_many_claimants(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_claims_through_one_server_are_batched_and_one_key_has_one_winner_on_postgres()
{
    one_batcher_many_claimants(Backend::Postgres).await;
}

/// 64 claims of one key and 64 of different keys through one ledger, whose group commit has
/// a single writer, so that they share batches: the key has one winner, every other key its
/// own claim, and then every completion of them lands.
async fn one_batcher_many_claimants(backend: Backend) {
    use std::sync::atomic::Ordering;

    let db = TestDb::new(backend);
    let (batched, stats) = db.batched(4, 1).await;
    let ledger = Ledger::new(batched, Arc::new(SystemClock), Limits::default());
    let barrier = Arc::new(Barrier::new(2 * CLAIMANTS));
    let mut tasks = Vec::new();
    for i in 0..2 * CLAIMANTS {
        let ledger = ledger.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            // The first half claim one key; the second half one key each.
            let args = if i < CLAIMANTS {
                r#"{"shared":true}"#.to_string()
            } else {
                format!("{{\"own\":{i}}}")
            };
            let input = crate::support::typed::claim_input("batch-run", "issue_credit", &args);
            barrier.wait().await;
            (i, ledger.claim(&Tenant::default_tenant(), input).await)
        }));
    }
    let mut shared_winners = 0;
    let mut own = Vec::new();
    for task in tasks {
        let (i, out) = task.await.expect("join");
        let out = out.expect("every claim answers");
        if i < CLAIMANTS {
            shared_winners += usize::from(out.outcome == Outcome::Claimed);
        } else {
            assert_eq!(
                out.outcome,
                Outcome::Claimed,
                "claimant {i} has its own key"
            );
            own.push(out);
        }
    }
    assert_eq!(shared_winners, 1);
    // Complete every own key at once: the completions share batches too.
    let mut completions = Vec::new();
    for out in own {
        let ledger = ledger.clone();
        completions.push(tokio::spawn(async move {
            ledger
                .complete(
                    &Tenant::default_tenant(),
                    CompleteInput {
                        key: out.entry.entry.key.clone(),
                        claim_token: out.claim_token.clone().expect("token"),
                        status: FinalStatus::Succeeded,
                        result: out.entry.entry.key.as_str().as_bytes().to_vec(),
                        error: String::new(),
                        retryable: false,
                    },
                )
                .await
        }));
    }
    for c in completions {
        let done = c.await.expect("join").expect("complete");
        assert!(!done.already_completed);
        assert_eq!(
            done.entry.entry.result,
            done.entry.entry.key.as_str().as_bytes(),
            "its own result"
        );
    }
    let (batches, requests, largest) = (
        stats.batches.load(Ordering::Relaxed),
        stats.requests.load(Ordering::Relaxed),
        stats.largest.load(Ordering::Relaxed),
    );
    assert!(
        largest > 1,
        "requests shared batches: {batches} batches, {requests} requests"
    );
    assert!(
        batches < requests,
        "{batches} batches for {requests} requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_batch_fails_every_request_in_it_and_writes_none_on_postgres() {
    a_failing_batch_writes_nothing(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_batch_fails_every_request_in_it_and_writes_none_on_sqlite() {
    a_failing_batch_writes_nothing(Backend::Sqlite).await;
}

/// One request in a batch breaks a table constraint (attempt 0): the batch's statement fails
/// as a whole, so every request of that batch gets the error and none of their rows exists.
async fn a_failing_batch_writes_nothing(backend: Backend) {
    use idempotency_ledger::domain::{
        ClaimToken, Entry, Key, Micros, Principal, RunId, Status, ToolName,
    };

    let db = TestDb::new(backend);
    let inner = db.backend(4).await;
    let entry = |n: usize, attempt: u32| Entry {
        key: Key::from_stored(format!("k-{n}")),
        run_id: Some(RunId::from_stored("r".into())),
        tool: ToolName::from_stored("t".into()),
        fingerprint: "f".into(),
        status: Status::Attempting,
        attempt,
        claim_token: ClaimToken::from_stored(format!("tok-{n}")),
        result: Vec::new(),
        error: String::new(),
        retryable: false,
        principal: Principal::none(),
        started_at: Micros(1),
        finished_at: None,
        lease_expires_at: Micros(2),
        retention: Micros(3),
        expires_at: None,
        replay_count: 0,
        arguments: None,
        resolved_by: Principal::none(),
        hold_token: idempotency_ledger::domain::HoldToken::none(),
        possible_double_effect: false,
        approval: Default::default(),
    };
    let tenant = Tenant::default_tenant();
    let mut batch: Vec<(Tenant, Entry)> = (0..10).map(|n| (tenant.clone(), entry(n, 1))).collect();
    batch.insert(5, (tenant.clone(), entry(99, 0)));
    let failed = inner.insert_many(&batch).await;
    assert!(failed.is_err(), "the poisoned batch must fail: {failed:?}");
    for n in (0..10).chain([99]) {
        assert!(
            inner
                .get(&tenant, &Key::from_stored(format!("k-{n}")))
                .await
                .expect("get")
                .is_none(),
            "k-{n} must not be half-written"
        );
    }
    // Through the group commit: the poisoned request and its batch-mates all get the error;
    // requests in other batches are unaffected.
    let batched =
        Arc::new(idempotency_ledger::storage::group_commit::GroupCommit::wrap(inner.clone(), 1));
    let barrier = Arc::new(Barrier::new(11));
    let mut tasks = Vec::new();
    for (owner, e) in batch {
        let batched = batched.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let n = e.key.clone();
            (n, batched.insert(&owner, &e).await)
        }));
    }
    let mut failed_keys = Vec::new();
    for t in tasks {
        let (key, result) = t.await.expect("join");
        match result {
            Ok(true) => {
                assert!(
                    inner.get(&tenant, &key).await.expect("get").is_some(),
                    "{key} acknowledged"
                );
            }
            Ok(false) => panic!("{key}: no conflict was possible"),
            Err(_) => {
                assert!(
                    inner.get(&tenant, &key).await.expect("get").is_none(),
                    "{key} failed but written"
                );
                failed_keys.push(key);
            }
        }
    }
    assert!(
        failed_keys.contains(&Key::from_stored("k-99".into())),
        "{failed_keys:?}"
    );
}
