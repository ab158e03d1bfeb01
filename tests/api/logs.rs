//! Structured logs, as the real binary writes them to stderr: `--log-format json` is one JSON
//! object a line, each ledger call has an access line with its fields and its W3C trace
//! context, the work inside a call is logged in its span, text stays readable, and no argument,
//! result or credential ever reaches the log in either format.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use serde_json::Value;
use tonic::transport::Channel;

use crate::support::postgres::PgCluster;
use crate::support::proxy::Proxy;
use crate::support::{Backend, STARTING, TestDb, claim_req, success, wait_for_logged_addr};

/// Every log line at trace level, less the HTTP/2 frame chatter.
const TRACE: &str = "trace,h2=info,hyper=info,tower=info";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const LOOKUP_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const SECRET: &str = "CANARY-91e4-sk_live_never_log_me";
const TOKEN: &str = "tok-CANARY-5d2b-bearer-never-log";

/// The real binary with its stderr in a file, a tokens file naming tenant `acme`, and a client
/// that sends its bearer token.
struct LoggedServer {
    child: tokio::process::Child,
    addr: SocketAddr,
    log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoggedServer {
    async fn start(url: &str, rust_log: &str, env: &[(&str, &str)], extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let log_path = dir.path().join("server.log");
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, format!("acme {TOKEN}\n")).expect("tokens file");
        let child = crate::support::ledger_command()
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--database-url")
            .arg(url)
            .arg("--auth-tokens-file")
            .arg(&tokens)
            .args(extra)
            .env("RUST_LOG", rust_log)
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).expect("log file"))
            .spawn()
            .expect("spawn idempotency-ledger");
        let addr = wait_for_logged_addr(&log_path, STARTING, "listen").await;
        let server = LoggedServer {
            child,
            addr,
            log_path,
            _dir: dir,
        };
        server.wait_until_serving().await;
        server
    }

    async fn wait_until_serving(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(channel) = Channel::from_shared(format!("http://{}", self.addr))
                .expect("uri")
                .connect()
                .await
            {
                let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
                let serving = health
                    .check(tonic_health::pb::HealthCheckRequest::default())
                    .await
                    .is_ok_and(|r| r.into_inner().status == 1);
                if serving {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "server did not start:\n{}",
                std::fs::read_to_string(&self.log_path).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn client(&self) -> LedgerServiceClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        LedgerServiceClient::new(channel)
    }

    /// SIGTERM, waits for the exit (so every line is written), and returns the log.
    async fn stop(mut self) -> String {
        let pid = self.child.id().expect("running");
        let killed = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(killed.success());
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
        std::fs::read_to_string(&self.log_path).expect("read log")
    }
}

/// `message` with the bearer token and, when given, a `traceparent`.
fn req<T>(message: T, traceparent: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let md = request.metadata_mut();
    md.insert(
        "authorization",
        format!("Bearer {TOKEN}").parse().expect("header"),
    );
    if let Some(tp) = traceparent {
        md.insert("traceparent", tp.parse().expect("header"));
    }
    request
}

/// Every line of a JSON log, each of which must be a JSON object.
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            assert!(v.is_object(), "not a JSON object: {line}");
            v
        })
        .collect()
}

fn call_lines<'a>(lines: &'a [Value], rpc: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["message"] == "call finished" && l["rpc"] == rpc)
        .collect()
}

