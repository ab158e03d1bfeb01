//! Traces over OTLP, as the real binary exports them to a real gRPC OTLP collector run here
//! (opentelemetry-proto's `TraceService`, served by tonic): the server's span of a call is a
//! child of the caller's `traceparent`, carries the RPC conventions' and the ledger's
//! attributes and never an argument or a result, has child spans for the group commit and a
//! claim's wait, and joins the access log on its ids; the spans of the last calls are flushed
//! on SIGTERM; a collector that hangs or is down never slows a call; and nothing is set up
//! without an endpoint.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind};
use prost::Message as _;
use serde_json::Value;
use tokio::net::TcpListener;
use tonic::transport::Channel;

use crate::support::{Backend, ServerProcess, TestDb, claim_req, ledger_command, success};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const WAIT_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const CANARY: &str = "CANARY-7f3a-sk_live_never_export_me";

/// An OTLP/gRPC trace collector on a port of its own: keeps every export request it receives.
struct Collector {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().expect("sink").push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    async fn start() -> Collector {
        Collector::on(TcpListener::bind("127.0.0.1:0").await.expect("bind")).await
    }

    async fn on(listener: TcpListener) -> Collector {
        let addr = listener.local_addr().expect("addr");
        let sink = Sink::default();
        let received = sink.0.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(sink))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                ),
        );
        Collector {
            addr,
            received,
            _stop: stop,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<ExportTraceServiceRequest> {
        self.received.lock().expect("sink").clone()
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Span> {
        self.requests()
            .into_iter()
            .flat_map(|r| r.resource_spans)
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans)
            .collect()
    }

    /// Waits (up to 20 s) until the spans received satisfy `done`, and returns them.
    async fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what} within 20 s; received {} spans: {:#?}",
                spans.len(),
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn text<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(&span.attributes, key) {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match attr(&span.attributes, key) {
        Some(any_value::Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id)
        .collect()
}

const CLAIM: &str = "idempotency.v1.LedgerService/Claim";
const COMPLETE: &str = "idempotency.v1.LedgerService/Complete";
const LOOKUP: &str = "idempotency.v1.LedgerService/Lookup";

/// `message` with a `traceparent` of `trace_id`, sampled.
fn traced<T>(message: T, trace_id: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{PARENT_ID}-01")
            .parse()
            .expect("header"),
    );
    request
}

/// The binary on a fresh SQLite file, its environment set by `env` (`OTEL_*` and `RUST_LOG`;
/// none is inherited), its log in JSON.
async fn server(db: &TestDb, env: &[(&str, &str)]) -> ServerProcess {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ServerProcess::start_with(&db.url, 0, &["--log-format", "json"], move |command| {
        command.envs(env);
    })
    .await
}

/// SIGTERM, and waits (up to `within`) for the process to exit; returns its log after start-up.
async fn stop(mut server: ServerProcess, within: Duration) -> String {
    server.terminate();
    let exited = tokio::time::timeout(within, server.child.wait()).await;
    assert!(
        exited.is_ok(),
        "the server did not exit within {within:?} of SIGTERM:\n{}",
        server.log.lock().expect("log")
    );
    // The log's reader drains what the process wrote before it exited.
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.log.lock().expect("log").clone()
}

/// The names of the process's threads (Linux truncates them to 15 bytes).
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the process's threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

/// The thread of the SDK's batch span processor ("OpenTelemetry.Traces.BatchProcessor").
const EXPORT_THREAD: &str = "OpenTelemetry.T";

async fn client(server: &ServerProcess) -> LedgerServiceClient<Channel> {
    server.client().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_span_is_a_child_of_the_callers_traceparent_with_its_attributes_and_no_payload() {
    let collector = Collector::start().await;
    let db = TestDb::new(Backend::Sqlite);
    let server = server(
        &db,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            // The store's statements too: they run inside the trace spans, which the log
            // never shows.
            (
                "RUST_LOG",
                "info,idempotency_ledger::telemetry=debug,sqlx=debug",
            ),
        ],
    )
    .await;
    assert!(
        server.startup_log.contains("exporting traces over OTLP"),
        "{}",
        server.startup_log
    );
    let pid = server.child.id().expect("running");
    assert!(
        thread_names(pid).iter().any(|n| n == EXPORT_THREAD),
        "no export thread: {:?}",
        thread_names(pid)
    );
    let mut client = client(&server).await;

    // A claim, its completion and a replay, with the canary in the arguments and the result.
    // In a member named like a secret (redacted where arguments are kept) and in a plain one.
    let args = format!(r#"{{"password":"{CANARY}","note":"{CANARY}","amount":5}}"#);
    let result = format!(r#"{{"receipt":"{CANARY}"}}"#);
    let claimed = client
        .claim(traced(claim_req("run-t", "issue_credit", &args), TRACE_ID))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let key = claimed.entry.expect("entry").key;
    client
        .complete(traced(
            success(&key, &claimed.claim_token, result.as_bytes()),
            TRACE_ID,
        ))
        .await
        .expect("complete");
    let replay = client
        .claim(traced(claim_req("run-t", "issue_credit", &args), TRACE_ID))
        .await
        .expect("replay")
        .into_inner();
    assert_eq!(replay.outcome(), pb::Outcome::Replayed);
    // A refused call: its code, not an error status (the caller's mistake, not the server's).
    let missing = client
        .lookup(traced(
            pb::LookupRequest {
                key: "f".repeat(64),
                ..Default::default()
            },
            TRACE_ID,
        ))
        .await
        .expect_err("absent");
    assert_eq!(missing.code(), tonic::Code::NotFound);

    // A claim that waits a second for an attempt in flight (and answers that it still is), in
    // a trace of its own.
    let first = client
        .claim(claim_req("run-w", "send_reply", &args))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(first.outcome(), pb::Outcome::Claimed);
    let mut waiting = claim_req("run-w", "send_reply", &args);
    waiting.wait = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let waited = client
        .claim(traced(waiting, WAIT_TRACE_ID))
        .await
        .expect("waiting claim")
        .into_inner();
    assert_eq!(waited.outcome(), pb::Outcome::InProgress);

    let spans = collector
        .wait_for(
            "spans of the claims, the completion, the lookup and the wait",
            |spans| {
                named(spans, CLAIM).len() >= 4
                    && !named(spans, COMPLETE).is_empty()
                    && !named(spans, LOOKUP).is_empty()
                    && !named(spans, "ledger.claim_wait").is_empty()
            },
        )
        .await;

    // The claim: in the caller's trace, under the caller's span, with its attributes.
    let claims: Vec<&Span> = named(&spans, CLAIM)
        .into_iter()
        .filter(|s| hex(&s.trace_id) == TRACE_ID)
        .collect();
    let claim = claims
        .iter()
        .find(|s| text(s, "ledger.outcome") == Some("CLAIMED"))
        .unwrap_or_else(|| panic!("no CLAIMED span in the caller's trace: {claims:#?}"));
    assert_eq!(hex(&claim.parent_span_id), PARENT_ID);
    assert_eq!(claim.kind, SpanKind::Server as i32);
    assert_eq!(text(claim, "rpc.system"), Some("grpc"));
    assert_eq!(
        text(claim, "rpc.service"),
        Some("idempotency.v1.LedgerService")
    );
    assert_eq!(text(claim, "rpc.method"), Some("Claim"));
    assert_eq!(int(claim, "rpc.grpc.status_code"), Some(0));
    assert_eq!(text(claim, "ledger.tool"), Some("issue_credit"));
    assert_eq!(text(claim, "ledger.key_prefix"), Some(&key[..12]));
    assert_eq!(text(claim, "ledger.status"), Some("ATTEMPTING"));
    assert_eq!(text(claim, "ledger.tenant"), Some("default"));
    assert_eq!(int(claim, "ledger.attempt"), Some(1));
    let span_id = hex(&claim.span_id);
    assert!(span_id.len() == 16 && span_id != PARENT_ID, "{span_id}");
    // Its insert, committed by the group commit, as its child.
    let commits: Vec<&Span> = children(&spans, claim)
        .into_iter()
        .filter(|s| s.name == "ledger.batch_commit")
        .collect();
    assert_eq!(commits.len(), 1, "{:#?}", children(&spans, claim));
    assert_eq!(text(commits[0], "ledger.batch.kind"), Some("insert"));
    assert!(int(commits[0], "ledger.batch.size").is_some_and(|n| n >= 1));
    assert_eq!(commits[0].kind, SpanKind::Internal as i32);

    // The completion's write and the replay's outcome.
    let complete = named(&spans, COMPLETE)
        .into_iter()
        .find(|s| hex(&s.trace_id) == TRACE_ID)
        .expect("the completion's span");
    assert_eq!(hex(&complete.parent_span_id), PARENT_ID);
    assert!(
        children(&spans, complete)
            .iter()
            .any(|s| s.name == "ledger.batch_commit"
                && text(s, "ledger.batch.kind") == Some("finish")),
        "{:#?}",
        children(&spans, complete)
    );
    assert!(
        claims
            .iter()
            .any(|s| text(s, "ledger.outcome") == Some("REPLAYED")),
        "{claims:#?}"
    );

    // The refused read: its code and reason; the span's status stays unset.
    let lookup = named(&spans, LOOKUP)[0];
    assert_eq!(int(lookup, "rpc.grpc.status_code"), Some(5));
    assert_eq!(text(lookup, "ledger.reason"), Some("ENTRY_NOT_FOUND"));
    assert_eq!(text(lookup, "ledger.key_prefix"), Some("ffffffffffff"));
    assert_ne!(lookup.status.as_ref().map_or(0, |s| s.code), 2, "ERROR");

    // The waiting claim: its wait is a child of its span.
    let waiting = named(&spans, CLAIM)
        .into_iter()
        .find(|s| hex(&s.trace_id) == WAIT_TRACE_ID)
        .expect("the waiting claim's span");
    assert_eq!(text(waiting, "ledger.outcome"), Some("IN_PROGRESS"));
    let wait = children(&spans, waiting)
        .into_iter()
        .find(|s| s.name == "ledger.claim_wait")
        .unwrap_or_else(|| panic!("no wait span: {:#?}", children(&spans, waiting)));
    assert!(
        wait.end_time_unix_nano - wait.start_time_unix_nano >= 500_000_000,
        "the wait span lasts the wait: {wait:#?}"
    );

    // The service, as resources name it.
    let requests = collector.requests();
    let service = requests[0].resource_spans[0]
        .resource
        .as_ref()
        .and_then(|r| attr(&r.attributes, "service.name"));
    assert_eq!(
        service,
        Some(&any_value::Value::StringValue("idempotency-ledger".into()))
    );

    // No argument or result anywhere in what was exported: every attribute, name and event of
    // every request, searched as the bytes sent.
    for request in &requests {
        let bytes = request.encode_to_vec();
        assert!(
            !bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()),
            "the canary was exported: {request:#?}"
        );
    }

    // The access log joins the span on its ids.
    let log = stop(server, Duration::from_secs(20)).await;
    let line: Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| {
            l["message"] == "call finished"
                && l["outcome"] == "CLAIMED"
                && l["trace_id"] == TRACE_ID
        })
        .unwrap_or_else(|| panic!("no access line of the claim:\n{log}"));
    assert_eq!(line["span_id"], span_id.as_str());
    assert_eq!(line["parent_span_id"], PARENT_ID);
    // The log's current span is the call's, also for the statements of a group commit.
    let lines: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let in_spans: Vec<&Value> = lines.iter().filter(|l| l.get("span").is_some()).collect();
    assert!(
        in_spans.iter().any(
            |l| l["target"].as_str().is_some_and(|t| t.starts_with("sqlx"))
                && l["span"]["trace_id"] == TRACE_ID
        ),
        "no store line in a traced call's span:\n{log}"
    );
    for l in in_spans {
        assert_eq!(l["span"]["name"], "call", "{l}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spans_of_the_last_calls_are_flushed_when_sigterm_stops_the_server() {
    let collector = Collector::start().await;
    let db = TestDb::new(Backend::Sqlite);
    // Batches every ten minutes: only the flush at shutdown can send these spans.
    let server = server(
        &db,
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &collector.endpoint()),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
            ("OTEL_SERVICE_NAME", "ledger-under-test"),
        ],
    )
    .await;
    let mut client = client(&server).await;
    for n in 0..3 {
        client
            .claim(traced(
                claim_req("run-f", "open_ticket", &format!(r#"{{"n":{n}}}"#)),
                TRACE_ID,
            ))
            .await
            .expect("claim");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(collector.spans().is_empty(), "sent before the flush");
    let log = stop(server, Duration::from_secs(20)).await;
    let spans = collector.spans();
    let claims = named(&spans, CLAIM);
    assert_eq!(claims.len(), 3, "{spans:#?}");
    assert!(claims.iter().all(|s| hex(&s.trace_id) == TRACE_ID));
    assert_eq!(named(&spans, "ledger.batch_commit").len(), 3);
    let service = collector.requests()[0].resource_spans[0]
        .resource
        .as_ref()
        .and_then(|r| attr(&r.attributes, "service.name"))
        .cloned();
    assert_eq!(
        service,
        Some(any_value::Value::StringValue("ledger-under-test".into()))
    );
    assert!(
        log.contains("trace export stopped") && log.contains(r#""spans_exported":6"#),
        "{log}"
    );
}

/// A collector that accepts connections and never answers: every export hangs until its
/// timeout.
async fn hung_collector() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_never_wait_for_a_collector_that_hangs_and_dropped_spans_are_logged_once() {
    let (addr, _hung) = hung_collector().await;
    let db = TestDb::new(Backend::Sqlite);
    let endpoint = format!("http://{addr}");
    let server = server(
        &db,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            // A queue of two spans, sent one at a time, each export hanging for a minute.
            ("OTEL_BSP_MAX_QUEUE_SIZE", "2"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1"),
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
        ],
    )
    .await;
    let mut client = client(&server).await;
    let started = tokio::time::Instant::now();
    for n in 0..40 {
        let mut request = traced(
            claim_req("run-h", "open_ticket", &format!(r#"{{"n":{n}}}"#)),
            TRACE_ID,
        );
        request.set_timeout(Duration::from_secs(10));
        let claimed = client.claim(request).await.expect("a claim is answered");
        assert_eq!(claimed.into_inner().outcome(), pb::Outcome::Claimed);
    }
    // Far from the minute one blocked export would take, even on a loaded machine.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "40 claims took {took:?}");
    // The flush at shutdown is bounded too: the process exits although the collector hangs.
    let log = stop(server, Duration::from_secs(30)).await;
    let drops = log
        .lines()
        .filter(|l| l.contains("dropped a Span due to queue full"))
        .count();
    assert_eq!(drops, 1, "{log}");
    assert!(
        log.contains("Spans were dropped due to a queue being full"),
        "the count at shutdown: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_go_on_when_the_collector_is_down_and_the_failure_is_logged_once() {
    // A port nothing listens on.
    let down = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", down.local_addr().expect("addr"));
    drop(down);
    let db = TestDb::new(Backend::Sqlite);
    let server = server(
        &db,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1"),
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "300"),
        ],
    )
    .await;
    let mut client = client(&server).await;
    for n in 0..20 {
        let claimed = client
            .claim(traced(
                claim_req("run-d", "open_ticket", &format!(r#"{{"n":{n}}}"#)),
                TRACE_ID,
            ))
            .await
            .expect("a claim is answered");
        assert_eq!(claimed.into_inner().outcome(), pb::Outcome::Claimed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = stop(server, Duration::from_secs(30)).await;
    let failures = log
        .lines()
        .filter(|l| l.contains("cannot export spans to the OTLP collector"))
        .count();
    assert_eq!(failures, 1, "{log}");
    assert!(!log.contains("BatchSpanProcessor.ExportError"), "{log}");
    let stopped = log
        .lines()
        .find(|l| l.contains("trace export stopped"))
        .unwrap_or_else(|| panic!("no shutdown line: {log}"));
    assert!(stopped.contains(r#""spans_exported":0"#), "{stopped}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_set_up_and_nothing_is_sent() {
    // A collector on the conventional port, where an exporter with no endpoint would send (if
    // another process holds the port, the other checks still hold).
    let default_port = match TcpListener::bind("127.0.0.1:4317").await {
        Ok(listener) => Some(Collector::on(listener).await),
        Err(_) => None,
    };
    let db = TestDb::new(Backend::Sqlite);
    let server = server(
        &db,
        &[
            ("OTEL_SERVICE_NAME", "ledger-without-endpoint"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_TRACES_SAMPLER", "always_on"),
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
        ],
    )
    .await;
    let mut client = client(&server).await;
    for n in 0..3 {
        client
            .claim(traced(
                claim_req("run-n", "open_ticket", &format!(r#"{{"n":{n}}}"#)),
                TRACE_ID,
            ))
            .await
            .expect("claim");
    }
    let pid = server.child.id().expect("running");
    let threads = thread_names(pid);
    assert!(!threads.iter().any(|n| n == EXPORT_THREAD), "{threads:?}");
    assert!(!server.startup_log.contains("exporting traces"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = stop(server, Duration::from_secs(20)).await;
    assert!(!log.contains("trace export"), "{log}");
    if let Some(collector) = default_port {
        assert!(collector.requests().is_empty(), "sent to the default port");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_settings_the_server_cannot_honour_stop_it_at_start_with_the_variable_named() {
    let db = TestDb::new(Backend::Sqlite);
    let output = ledger_command()
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--database-url")
        .arg(&db.url)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .stdin(std::process::Stdio::null())
        .output();
    let output = tokio::time::timeout(Duration::from_secs(20), output)
        .await
        .expect("exits")
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot set up traces")
            && stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL")
            && stderr.contains("http/json"),
        "{stderr}"
    );
}

/// An OTLP/HTTP collector (protobuf bodies): keeps each request's path and decoded body.
async fn http_collector() -> (
    SocketAddr,
    Arc<Mutex<Vec<(String, ExportTraceServiceRequest)>>>,
) {
    use hyper_util::rt::TokioIo;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let received = Arc::new(Mutex::new(Vec::new()));
    let sink = received.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let sink = sink.clone();
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let sink = sink.clone();
                    async move {
                        let path = request.uri().path().to_string();
                        let mut body = request.into_body();
                        let mut bytes = Vec::new();
                        while let Some(frame) = std::future::poll_fn(|cx| {
                            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
                        })
                        .await
                        {
                            if let Ok(data) = frame.expect("a body frame").into_data() {
                                bytes.extend_from_slice(&data);
                            }
                        }
                        let decoded = ExportTraceServiceRequest::decode(bytes.as_slice())
                            .expect("a protobuf ExportTraceServiceRequest");
                        sink.lock().expect("sink").push((path, decoded));
                        let mut response = http::Response::new(http_body_full(
                            ExportTraceServiceResponse::default().encode_to_vec(),
                        ));
                        response.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("application/x-protobuf"),
                        );
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (addr, received)
}

/// A body of `bytes`, in one frame.
fn http_body_full(
    bytes: Vec<u8>,
) -> impl http_body::Body<Data = bytes::Bytes, Error = std::convert::Infallible> + Send + 'static {
    struct Once(Option<bytes::Bytes>);
    impl http_body::Body for Once {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            std::task::Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
        }
    }
    Once(Some(bytes.into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_delivers_the_same_spans_to_the_traces_path() {
    let (addr, received) = http_collector().await;
    let db = TestDb::new(Backend::Sqlite);
    let server = server(
        &db,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{addr}")),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    let mut client = client(&server).await;
    client
        .claim(traced(claim_req("run-p", "open_ticket", "{}"), TRACE_ID))
        .await
        .expect("claim");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let claim = loop {
        let found = received
            .lock()
            .expect("sink")
            .iter()
            .flat_map(|(path, r)| {
                assert_eq!(path, "/v1/traces");
                r.resource_spans.iter()
            })
            .flat_map(|r| r.scope_spans.iter())
            .flat_map(|s| s.spans.iter())
            .find(|s| s.name == CLAIM)
            .cloned();
        if let Some(claim) = found {
            break claim;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Claim span over HTTP"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(hex(&claim.trace_id), TRACE_ID);
    assert_eq!(hex(&claim.parent_span_id), PARENT_ID);
    assert_eq!(text(&claim, "ledger.outcome"), Some("CLAIMED"));
    drop(stop(server, Duration::from_secs(20)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_recorded_when_it_happens_exports_a_span_with_its_event() {
    let collector = Collector::start().await;
    let db = TestDb::new(Backend::Sqlite);
    let endpoint = collector.endpoint();
    let server = ServerProcess::start_with(
        &db.url,
        0,
        &["--log-format", "json", "--approval-timeout", "1s"],
        move |command| {
            command.envs([
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint.as_str()),
                ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ]);
        },
    )
    .await;
    let mut client = client(&server).await;
    client
        .claim(pb::ClaimRequest {
            require_approval: true,
            ..claim_req("run-lapse", "issue_refund", r#"{"order":"o-1"}"#)
        })
        .await
        .expect("claim");
    // No claim comes again: only the task that waits for the deadline records the lapse.
    let spans = collector
        .wait_for("lapse span", |spans| {
            named(spans, "ledger.approval_lapsed")
                .iter()
                .any(|s| s.events.iter().any(|e| e.name == "approval lapsed"))
        })
        .await;
    let lapsed = named(&spans, "ledger.approval_lapsed")
        .into_iter()
        .find(|s| !s.events.is_empty())
        .expect("the recording span");
    assert_eq!(text(lapsed, "ledger.tool"), Some("issue_refund"));
    assert_eq!(int(lapsed, "ledger.attempt"), Some(1));
    assert_eq!(
        text(lapsed, "ledger.key_prefix").map(str::len),
        Some(12),
        "a key prefix, never the arguments"
    );
}
