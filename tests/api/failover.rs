//! Failover, as production meets it: a primary whose every commit waits for its streaming
//! standby, both behind one address (the harness's TCP proxy standing in for a DNS name or a
//! virtual IP), and the real binary serving claims and completions from several clients while
//! the primary's postmaster is killed with SIGKILL, the address moved to the standby, and the
//! standby promoted a few seconds later. Health follows it all without a restart of the ledger
//! server; writes that reach the standby before its promotion answer UNAVAILABLE
//! `STORE_READ_ONLY`, never INTERNAL; no acknowledged completion is lost; no attempt is granted
//! twice.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

use crate::grpc_api::key_req;
use crate::support::clusters::{LedgerProcess, ReplicatedPair};
use crate::support::postgres::PgCluster;
use crate::support::proxy::Proxy;
use crate::support::{claim_req, reason, success};

const RUN: &str = "run-failover";
const TOOL: &str = "charge_card";
/// What the probe logs when it finds the store unusable.
const NOT_READY: &str = "store not ready for calls: health NOT_SERVING";
/// Clients claiming and completing at once.
const WORKERS: usize = 4;

fn addr_of(cluster: &PgCluster) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], cluster.port()))
}

/// The binary on `url`, with the pool's acquire timeout the tests' usual 2 s.
async fn ledger_on(url: &str) -> LedgerProcess {
    let server = LedgerProcess::spawn(url, &["--db-acquire-timeout", "2s"]);
    server
        .wait_for_health(ServingStatus::Serving, Duration::from_secs(20))
        .await;
    server
}

/// A request that gives up after 10 s, so that a call stuck on a dead link shows as
/// DEADLINE_EXCEEDED instead of hanging the test.
fn bounded<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_secs(10));
    request
}

