//! Replays answer without waiting for the disk, and their counts are still kept: a replay's
//! commit, and the write of the counts of replays answered from memory, do not wait for the
//! WAL flush (PostgreSQL, directly and behind PgBouncer; SQLite's connection that does not
//! sync is a unit test of `storage::sqlite`), sequential replays are numbered one by one, and
//! the counts are there after a graceful restart, and after a kill once written, on every
//! store.

use std::time::{Duration, Instant};

use idempotency_ledger::domain::{FinalStatus, Key, Tenant};
use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use idempotency_ledger::ledger::{CompleteInput, Ledger, Limits, Outcome};
use idempotency_ledger::storage::{self, PoolOptions, Pooler};
use tonic::transport::Channel;

use crate::support::pgbouncer::PgBouncer;
use crate::support::postgres::{ClusterSetup, PgCluster};
use crate::support::{Backend, ManualClock, ServerProcess, TestDb, claim_req, success};

on_every_store!(sequential_replays_count_one_each_and_a_killed_server_keeps_them);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_commits_without_waiting_for_the_wal_flush_on_postgres() {
    a_replay_commits_without_waiting_for_the_wal_flush(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_commits_without_waiting_for_the_wal_flush_behind_pgbouncer() {
    a_replay_commits_without_waiting_for_the_wal_flush(Backend::PgBouncer).await;
}

const TOOL: &str = "issue_credit";
const ARGS: &str = r#"{"customer":"c-42","amount":200,"currency":"EUR"}"#;

/// How long PostgreSQL holds each synchronous commit of the test's cluster before flushing it
/// (`commit_delay`, at its maximum): a statement that waits for the flush takes at least this.
const COMMIT_DELAY: Duration = Duration::from_millis(100);

/// In a cluster of its own that holds every synchronous commit for [`COMMIT_DELAY`] (which
/// PostgreSQL does only for commits that wait for the WAL flush, and only with `fsync` on,
/// unlike the shared test cluster), the claim and the completion take at least that long each,
/// and the replays do not: they commit without the flush.
async fn a_replay_commits_without_waiting_for_the_wal_flush(b: Backend) {
    crate::support::init_tracing();
    let cluster = tokio::task::spawn_blocking(|| {
        PgCluster::start_with(
            ClusterSetup::default()
                .conf("fsync = on")
                .conf(format!("commit_delay = {}", COMMIT_DELAY.as_micros()))
                // Whatever else runs: the delay applies to every synchronous commit.
                .conf("commit_siblings = 0"),
        )
    })
    .await
    .expect("cluster");
    let direct_url = cluster.create_database();
    let bouncer = (b == Backend::PgBouncer).then(|| PgBouncer::start(&cluster, "transaction"));
    let options = PoolOptions {
        max_connections: 4,
        acquire_timeout: Duration::from_secs(10),
        pooler: if bouncer.is_some() {
            Pooler::Transaction
        } else {
            Pooler::None
        },
        migrations_url: bouncer.is_some().then(|| direct_url.clone()),
        ..PoolOptions::default()
    };
    let url = bouncer.as_ref().map_or_else(
        || direct_url.clone(),
        |bouncer| bouncer.url_for(&direct_url),
    );
    let store = storage::open(&url, &options).await.expect("open store");
    store.migrate().await.expect("migrate");
    // Without the replay memory, so that each replay runs the store's REPLAY statement.
    let ledger = Ledger::new(
        store.clone(),
        ManualClock::new(),
        Limits {
            replay_memory_bytes: 0,
            ..Limits::default()
        },
    );
    let tenant = Tenant::default_tenant();
    let input = crate::support::typed::claim_input("run-1", TOOL, ARGS);

    let started = Instant::now();
    let first = ledger.claim(&tenant, input.clone()).await.expect("claim");
    assert_eq!(first.outcome, Outcome::Claimed);
    ledger
        .complete(
            &tenant,
            CompleteInput {
                key: first.entry.entry.key.clone(),
                claim_token: first.claim_token.clone().expect("token"),
                status: FinalStatus::Succeeded,
                result: b"cr-1".to_vec(),
                error: String::new(),
                retryable: false,
            },
        )
        .await
        .expect("complete");
    let durable = started.elapsed();
    // The control: the delay is in force, and the claim and the completion waited for it.
    assert!(
        durable >= 2 * COMMIT_DELAY,
        "a claim and a completion took {durable:?}, below two commit delays: the delay is not \
         in force, so this test shows nothing"
    );

    let mut took = Vec::new();
    for n in 1..=9 {
        let started = Instant::now();
        let replay = ledger.claim(&tenant, input.clone()).await.expect("replay");
        took.push(started.elapsed());
        assert_eq!(replay.outcome, Outcome::Replayed);
        assert_eq!(replay.entry.entry.replay_count, n);
    }
    took.sort();
    // The median, so that one replay slowed by a busy machine does not decide.
    let median = took[took.len() / 2];
    assert!(
        median < COMMIT_DELAY / 2,
        "replays took {took:?}: they wait for the WAL flush"
    );

    // With the memory: the replays are answered from it, and the write of their counts does
    // not wait for the flush either.
    let remembering = Ledger::new(store, ManualClock::new(), Limits::default());
    remembering
        .claim(&tenant, input.clone())
        .await
        .expect("read once");
    let mut took = Vec::new();
    for _ in 0..9 {
        for _ in 0..3 {
            let replay = remembering
                .claim(&tenant, input.clone())
                .await
                .expect("replay");
            assert_eq!(replay.outcome, Outcome::Replayed);
        }
        let started = Instant::now();
        assert_eq!(remembering.flush_replay_counts().await.expect("write"), 1);
        took.push(started.elapsed());
    }
    took.sort();
    let median = took[took.len() / 2];
    assert!(
        median < COMMIT_DELAY / 2,
        "writes of replay counts took {took:?}: they wait for the WAL flush"
    );
    let stored = remembering
        .lookup(
            &tenant,
            idempotency_ledger::ledger::LookupInput::by_key(first.entry.entry.key.clone()),
        )
        .await
        .expect("lookup");
    assert_eq!(stored.entry.replay_count, 9 + 1 + 27);
}

/// Replays answered from the server's memory are numbered one by one and Lookup on that server
/// shows them at once; their counts reach the store within a second or so, and at a graceful
/// shutdown: a server stopped with SIGTERM right after two replays, then one killed (no
/// graceful shutdown) once its count is in the store, both leave every count behind.
async fn sequential_replays_count_one_each_and_a_killed_server_keeps_them(b: Backend) {
    let db = TestDb::new(b);
    let pooled = [
        "--postgres-pooler",
        "transaction",
        "--migrations-database-url",
        &db.direct_url,
    ];
    let extra: &[&str] = if b == Backend::PgBouncer {
        &pooled
    } else {
        &[]
    };
    let mut server = ServerProcess::start(&db.url, extra).await;
    let mut client = server.client().await;
    let claimed = client
        .claim(claim_req("run-1", TOOL, ARGS))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let key = claimed.entry.expect("entry").key;
    client
        .complete(success(&key, &claimed.claim_token, b"cr-1"))
        .await
        .expect("complete");
    let replay = |mut client: LedgerServiceClient<Channel>| async move {
        let replay = client
            .claim(claim_req("run-1", TOOL, ARGS))
            .await
            .expect("replay")
            .into_inner();
        assert_eq!(replay.outcome(), pb::Outcome::Replayed);
        replay.entry.expect("entry").replay_count
    };
    for n in 1..=2 {
        assert_eq!(replay(client.clone()).await, n);
    }
    let lookup = |mut client: LedgerServiceClient<Channel>| {
        let key = key.clone();
        async move {
            client
                .lookup(pb::LookupRequest {
                    key,
                    ..Default::default()
                })
                .await
                .expect("lookup")
                .into_inner()
                .entry
                .expect("entry")
        }
    };
    assert_eq!(lookup(client.clone()).await.replay_count, 2);

    // A graceful stop writes the counts it holds.
    server.terminate();
    let stopped = tokio::time::timeout(Duration::from_secs(20), server.child.wait())
        .await
        .expect("the server stops within 20 s of SIGTERM")
        .expect("wait");
    assert!(stopped.success(), "{stopped:?}");
    let mut server = ServerProcess::start(&db.url, extra).await;
    let client = server.client().await;
    assert_eq!(
        lookup(client.clone()).await.replay_count,
        2,
        "the counts survive a graceful restart"
    );
    assert_eq!(replay(client.clone()).await, 3);

    // Without a stop, they reach the store within about a second: read it directly.
    let store = db.store(1).await;
    let tenant = Tenant::default_tenant();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stored = store
            .get(&tenant, &Key::from_stored(key.clone()))
            .await
            .expect("read")
            .expect("the entry");
        if stored.replay_count == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the count was not written within 10 s: {}",
            stored.replay_count
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(store);
    server.child.start_kill().expect("SIGKILL");
    tokio::time::timeout(Duration::from_secs(10), server.child.wait())
        .await
        .expect("the killed server is gone within 10 s")
        .expect("wait");
    let server = ServerProcess::start(&db.url, extra).await;
    let client = server.client().await;
    assert_eq!(
        lookup(client.clone()).await.replay_count,
        3,
        "written counts survive the server's crash"
    );
    assert_eq!(replay(client).await, 4);
}
