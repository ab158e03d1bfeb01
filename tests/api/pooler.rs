//! The server behind PgBouncer in transaction mode (Debian's 1.18, default settings): a wrong
//! `--postgres-pooler` fails loudly at start-up, migrations are run against the database
//! itself and checked through the pooler, and the server leaves no session state on the
//! pool's server connections. (The conformance suite, the commit-failure suite and the races
//! also run through PgBouncer: see `on_every_store!` and `concurrency.rs`.)

use std::time::Duration;

use sqlx::ConnectOptions as _;
use sqlx::postgres::PgConnectOptions;

use crate::support::{Backend, ServerProcess, TestDb, claim_req};

/// A plain client of PgBouncer: what another application sharing the pool would use.
async fn plain_client(url: &str) -> sqlx::PgConnection {
    let options: PgConnectOptions = url.parse().expect("url");
    options
        .extra_float_digits(None)
        .connect()
        .await
        .expect("connect through pgbouncer")
}

/// Every server connection of the pool shows the database's defaults: twenty plain clients,
/// each in a transaction at once (so each holds a server connection of its own), see
/// `enable_seqscan = on` and the default statement timeout.
pub async fn assert_no_session_state_left(db: &TestDb) {
    let mut clients = Vec::new();
    for _ in 0..20 {
        let mut conn = plain_client(&db.url).await;
        sqlx::raw_sql("BEGIN")
            .execute(&mut conn)
            .await
            .expect("begin");
        clients.push(conn);
    }
    for conn in &mut clients {
        let (seqscan, timeout): (String, String) = sqlx::query_as(
            "SELECT current_setting('enable_seqscan'), current_setting('statement_timeout')",
        )
        .persistent(false)
        .fetch_one(&mut *conn)
        .await
        .expect("show");
        assert_eq!(
            seqscan, "on",
            "a server connection kept the ledger's plan setting"
        );
        assert_eq!(
            timeout, "0",
            "a server connection kept the ledger's statement timeout"
        );
    }
    for mut conn in clients {
        sqlx::raw_sql("COMMIT")
            .execute(&mut conn)
            .await
            .expect("commit");
    }
}

/// Runs the binary with `args` and waits for it to exit (within 30 s); its exit status and
/// what it wrote to stderr.
async fn run_to_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        crate::support::ledger_command()
            .args(args)
            .env("RUST_LOG", "info")
            .output(),
    )
    .await
    .expect("the process exits within 30 s")
    .expect("run idempotency-ledger");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_expects_no_pooler_refuses_to_start_behind_one_in_transaction_mode() {
    let db = TestDb::new(Backend::PgBouncer);
    let (status, log) = run_to_exit(&[
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        &db.url,
        "--health-probe-interval",
        "200ms",
    ])
    .await;
    assert!(!status.success(), "it must not run: {log}");
    assert!(
        log.contains("through a pooler in transaction mode")
            && log.contains("--postgres-pooler transaction"),
        "the log says what is wrong and what to set:\n{log}"
    );
    // `migrate` through the pooler refuses the same way.
    let (status, log) = run_to_exit(&["migrate", "--database-url", &db.url]).await;
    assert!(!status.success(), "{log}");
    assert!(log.contains("--postgres-pooler transaction"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_with_a_transaction_pooler_is_refused_at_start_up() {
    let db = TestDb::new(Backend::PgBouncer);
    let (status, log) = run_to_exit(&[
        "--database-url",
        &db.url,
        "--postgres-pooler",
        "transaction",
        "--wait-wakeup",
        "listen",
    ])
    .await;
    assert!(!status.success(), "{log}");
    assert!(log.contains("--wait-wakeup listen cannot work"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_migrations_run_against_the_database_itself() {
    let db = TestDb::new(Backend::PgBouncer);
    let pooled = ["--postgres-pooler", "transaction"];

    // Not migrated, no migrations URL: the server says what to run and serves nothing.
    let mut server = crate::support::ledger_command()
        .args(["--listen", "127.0.0.1:0", "--database-url", &db.url])
        .args(pooled)
        .args(["--health-probe-interval", "200ms"])
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.start_kill().expect("kill");
    let out = server.wait_with_output().await.expect("output");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("the database lacks migrations")
            && log.contains("idempotency-ledger migrate --database-url"),
        "the log says how to migrate:\n{log}"
    );
    assert_eq!(
        log.matches("the database lacks migrations").count(),
        1,
        "said once, not once per probe:\n{log}"
    );
    assert!(!log.contains("health SERVING"), "{log}");

    // `migrate` through the pooler cannot apply them, and says why.
    let mut args = vec!["migrate", "--database-url", &db.url];
    args.extend(pooled);
    let (status, log) = run_to_exit(&args).await;
    assert!(!status.success(), "{log}");
    assert!(log.contains("session advisory lock"), "{log}");

    // Against the database itself it applies them, and then the pooled server serves.
    let (status, log) = run_to_exit(&["migrate", "--database-url", &db.direct_url]).await;
    assert!(status.success(), "{log}");
    assert!(
        !log.contains("already exists"),
        "no NOTICE for every IF NOT EXISTS:\n{log}"
    );
    let server = ServerProcess::start(&db.url, &pooled).await;
    let mut client = server.client().await;
    client
        .claim(claim_req("run-1", "issue_credit", r#"{"n":1}"#))
        .await
        .expect("a claim through the pooler");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_behind_pgbouncer_serves_waits_and_leaves_the_pool_clean() {
    use idempotency_ledger::grpc::pb;
    let db = TestDb::new(Backend::PgBouncer);
    let server = ServerProcess::start(
        &db.url,
        &[
            "--postgres-pooler",
            "transaction",
            "--migrations-database-url",
            &db.direct_url,
        ],
    )
    .await;
    assert!(
        server.startup_log.contains("store connection"),
        "the start-up log describes the store link:\n{}",
        server.startup_log
    );
    let mut client = server.client().await;
    let first = client
        .claim(claim_req("run-1", "send_reply", r#"{"to":"c-1"}"#))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(first.outcome(), pb::Outcome::Claimed);
    // A duplicate waits (polling behind the pooler) and gets the result once it completes.
    let mut waiter = client.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .claim(pb::ClaimRequest {
                wait: Some(prost_types::Duration {
                    seconds: 10,
                    nanos: 0,
                }),
                ..claim_req("run-1", "send_reply", r#"{"to":"c-1"}"#)
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let key = first.entry.expect("entry").key;
    client
        .complete(crate::support::success(&key, &first.claim_token, b"sent"))
        .await
        .expect("complete");
    let replay = waiting.await.expect("join").expect("wait").into_inner();
    assert_eq!(replay.outcome(), pb::Outcome::Replayed);
    assert_eq!(replay.entry.expect("entry").result.as_ref(), b"sent");
    assert_no_session_state_left(&db).await;
}
