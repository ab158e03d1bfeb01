//! Around the RPCs: health that follows the database and the drain, graceful shutdown, the real
//! binary's start-up log, SIGTERM, `--help` and `migrate`.

use std::time::{Duration, Instant};

use idempotency_ledger::grpc::pb;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

use crate::grpc_api::{assert_error, claim_ok, key_req, lookup_entry, spawn_app_on_own_cluster};
use crate::support::postgres::{PgCluster, StopMode};
use crate::support::{Backend, ServerProcess, TestApp, claim_req, plain, spawn_app, success};

const LEDGER: &str = "idempotency.v1.LedgerService";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_serving_for_the_server_and_the_ledger_and_not_found_for_other_services() {
    let app = spawn_app(Backend::Sqlite).await;
    assert_eq!(
        app.health("").await.expect("health of \"\""),
        ServingStatus::Serving
    );
    assert_eq!(
        app.health(LEDGER).await.expect("health of the ledger"),
        ServingStatus::Serving
    );
    for unknown in [
        "idempotency.v1.NoSuchService",
        "idempotency.v1",
        "grpc.health.v1.Health",
    ] {
        let err = app.health(unknown).await.expect_err("an unknown service");
        assert_eq!(err.code(), Code::NotFound, "{unknown}: {err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_stop_of_postgres_turns_health_not_serving_and_a_restart_restores_every_completion()
{
    outage_and_recovery(StopMode::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_of_postgres_turns_health_not_serving_and_a_restart_restores_every_completion() {
    outage_and_recovery(StopMode::Immediate).await;
}

/// Completes 20 entries, stops the database, watches health and claims fail, restarts it, and
/// checks that every acknowledged completion survived and that claims work again.
async fn outage_and_recovery(mode: StopMode) {
    let (cluster, app) = spawn_app_on_own_cluster(|_| {}).await;
    let mut client = app.client.clone();
    let mut done = Vec::new();
    for i in 0..20 {
        let claimed = claim_ok(
            &app,
            claim_req("run-outage", "send_reply", &format!(r#"{{"n":{i}}}"#)),
        )
        .await;
        assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
        let key = claimed.entry.expect("entry").key;
        let result = format!("reply {i} sent").into_bytes();
        let entry = client
            .complete(success(&key, &claimed.claim_token, &result))
            .await
            .expect("complete before the outage")
            .into_inner()
            .entry
            .expect("entry");
        done.push(entry);
    }

    tokio::task::block_in_place(|| cluster.stop(mode));
    let stopped = Instant::now();
    app.wait_for_health("", ServingStatus::NotServing, Duration::from_secs(5))
        .await;
    app.wait_for_health(LEDGER, ServingStatus::NotServing, Duration::from_secs(2))
        .await;
    let noticed = stopped.elapsed();
    let err = client
        .claim(claim_req("run-outage", "send_reply", r#"{"n":100}"#))
        .await
        .expect_err("a claim while the database is down");
    assert_error(&err, Code::Unavailable, "STORE_UNAVAILABLE", None);
    assert!(err.get_details_retry_info().is_some(), "{err:?}");

    tokio::task::block_in_place(|| cluster.restart());
    app.wait_for_health("", ServingStatus::Serving, Duration::from_secs(10))
        .await;
    assert_eq!(
        app.health(LEDGER).await.expect("health"),
        ServingStatus::Serving
    );
    for entry in &done {
        let found = lookup_entry(&app, key_req(&entry.key)).await;
        assert_eq!(&found, entry, "a completion acknowledged before the outage");
    }
    let claimed = claim_ok(&app, claim_req("run-outage", "send_reply", r#"{"n":100}"#)).await;
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let replay = claim_ok(&app, claim_req("run-outage", "send_reply", r#"{"n":7}"#)).await;
    assert_eq!(replay.outcome(), pb::Outcome::Replayed);
    assert_eq!(replay.entry.expect("entry").result, &b"reply 7 sent"[..]);
    assert!(noticed < Duration::from_secs(5), "{noticed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beginning_shutdown_turns_health_not_serving_before_the_server_returns() {
    let mut app = spawn_app(Backend::Sqlite).await;
    // A watch opened before the shutdown sees the change as it happens.
    let mut health = HealthClient::new(app.channel.clone());
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first = watch
        .message()
        .await
        .expect("watch message")
        .expect("a status");
    assert_eq!(first.status(), ServingStatus::Serving);

    let began = Instant::now();
    app.begin_shutdown();
    let next = tokio::time::timeout(Duration::from_secs(2), watch.message())
        .await
        .expect("health changes within 2 s of the shutdown signal")
        .expect("watch message")
        .expect("a status before the stream ends");
    assert_eq!(next.status(), ServingStatus::NotServing);
    drop(watch);

    // A new check now sees NOT_SERVING, or no server at all.
    let check = app.health("").await;
    assert!(
        matches!(check, Ok(ServingStatus::NotServing) | Err(_)),
        "health after the shutdown began: {check:?}"
    );
    let served = tokio::time::timeout(Duration::from_secs(6), app.shutdown())
        .await
        .expect("the server returns within the 5 s grace period");
    assert!(served.is_ok(), "{served:?}");
    assert!(
        began.elapsed() < Duration::from_secs(4),
        "nothing was in flight, so no need to wait out the grace: {:?}",
        began.elapsed()
    );
    let after = app.health("").await;
    assert!(
        after.is_err(),
        "nothing answers after the server returned: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_when_shutdown_begins_gets_its_answer() {
    let mut app = spawn_app(Backend::Sqlite).await;
    let claimed = claim_ok(&app, claim_req("run-1", "open_ticket", "{}")).await;
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let mut waiter = app.client.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .claim(pb::ClaimRequest {
                wait: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                ..claim_req("run-1", "open_ticket", "{}")
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    app.begin_shutdown();
    let served = tokio::time::timeout(Duration::from_secs(6), app.shutdown())
        .await
        .expect("the server returns within the grace period");
    assert!(served.is_ok(), "{served:?}");
    let answer = waiting
        .await
        .expect("join")
        .expect("the waiting claim is answered, not cut off")
        .into_inner();
    assert_eq!(answer.outcome(), pb::Outcome::InProgress);
}

async fn terminate_and_expect_exit_zero(mut server: ServerProcess) {
    let sent = Instant::now();
    server.terminate();
    let status = tokio::time::timeout(Duration::from_secs(10), server.child.wait())
        .await
        .expect("exits within 10 s of SIGTERM")
        .expect("wait");
    assert_eq!(status.code(), Some(0), "{status:?}");
    // Nothing was in flight: no reason to wait out the 10 s grace period.
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "exited after {:?}",
        sent.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_its_address_store_and_tenancy_and_exits_zero_on_sigterm() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let server = ServerProcess::start(&url, &[]).await;
    let log = plain(&server.startup_log);
    assert!(
        log.contains(&server.addr.to_string()),
        "the address in:\n{log}"
    );
    assert!(log.contains(&url), "the store in:\n{log}");
    assert!(log.contains("single tenant"), "the tenancy in:\n{log}");

    let claimed = server
        .client()
        .await
        .claim(claim_req("run-1", "open_ticket", "{}"))
        .await
        .expect("the binary serves claims")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    terminate_and_expect_exit_zero(server).await;
}

/// `url` with the password `password` in its user info (user `postgres` when it names none).
fn with_password(url: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (user, host) = match authority.rsplit_once('@') {
        Some((userinfo, host)) => (userinfo.split(':').next().unwrap_or("postgres"), host),
        None => ("postgres", authority),
    };
    format!("{scheme}://{user}:{password}@{host}{tail}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_log_hides_the_database_password() {
    let url = with_password(&PgCluster::shared().create_database(), "secretpw");
    assert!(url.contains(":secretpw@"), "{url}");
    let server = ServerProcess::start(&url, &[]).await;
    let log = plain(&server.startup_log);
    assert!(log.contains("postgres://"), "the store in:\n{log}");
    assert!(log.contains(":***@"), "a redacted password in:\n{log}");
    assert!(!log.contains("secretpw"), "the password leaked:\n{log}");
    terminate_and_expect_exit_zero(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_documents_every_flag_and_its_environment_variable() {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        crate::support::ledger_command().arg("--help").output(),
    )
    .await
    .expect("--help within 20 s")
    .expect("run --help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).expect("UTF-8 help");
    let settings = [
        ("--listen", "LEDGER_LISTEN", "127.0.0.1:50051"),
        ("--database-url", "DATABASE_URL", "sqlite://ledger.db"),
        ("--auth-tokens-file", "LEDGER_AUTH_TOKENS_FILE", ""),
        ("--tls-cert", "LEDGER_TLS_CERT", ""),
        ("--tls-key", "LEDGER_TLS_KEY", ""),
        ("--metrics-listen", "LEDGER_METRICS_LISTEN", ""),
        (
            "--metrics-refresh-interval",
            "LEDGER_METRICS_REFRESH_INTERVAL",
            "15s",
        ),
        ("--metrics-max-tools", "LEDGER_METRICS_MAX_TOOLS", "50"),
        ("--replay-alarm-window", "LEDGER_REPLAY_ALARM_WINDOW", "15m"),
        (
            "--replay-alarm-min-claims",
            "LEDGER_REPLAY_ALARM_MIN_CLAIMS",
            "100",
        ),
        ("--default-lease", "LEDGER_DEFAULT_LEASE", "60s"),
        ("--max-lease", "LEDGER_MAX_LEASE", "1h"),
        ("--default-retention", "LEDGER_DEFAULT_RETENTION", "24h"),
        ("--max-retention", "LEDGER_MAX_RETENTION", "30d"),
        ("--max-wait", "LEDGER_MAX_WAIT", "30s"),
        (
            "--max-arguments-bytes",
            "LEDGER_MAX_ARGUMENTS_BYTES",
            "1048576",
        ),
        ("--max-result-bytes", "LEDGER_MAX_RESULT_BYTES", "1048576"),
        ("--max-json-depth", "LEDGER_MAX_JSON_DEPTH", "64"),
        (
            "--external-ref-prefix",
            "LEDGER_EXTERNAL_REF_PREFIX",
            "idem-",
        ),
    ];
    // Each option's paragraph (its line and its description), with clap's wrapping undone.
    let mut paragraphs: Vec<String> = Vec::new();
    for line in help.lines() {
        if line.trim_start().starts_with('-') || paragraphs.is_empty() {
            paragraphs.push(String::new());
        }
        let last = paragraphs.last_mut().expect("a paragraph");
        last.push(' ');
        last.push_str(line.trim());
    }
    let mut missing = Vec::new();
    for (flag, env, default) in settings {
        let Some(paragraph) = paragraphs
            .iter()
            .find(|p| p.trim_start().starts_with(&format!("{flag} <")))
        else {
            missing.push(format!("{flag} is not documented"));
            continue;
        };
        if !paragraph.contains(&format!("[env: {env}=")) {
            missing.push(format!("{flag} does not name {env}: {paragraph}"));
        }
        if !default.is_empty() && !paragraph.contains(&format!("[default: {default}]")) {
            missing.push(format!(
                "{flag} does not show the default {default}: {paragraph}"
            ));
        }
    }
    assert!(help.contains("migrate"), "the migrate subcommand:\n{help}");
    assert!(missing.is_empty(), "{}\n\n{help}", missing.join("\n"));
}

/// Runs `idempotency-ledger migrate --database-url url` and expects exit status 0.
async fn migrate(url: &str) {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        crate::support::ledger_command()
            .args(["migrate", "--database-url", url])
            .env("RUST_LOG", "info")
            .output(),
    )
    .await
    .expect("migrate within 20 s")
    .expect("run migrate");
    assert_eq!(
        out.status.code(),
        Some(0),
        "migrate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_sqlite_file_with_the_ledger_table_and_can_run_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("m.db");
    let url = format!("sqlite://{}", path.display());
    migrate(&url).await;
    assert!(path.is_file(), "{} was created", path.display());
    migrate(&url).await;

    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("open the migrated file");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger_entries")
        .fetch_one(&pool)
        .await
        .expect("the ledger_entries table exists");
    assert_eq!(rows, 0);
    pool.close().await;

    // And a server over it starts and serves.
    let mut db = crate::support::TestDb::new(Backend::Sqlite);
    db.url = url;
    let app: TestApp = crate::support::spawn_app_on(db, |_| {}).await;
    let claimed = claim_ok(&app, claim_req("run-1", "open_ticket", "{}")).await;
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_ledger_table_in_a_fresh_postgres_database() {
    let url = PgCluster::shared().create_database();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect");
    let exists = || async {
        sqlx::query_scalar::<_, bool>("SELECT to_regclass('ledger_entries') IS NOT NULL")
            .fetch_one(&pool)
            .await
            .expect("query")
    };
    assert!(!exists().await, "a fresh database has no ledger table yet");
    migrate(&url).await;
    assert!(exists().await, "migrate created ledger_entries");
    migrate(&url).await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger_entries")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(rows, 0);
    pool.close().await;
}
