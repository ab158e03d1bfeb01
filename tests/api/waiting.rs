//! Waiting claims through the real server: woken by the Complete on the same server and on
//! another server sharing PostgreSQL (LISTEN/NOTIFY, and polling where NOTIFY is unavailable),
//! not by the end of the wait, and bounded by the call's deadline. (How fast a waiter wakes is
//! measured where speed is, in the benchmarks; here a bound a loaded machine holds.)

use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::server::Wakeup;
use tokio::time::Instant;

use crate::support::{
    Backend, TestApp, TestDb, claim_req, spawn_app, spawn_app_on, spawn_app_with, success,
};

const ARGS: &str = r#"{"ticket":"T-9","priority":"high"}"#;

/// How long a waiter would wait unwoken: long, so that a wake-up well before it is the
/// mechanism's doing, not the wait's end.
const LONG_WAIT: i64 = 25;

/// The bound on a wake-up: it takes milliseconds on an idle machine; this much holds on a
/// loaded two-core one and stays far below [`LONG_WAIT`] and [`NO_POLL`].
const WOKEN_WITHIN: Duration = Duration::from_secs(5);

/// A poll interval no wake-up in these tests can come from (`--wait-poll-interval`; the safety
/// poll under LISTEN/NOTIFY takes it too when it is over 1 s).
const NO_POLL: Duration = Duration::from_secs(600);

