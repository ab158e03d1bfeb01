//! A store that is busy is not a store that cannot be reached: a call that waited past
//! `--db-acquire-timeout` for a connection every other call was using (or, on SQLite, for the
//! write lock another writer held) is answered UNAVAILABLE with a reason of its own,
//! `STORE_BUSY`, and RetryInfo, and the log says the store was busy, not unavailable. On
//! SQLite under the burst that first showed it (large Claims and their Completes at once, two
//! group-commit writers meeting on the one write lock); on PostgreSQL with every connection of
//! a small pool held up by a slow link.

use std::collections::HashMap;
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

use crate::grpc_api::key_req;
use crate::support::clusters::LedgerProcess;
use crate::support::postgres::PgCluster;
use crate::support::proxy::Proxy;
use crate::support::{claim_req, reason, success};

/// How the calls of a burst were answered: "OK", or the code and reason, with whether every
/// refusal carried RetryInfo.
#[derive(Debug, Default)]
struct Tally {
    answers: HashMap<String, usize>,
    without_retry_info: Vec<String>,
}

impl Tally {
    fn note(&mut self, answer: &Result<(), tonic::Status>) {
        let name = match answer {
            Ok(()) => "OK".to_string(),
            Err(status) => {
                let name = format!("{:?} {}", status.code(), reason(status));
                if status.code() == Code::Unavailable && status.get_details_retry_info().is_none() {
                    self.without_retry_info.push(name.clone());
                }
                name
            }
        };
        *self.answers.entry(name).or_default() += 1;
    }

    fn count(&self, answer: &str) -> usize {
        self.answers.get(answer).copied().unwrap_or(0)
    }

    /// Every refusal is STORE_BUSY (or load shedding's OVERLOADED) with RetryInfo, and at
    /// least one call was busy.
    #[track_caller]
    fn assert_busy_not_unavailable(&self, log: &str) {
        let other: Vec<_> = self
            .answers
            .keys()
            .filter(|a| {
                !matches!(
                    a.as_str(),
                    "OK" | "Unavailable STORE_BUSY" | "ResourceExhausted OVERLOADED"
                )
            })
            .collect();
        assert!(
            other.is_empty(),
            "answers other than OK, STORE_BUSY (or OVERLOADED): {self:?}\n{log}"
        );
        assert!(
            self.count("Unavailable STORE_BUSY") > 0,
            "some calls waited past the acquire timeout: {self:?}"
        );
        assert!(
            self.without_retry_info.is_empty(),
            "STORE_BUSY without RetryInfo: {self:?}"
        );
        assert!(
            log.contains("store busy, not unreachable"),
            "the log says the store was busy:\n{log}"
        );
        assert!(
            !log.contains("store unavailable"),
            "and never that it was unavailable:\n{log}"
        );
    }
}

