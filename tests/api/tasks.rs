//! The background tasks a server starts end with it: after `serve` returns, normally or early
//! in start-up, nothing it started keeps running. The announcement listener is the task that
//! shows it from outside: it holds a PostgreSQL connection that LISTENs.

use std::time::Duration;

use idempotency_ledger::server;
use sqlx::Connection as _;
use tokio::net::TcpListener;

use crate::support::app::{Backend, ManualClock, TestDb, spawn_app, test_settings};

/// The connections of `url`'s database (other than this one) whose last statement was a
/// LISTEN: the server's announcement listener.
async fn listening(url: &str) -> i64 {
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
           AND query LIKE 'LISTEN %'",
    )
    .fetch_one(&mut conn)
    .await
    .expect("pg_stat_activity")
}

/// Polls until `url` has `want` listening connections, or panics after `within`.
async fn wait_for_listening(url: &str, want: i64, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let got = listening(url).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{got} connections LISTEN, want {want}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_announcement_listener_ends_when_the_server_stops() {
    let mut app = spawn_app(Backend::Postgres).await;
    let url = app.db.direct_url.clone();
    wait_for_listening(&url, 1, Duration::from_secs(10)).await;
    app.shutdown().await.expect("clean shutdown");
    wait_for_listening(&url, 0, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_fails_to_start_leaves_no_listener_behind() {
    // The metrics address is taken, so `serve` returns early, after the store opened and
    // the announcement relay started.
    let db = TestDb::new(Backend::Postgres);
    let taken = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let mut settings = test_settings(&db.url);
    settings.metrics_listen = Some(taken.local_addr().expect("addr"));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let served = server::serve(
        listener,
        settings,
        ManualClock::new(),
        std::future::pending(),
    )
    .await;
    let err = served.expect_err("the metrics address is in use");
    assert!(err.to_string().contains("metrics"), "{err}");
    // A listener left running connects within milliseconds and stays; give it ample time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(listening(&db.direct_url).await, 0);
}
