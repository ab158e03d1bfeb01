//! The Prometheus endpoint against the real server over real gRPC, on both stores: exact
//! counts after a scripted mix, tool folding, the store-wide unresolved gauge, the replay
//! alarm, store errors counted once, and the docs that go with them (alert rules, the
//! monitoring SQL).

use std::net::SocketAddr;
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::postgres::PgCluster;
use crate::support::proxy::Proxy;
use crate::support::{
    Backend, ServerProcess, TestApp, TestDb, claim_req, free_port, reason, spawn_app_on,
    spawn_app_with, success,
};

/// The body of `GET /metrics`, after checking the answer is 200 in the Prometheus text format.
pub(crate) async fn scrape(addr: SocketAddr) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect metrics");
    socket
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut text = String::new();
    socket.read_to_string(&mut text).await.expect("read");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// The value of the one series named exactly `series` (name and labels as rendered).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[track_caller]
fn assert_series(text: &str, series: &str, want: f64) {
    assert_eq!(value(text, series), Some(want), "{series} in:\n{text}");
}

/// Scrapes until `series` reads `want` (gauges refreshed from the store), or panics.
async fn await_series(addr: SocketAddr, series: &str, want: f64) -> String {
    await_all(addr, &[(series, want)]).await
}

/// Scrapes until every series reads its value in one scrape, or panics.
async fn await_all(addr: SocketAddr, wanted: &[(&str, f64)]) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let text = scrape(addr).await;
        if wanted
            .iter()
            .all(|(s, want)| value(&text, s) == Some(*want))
        {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{wanted:?} never read so:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn metrics_addr() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().expect("addr")
}

/// A server with metrics on a fresh port, gauges refreshed every 100 ms.
async fn app_with_metrics(
    backend: Backend,
    configure: impl FnOnce(&mut idempotency_ledger::server::Settings),
) -> (TestApp, SocketAddr) {
    let addr = metrics_addr();
    let app = spawn_app_with(backend, |s| {
        s.metrics_listen = Some(addr);
        s.metrics_refresh_interval = Duration::from_millis(100);
        configure(s);
    })
    .await;
    (app, addr)
}

fn grpc(method: &str) -> String {
    format!(
        "grpc_type=\"unary\",grpc_service=\"idempotency.v1.LedgerService\",grpc_method=\"{method}\""
    )
}

fn complete(key: &str, token: &str, status: pb::Status) -> pb::CompleteRequest {
    pb::CompleteRequest {
        key: key.into(),
        claim_token: token.into(),
        status: status.into(),
        ..Default::default()
    }
}

async fn claim(
    c: &mut pb::ledger_service_client::LedgerServiceClient<tonic::transport::Channel>,
    req: pb::ClaimRequest,
) -> pb::ClaimResponse {
    c.claim(req).await.expect("claim").into_inner()
}

