//! Logs: the subscriber (`--log-format text|json`, filtered by `RUST_LOG`, to stderr), one
//! `call` span per ledger RPC with the W3C trace context of its `traceparent`, and one
//! "call finished" event per call, the access log.
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
//! Everything this module logs has the target [`LOG_TARGET`], `idempotency_ledger::telemetry`,
//! the module's path before it moved under `observe`: log pipelines and `RUST_LOG` filters name
//! it.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::time::Instant;
use tonic::Code;
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_subscriber::EnvFilter;

use super::Rpc;
use crate::domain::Tenant;
use crate::error::code_name;
use crate::ledger::{ClaimOutput, EntryView};
use crate::splitmix::SplitMix64;

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
/// everything goes to stderr.
///
/// # Errors
/// A subscriber was already installed.
pub fn init(format: LogFormat) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        // Flattened, so a pipeline reads `rpc` or `code` at the top level; only the current
        // span, because the call span is the only one the ledger opens.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    }
}

/// A valid W3C `traceparent` (<https://www.w3.org/TR/trace-context/#traceparent-header>), its
/// ids as the lowercase hex they were sent in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceParent {
    /// 32 lowercase hex digits, not all zero.
    pub trace_id: String,
    /// 16 lowercase hex digits, not all zero: the caller's span, our call's parent.
    pub parent_id: String,
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

/// Why a `traceparent` was ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TraceParentError {
    /// Not `version-trace_id-parent_id-flags` with 2, 32, 16 and 2 characters.
    #[error("not version-traceid-parentid-flags of 2, 32, 16 and 2 characters")]
    Shape,
    /// A field holds something other than lowercase hex digits.
    #[error("a field is not lowercase hex")]
    NotLowercaseHex,
    /// Version `ff` is forbidden; version `00` has nothing after the flags.
    #[error("version ff, or data after the flags of version 00")]
    Version,
    /// The trace id or parent id is all zeros.
    #[error("an all-zero trace id or parent id")]
    ZeroId,
}

impl TraceParent {
    /// Parses a `traceparent` value as the W3C recommendation says: version `00` is exactly
    /// `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, with non-zero ids; a later version (`01` to
    /// `fe`) is read the same way and may have more after a `-` following the flags; `ff` is
    /// invalid.
    ///
    /// # Errors
    /// What makes the value invalid; the caller then starts no trace from it.
    pub fn parse(value: &str) -> Result<TraceParent, TraceParentError> {
        let b = value.as_bytes();
        if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(TraceParentError::Shape);
        }
        let lower_hex = |s: &[u8]| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        let (version, trace_id, parent_id, flags) = (&b[..2], &b[3..35], &b[36..52], &b[53..55]);
        if ![version, trace_id, parent_id, flags]
            .into_iter()
            .all(lower_hex)
        {
            return Err(TraceParentError::NotLowercaseHex);
        }
        let future_version_rest = b.len() == 55 || b[55] == b'-';
        if version == b"ff" || (version == b"00" && b.len() != 55) || !future_version_rest {
            return Err(TraceParentError::Version);
        }
        if trace_id.iter().all(|&c| c == b'0') || parent_id.iter().all(|&c| c == b'0') {
            return Err(TraceParentError::ZeroId);
        }
        // Every byte checked above is ASCII, so these slices are whole characters.
        Ok(TraceParent {
            trace_id: value[3..35].to_string(),
            parent_id: value[36..52].to_string(),
            flags: u8::from_str_radix(&value[53..55], 16).map_err(|_| TraceParentError::Shape)?,
        })
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
    tracing::Span::current().record("tenant", tenant.0.as_str());
    with_record(|c| c.tenant = Some(tenant.0.clone()));
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
    record_request(&e.tool, &e.key);
    with_record(|c| {
        c.status = Some(view.status.as_str());
        c.attempt = Some(e.attempt);
    });
}