async fn a_claim_with_a_traceparent_is_logged_as_one_json_line_with_its_fields(backend: Backend) {
    let db = TestDb::new(backend);
    // The format from the environment variable; the flag is used by the canary test.
    let server = LoggedServer::start(&db.url, TRACE, &[("LEDGER_LOG_FORMAT", "json")], &[]).await;
    let mut client = server.client().await;
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let claimed = client
        .claim(req(
            claim_req("run-logs", "issue_credit", r#"{"amount":5}"#),
            Some(&traceparent),
        ))
        .await
        .expect("claim")
        .into_inner();
    let key = claimed.entry.expect("entry").key;
    // An invalid traceparent (uppercase) is ignored, and the call succeeds.
    let invalid = format!("00-{}-{PARENT_ID}-01", TRACE_ID.to_uppercase());
    let other = client
        .claim(req(
            claim_req("run-logs", "open_ticket", r#"{"subject":"x"}"#),
            Some(&invalid),
        ))
        .await
        .expect("a claim with an invalid traceparent succeeds")
        .into_inner();
    assert_eq!(other.outcome(), pb::Outcome::Claimed);
    // A read, in the spawned task of its call, with another trace.
    let missing = client
        .lookup(req(
            pb::LookupRequest {
                key: "f".repeat(64),
                ..Default::default()
            },
            Some(&format!("00-{LOOKUP_TRACE_ID}-{PARENT_ID}-00")),
        ))
        .await
        .expect_err("absent");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let log = server.stop().await;
    let lines = json_lines(&log);
    assert!(lines.len() > 20, "{backend:?}: only {} lines", lines.len());

    let claims = call_lines(&lines, "Claim");
    let line = claims
        .iter()
        .find(|l| l["trace_id"] == TRACE_ID)
        .unwrap_or_else(|| panic!("{backend:?}: no Claim line with the trace id:\n{log}"));
    assert_eq!(line["level"], "DEBUG");
    assert_eq!(line["target"], "idempotency_ledger::telemetry");
    assert!(line["timestamp"].is_string());
    assert_eq!(line["parent_span_id"], PARENT_ID);
    assert_eq!(line["tenant"], "acme");
    assert_eq!(line["tool"], "issue_credit");
    assert_eq!(line["key"], &key[..12]);
    assert_eq!(line["outcome"], "CLAIMED");
    assert_eq!(line["status"], "ATTEMPTING");
    assert_eq!(line["attempt"], 1);
    assert_eq!(line["code"], "OK");
    let latency = line["latency_ms"].as_f64().expect("latency_ms is a number");
    assert!((0.0..20_000.0).contains(&latency), "{latency}");
    let span_id = line["span_id"].as_str().expect("span_id");
    assert!(span_id.len() == 16 && span_id != PARENT_ID, "{span_id}");

    // The call without a valid trace context has none, and says why at DEBUG.
    let untraced = claims
        .iter()
        .find(|l| l["tool"] == "open_ticket")
        .expect("the second claim's line");
    assert_eq!(untraced["code"], "OK");
    assert!(untraced.get("trace_id").is_none(), "{untraced}");
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "ignoring an invalid traceparent" && l["level"] == "DEBUG"),
        "{backend:?}: the invalid traceparent is not mentioned"
    );

    // The refused read: its code and reason, at DEBUG.
    let lookup = call_lines(&lines, "Lookup");
    let lookup = lookup.first().expect("the Lookup's line");
    assert_eq!(
        (&lookup["code"], &lookup["reason"], &lookup["level"]),
        (
            &Value::from("NOT_FOUND"),
            &Value::from("ENTRY_NOT_FOUND"),
            &Value::from("DEBUG")
        )
    );
    assert_eq!(lookup["key"], "ffffffffffff");

    // What the store logged for the read ran in the call's span, with its trace context.
    let inner: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["trace_id"] == LOOKUP_TRACE_ID && l["message"] != "call finished")
        .collect();
    assert!(
        inner
            .iter()
            .any(|l| l["target"].as_str().is_some_and(|t| t.starts_with("sqlx"))),
        "{backend:?}: no store line in the Lookup's span: {inner:#?}"
    );
    let span = &inner[0]["span"];
    assert_eq!(span["name"], "call");
    assert_eq!(span["rpc"], "Lookup");
    assert_eq!(span["tenant"], "acme");
    assert_eq!(span["parent_span_id"], PARENT_ID);
}

