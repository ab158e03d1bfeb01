//! Logs: the subscriber (`--log-format text|json`, filtered by `RUST_LOG`, to stderr), one
//! `call` span per ledger RPC with the W3C trace context of its `traceparent`, and one
//! "call finished" event per call, the access log. With traces exported
//! ([`super::traces`]), the same place opens the call's server span, a child of the caller's
//! `traceparent`, and gives it the call's attributes when the call ends.
//!
//! The span and the event are made by [`CallLogLayer`], a tower layer around the whole server,
//! so they cover every ledger call, also those refused before a handler runs (a bad credential,
//! a message over the size limit, one that does not decode) and they see the gRPC code the
//! caller gets. The handlers add what only they know (tenant, tool, key prefix, outcome,
//! status, attempt) through the `record_*` functions, which write to a per-call record kept in
//! a task-local (and to the span, when it is enabled).
//!
//! Arguments, results, error texts sent by callers, claim tokens and credentials are never
//! recorded: only the fields named here, each of them either chosen by the server or an
//! identifier (tool name, the first 12 characters of the key, tenant name).
//!
//! The `traceparent` is read by OpenTelemetry's W3C propagator. Its trace id and span id are
//! the log's `trace_id` and `parent_span_id`; the call's `span_id` is the exported span's when
//! traces are exported (and `trace_id` then is the exported trace's, also for a call that
//! brought none), so that a log line and a span join on their ids.
//!
//! Everything this module logs has the target [`LOG_TARGET`], `idempotency_ledger::telemetry`,
//! the module's path before it moved under `observe`: log pipelines and `RUST_LOG` filters name
//! it.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tonic::Code;
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::EnvFilter;

use super::traces::{self, TraceExport};
use super::{Rpc, SERVICE};
use crate::domain::{ApprovalState, Decision, Tenant};
use crate::ledger::{ClaimOutput, EntryView, Outcome};
use crate::proto::code_name;

mod trace_context;

use trace_context::{CallIds, Hex, remote_parent};

/// The target of the `call` span, the access line and this module's other events.
pub const LOG_TARGET: &str = "idempotency_ledger::telemetry";

/// The path prefix of the ledger's RPCs; other services (health, reflection) are not logged
/// per call: load balancers probe health every second.
const LEDGER_PATH: &str = "/idempotency.v1.LedgerService/";

/// How the server writes its logs to stderr.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event (the span's fields in front of the message).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message`, the event's fields, `target`,
    /// and the current span's fields under `span`.
    Json,
}