/// Records a claim's outcome and its entry.
pub fn record_claim(out: &ClaimOutput) {
    record_entry(&out.entry);
    with_record(|c| c.outcome = Some(out.outcome.as_str()));
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

/// A fresh span id for a call: 16 hex digits, never all zero. SplitMix64's output is a
/// bijection of its state, so a per-process random seed plus a counter gives ids unique within
/// the process, at no system call per call.
fn new_span_id() -> String {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let mut bytes = [0u8; 8];
        // Without randomness the ids are still unique in this process, which is what logs need.
        let _ = getrandom::fill(&mut bytes);
        u64::from_le_bytes(bytes)
    });
    let id = SplitMix64(seed.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed))).next();
    format!("{:016x}", id.max(1))
}

/// The trace context of a request: one valid `traceparent`, or none. An invalid one (or
/// several) is ignored, as the recommendation says, and never fails the call.
fn trace_parent(headers: &http::HeaderMap) -> Option<TraceParent> {
    let mut values = headers.get_all("traceparent").iter();
    let value = values.next()?;
    if values.next().is_some() {
        tracing::debug!(target: LOG_TARGET, "ignoring traceparent: sent more than once");
        return None;
    }
    let Ok(text) = value.to_str() else {
        tracing::debug!(target: LOG_TARGET, "ignoring traceparent: not visible ASCII");
        return None;
    };
    match TraceParent::parse(text) {
        Ok(tp) => Some(tp),
        Err(e) => {
            // The value is a header, not a payload; shortened so a junk header cannot bloat
            // the log.
            let shown = text.get(..64).unwrap_or(text);
            tracing::debug!(
                target: LOG_TARGET,
                traceparent = shown,
                error = %e,
                "ignoring an invalid traceparent"
            );
            None
        }
    }
}