/// Claims on `owner`, waits on `waiter`, completes on `owner` once the waiter waits, and
/// returns how long after the Complete's answer the waiter answered.
async fn wake_latency(owner: &TestApp, waiter: &TestApp) -> Duration {
    let claimed = owner
        .client
        .clone()
        .claim(claim_req("run-w", "open_ticket", ARGS))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let key = claimed.entry.as_ref().expect("entry").key.clone();
    let mut client = waiter.client.clone();
    let waiting = tokio::spawn(async move {
        let out = client
            .claim(pb::ClaimRequest {
                wait: Some(prost_types::Duration {
                    seconds: LONG_WAIT,
                    nanos: 0,
                }),
                ..claim_req("run-w", "open_ticket", ARGS)
            })
            .await
            .expect("waiting claim")
            .into_inner();
        (out, Instant::now())
    });
    if waiter.db.backend == Backend::Sqlite {
        // Nothing outside the server shows a waiter on SQLite: give it ample time to arrive.
        tokio::time::sleep(Duration::from_millis(500)).await;
    } else {
        // A waiter marks the entry once it found the attempt in flight (for other servers to
        // announce its completion): the Complete comes after that, so the waiter surely waits.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !waiter_flag(&waiter.db, &key).await {
            assert!(
                Instant::now() < deadline,
                "the waiter did not wait within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert!(!waiting.is_finished(), "the waiter must still be waiting");
    owner
        .client
        .clone()
        .complete(success(&key, &claimed.claim_token, b"ticket opened"))
        .await
        .expect("complete");
    let completed = Instant::now();
    let (out, answered) = waiting.await.expect("join");
    assert_eq!(out.outcome(), pb::Outcome::Replayed);
    assert_eq!(
        &out.entry.as_ref().expect("entry").result[..],
        b"ticket opened"
    );
    answered.saturating_duration_since(completed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_the_same_server_is_woken_by_the_complete() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let app = spawn_app_with(backend, |s| s.wait_poll_interval = NO_POLL).await;
        let latency = wake_latency(&app, &app).await;
        eprintln!("wake-up latency, same server, {backend:?}: {latency:?}");
        assert!(latency < WOKEN_WITHIN, "{backend:?}: {latency:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_another_server_sharing_postgres_is_woken_by_notify() {
    let no_poll = |s: &mut idempotency_ledger::server::Settings| s.wait_poll_interval = NO_POLL;
    let a = spawn_app_on(TestDb::new(Backend::Postgres), no_poll).await;
    let b = spawn_app_on(TestDb::existing(Backend::Postgres, &a.db.url), no_poll).await;
    let latency = wake_latency(&a, &b).await;
    eprintln!("wake-up latency, across servers (LISTEN/NOTIFY): {latency:?}");
    assert!(latency < WOKEN_WITHIN, "{latency:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_notify_a_waiter_on_another_server_learns_by_polling_the_key() {
    let poll = |s: &mut idempotency_ledger::server::Settings| {
        s.wait_wakeup = Some(Wakeup::Poll);
        s.wait_poll_interval = Duration::from_millis(50);
    };
    let a = spawn_app_on(TestDb::new(Backend::Postgres), poll).await;
    let b = spawn_app_on(TestDb::existing(Backend::Postgres, &a.db.url), poll).await;
    let latency = wake_latency(&a, &b).await;
    eprintln!("wake-up latency, across servers (50 ms polling): {latency:?}");
    // Nothing else wakes it: no NOTIFY, and the wait is far longer.
    assert!(latency < WOKEN_WITHIN, "{latency:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_longer_than_the_deadline_answers_in_progress_before_the_deadline() {
    let app = spawn_app(Backend::Sqlite).await;
    let mut client = app.client.clone();
    client
        .claim(claim_req("run-d", "send_reply", ARGS))
        .await
        .expect("claim");
    let mut request = tonic::Request::new(pb::ClaimRequest {
        wait: Some(prost_types::Duration {
            seconds: 30,
            nanos: 0,
        }),
        ..claim_req("run-d", "send_reply", ARGS)
    });
    request.set_timeout(Duration::from_millis(800));
    let started = Instant::now();
    let out = client
        .claim(request)
        .await
        .expect("IN_PROGRESS, not DEADLINE_EXCEEDED")
        .into_inner();
    let took = started.elapsed();
    assert_eq!(out.outcome(), pb::Outcome::InProgress);
    assert!(out.retry_after.is_some());
    assert!(
        took < Duration::from_millis(800),
        "answered after the deadline: {took:?}"
    );
    assert!(
        took > Duration::from_millis(500),
        "gave up too early: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_is_cut_to_the_servers_maximum() {
    let app = crate::support::spawn_app_with(Backend::Sqlite, |s| {
        s.max_wait = Duration::from_millis(300);
    })
    .await;
    let mut client = app.client.clone();
    client
        .claim(claim_req("run-x", "send_reply", ARGS))
        .await
        .expect("claim");
    let started = Instant::now();
    let out = client
        .claim(pb::ClaimRequest {
            wait: Some(prost_types::Duration {
                seconds: 30,
                nanos: 0,
            }),
            ..claim_req("run-x", "send_reply", ARGS)
        })
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(out.outcome(), pb::Outcome::InProgress);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

/// The stored `has_waiters` flag of `key`, read from the database itself.
async fn waiter_flag(db: &TestDb, key: &str) -> bool {
    use sqlx::Connection as _;
    let sql = "SELECT has_waiters FROM ledger_entries WHERE key = $1";
    match db.backend {
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(&db.url)
                .await
                .expect("connect");
            sqlx::query_scalar(sql)
                .bind(key)
                .fetch_one(&mut conn)
                .await
                .expect("read")
        }
        _ => {
            let mut conn = sqlx::PgConnection::connect(&db.direct_url)
                .await
                .expect("connect");
            sqlx::query_scalar(sql)
                .bind(key)
                .fetch_one(&mut conn)
                .await
                .expect("read")
        }
    }
}

/// A claim of `ARGS` that waits up to 300 ms; its outcome.
async fn short_wait(app: &TestApp) -> pb::Outcome {
    app.client
        .clone()
        .claim(pb::ClaimRequest {
            wait: Some(prost_types::Duration {
                seconds: 0,
                nanos: 300_000_000,
            }),
            ..claim_req("run-f", "open_ticket", ARGS)
        })
        .await
        .expect("waiting claim")
        .into_inner()
        .outcome()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiter_flag_is_written_only_where_it_is_read_and_a_new_attempt_clears_it() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let app = spawn_app(backend).await;
        let first = app
            .client
            .clone()
            .claim(claim_req("run-f", "open_ticket", ARGS))
            .await
            .expect("claim")
            .into_inner();
        let key = first.entry.as_ref().expect("entry").key.clone();
        assert_eq!(short_wait(&app).await, pb::Outcome::InProgress);
        // Only another server reads the flag (to announce the change); SQLite has no other
        // server, so a waiter there writes nothing.
        assert_eq!(
            waiter_flag(&app.db, &key).await,
            backend == Backend::Postgres,
            "{backend:?}: the flag after a wait"
        );
        // A retryable failure, then the next claim starts attempt 2 on the same row: nobody
        // waits for that attempt yet, so its completion must not be announced.
        app.client
            .clone()
            .complete(pb::CompleteRequest {
                status: pb::Status::Failed.into(),
                error: "upstream timed out before acting".into(),
                retryable: true,
                result: Default::default(),
                ..success(&key, &first.claim_token, b"")
            })
            .await
            .expect("complete failed");
        let second = app
            .client
            .clone()
            .claim(claim_req("run-f", "open_ticket", ARGS))
            .await
            .expect("claim again")
            .into_inner();
        assert_eq!(second.outcome(), pb::Outcome::Claimed, "{backend:?}");
        assert_eq!(second.entry.as_ref().expect("entry").attempt, 2);
        assert!(
            !waiter_flag(&app.db, &key).await,
            "{backend:?}: a new attempt starts with no waiters"
        );
    }
}
