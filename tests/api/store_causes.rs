//! When the store cannot be reached or refuses, the server says why in the database's (or the
//! pooler's) own words, with host, port and database and never the password, at WARN the
//! first time and when the cause changes, not once per call or per probe; `migrate` prints
//! the same cause and exits non-zero.

use std::time::Duration;

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::support::pgbouncer::PgBouncer;
use crate::support::postgres::PgCluster;
use crate::support::{STARTING, claim_req, free_port, wait_for_logged_addr};

/// Runs the server on `url` for `for_how_long`, sending a claim now and then (each answered
/// UNAVAILABLE), and returns what it logged.
async fn log_of_a_server_on(url: &str, for_how_long: Duration) -> String {
    use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
    let dir = tempfile::tempdir().expect("dir");
    let log_path = dir.path().join("server.log");
    let mut server = crate::support::ledger_command()
        .args(["--listen", "127.0.0.1:0", "--database-url", url])
        .args([
            "--health-probe-interval",
            "200ms",
            "--db-acquire-timeout",
            "1s",
        ])
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log_path).expect("log file"))
        .spawn()
        .expect("spawn");
    let addr = wait_for_logged_addr(&log_path, STARTING, "listen").await;
    let started = tokio::time::Instant::now();
    let mut calls = 0;
    while started.elapsed() < for_how_long {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
        else {
            continue;
        };
        let status = HealthClient::new(channel.clone())
            .check(HealthCheckRequest::default())
            .await
            .map(|r| r.into_inner().status());
        assert!(
            !matches!(
                status,
                Ok(tonic_health::pb::health_check_response::ServingStatus::Serving)
            ),
            "health must not be SERVING on an unreachable store"
        );
        let answer = LedgerServiceClient::new(channel)
            .claim(claim_req("run-1", "issue_credit", r#"{"n":1}"#))
            .await;
        assert!(answer.is_err(), "a claim cannot succeed: {answer:?}");
        calls += 1;
    }
    assert!(calls >= 3, "the server answered only {calls} calls");
    server.start_kill().expect("kill");
    server.wait().await.expect("exit");
    std::fs::read_to_string(&log_path).expect("log")
}

/// The cause is logged once, at WARN, with where the store is.
#[track_caller]
fn said_once(log: &str, cause: &str, place: &str) {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("store not ready for calls"))
        .collect();
    assert_eq!(lines.len(), 1, "one line for one cause:\n{log}");
    assert!(
        lines[0].contains("WARN") && lines[0].contains(cause) && lines[0].contains(place),
        "the line names the cause ({cause}) and the store ({place}):\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_logged_once_with_where_the_store_is() {
    let port = free_port(); // nothing listens there
    let url = format!("postgres://ledger:hunter2@127.0.0.1:{port}/ledger");
    let log = log_of_a_server_on(&url, Duration::from_secs(3)).await;
    said_once(&log, "Connection refused", &format!("port={port}"));
    assert!(
        !log.contains("hunter2"),
        "the password never reaches the log:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_is_logged_once_in_postgres_words() {
    let cluster = PgCluster::shared();
    let url = cluster.url("no_such_database");
    let log = log_of_a_server_on(&url, Duration::from_secs(3)).await;
    said_once(
        &log,
        "database \"no_such_database\" does not exist",
        "database=no_such_database",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_logged_once_in_the_poolers_words_and_never_shown() {
    let bouncer = PgBouncer::start_with(
        PgCluster::shared(),
        "transaction",
        "md5",
        "\"app\" \"the-right-one\"\n",
    );
    let url = format!(
        "postgres://app:wrong-secret@127.0.0.1:{}/postgres",
        bouncer.port()
    );
    let log = log_of_a_server_on(&url, Duration::from_secs(3)).await;
    said_once(&log, "password authentication failed", "user=app");
    assert!(
        !log.contains("wrong-secret"),
        "the password never reaches the log:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_prints_the_cause_and_exits_non_zero() {
    let port = free_port();
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        crate::support::ledger_command()
            .args([
                "migrate",
                "--database-url",
                &format!("postgres://ledger:hunter2@127.0.0.1:{port}/ledger"),
            ])
            .output(),
    )
    .await
    .expect("migrate ends within 30 s")
    .expect("run");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains("Connection refused") && log.contains(&format!("port={port}")),
        "migrate names the cause and the store:\n{log}"
    );
    assert!(!log.contains("hunter2"), "{log}");
}