/// The gRPC code and `ErrorInfo` reason of a response's headers. A unary call that fails is a
/// trailers-only response, so its `grpc-status` is in the headers; one that succeeds has its
/// status in the trailers, so no `grpc-status` here means OK.
fn answer<B>(response: &http::Response<B>) -> (Code, Option<String>) {
    let headers = response.headers();
    let Some(code) = headers.get("grpc-status") else {
        return (Code::Ok, None);
    };
    let code = code
        .to_str()
        .ok()
        .and_then(|c| c.parse::<i32>().ok())
        .map_or(Code::Unknown, Code::from_i32);
    // Only failed calls pay for decoding the details.
    let reason = tonic::Status::from_header_map(headers)
        .and_then(|s| tonic_types::StatusExt::get_details_error_info(&s).map(|info| info.reason));
    (code, reason)
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
        let trace = trace_parent(request.headers());
        let span_id = new_span_id();
        let span = tracing::debug_span!(
            target: LOG_TARGET,
            "call",
            rpc,
            tenant = Empty,
            tool = Empty,
            key = Empty,
            trace_id = trace.as_ref().map(|t| t.trace_id.as_str()),
            parent_span_id = trace.as_ref().map(|t| t.parent_id.as_str()),
            span_id = span_id.as_str(),
        );
        // The routes may run the interceptor when called, not only when polled.
        let inner = span.in_scope(|| self.inner.call(request));
        let call = CALL.scope(RefCell::new(CallRecord::default()), async move {
            let result = inner.await;
            (result, CALL.with(|c| c.take()))
        });
        let mut log = CallLogGuard {
            rpc,
            trace,
            span_id,
            started,
            record: CallRecord::default(),
            answer: None,
        };
        Box::pin(async move {
            let (result, record) = call.instrument(span).await;
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
/// CANCELLED, with what was known before the handler ran.
struct CallLogGuard {
    rpc: &'static str,
    trace: Option<TraceParent>,
    span_id: String,
    started: Instant,
    record: CallRecord,
    /// The code and reason sent; `None` while the call runs.
    answer: Option<(Code, Option<String>)>,
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
        finished(
            self.rpc,
            &self.record,
            self.trace.as_ref(),
            &self.span_id,
            code,
            reason,
            self.started,
        );
    }
}

/// Logs the access line of one call, outside its span, with every field on the event itself,
/// so the line reads alike whether or not DEBUG spans are enabled.
fn finished(
    rpc: &'static str,
    c: &CallRecord,
    trace: Option<&TraceParent>,
    span_id: &str,
    code: Code,
    reason: Option<String>,
    started: Instant,
) {
    // Whole microseconds, so the number prints short (0.412, not 0.41200000000000003).
    let latency_ms = started.elapsed().as_micros() as f64 / 1000.0;
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
                reason = reason.as_deref(),
                latency_ms,
                trace_id = trace.map(|t| t.trace_id.as_str()),
                parent_span_id = trace.map(|t| t.parent_id.as_str()),
                span_id,
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
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_gives_its_ids_and_flags() {
        assert_eq!(
            TraceParent::parse(VALID),
            Ok(TraceParent {
                trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                parent_id: "00f067aa0ba902b7".into(),
                flags: 1,
            })
        );
        let unsampled = VALID.replace("-01", "-00");
        assert_eq!(TraceParent::parse(&unsampled).map(|t| t.flags), Ok(0));
    }

    #[test]
    fn version_ff_and_data_after_version_00_are_refused_and_later_versions_are_read() {
        assert_eq!(
            TraceParent::parse(&VALID.replacen("00", "ff", 1)),
            Err(TraceParentError::Version)
        );
        assert_eq!(
            TraceParent::parse(&format!("{VALID}-extra")),
            Err(TraceParentError::Version)
        );
        assert_eq!(
            TraceParent::parse(&format!("{VALID}0")),
            Err(TraceParentError::Version)
        );
        let later = VALID.replacen("00", "01", 1);
        assert!(TraceParent::parse(&later).is_ok());
        assert!(TraceParent::parse(&format!("{later}-what-comes-next")).is_ok());
        assert_eq!(
            TraceParent::parse(&format!("{later}x")),
            Err(TraceParentError::Version)
        );
        assert_eq!(
            TraceParent::parse(&VALID.replacen("00", "0g", 1)),
            Err(TraceParentError::NotLowercaseHex)
        );
    }

    #[test]
    fn uppercase_and_non_hex_digits_are_refused() {
        assert_eq!(
            TraceParent::parse(&VALID.to_uppercase()),
            Err(TraceParentError::NotLowercaseHex)
        );
        assert_eq!(
            TraceParent::parse(&VALID.replace("4bf9", "4BF9")),
            Err(TraceParentError::NotLowercaseHex)
        );
        assert_eq!(
            TraceParent::parse(&VALID.replace("00f0", "00z0")),
            Err(TraceParentError::NotLowercaseHex)
        );
        assert_eq!(
            TraceParent::parse(&VALID.replace("-01", "-0x")),
            Err(TraceParentError::NotLowercaseHex)
        );
    }

    #[test]
    fn all_zero_ids_are_refused() {
        let zero_trace = format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32));
        let zero_parent = format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", "0".repeat(16));
        assert_eq!(
            TraceParent::parse(&zero_trace),
            Err(TraceParentError::ZeroId)
        );
        assert_eq!(
            TraceParent::parse(&zero_parent),
            Err(TraceParentError::ZeroId)
        );
    }

    #[test]
    fn wrong_lengths_and_separators_are_refused() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47361-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "004bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
        ] {
            assert_eq!(
                TraceParent::parse(bad),
                Err(TraceParentError::Shape),
                "{bad:?}"
            );
        }
        // Multi-byte characters in the right places never slice a character apart.
        assert!(TraceParent::parse("00-ééééééééééééééé-00f067aa0ba902b7-01éé").is_err());
    }

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
    fn key_prefixes_are_twelve_characters_and_span_ids_are_distinct_hex() {
        assert_eq!(key_prefix(&"ab".repeat(32)), "abababababab");
        assert_eq!(key_prefix("short"), "short");
        assert_eq!(key_prefix("ééééééééééééééé"), "éééééééééééé");
        let ids: std::collections::HashSet<String> = (0..10_000).map(|_| new_span_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(
            ids.iter()
                .all(|id| id.len() == 16 && id.bytes().all(|c| c.is_ascii_hexdigit()))
        );
    }
}