/// Claims fresh keys until one is answered `STORE_READ_ONLY` (a few may first meet the links the
/// move reset: STORE_UNAVAILABLE), and returns that answer; panics on any other answer.
async fn read_only_refusal(client: &mut LedgerServiceClient<Channel>, tag: &str) -> tonic::Status {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    loop {
        n += 1;
        let args = format!(r#"{{"probe":"{tag}","n":{n}}}"#);
        match client.claim(bounded(claim_req(RUN, TOOL, &args))).await {
            Err(s) if reason(&s) == "STORE_READ_ONLY" => return s,
            Err(s) if reason(&s) == "STORE_UNAVAILABLE" => {}
            other => panic!("a claim that can only reach a standby answered {other:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no STORE_READ_ONLY within 10 s of the move to the standby"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[track_caller]
fn assert_read_only(status: &tonic::Status) {
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(reason(status), "STORE_READ_ONLY", "{status:?}");
    assert!(
        status.get_details_retry_info().is_some(),
        "RetryInfo with a read-only refusal: {status:?}"
    );
}

/// Waits for the probe's NOT_SERVING line that says the database is a standby.
async fn assert_names_the_standby(server: &LedgerProcess) {
    let line = server
        .wait_for_log("is a standby in recovery", Duration::from_secs(5))
        .await;
    assert!(
        line.contains(NOT_READY) && line.contains("kind=\"read_only\""),
        "the probe's NOT_SERVING line, with the cause's kind:\n{line}"
    );
}

/// Where the failover is, as the workers stamp their answers.
const PRIMARY: u8 = 0;
const KILLED: u8 = 1;
const ON_STANDBY: u8 = 2;
const PROMOTED: u8 = 3;

/// A refused call; every field shows in the failure messages (through `Debug`).
#[derive(Debug)]
#[allow(dead_code)]
struct Failure {
    op: &'static str,
    sent: u8,
    answered: u8,
    code: Code,
    reason: String,
    retry_info: bool,
    message: String,
}

/// What one worker was told.
#[derive(Debug, Default)]
struct Record {
    /// CLAIMED answers: key, attempt, phase sent, phase answered.
    claimed: Vec<(String, u32, u8, u8)>,
    /// OK answers to Complete: key, attempt, result, phase sent, phase answered.
    acked: Vec<(String, u32, Vec<u8>, u8, u8)>,
    /// Claims answered with another outcome: phase sent, phase answered, outcome.
    other: Vec<(u8, u8, pb::Outcome)>,
    failures: Vec<Failure>,
}

struct Traffic {
    phase: AtomicU8,
    stop: AtomicBool,
    /// Completions acknowledged, by phase answered.
    acked: [AtomicUsize; 4],
}

impl Traffic {
    fn phase(&self) -> u8 {
        self.phase.load(Ordering::SeqCst)
    }

    fn failure(&self, op: &'static str, sent: u8, status: &tonic::Status) -> Failure {
        Failure {
            op,
            sent,
            answered: self.phase(),
            code: status.code(),
            reason: reason(status),
            retry_info: status.get_details_retry_info().is_some(),
            message: status.message().to_string(),
        }
    }

    /// Waits until `n` completions were acknowledged in `phase` (at most `within`).
    async fn wait_for_acks(&self, phase: u8, n: usize, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.acked[usize::from(phase)].load(Ordering::SeqCst) < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "fewer than {n} completions acknowledged in phase {phase} within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Claims fresh keys and completes each one it gets, until told to stop. A claim that failed is
/// sent again (it may have committed, and then must not be CLAIMED again); a completion that
/// failed UNAVAILABLE is sent again until it is answered otherwise.
async fn worker(
    w: usize,
    mut client: LedgerServiceClient<Channel>,
    traffic: Arc<Traffic>,
) -> Record {
    let mut record = Record::default();
    let mut n = 0u32;
    let mut retry: Option<String> = None;
    while !traffic.stop.load(Ordering::SeqCst) {
        let args = retry.take().unwrap_or_else(|| {
            n += 1;
            format!(r#"{{"worker":{w},"n":{n}}}"#)
        });
        let sent = traffic.phase();
        let claimed = match client.claim(bounded(claim_req(RUN, TOOL, &args))).await {
            Ok(answer) => answer.into_inner(),
            Err(status) => {
                record
                    .failures
                    .push(traffic.failure("claim", sent, &status));
                retry = Some(args);
                tokio::time::sleep(Duration::from_millis(25)).await;
                continue;
            }
        };
        if claimed.outcome() != pb::Outcome::Claimed {
            record
                .other
                .push((sent, traffic.phase(), claimed.outcome()));
            continue;
        }
        let entry = claimed.entry.expect("a CLAIMED answer's entry");
        record
            .claimed
            .push((entry.key.clone(), entry.attempt, sent, traffic.phase()));
        let result = format!("charged for {args}").into_bytes();
        while !traffic.stop.load(Ordering::SeqCst) {
            let sent = traffic.phase();
            match client
                .complete(bounded(success(&entry.key, &claimed.claim_token, &result)))
                .await
            {
                Ok(_) => {
                    let answered = traffic.phase();
                    record.acked.push((
                        entry.key.clone(),
                        entry.attempt,
                        result.clone(),
                        sent,
                        answered,
                    ));
                    traffic.acked[usize::from(answered)].fetch_add(1, Ordering::SeqCst);
                    break;
                }
                Err(status) => {
                    let failure = traffic.failure("complete", sent, &status);
                    let again = failure.code == Code::Unavailable;
                    record.failures.push(failure);
                    if !again {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
        }
    }
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_and_a_promoted_standby_lose_no_acknowledged_completion_and_grant_no_attempt_twice()
 {
    let pair = ReplicatedPair::start().await;
    let db = tokio::task::block_in_place(|| pair.primary.create_database());
    let proxy = Proxy::start(addr_of(&pair.primary)).await;
    let mut server = ledger_on(&proxy.url_for(&db)).await;
    let pid = server.child.id();
    let client = server.client().await;

    let traffic = Arc::new(Traffic {
        phase: AtomicU8::new(PRIMARY),
        stop: AtomicBool::new(false),
        acked: Default::default(),
    });
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| tokio::spawn(worker(w, client.clone(), traffic.clone())))
        .collect();
    traffic
        .wait_for_acks(PRIMARY, 40, Duration::from_secs(15))
        .await;

    // The crash: the postmaster dies at once; its backends notice and exit.
    traffic.phase.store(KILLED, Ordering::SeqCst);
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| pair.primary.kill());
    // The address moves to the standby, which is not promoted yet.
    traffic.phase.store(ON_STANDBY, Ordering::SeqCst);
    proxy.set_upstream(addr_of(&pair.standby));
    server
        .wait_for_health(ServingStatus::NotServing, Duration::from_secs(5))
        .await;
    let mut probe = client.clone();
    assert_read_only(&read_only_refusal(&mut probe, "on-standby").await);
    // Health stays NOT_SERVING while the only database it reaches is in recovery.
    assert!(ReplicatedPair::in_recovery(&pair.standby).await);
    for _ in 0..20 {
        assert_eq!(
            server.health().await,
            Ok(ServingStatus::NotServing),
            "health while the address reaches a standby in recovery:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_names_the_standby(&server).await;

    traffic.phase.store(PROMOTED, Ordering::SeqCst);
    let promoted_at = Instant::now();
    tokio::task::block_in_place(|| pair.standby.promote());
    let budget = Duration::from_secs(30).saturating_sub(killed_at.elapsed());
    server.wait_for_health(ServingStatus::Serving, budget).await;
    let serving_after_promotion = promoted_at.elapsed();
    traffic
        .wait_for_acks(PROMOTED, 40, Duration::from_secs(15))
        .await;
    traffic.stop.store(true, Ordering::SeqCst);
    let mut records = Vec::new();
    for w in workers {
        records.push(w.await.expect("worker"));
    }

    // Never restarted: the same process served throughout.
    assert!(server.is_running(), "{}", server.log());
    assert_eq!(server.child.id(), pid);
    assert_eq!(
        server.lines_with("idempotency-ledger starting").len(),
        1,
        "{}",
        server.log()
    );

    // No attempt was granted twice.
    let mut grants: HashMap<(String, u32), usize> = HashMap::new();
    for (key, attempt, _, _) in records.iter().flat_map(|r| &r.claimed) {
        *grants.entry((key.clone(), *attempt)).or_default() += 1;
    }
    let twice: Vec<_> = grants.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "attempts CLAIMED more than once: {twice:?}"
    );

    // Writes that could only reach the standby were refused as such, never as INTERNAL.
    let failures: Vec<&Failure> = records.iter().flat_map(|r| &r.failures).collect();
    let internal: Vec<_> = failures
        .iter()
        .filter(|f| f.code == Code::Internal || f.reason == "INTERNAL")
        .collect();
    assert!(internal.is_empty(), "INTERNAL answers: {internal:#?}");
    let on_standby: Vec<_> = failures
        .iter()
        .filter(|f| f.sent == ON_STANDBY && f.answered == ON_STANDBY)
        .collect();
    let not_unavailable: Vec<_> = on_standby
        .iter()
        .filter(|f| f.code != Code::Unavailable || !f.retry_info)
        .collect();
    assert!(
        not_unavailable.is_empty(),
        "refusals while the address reached the standby, other than UNAVAILABLE with RetryInfo: \
         {not_unavailable:#?}"
    );
    for record in &records {
        assert!(
            !record
                .acked
                .iter()
                .any(|a| a.3 == ON_STANDBY && a.4 == ON_STANDBY),
            "a completion acknowledged by a standby"
        );
        assert!(
            !record
                .claimed
                .iter()
                .any(|c| c.2 == ON_STANDBY && c.3 == ON_STANDBY),
            "an attempt granted by a standby"
        );
    }

    // Every acknowledged completion is on the promoted standby, as acknowledged.
    let acked: Vec<_> = records.iter().flat_map(|r| &r.acked).collect();
    let mut lookups = client.clone();
    for (key, attempt, result, _, _) in &acked {
        let entry = lookups
            .lookup(bounded(key_req(key)))
            .await
            .unwrap_or_else(|s| panic!("lookup of acknowledged {key}: {s:?}"))
            .into_inner()
            .entry
            .expect("entry");
        assert_eq!(entry.status(), pb::Status::Succeeded, "{key}");
        assert_eq!(&entry.result, result, "{key}");
        assert_eq!(entry.attempt, *attempt, "{key}");
    }

    // New claims work on the new primary, and the old results replay.
    let mut fresh = client.clone();
    let claimed = fresh
        .claim(bounded(claim_req(RUN, TOOL, r#"{"after":"failover"}"#)))
        .await
        .expect("a claim after the failover")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    fresh
        .complete(bounded(success(
            &claimed.entry.expect("entry").key,
            &claimed.claim_token,
            b"done",
        )))
        .await
        .expect("a completion after the failover");
    let first = acked
        .iter()
        .find(|a| a.4 == PRIMARY)
        .expect("a completion acknowledged by the old primary");
    let replay = fresh
        .lookup(bounded(key_req(&first.0)))
        .await
        .expect("lookup")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(replay.result, first.2);

    eprintln!(
        "failover: {} completions acknowledged ({} by the old primary, {} after promotion), {} \
         refusals, health SERVING {:?} after the promotion, {:?} after the kill",
        acked.len(),
        acked.iter().filter(|a| a.4 == PRIMARY).count(),
        acked.iter().filter(|a| a.4 == PROMOTED).count(),
        failures.len(),
        serving_after_promotion,
        killed_at.elapsed(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_reach_a_standby_answer_unavailable_store_read_only_and_health_is_not_serving_until_the_primary_is_back()
 {
    let pair = ReplicatedPair::start().await;
    let db = tokio::task::block_in_place(|| pair.primary.create_database());
    let proxy = Proxy::start(addr_of(&pair.primary)).await;
    let server = ledger_on(&proxy.url_for(&db)).await;
    let mut client = server.client().await;

    let done = client
        .claim(bounded(claim_req(RUN, TOOL, r#"{"card":"done"}"#)))
        .await
        .expect("claim")
        .into_inner();
    let done_key = done.entry.expect("entry").key;
    client
        .complete(bounded(success(&done_key, &done.claim_token, b"charged")))
        .await
        .expect("complete");
    let held = client
        .claim(bounded(claim_req(RUN, TOOL, r#"{"card":"held"}"#)))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(held.outcome(), pb::Outcome::Claimed);
    let held_key = held.entry.expect("entry").key;

    proxy.set_upstream(addr_of(&pair.standby));
    server
        .wait_for_health(ServingStatus::NotServing, Duration::from_secs(5))
        .await;
    // A new claim and a completion write, and are refused.
    assert_read_only(&read_only_refusal(&mut client, "standby").await);
    let complete = client
        .complete(bounded(success(&held_key, &held.claim_token, b"charged")))
        .await
        .expect_err("a completion on a standby");
    assert_read_only(&complete);
    // A replay is answered (its result is committed); its count is written in a later batch,
    // which the standby refuses, so the count waits in memory for the primary.
    let replay = client
        .claim(bounded(claim_req(RUN, TOOL, r#"{"card":"done"}"#)))
        .await
        .expect("a replay on a standby")
        .into_inner();
    assert_eq!(replay.outcome(), pb::Outcome::Replayed);
    assert_eq!(replay.entry.expect("entry").result, &b"charged"[..]);
    // Reads still answer, from the standby.
    let found = client
        .lookup(bounded(key_req(&done_key)))
        .await
        .expect("a lookup on a standby")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(found.result, &b"charged"[..]);
    assert_eq!(server.health().await, Ok(ServingStatus::NotServing));
    assert_names_the_standby(&server).await;

    proxy.set_upstream(addr_of(&pair.primary));
    server
        .wait_for_health(ServingStatus::Serving, Duration::from_secs(10))
        .await;
    let completed = client
        .complete(bounded(success(&held_key, &held.claim_token, b"charged")))
        .await
        .expect("the completion, once the primary is back")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(completed.status(), pb::Status::Succeeded);
    // The replay's count, held while the standby refused it, reaches the primary's table (a
    // Lookup would show it from memory either way).
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(&db)
        .await
        .expect("connect to the primary");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let count: i64 =
            sqlx::query_scalar("SELECT replay_count FROM ledger_entries WHERE key = $1")
                .bind(&done_key)
                .fetch_one(&mut conn)
                .await
                .expect("the entry's row");
        if count == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replay's count never reached the primary: replay_count {count}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_returns_to_serving_once_new_connections_reach_the_primary_even_while_an_old_one_reaches_the_standby()
 {
    let pair = ReplicatedPair::start().await;
    let db = tokio::task::block_in_place(|| pair.primary.create_database());
    let proxy = Proxy::start(addr_of(&pair.primary)).await;
    let server = ledger_on(&proxy.url_for(&db)).await;

    // The address reaches the standby for a while: the probe's connections are made to it.
    proxy.set_upstream(addr_of(&pair.standby));
    assert_names_the_standby(&server).await;
    assert_eq!(server.health().await, Ok(ServingStatus::NotServing));
    // Then the address is put right, but nothing breaks the connections made meanwhile: a
    // connection on which the probe found recovery must not be what it asks next time.
    proxy.redirect_new_connections(addr_of(&pair.primary));
    // Within a few probes; not at the next write that happens to take that connection (the
    // pruner's, every --prune-interval), which a load balancer that believes NOT_SERVING
    // never sends.
    server
        .wait_for_health(ServingStatus::Serving, Duration::from_secs(10))
        .await;
    let mut client = server.client().await;
    let claimed = client
        .claim(bounded(claim_req(RUN, TOOL, r#"{"after":"correction"}"#)))
        .await
        .expect("a claim once health is SERVING")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
}