async fn a_canary_in_arguments_and_results_never_reaches_the_logs_in_either_format(
    backend: Backend,
) {
    for format in ["text", "json"] {
        let db = TestDb::new(backend);
        let server = LoggedServer::start(
            &db.url,
            TRACE,
            &[],
            &["--log-format", format, "--reconcile-grace", "0s"],
        )
        .await;
        let mut client = server.client().await;
        let args =
            format!(r#"{{"password":"{SECRET}","card":{{"number":"{SECRET}"}},"amount":5}}"#);
        let claimed = client
            .claim(req(claim_req("run-secret", "charge_card", &args), None))
            .await
            .expect("claim")
            .into_inner();
        let key = claimed.entry.expect("entry").key;
        let result = format!(r#"{{"receipt":"{SECRET}"}}"#);
        client
            .complete(req(
                success(&key, &claimed.claim_token, result.as_bytes()),
                None,
            ))
            .await
            .expect("complete");
        let replay = client
            .claim(req(claim_req("run-secret", "charge_card", &args), None))
            .await
            .expect("replay")
            .into_inner();
        assert_eq!(replay.entry.expect("entry").result, result.as_bytes());
        client
            .lookup(req(
                pb::LookupRequest {
                    key: key.clone(),
                    ..Default::default()
                },
                None,
            ))
            .await
            .expect("lookup by key");
        client
            .lookup(req(
                pb::LookupRequest {
                    run_id: "run-secret".into(),
                    tool: "charge_card".into(),
                    arguments_json: args.clone(),
                    ..Default::default()
                },
                None,
            ))
            .await
            .expect("lookup by arguments");
        // An unknown outcome with the canary as its error, found by Reconcile and resolved with
        // the canary as its result.
        let unknown = client
            .claim(req(
                claim_req(
                    "run-secret",
                    "charge_card",
                    &format!(r#"{{"n":"{SECRET}"}}"#),
                ),
                None,
            ))
            .await
            .expect("claim")
            .into_inner();
        let unknown_key = unknown.entry.expect("entry").key;
        client
            .complete(req(
                pb::CompleteRequest {
                    key: unknown_key.clone(),
                    claim_token: unknown.claim_token,
                    status: pb::Status::Unknown.into(),
                    error: SECRET.into(),
                    ..Default::default()
                },
                None,
            ))
            .await
            .expect("complete unknown");
        let pending = client
            .reconcile(req(
                pb::ReconcileRequest {
                    older_than: Some(prost_types::Duration::default()),
                    ..Default::default()
                },
                None,
            ))
            .await
            .expect("reconcile")
            .into_inner()
            .pending;
        let held = pending
            .iter()
            .find(|e| e.key == unknown_key)
            .expect("handed out");
        let (attempt, hold_token) = (held.attempt, held.hold_token.clone());
        let resolved = client
            .reconcile(req(
                pb::ReconcileRequest {
                    resolutions: vec![pb::Resolution {
                        key: unknown_key.clone(),
                        status: pb::Status::Succeeded.into(),
                        result: result.clone().into_bytes().into(),
                        attempt,
                        hold_token,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                None,
            ))
            .await
            .expect("resolve")
            .into_inner()
            .resolved;
        assert_eq!(resolved.len(), 1);
        // Refused requests that carry the canary.
        let refused = client
            .claim(req(
                claim_req("run-secret", "t", &format!(r#"{{"a":"{SECRET}","a":1}}"#)),
                None,
            ))
            .await
            .expect_err("duplicate member");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        let stale = client
            .complete(req(
                pb::CompleteRequest {
                    key: key.clone(),
                    claim_token: SECRET.into(),
                    status: pb::Status::Failed.into(),
                    error: SECRET.into(),
                    ..Default::default()
                },
                None,
            ))
            .await
            .expect_err("stale token");
        assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
        let log = server.stop().await;
        // The log is verbose enough to matter: every RPC has its access line.
        for rpc in ["Claim", "Complete", "Lookup", "Reconcile"] {
            let needle = match format {
                "json" => format!(r#""rpc":"{rpc}""#),
                _ => format!(r#"rpc="{rpc}""#),
            };
            assert!(
                log.lines()
                    .any(|l| l.contains("call finished") && l.contains(&needle)),
                "{backend:?} {format}: no access line for {rpc}"
            );
        }
        assert!(
            log.lines().count() > 40,
            "{backend:?} {format}: a short log"
        );
        assert!(
            !log.contains(SECRET),
            "{backend:?} {format}: the canary leaked into the log"
        );
        assert!(
            !log.contains(TOKEN),
            "{backend:?} {format}: the bearer token leaked into the log"
        );
    }
}

async fn text_logs_show_the_calls_fields_by_default(backend: Backend) {
    let db = TestDb::new(backend);
    let server = LoggedServer::start(&db.url, "idempotency_ledger=debug", &[], &[]).await;
    let mut client = server.client().await;
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let claimed = client
        .claim(req(
            claim_req("run-text", "issue_credit", r#"{"amount":5}"#),
            Some(&traceparent),
        ))
        .await
        .expect("claim")
        .into_inner();
    let key = claimed.entry.expect("entry").key;
    let log = server.stop().await;
    let line = log
        .lines()
        .find(|l| l.contains("call finished") && l.contains(r#"rpc="Claim""#))
        .unwrap_or_else(|| panic!("{backend:?}: no Claim line:\n{log}"));
    assert!(!line.starts_with('{'), "{line}");
    for field in [
        "DEBUG".to_string(),
        r#"tenant="acme""#.into(),
        r#"tool="issue_credit""#.into(),
        format!(r#"key="{}""#, &key[..12]),
        r#"outcome="CLAIMED""#.into(),
        "attempt=1".into(),
        r#"code="OK""#.into(),
        "latency_ms=".into(),
        format!(r#"trace_id="{TRACE_ID}""#),
    ] {
        assert!(line.contains(&field), "{backend:?}: no {field} in {line}");
    }
}

on_every_backend!(
    a_claim_with_a_traceparent_is_logged_as_one_json_line_with_its_fields,
    a_canary_in_arguments_and_results_never_reaches_the_logs_in_either_format,
    text_logs_show_the_calls_fields_by_default,
);

/// At the default level (`info`) an answered call writes nothing, and a call the server failed
/// writes one WARN line. PostgreSQL only: a SQLite file has no link to cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_info_only_calls_the_server_failed_are_logged() {
    let direct = PgCluster::shared().create_database();
    let upstream: SocketAddr = format!("127.0.0.1:{}", PgCluster::shared().port())
        .parse()
        .expect("addr");
    let proxy = Proxy::start(upstream).await;
    let server = LoggedServer::start(
        &proxy.url_for(&direct),
        "info",
        &[],
        &["--log-format", "json"],
    )
    .await;
    let mut client = server.client().await;
    client
        .claim(req(claim_req("run-info", "t", "{}"), None))
        .await
        .expect("claim");
    let _ = client
        .lookup(req(
            pb::LookupRequest {
                key: "f".repeat(64),
                ..Default::default()
            },
            None,
        ))
        .await
        .expect_err("absent");
    proxy.blackhole(true);
    let mut stuck = req(claim_req("run-info", "stuck", "{}"), None);
    stuck.set_timeout(Duration::from_millis(800));
    let failed = client.claim(stuck).await.expect_err("the store is cut off");
    proxy.blackhole(false);
    let log = server.stop().await;
    let lines = json_lines(&log);
    let calls: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "call finished")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let line = calls[0];
    assert_eq!(line["level"], "WARN");
    assert_eq!(line["rpc"], "Claim");
    assert_eq!(line["tenant"], "acme");
    assert_eq!(line["tool"], "stuck");
    assert_eq!(
        line["code"],
        match failed.code() {
            tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            tonic::Code::Unavailable => "UNAVAILABLE",
            other => panic!("unexpected {other:?}"),
        }
    );
}
