//! Exactly one winner: many claimants of one key on separate connections, on both stores, and
//! two server processes sharing one PostgreSQL database over a few hundred contended keys.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idempotency_ledger::domain::FinalStatus;
use idempotency_ledger::domain::time::SystemClock;
use idempotency_ledger::ledger::{ClaimInput, CompleteInput, Ledger, Limits, Outcome, Tenant};
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
                let input = ClaimInput {
                    run_id: format!("round-{round}"),
                    tool: "issue_credit".into(),
                    arguments_json: r#"{"amount":5}"#.into(),
                    ..Default::default()
                };
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
async fn two_server_processes_on_one_postgres_give_one_winner_per_key() {
    use crate::support::{ServerProcess, claim_req};
    use idempotency_ledger::grpc::pb;

    let db = TestDb::new(Backend::Postgres);
    let a = ServerProcess::start(&db.url, &[]).await;
    let b = ServerProcess::start(&db.url, &[]).await;
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