/// Installs the global subscriber: `RUST_LOG` filters (default `info`), `format` formats, and
/// everything goes to stderr; with `traces`, an OpenTelemetry layer beside it turns the calls'
/// trace spans into exported spans (and sees nothing else).
///
/// # Errors
/// A subscriber was already installed.
pub fn init(
    format: LogFormat,
    traces: Option<&TraceExport>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter = log_filter();
    let Some(traces) = traces else {
        // Without traces, the one filter is global: as cheap as a subscriber gets.
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        return match format {
            LogFormat::Text => builder
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .try_init(),
            // Flattened, so a pipeline reads `rpc` or `code` at the top level; only the current
            // span, because the call span is the only one the log shows.
            LogFormat::Json => builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(false)
                .try_init(),
        };
    };
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{Layer as _, fmt};
    // Each layer with its own filter: the log sees what RUST_LOG says and never a trace span
    // (so "the current span" of a line is still the call's), the exporter sees trace spans only.
    let logs = match format {
        LogFormat::Text => fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(traces.layer())
        .try_init()?;
    Ok(())
}

/// `RUST_LOG` (default `info`), less the trace spans: they are for the exporter only.
fn log_filter() -> EnvFilter {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match format!("{}=off", traces::TARGET).parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// What a call's handler learned, for its "call finished" event.
#[derive(Debug, Default)]
struct CallRecord {
    tenant: Option<String>,
    tool: Option<String>,
    key: Option<String>,
    outcome: Option<&'static str>,
    status: Option<&'static str>,
    attempt: Option<u32>,
}

tokio::task_local! {
    /// The record of the call whose handler runs in this task.
    static CALL: RefCell<CallRecord>;
}

/// Runs `f` on the current call's record; outside a call (unit tests, background tasks) it
/// does nothing.
fn with_record(f: impl FnOnce(&mut CallRecord)) {
    let _ = CALL.try_with(|call| f(&mut call.borrow_mut()));
}

/// Records the call's tenant (its name: the credential is never logged).
pub fn record_tenant(tenant: &Tenant) {
    tracing::Span::current().record("tenant", tenant.as_str());
    with_record(|c| c.tenant = Some(tenant.as_str().to_owned()));
}

/// Records what a request names before it runs, so a refused call is logged with it: its tool
/// and its key's prefix, each when not empty.
pub fn record_request(tool: &str, key: &str) {
    let span = tracing::Span::current();
    if !tool.is_empty() {
        span.record("tool", tool);
    }
    if !key.is_empty() {
        span.record("key", key_prefix(key));
    }
    with_record(|c| {
        if !tool.is_empty() {
            c.tool = Some(tool.to_string());
        }
        if !key.is_empty() {
            c.key = Some(key_prefix(key).to_string());
        }
    });
}

/// Records the entry a call answers with: its tool, key prefix, status and attempt.
pub fn record_entry(view: &EntryView) {
    let e = &view.entry;
    record_request(e.tool.as_str(), e.key.as_str());
    with_record(|c| {
        c.status = Some(view.status.as_str());
        c.attempt = Some(e.attempt);
    });
}

/// Records a claim's outcome and its entry; a claim that asked a person, or used an approval,
/// adds an event to its span (an OTLP span event when traces are exported).
pub fn record_claim(out: &ClaimOutput) {
    record_entry(&out.entry);
    with_record(|c| c.outcome = Some(out.outcome.as_str()));
    let approval = &out.entry.entry.approval;
    match (out.outcome, approval.state) {
        (Outcome::AwaitingApproval, _) => tracing::info!(
            target: super::traces::TARGET,
            approval_state = approval.state.as_str(),
            "ledger.approval.awaiting"
        ),
        (Outcome::Claimed, ApprovalState::Used) => tracing::info!(
            target: super::traces::TARGET,
            approval_state = approval.state.as_str(),
            "ledger.approval.used"
        ),
        (Outcome::Denied, _) => tracing::info!(
            target: super::traces::TARGET,
            approval_state = approval.state.as_str(),
            "ledger.approval.denied"
        ),
        _ => {}
    }
}

/// Records a decision and its entry, with an event on the call's span (an OTLP span event when
/// traces are exported).
pub fn record_decision(view: &EntryView, decision: Decision, changed: bool) {
    record_entry(view);
    tracing::info!(
        target: super::traces::TARGET,
        approval_decision = decision.as_str(),
        approval_changed = changed,
        "ledger.approval.decided"
    );
}

/// The first 12 characters of a key: enough to find it in the store, short enough for logs,
/// and, for an explicit key, too little to carry a caller's secret whole.
pub fn key_prefix(key: &str) -> &str {
    let end = key.char_indices().nth(12).map_or(key.len(), |(at, _)| at);
    &key[..end]
}

/// Whether a finished call is logged at WARN: the server failed it (a bug, the store, time).
/// Every other answer, OK or the caller's own mistake or an expected refusal, is DEBUG: at
/// several thousand calls a second an INFO line per call would cost throughput and drown the
/// log.
fn is_server_failure(code: Code) -> bool {
    matches!(
        code,
        Code::Internal
            | Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::DataLoss
    )
}

/// The RPC a request path names, if it is one of the ledger's.
fn ledger_rpc(path: &str) -> Option<&'static str> {
    if !path.starts_with(LEDGER_PATH) {
        return None;
    }
    // tonic answers an unknown method UNIMPLEMENTED; the caller's text is not echoed into the
    // log.
    Some(Rpc::from_path(path).map_or("unknown", Rpc::name))
}

/// The gRPC code and `ErrorInfo` reason of a response's headers. A unary call that fails is a
/// trailers-only response, so its `grpc-status` is in the headers; one that succeeds has its
/// status in the trailers, so no `grpc-status` here means OK.
fn answer<B>(response: &http::Response<B>) -> (Code, Option<String>) {
    let Some(status) = tonic::Status::from_header_map(response.headers()) else {
        return (Code::Ok, None);
    };
    // Only failed calls pay for decoding the details.
    let reason = tonic_types::StatusExt::get_details_error_info(&status).map(|info| info.reason);
    (status.code(), reason)
}

/// The tower layer that opens a `call` span for each ledger RPC, runs the call inside it, and
/// logs one "call finished" event with the call's fields, code and latency.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallLogLayer;

impl<S> tower::Layer<S> for CallLogLayer {
    type Service = CallLog<S>;

    fn layer(&self, inner: S) -> CallLog<S> {
        CallLog { inner }
    }
}

/// The service [`CallLogLayer`] makes.
#[derive(Clone, Debug)]
pub struct CallLog<S> {
    /// The server's routes.
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for CallLog<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(rpc) = ledger_rpc(request.uri().path()) else {
            return Box::pin(self.inner.call(request));
        };
        let started = Instant::now();
        let parent = remote_parent(request.headers());
        // The call's exported span: enabled only by the OpenTelemetry layer, so without traces
        // it is never created. A root here; its parent is the caller's, set in `CallIds::new`.
        let server = tracing::info_span!(
            target: traces::TARGET,
            parent: None,
            "rpc",
            otel.name = traces::span_name(rpc),
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = SERVICE,
            rpc.method = traces::method_attribute(rpc),
        );
        let ids = CallIds::new(&server, parent);
        // Inside the exported span, so that the spans of the call's work find it through this
        // one, which the exporter does not see (and the log sees this one only).
        let span = server.in_scope(|| {
            tracing::debug_span!(
                target: LOG_TARGET,
                "call",
                rpc,
                tenant = Empty,
                tool = Empty,
                key = Empty,
                trace_id = ids.trace_hex().as_ref().map(Hex::as_str),
                parent_span_id = ids.parent_hex().as_ref().map(Hex::as_str),
                span_id = ids.span_hex().as_str(),
            )
        });
        // The routes may run the interceptor when called, not only when polled.
        let inner = server.in_scope(|| span.in_scope(|| self.inner.call(request)));
        let call = CALL.scope(RefCell::new(CallRecord::default()), async move {
            let result = inner.await;
            (result, CALL.with(|c| c.take()))
        });
        let mut log = CallLogGuard {
            rpc,
            ids,
            started,
            record: CallRecord::default(),
            answer: None,
            server: server.clone(),
        };
        Box::pin(async move {
            let (result, record) = call.instrument(span).instrument(server).await;
            let sent = match &result {
                Ok(response) => answer(response),
                Err(_) => (Code::Unknown, None),
            };
            log.answered(record, sent);
            result
        })
    }
}