async fn a_scripted_mix_is_counted_exactly(backend: Backend) {
    let (mut app, addr) = app_with_metrics(backend, |_| {}).await;
    let c = &mut app.client;
    // Three intents claimed and completed three ways.
    let a = claim(c, claim_req("run-1", "issue_credit", r#"{"n":1}"#)).await;
    let a_key = a.entry.as_ref().expect("entry").key.clone();
    c.complete(success(&a_key, &a.claim_token, b"cr-1"))
        .await
        .expect("complete a");
    let b = claim(c, claim_req("run-1", "open_ticket", r#"{"n":2}"#)).await;
    let b_key = b.entry.as_ref().expect("entry").key.clone();
    c.complete(complete(&b_key, &b.claim_token, pb::Status::Failed))
        .await
        .expect("complete b");
    let u = claim(c, claim_req("run-1", "issue_credit", r#"{"n":3}"#)).await;
    let u_key = u.entry.as_ref().expect("entry").key.clone();
    c.complete(complete(&u_key, &u.claim_token, pb::Status::Unknown))
        .await
        .expect("complete u");
    // Repeats: two replays, a previous failure, an unknown outcome in progress.
    for _ in 0..2 {
        let r = claim(c, claim_req("run-1", "issue_credit", r#"{"n":1}"#)).await;
        assert_eq!(r.outcome(), pb::Outcome::Replayed);
    }
    let r = claim(c, claim_req("run-1", "open_ticket", r#"{"n":2}"#)).await;
    assert_eq!(r.outcome(), pb::Outcome::PreviouslyFailed);
    let r = claim(c, claim_req("run-1", "issue_credit", r#"{"n":3}"#)).await;
    assert_eq!(r.outcome(), pb::Outcome::InProgress);
    // An explicit key, then the same key with other arguments: refused.
    let explicit = |args: &str| pb::ClaimRequest {
        key: "wf-9:step-1".into(),
        ..claim_req("run-1", "send_reply", args)
    };
    let k = claim(c, explicit(r#"{"to":"ana"}"#)).await;
    let reused = c
        .claim(explicit(r#"{"to":"bob"}"#))
        .await
        .expect_err("key reuse");
    assert_eq!(reason(&reused), "KEY_REUSED_WITH_DIFFERENT_REQUEST");
    c.complete(success("wf-9:step-1", &k.claim_token, b"sent"))
        .await
        .expect("complete k");
    // An attempt left in flight, and bad input.
    let d = claim(c, claim_req("run-1", "fetch_page", "{}")).await;
    assert_eq!(d.outcome(), pb::Outcome::Claimed);
    let bad = c
        .claim(claim_req("run-1", "fetch_page", "{"))
        .await
        .expect_err("bad json");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    // A stale token, and an identical Complete repeated.
    let stale = c
        .complete(success(&a_key, "not-the-token", b"cr-1"))
        .await
        .expect_err("stale");
    assert_eq!(reason(&stale), "STALE_CLAIM_TOKEN");
    let again = c
        .complete(success(&a_key, &a.claim_token, b"cr-1"))
        .await
        .expect("repeat")
        .into_inner();
    assert!(again.already_completed);
    c.lookup(pb::LookupRequest {
        key: a_key.clone(),
        ..Default::default()
    })
    .await
    .expect("lookup");

    // The unknown outcome and the attempt in flight are the store's backlog.
    let text = await_all(
        addr,
        &[
            ("ledger_unresolved_entries{status=\"unknown\"}", 1.0),
            ("ledger_unresolved_entries{status=\"attempting\"}", 1.0),
        ],
    )
    .await;

    let claims = |outcome: &str, tool: &str| {
        format!("ledger_claims_total{{outcome=\"{outcome}\",tool=\"{tool}\"}}")
    };
    for (series, want) in [
        (claims("claimed", "issue_credit"), 2.0),
        (claims("replayed", "issue_credit"), 2.0),
        (claims("in_progress", "issue_credit"), 1.0),
        (claims("previously_failed", "issue_credit"), 0.0),
        (claims("claimed", "open_ticket"), 1.0),
        (claims("previously_failed", "open_ticket"), 1.0),
        (claims("claimed", "send_reply"), 1.0),
        (claims("claimed", "fetch_page"), 1.0),
        (claims("claimed", "other"), 0.0),
        ("ledger_replays_total{tool=\"issue_credit\"}".into(), 2.0),
        ("ledger_replays_total{tool=\"open_ticket\"}".into(), 0.0),
        (
            "ledger_key_reuse_refusals_total{tool=\"send_reply\"}".into(),
            1.0,
        ),
        (
            "ledger_key_reuse_refusals_total{tool=\"issue_credit\"}".into(),
            0.0,
        ),
        ("ledger_stale_claim_tokens_total".into(), 1.0),
        ("ledger_completions_total{status=\"succeeded\"}".into(), 2.0),
        ("ledger_completions_total{status=\"failed\"}".into(), 1.0),
        ("ledger_completions_total{status=\"unknown\"}".into(), 1.0),
        (
            "ledger_completions_total{status=\"already_completed\"}".into(),
            1.0,
        ),
        (
            "ledger_store_errors_total{kind=\"unavailable\"}".into(),
            0.0,
        ),
        ("ledger_store_errors_total{kind=\"internal\"}".into(), 0.0),
        ("ledger_store_up".into(), 1.0),
        ("ledger_store_pool_connections{state=\"max\"}".into(), 16.0),
        // 9 claims answered (the refusal and the bad input are not), 2 of them replays.
        ("ledger_replay_window_claims".into(), 9.0),
        ("ledger_replay_window_replays".into(), 2.0),
        ("ledger_replay_ratio".into(), 2.0 / 9.0),
        ("ledger_replay_alarm".into(), 0.0),
        // 11 Claim calls: 9 answered, the key reuse, the bad JSON.
        (
            format!("grpc_server_started_total{{{}}}", grpc("Claim")),
            11.0,
        ),
        (
            format!(
                "grpc_server_handled_total{{{},grpc_code=\"OK\"}}",
                grpc("Claim")
            ),
            9.0,
        ),
        (
            format!(
                "grpc_server_handled_total{{{},grpc_code=\"FAILED_PRECONDITION\"}}",
                grpc("Claim")
            ),
            1.0,
        ),
        (
            format!(
                "grpc_server_handled_total{{{},grpc_code=\"INVALID_ARGUMENT\"}}",
                grpc("Claim")
            ),
            1.0,
        ),
        (
            format!("grpc_server_handling_seconds_count{{{}}}", grpc("Claim")),
            11.0,
        ),
        (
            format!(
                "grpc_server_handling_seconds_bucket{{{},le=\"+Inf\"}}",
                grpc("Claim")
            ),
            11.0,
        ),
        // 6 Completes: 5 answered, the stale token.
        (
            format!("grpc_server_started_total{{{}}}", grpc("Complete")),
            6.0,
        ),
        (
            format!(
                "grpc_server_handled_total{{{},grpc_code=\"OK\"}}",
                grpc("Complete")
            ),
            5.0,
        ),
        (
            format!(
                "grpc_server_handled_total{{{},grpc_code=\"FAILED_PRECONDITION\"}}",
                grpc("Complete")
            ),
            1.0,
        ),
        (
            format!("grpc_server_handling_seconds_count{{{}}}", grpc("Complete")),
            6.0,
        ),
        (
            format!("grpc_server_started_total{{{}}}", grpc("Lookup")),
            1.0,
        ),
        (
            format!("grpc_server_handling_seconds_count{{{}}}", grpc("Lookup")),
            1.0,
        ),
        (
            format!("grpc_server_started_total{{{}}}", grpc("Reconcile")),
            0.0,
        ),
    ] {
        assert_series(&text, &series, want);
    }
    // The buckets are cumulative: each at most the next.
    let buckets: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("grpc_server_handling_seconds_bucket") && l.contains("\"Claim\""))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .expect("value")
                .parse()
                .expect("number")
        })
        .collect();
    assert_eq!(buckets.len(), 16, "{text}");
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    // Keys, runs and tokens are never labels.
    for secret in [&a_key, "run-1", "wf-9:step-1", &a.claim_token] {
        assert!(!text.contains(secret), "{secret} is in:\n{text}");
    }

    // A reconciler takes the unknown outcome and answers it, first with a finding about an
    // attempt that is not the entry's (stale, counted by why), then with the right one: the
    // backlog shrinks on the next refresh.
    let held = app
        .client
        .clone()
        .reconcile(pb::ReconcileRequest {
            keys: vec![u_key.clone()],
            ..Default::default()
        })
        .await
        .expect("take")
        .into_inner()
        .pending
        .pop()
        .expect("handed out");
    let found = |attempt: u32| pb::Resolution {
        key: u_key.clone(),
        status: pb::Status::Succeeded.into(),
        result: b"found".to_vec().into(),
        attempt,
        hold_token: held.hold_token.clone(),
        ..Default::default()
    };
    app.client
        .clone()
        .reconcile(pb::ReconcileRequest {
            resolutions: vec![found(held.attempt + 1), found(held.attempt)],
            ..Default::default()
        })
        .await
        .expect("reconcile");
    let text = await_series(addr, "ledger_unresolved_entries{status=\"unknown\"}", 0.0).await;
    assert_series(
        &text,
        "ledger_stale_findings_total{reason=\"other_attempt\"}",
        1.0,
    );
    assert_series(
        &text,
        "ledger_stale_findings_total{reason=\"later_attempt\"}",
        0.0,
    );
    assert_series(&text, "ledger_possible_double_effects", 0.0);
    assert_series(
        &text,
        "ledger_reconcile_resolutions_total{status=\"succeeded\"}",
        2.0,
    );
    assert_series(
        &text,
        "ledger_reconcile_resolutions_total{status=\"failed\"}",
        0.0,
    );
    assert_series(
        &text,
        &format!(
            "grpc_server_handled_total{{{},grpc_code=\"OK\"}}",
            grpc("Reconcile")
        ),
        // The one that took the entry, and the one that answered it.
        2.0,
    );
    app.shutdown().await.expect("shutdown");
}

async fn tools_beyond_the_limit_count_as_other(backend: Backend) {
    let (mut app, addr) = app_with_metrics(backend, |s| s.metrics_max_tools = 2).await;
    for tool in [
        "issue_credit",
        "open_ticket",
        "send_reply",
        "fetch_page",
        "issue_credit",
    ] {
        app.client
            .claim(claim_req("run-f", tool, r#"{"x":1}"#))
            .await
            .expect("claim");
    }
    let text = scrape(addr).await;
    // The second issue_credit claim is in progress: the first is still in flight.
    assert_series(
        &text,
        "ledger_claims_total{outcome=\"claimed\",tool=\"issue_credit\"}",
        1.0,
    );
    assert_series(
        &text,
        "ledger_claims_total{outcome=\"in_progress\",tool=\"issue_credit\"}",
        1.0,
    );
    assert_series(
        &text,
        "ledger_claims_total{outcome=\"claimed\",tool=\"open_ticket\"}",
        1.0,
    );
    assert_series(
        &text,
        "ledger_claims_total{outcome=\"claimed\",tool=\"other\"}",
        2.0,
    );
    assert!(
        !text.contains("send_reply") && !text.contains("fetch_page"),
        "{text}"
    );
    app.shutdown().await.expect("shutdown");
}

async fn the_replay_alarm_turns_on_without_replays_and_off_after_one(backend: Backend) {
    let (mut app, addr) = app_with_metrics(backend, |s| {
        s.replay_alarm_window = Duration::from_secs(60);
        s.replay_alarm_min_claims = 3;
    })
    .await;
    let mut first = None;
    for n in 0..3 {
        let out = app
            .client
            .claim(claim_req(
                "run-a",
                "issue_credit",
                &format!(r#"{{"n":{n}}}"#),
            ))
            .await
            .expect("claim")
            .into_inner();
        // Two claims are not yet enough traffic to call zero replays suspicious.
        if n == 1 {
            assert_series(&scrape(addr).await, "ledger_replay_alarm", 0.0);
        }
        first.get_or_insert(out);
    }
    let text = scrape(addr).await;
    assert_series(&text, "ledger_replay_alarm", 1.0);
    assert_series(&text, "ledger_replay_ratio", 0.0);
    assert_series(&text, "ledger_replay_window_claims", 3.0);

    // One replay: deduplication works, the alarm is off.
    let first = first.expect("claimed");
    let key = first.entry.as_ref().expect("entry").key.clone();
    app.client
        .complete(success(&key, &first.claim_token, b"ok"))
        .await
        .expect("complete");
    let replay = app
        .client
        .claim(claim_req("run-a", "issue_credit", r#"{"n":0}"#))
        .await
        .expect("replay")
        .into_inner();
    assert_eq!(replay.outcome(), pb::Outcome::Replayed);
    let text = scrape(addr).await;
    assert_series(&text, "ledger_replay_alarm", 0.0);
    assert_series(&text, "ledger_replay_ratio", 0.25);

    // The window slides on the server's clock: a window later it is empty, and a new window
    // of traffic without replays raises the alarm again.
    app.clock.advance(Duration::from_secs(61));
    let text = scrape(addr).await;
    assert_series(&text, "ledger_replay_window_claims", 0.0);
    assert_series(&text, "ledger_replay_alarm", 0.0);
    for n in 10..13 {
        app.client
            .claim(claim_req(
                "run-a",
                "issue_credit",
                &format!(r#"{{"n":{n}}}"#),
            ))
            .await
            .expect("claim");
    }
    assert_series(&scrape(addr).await, "ledger_replay_alarm", 1.0);
    app.shutdown().await.expect("shutdown");
}

async fn the_replay_ratio_sql_agrees_with_the_gauge(backend: Backend) {
    let (mut app, addr) = app_with_metrics(backend, |_| {}).await;
    // Four intents, three replays: 3 of 7 claims answered were replays.
    for n in 0..4 {
        let args = format!(r#"{{"n":{n}}}"#);
        let out = app
            .client
            .claim(claim_req("run-s", "issue_credit", &args))
            .await
            .expect("claim")
            .into_inner();
        let key = out.entry.as_ref().expect("entry").key.clone();
        app.client
            .complete(success(&key, &out.claim_token, b"ok"))
            .await
            .expect("complete");
        for _ in 0..[2, 1, 0, 0][n] {
            app.client
                .claim(claim_req("run-s", "issue_credit", &args))
                .await
                .expect("replay");
        }
    }
    let text = scrape(addr).await;
    assert_series(&text, "ledger_replay_window_claims", 7.0);
    assert_series(&text, "ledger_replay_ratio", 3.0 / 7.0);

    let sql = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/replay-ratio.sql"
    ))
    .expect("docs/replay-ratio.sql");
    let marker = match backend {
        Backend::Postgres | Backend::PgBouncer => "-- [postgres]",
        Backend::Sqlite => "-- [sqlite]",
    };
    let query = sql
        .split_once(marker)
        .and_then(|(_, rest)| rest.split_once(';'))
        .map(|(query, _)| query)
        .unwrap_or_else(|| panic!("no `{marker}` query in docs/replay-ratio.sql"));
    let run = || async {
        let figures: (i64, i64, f64) = match backend {
            Backend::Postgres | Backend::PgBouncer => {
                let pool = sqlx::PgPool::connect(&app.db.url).await.expect("connect");
                sqlx::query_as(sqlx::AssertSqlSafe(query.to_string()))
                    .fetch_one(&pool)
                    .await
                    .expect("query")
            }
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&app.db.url)
                    .await
                    .expect("connect");
                sqlx::query_as(sqlx::AssertSqlSafe(query.to_string()))
                    .fetch_one(&pool)
                    .await
                    .expect("query")
            }
        };
        figures
    };
    // Replays answered from the server's memory reach the store within about a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (entries, replays, ratio) = loop {
        let figures = run().await;
        if figures.1 == 3 || std::time::Instant::now() > deadline {
            break figures;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((entries, replays), (4, 3));
    assert!((ratio - 3.0 / 7.0).abs() < 1e-9, "{ratio}");
    app.shutdown().await.expect("shutdown");
}

on_every_backend!(
    a_scripted_mix_is_counted_exactly,
    tools_beyond_the_limit_count_as_other,
    the_replay_alarm_turns_on_without_replays_and_off_after_one,
    the_replay_ratio_sql_agrees_with_the_gauge,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_server_on_one_postgres_reports_the_stores_unresolved_count() {
    let db = TestDb::new(Backend::Postgres);
    let url = db.url.clone();
    let (mut one, addr_one) = {
        let addr = metrics_addr();
        let app = spawn_app_on(db, |s| {
            s.metrics_listen = Some(addr);
            s.metrics_refresh_interval = Duration::from_millis(100);
        })
        .await;
        (app, addr)
    };
    let addr_two = metrics_addr();
    let mut two = spawn_app_on(TestDb::existing(Backend::Postgres, &url), |s| {
        s.metrics_listen = Some(addr_two);
        s.metrics_refresh_interval = Duration::from_millis(100);
    })
    .await;
    // Two unknown outcomes claimed through the first server, one attempt through the second.
    for n in 0..2 {
        let out = one
            .client
            .claim(claim_req(
                "run-u",
                "issue_credit",
                &format!(r#"{{"n":{n}}}"#),
            ))
            .await
            .expect("claim")
            .into_inner();
        let key = out.entry.as_ref().expect("entry").key.clone();
        one.client
            .complete(complete(&key, &out.claim_token, pb::Status::Unknown))
            .await
            .expect("unknown");
    }
    two.client
        .claim(claim_req("run-u", "open_ticket", "{}"))
        .await
        .expect("claim");
    for addr in [addr_one, addr_two] {
        await_all(
            addr,
            &[
                ("ledger_unresolved_entries{status=\"unknown\"}", 2.0),
                ("ledger_unresolved_entries{status=\"attempting\"}", 1.0),
            ],
        )
        .await;
    }
    // Claims are counted where they were answered; the backlog is the store's.
    let text = scrape(addr_two).await;
    assert_series(
        &text,
        "ledger_claims_total{outcome=\"claimed\",tool=\"open_ticket\"}",
        1.0,
    );
    assert!(!text.contains("issue_credit"), "{text}");
    two.shutdown().await.expect("shutdown");
    one.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_endpoints_log_the_addresses_they_bound() {
    // Port 0 for both: the kernel picks, the start-up log says what it picked, and that is
    // where the server answers (the log once said `metrics=127.0.0.1:0`).
    let db = TestDb::new(Backend::Sqlite);
    let server = ServerProcess::start(&db.url, &["--metrics-listen", "127.0.0.1:0"]).await;
    let metrics = server.metrics_addr();
    assert_ne!(metrics.port(), 0, "{}", server.startup_log);
    assert_ne!(server.addr.port(), 0, "{}", server.startup_log);
    let mut client = server.client().await;
    client
        .claim(claim_req("run-a", "issue_credit", r#"{"n":1}"#))
        .await
        .expect("claim on the logged address");
    let text = scrape(metrics).await;
    assert!(
        text.contains("ledger_claims_total{outcome=\"claimed\",tool=\"issue_credit\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_alarm_logs_one_warning_per_window() {
    let db = TestDb::new(Backend::Sqlite);
    let server = ServerProcess::start(
        &db.url,
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-refresh-interval",
            "50ms",
            "--replay-alarm-window",
            "1h",
            "--replay-alarm-min-claims",
            "3",
        ],
    )
    .await;
    let mut client = server.client().await;
    for n in 0..3 {
        client
            .claim(claim_req(
                "run-w",
                "issue_credit",
                &format!(r#"{{"n":{n}}}"#),
            ))
            .await
            .expect("claim");
    }
    let warnings = || {
        server
            .log
            .lock()
            .expect("log")
            .lines()
            .filter(|l| l.contains("replay alarm"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while warnings().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no warning was logged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Twenty more checks while the alarm stays on: still the one warning of this window.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let logged = warnings();
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0].contains("WARN"), "{logged:?}");
    assert!(
        logged[0].contains("claims=3") && logged[0].contains("replays=0"),
        "{logged:?}"
    );
    assert_series(
        &scrape(server.metrics_addr()).await,
        "ledger_replay_alarm",
        1.0,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_refused_by_authentication_are_counted() {
    let dir = tempfile::tempdir().expect("dir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "acme s3cret-token\n").expect("write");
    let (mut app, addr) = app_with_metrics(Backend::Sqlite, |s| {
        s.auth_tokens_file = Some(tokens.clone());
    })
    .await;
    let refused = app
        .client
        .claim(claim_req("run-x", "issue_credit", "{}"))
        .await
        .expect_err("no credential");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let text = scrape(addr).await;
    assert_series(
        &text,
        &format!("grpc_server_started_total{{{}}}", grpc("Claim")),
        1.0,
    );
    assert_series(
        &text,
        &format!(
            "grpc_server_handled_total{{{},grpc_code=\"UNAUTHENTICATED\"}}",
            grpc("Claim")
        ),
        1.0,
    );
    assert!(!text.contains("s3cret") && !text.contains("acme"), "{text}");
    app.shutdown().await.expect("shutdown");
}

/// The sum of every `ledger_store_errors_total` series.
fn store_errors(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("ledger_store_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A call's store error is counted in the call's task, when the store answers: also after the
/// caller's deadline passed and the caller got DEADLINE_EXCEEDED, and only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_error_is_counted_once_also_when_the_caller_stopped_waiting() {
    let direct = PgCluster::shared().create_database();
    let upstream: SocketAddr = format!("127.0.0.1:{}", PgCluster::shared().port())
        .parse()
        .expect("addr");
    let proxy = Proxy::start(upstream).await;
    let addr = metrics_addr();
    let mut app = spawn_app_on(
        TestDb::existing(Backend::Postgres, &proxy.url_for(&direct)),
        |s| {
            s.metrics_listen = Some(addr);
            // Neither the gauges' refresh nor the pruner reads the store during the test: only
            // the call's error counts.
            s.metrics_refresh_interval = Duration::from_secs(3600);
            s.prune_interval = Duration::from_secs(3600);
        },
    )
    .await;
    app.client
        .claim(claim_req("run-e", "issue_credit", r#"{"n":1}"#))
        .await
        .expect("a claim while the link is up");
    // The refresh loop's one read of the store is done (its gauge is there) before the link
    // fails.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let text = scrape(addr).await;
        if text.contains("ledger_unresolved_entries{") {
            assert_eq!(store_errors(&text), 0.0, "{text}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no refresh:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The link goes silent: the claim's statement hangs, and the caller gives up first.
    proxy.blackhole(true);
    let mut stuck = tonic::Request::new(claim_req("run-e", "issue_credit", r#"{"n":2}"#));
    stuck.set_timeout(Duration::from_millis(500));
    let gave_up = app
        .client
        .claim(stuck)
        .await
        .expect_err("the link is silent");
    assert_eq!(gave_up.code(), tonic::Code::DeadlineExceeded, "{gave_up:?}");
    // Then the connection breaks (and no new one gets through): the claim's task fails.
    proxy.reset_all();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let text = loop {
        let text = scrape(addr).await;
        if store_errors(&text) > 0.0 {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the claim's store error was never counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Long enough for a second count to show, were there one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text_later = scrape(addr).await;
    assert_eq!(store_errors(&text_later), 1.0, "{text}\n{text_later}");
    assert_series(
        &text_later,
        &format!(
            "grpc_server_handled_total{{{},grpc_code=\"DEADLINE_EXCEEDED\"}}",
            grpc("Claim")
        ),
        1.0,
    );
    proxy.blackhole(false);
    app.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alert_rules_pass_promtool_and_name_exported_metrics() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/prometheus-alerts.yml");
    let checked = std::process::Command::new("promtool")
        .args(["check", "rules", rules])
        .output()
        .expect("promtool (Debian's `prometheus` package; .ci/run installs it)");
    assert!(
        checked.status.success(),
        "promtool check rules:\n{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // Every metric an expression names is one the server really exports.
    let (mut app, addr) = app_with_metrics(Backend::Sqlite, |_| {}).await;
    app.client
        .claim(claim_req("run-r", "issue_credit", "{}"))
        .await
        .expect("claim");
    let text = await_series(
        addr,
        "ledger_unresolved_entries{status=\"attempting\"}",
        1.0,
    )
    .await;
    let exported: std::collections::HashSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let yaml = std::fs::read_to_string(rules).expect("rules");
    let mut named = 0;
    for line in yaml.lines().filter(|l| l.trim_start().starts_with("expr:")) {
        for word in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("ledger_") || word.starts_with("grpc_server_") {
                assert!(exported.contains(word), "{word} is not exported:\n{text}");
                named += 1;
            }
        }
    }
    assert!(named >= 4, "the rules name only {named} metrics");
    app.shutdown().await.expect("shutdown");
}
