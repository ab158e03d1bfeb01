//! One clock for the arbiter: two servers on one PostgreSQL, one of them started under
//! `faketime` (Debian's package, an `LD_PRELOAD` library) ten minutes ahead of the other, and
//! once ten minutes behind. Each server follows the database's clock, so an attempt claimed on
//! either is ATTEMPTING on both, never handed out by either's Reconcile, and a duplicate Claim
//! on either is IN_PROGRESS; the skewed server says in its log that its clock is off.

use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tonic::transport::Channel;

use crate::support::{Backend, ServerProcess, TestDb, claim_req};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The binary with its wall clock (and monotonic clock) moved by `offset` (`+10m`, `-10m`).
async fn skewed_server(url: &str, offset: &'static str) -> ServerProcess {
    assert!(
        std::path::Path::new(LIBFAKETIME).is_file(),
        "{LIBFAKETIME} is missing (Debian's `faketime` package; .ci/run installs it)"
    );
    ServerProcess::start_with(url, 0, &[], move |command| {
        command
            .env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME", offset);
    })
    .await
}

/// Claims a new key on `on` with a two-minute lease; its key.
async fn claim_for_two_minutes(on: &mut LedgerServiceClient<Channel>, args: &str) -> pb::Entry {
    let out = on
        .claim(pb::ClaimRequest {
            lease: Some(prost_types::Duration {
                seconds: 120,
                nanos: 0,
            }),
            ..claim_req("run-1", "issue_credit", args)
        })
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(out.outcome(), pb::Outcome::Claimed);
    out.entry.expect("entry")
}

/// What `on` says of an attempt another server claimed: in flight, not unknown, not handed out,
/// not claimable.
async fn is_in_flight_on(on: &mut LedgerServiceClient<Channel>, entry: &pb::Entry, args: &str) {
    let looked = on
        .lookup(pb::LookupRequest {
            key: entry.key.clone(),
            ..Default::default()
        })
        .await
        .expect("lookup")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(looked.status(), pb::Status::Attempting, "{looked:?}");
    let pending = on
        .reconcile(pb::ReconcileRequest::default())
        .await
        .expect("reconcile")
        .into_inner()
        .pending;
    assert!(
        pending.iter().all(|e| e.key != entry.key),
        "a live attempt was handed to a reconciler: {pending:?}"
    );
    let duplicate = on
        .claim(claim_req("run-1", "issue_credit", args))
        .await
        .expect("duplicate")
        .into_inner();
    assert_eq!(duplicate.outcome(), pb::Outcome::InProgress);
    assert_eq!(
        duplicate.entry.expect("entry").status(),
        pb::Status::Attempting
    );
}

fn seconds(t: &Option<prost_types::Timestamp>) -> i64 {
    t.as_ref().map_or(0, |t| t.seconds)
}

async fn two_servers_agree_with_one_skewed_by(offset: &'static str) {
    let db = TestDb::new(Backend::Postgres);
    let honest = ServerProcess::start(&db.url, &[]).await;
    let skewed = skewed_server(&db.url, offset).await;
    let (mut h, mut s) = (honest.client().await, skewed.client().await);

    let on_honest = claim_for_two_minutes(&mut h, r#"{"n":1}"#).await;
    is_in_flight_on(&mut s, &on_honest, r#"{"n":1}"#).await;
    let on_skewed = claim_for_two_minutes(&mut s, r#"{"n":2}"#).await;
    is_in_flight_on(&mut h, &on_skewed, r#"{"n":2}"#).await;

    // Both wrote the database's time, within a few seconds of each other, not ten minutes.
    let apart = (seconds(&on_honest.started_at) - seconds(&on_skewed.started_at)).abs();
    assert!(apart < 5, "started_at {apart} s apart");
    let lease = seconds(&on_skewed.lease_expires_at) - seconds(&on_skewed.started_at);
    assert!(
        (119..=121).contains(&lease),
        "a two-minute lease: {lease} s"
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = skewed.log.lock().expect("log").clone() + &skewed.startup_log;
    assert!(
        log.contains("this server's clock is far from the database's"),
        "the skewed server says so:\n{log}"
    );
    let honest_log = honest.startup_log.clone() + &honest.log.lock().expect("log");
    assert!(
        !honest_log.contains("far from the database's"),
        "{honest_log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_ten_minutes_ahead_agrees_with_one_on_time_about_leases() {
    two_servers_agree_with_one_skewed_by("+10m").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_ten_minutes_behind_agrees_with_one_on_time_about_leases() {
    two_servers_agree_with_one_skewed_by("-10m").await;
}