/// Logs a call's access line when the call's future ends, also when it is dropped unanswered
/// (the client cancelled, or tonic's own `grpc-timeout` ended it): that call is logged as
/// CANCELLED, with what was known before the handler ran. With traces exported, it also gives
/// the call's span its attributes, and the span ends after it.
struct CallLogGuard {
    rpc: &'static str,
    ids: CallIds,
    started: Instant,
    record: CallRecord,
    /// The code and reason sent; `None` while the call runs.
    answer: Option<(Code, Option<String>)>,
    /// The exported span (disabled without traces).
    server: tracing::Span,
}

impl CallLogGuard {
    /// The call ended with `answer`; what its handler learned is `record`.
    fn answered(&mut self, record: CallRecord, answer: (Code, Option<String>)) {
        self.record = record;
        self.answer = Some(answer);
    }
}

impl Drop for CallLogGuard {
    fn drop(&mut self) {
        let (code, reason) = self.answer.take().unwrap_or((Code::Cancelled, None));
        if !self.server.is_disabled() {
            describe(&self.server, &self.record, code, reason.as_deref());
        }
        finished(
            self.rpc,
            &self.record,
            &self.ids,
            code,
            reason.as_deref(),
            self.started,
        );
    }
}

/// Gives a call's exported span what the call's access line says: the RPC conventions' status
/// code, and the ledger's identifiers and answers (never an argument, a result or an error
/// text sent by the caller). The code and the status are set last, when the call ended.
fn describe(server: &tracing::Span, c: &CallRecord, code: Code, reason: Option<&str>) {
    server.set_attribute("rpc.grpc.status_code", i64::from(code as i32));
    if let Some(tenant) = &c.tenant {
        server.set_attribute("ledger.tenant", tenant.clone());
    }
    if let Some(tool) = &c.tool {
        server.set_attribute("ledger.tool", tool.clone());
    }
    if let Some(key) = &c.key {
        server.set_attribute("ledger.key_prefix", key.clone());
    }
    if let Some(outcome) = c.outcome {
        server.set_attribute("ledger.outcome", outcome);
    }
    if let Some(status) = c.status {
        server.set_attribute("ledger.status", status);
    }
    if let Some(attempt) = c.attempt {
        server.set_attribute("ledger.attempt", i64::from(attempt));
    }
    if let Some(reason) = reason {
        // A reason is one of the ledger's own SCREAMING_SNAKE_CASE words.
        server.set_attribute("ledger.reason", reason.to_string());
    }
    if traces::is_error_status(code) {
        server.set_status(opentelemetry::trace::Status::error(code_name(code)));
    }
}