/// 256 at once, each a Claim with 64 KiB of arguments and then a Complete with 64 KiB of
/// result; returns how they were answered.
async fn burst_of_large_claims_and_completes(client: &LedgerServiceClient<Channel>) -> Tally {
    let large = "a".repeat(64 * 1024);
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..256 {
        let mut client = client.clone();
        let args = format!(r#"{{"n":{n},"payload":"{large}"}}"#);
        let result = large.as_bytes().to_vec();
        tasks.spawn(async move {
            let mut answers = Vec::new();
            let claimed = client.claim(claim_req("run-burst", "upload", &args)).await;
            answers.push(claimed.as_ref().map(drop).map_err(Clone::clone));
            if let Ok(claimed) = claimed {
                let claimed = claimed.into_inner();
                if claimed.outcome() == pb::Outcome::Claimed {
                    let key = claimed.entry.expect("entry").key;
                    let done = client
                        .complete(success(&key, &claimed.claim_token, &result))
                        .await;
                    answers.push(done.map(drop));
                }
            }
            answers
        });
    }
    let mut tally = Tally::default();
    while let Some(answers) = tasks.join_next().await {
        for answer in answers.expect("a burst task") {
            tally.note(&answer);
        }
    }
    tally
}

/// The burst meets a write lock held past the acquire timeout (which is also SQLite's busy
/// timeout): by another connection to the file for its first second, so that some calls wait
/// that long on any machine, however fast its disk (the burst's own writers, claims and
/// completions, then meet on the lock as well).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_a_burst_that_waits_past_the_acquire_timeout_is_store_busy_not_unavailable() {
    use sqlx::{Connection as _, Executor as _};
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("ledger.db");
    let url = format!("sqlite://{}", file.display());
    let server = LedgerProcess::spawn(&url, &["--db-acquire-timeout", "300ms"]);
    server
        .wait_for_health(ServingStatus::Serving, Duration::from_secs(30))
        .await;
    let client = server.client().await;
    let mut writer = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("another connection to the file");
    writer
        .execute("BEGIN IMMEDIATE")
        .await
        .expect("take the write lock");
    let holder = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        writer.execute("ROLLBACK").await.expect("release the lock");
    });
    let tally = burst_of_large_claims_and_completes(&client).await;
    holder.await.expect("the lock holder");
    tally.assert_busy_not_unavailable(&server.log());
    assert!(tally.count("OK") > 0, "the rest were served: {tally:?}");
    eprintln!("sqlite burst: {tally:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_calls_that_find_every_connection_in_use_past_the_timeout_are_store_busy() {
    let cluster = PgCluster::shared();
    let db = tokio::task::block_in_place(|| cluster.create_database());
    let proxy = Proxy::start(([127, 0, 0, 1], cluster.port()).into()).await;
    let server = LedgerProcess::spawn(
        &proxy.url_for(&db),
        &["--db-max-connections", "2", "--db-acquire-timeout", "300ms"],
    );
    server
        .wait_for_health(ServingStatus::Serving, Duration::from_secs(30))
        .await;
    let mut client = server.client().await;
    let claimed = client
        .claim(claim_req("run-busy", "lookup_me", "{}"))
        .await
        .expect("claim")
        .into_inner();
    let key = claimed.entry.expect("entry").key;
    // Both connections open (opening one through the slow link below would take longer than
    // the acquire timeout: a link too slow to open a connection on, not a busy pool): two
    // lookups at once until both are served (on a loaded machine, opening the second may
    // itself take longer than 300 ms). And proven: after a failed call the store gives its
    // connections back to sqlx, which checks each with a round trip (over the slow link, one
    // longer than the timeout: a database that does not answer in time, not a busy pool) for
    // a second after it; so the burst begins only once the last failure is older than that.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut last_failure: Option<tokio::time::Instant> = None;
    loop {
        let (mut a, mut b) = (client.clone(), client.clone());
        let (x, y) = tokio::join!(a.lookup(key_req(&key)), b.lookup(key_req(&key)));
        if x.is_err() || y.is_err() {
            last_failure = Some(tokio::time::Instant::now());
        } else if last_failure.is_none_or(|at| at.elapsed() > Duration::from_millis(1500)) {
            break;
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "two lookups at once on the fast link: {x:?} {y:?}"
        );
    }
    // Each statement now takes at least 400 ms (its request and its answer wait 200 ms each):
    // two connections serve 24 lookups at once slower than 300 ms allows the waiting ones.
    proxy.set_latency(Duration::from_millis(200));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..24 {
        let mut client = client.clone();
        let key = key.clone();
        tasks.spawn(async move { client.lookup(key_req(&key)).await.map(drop) });
    }
    let mut tally = Tally::default();
    while let Some(answer) = tasks.join_next().await {
        tally.note(&answer.expect("a lookup task"));
    }
    proxy.clear();
    tally.assert_busy_not_unavailable(&server.log());
    // The database was there all along: served again as soon as the calls thin out.
    client
        .lookup(key_req(&key))
        .await
        .expect("a lookup once the burst is over");
}
