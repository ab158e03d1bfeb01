//! The background tasks a server starts end with it: after `serve` returns, normally or early
//! in start-up, nothing it started keeps running. The announcement listener is the task that
//! shows it from outside: it holds a PostgreSQL connection that LISTENs.

use std::time::Duration;

use std::sync::{Arc, Mutex};

use idempotency_ledger::server;
use sqlx::Connection as _;
use tokio::net::TcpListener;
use tracing::instrument::WithSubscriber as _;
use tracing_subscriber::layer::SubscriberExt as _;

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
    // The metrics address is taken, so `serve` returns early, after the store opened and the
    // announcement relay started; so early that the relay's connection would not have LISTENed
    // yet. The gate holds `serve` at the first line it logs after starting the relay until that
    // connection LISTENs: the failure then leaves a listener behind unless `serve` stops it.
    let db = TestDb::new(Backend::Postgres);
    let taken = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let mut settings = test_settings(&db.url);
    settings.metrics_listen = Some(taken.local_addr().expect("addr"));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let gate = ListenerGate::new(&db.direct_url);
    let served = server::run(
        listener,
        settings,
        ManualClock::new(),
        std::future::pending(),
        tokio_stream::pending(),
    )
    .with_subscriber(gate.subscriber())
    .await;
    let err = served.expect_err("the metrics address is in use");
    assert!(err.to_string().contains("metrics"), "{err}");
    assert_eq!(
        gate.outcome(),
        Some(true),
        "the relay's connection LISTENed while `serve` was held (None: `serve` never logged \
         {GATE_LINES:?} after starting the relay; false: no LISTEN within 10 s)"
    );
    wait_for_listening(&db.direct_url, 0, Duration::from_secs(10)).await;
}

/// The lines `serve` logs first after it started the announcement relay (`connection_limits`:
/// one or the other), where the gate holds it.
const GATE_LINES: [&str; 2] = [
    "connection limits",
    "cannot read or raise the open-files limit",
];

/// A tracing layer, for the one task that runs `serve`, that blocks that task at the first of
/// [`GATE_LINES`] until a connection LISTENs on the database (or 10 s pass), and records which.
#[derive(Clone)]
struct ListenerGate {
    url: String,
    /// `None` until the gate was reached; then whether a connection LISTENed.
    outcome: Arc<Mutex<Option<bool>>>,
}

impl ListenerGate {
    fn new(url: &str) -> ListenerGate {
        ListenerGate {
            url: url.to_string(),
            outcome: Arc::new(Mutex::new(None)),
        }
    }

    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        tracing_subscriber::registry().with(self.clone())
    }

    fn outcome(&self) -> Option<bool> {
        *self.outcome.lock().expect("outcome")
    }

    /// Polls `pg_stat_activity` from a thread and runtime of its own (this one is held) until
    /// a connection LISTENs, for up to 10 s.
    fn wait_for_a_listener(&self) -> bool {
        let url = self.url.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while tokio::time::Instant::now() < deadline {
                    if listening(&url).await > 0 {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                false
            })
        })
        .join()
        .expect("the gate's thread")
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ListenerGate {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if self.outcome().is_none() && GATE_LINES.iter().any(|l| message.0.contains(l)) {
            let listened = self.wait_for_a_listener();
            *self.outcome.lock().expect("outcome") = Some(listened);
        }
    }
}