/// Logs the access line of one call, outside its span, with every field on the event itself,
/// so the line reads alike whether or not DEBUG spans are enabled.
fn finished(
    rpc: &'static str,
    c: &CallRecord,
    ids: &CallIds,
    code: Code,
    reason: Option<&str>,
    started: Instant,
) {
    // Whole microseconds, so the number prints short (0.412, not 0.41200000000000003).
    let latency_ms = started.elapsed().as_micros() as f64 / 1000.0;
    // The ids are formatted only if the line is written (tracing evaluates the fields then).
    macro_rules! event {
        ($level:expr) => {
            tracing::event!(
                target: LOG_TARGET,
                $level,
                rpc,
                tenant = c.tenant.as_deref(),
                tool = c.tool.as_deref(),
                key = c.key.as_deref(),
                outcome = c.outcome,
                status = c.status,
                attempt = c.attempt,
                code = code_name(code),
                reason,
                latency_ms,
                trace_id = ids.trace_hex().as_ref().map(Hex::as_str),
                parent_span_id = ids.parent_hex().as_ref().map(Hex::as_str),
                span_id = ids.span_hex().as_str(),
                "call finished"
            )
        };
    }
    if is_server_failure(code) {
        event!(tracing::Level::WARN);
    } else {
        event!(tracing::Level::DEBUG);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::SpanId;

    use super::trace_context::new_span_id;
    use super::*;

    #[test]
    fn server_failures_are_warnings_and_every_other_answer_is_debug() {
        for code in [Code::Internal, Code::Unavailable, Code::DeadlineExceeded] {
            assert!(is_server_failure(code), "{code:?}");
        }
        for code in [
            Code::Ok,
            Code::InvalidArgument,
            Code::FailedPrecondition,
            Code::NotFound,
            Code::Unauthenticated,
            Code::ResourceExhausted,
            Code::Unimplemented,
        ] {
            assert!(!is_server_failure(code), "{code:?}");
        }
    }

    #[test]
    fn only_ledger_paths_are_logged_and_unknown_methods_are_not_echoed() {
        assert_eq!(
            ledger_rpc("/idempotency.v1.LedgerService/Claim"),
            Some("Claim")
        );
        assert_eq!(
            ledger_rpc("/idempotency.v1.LedgerService/ListEntries"),
            Some("ListEntries")
        );
        assert_eq!(
            ledger_rpc("/idempotency.v1.LedgerService/sk_live_x"),
            Some("unknown")
        );
        assert_eq!(ledger_rpc("/grpc.health.v1.Health/Check"), None);
    }

    #[test]
    fn key_prefixes_are_twelve_characters_and_span_ids_are_distinct_and_valid() {
        assert_eq!(key_prefix(&"ab".repeat(32)), "abababababab");
        assert_eq!(key_prefix("short"), "short");
        assert_eq!(key_prefix("ééééééééééééééé"), "éééééééééééé");
        let ids: std::collections::HashSet<SpanId> = (0..10_000).map(|_| new_span_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(!ids.contains(&SpanId::INVALID));
    }

    #[test]
    fn without_traces_a_call_without_trace_context_allocates_only_its_future() {
        use tower::{Layer as _, Service as _};
        // The server's log subscriber without traces, at the default level.
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(log_filter())
            .with_writer(std::io::sink)
            .finish();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        tracing::subscriber::with_default(subscriber, || {
            let mut service = CallLogLayer.layer(tower::service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            }));
            let request = || {
                http::Request::builder()
                    .uri("/idempotency.v1.LedgerService/Claim")
                    .body(())
                    .expect("request")
            };
            // The first call registers the callsites.
            runtime.block_on(service.call(request())).expect("call");
            let requests: Vec<_> = (0..100).map(|_| request()).collect();
            let before = crate::counting_alloc::allocations();
            for r in requests {
                runtime.block_on(service.call(r)).expect("call");
            }
            let per_call = (crate::counting_alloc::allocations() - before) as f64 / 100.0;
            // The boxed future of the layer; no span, no id text, no trace context.
            assert_eq!(per_call, 1.0);
        });
    }
}
