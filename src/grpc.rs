//! The gRPC face of the ledger: the generated `idempotency.v1` types, the `LedgerService`
//! implementation and the proto ↔ domain conversions. Each RPC converts its request, runs the
//! use case to completion in its own task (so a cancelled call never abandons a write halfway),
//! bounded by the call's deadline, and converts the answer back.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::admission::Admission;
use crate::domain::canonical::Canonicalization;
use crate::domain::{FinalStatus, Micros, Tenant};
use crate::error::LedgerError;
use crate::ledger::{
    ClaimInput, ClaimOutput, CompleteInput, EntryView, Ledger, ListInput, LookupInput, Outcome,
    ReconcileInput, RenewInput, ResolutionInput,
};
use crate::observe::Metrics;
use crate::observe::telemetry;

/// The generated protobuf types and service traits of `idempotency.v1`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("idempotency.v1");

    /// The encoded descriptors of `ledger.proto` and its imports, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/ledger_descriptor.bin"));

    /// The descriptors of the `google.rpc` error details the ledger sends, so that reflective
    /// clients (grpcurl) decode them.
    pub const ERROR_DETAILS_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/error_details_descriptor.bin"));
}

pub use pb::ledger_service_server::{LedgerService, LedgerServiceServer};

/// How much earlier than the caller's deadline the server answers DEADLINE_EXCEEDED (or a
/// waiting claim answers IN_PROGRESS), so the answer arrives before the caller gives up.
const DEADLINE_MARGIN_MAX: Duration = Duration::from_millis(50);

/// How much of a call's remaining time a waiting claim keeps for its last read and its
/// answer: a fifth, within these bounds.
const ANSWER_RESERVE_MIN: Duration = Duration::from_millis(50);
const ANSWER_RESERVE_MAX: Duration = Duration::from_millis(250);

/// The `LedgerService` implementation: a thin shell over [`Ledger`].
#[derive(Clone)]
pub struct LedgerApi {
    /// The use cases.
    ledger: Ledger,
    /// What was answered, for the metrics endpoint.
    metrics: Arc<Metrics>,
    /// Which calls run now, and which are shed.
    admission: Arc<Admission>,
    /// The longest any call may take, whatever its own deadline.
    request_timeout: Duration,
}

/// What a call runs with once admitted.
struct Call {
    /// From the credential.
    tenant: Tenant,
    /// The earlier of the caller's deadline and the server's request timeout.
    deadline: Instant,
    /// Its place among the calls running now; released when its work ends.
    permit: OwnedSemaphorePermit,
}

impl LedgerApi {
    /// The service over `ledger`, counting into `metrics`, admitting calls through `admission`
    /// and ending any call after `request_timeout`.
    pub fn new(
        ledger: Ledger,
        metrics: Arc<Metrics>,
        admission: Arc<Admission>,
        request_timeout: Duration,
    ) -> LedgerApi {
        LedgerApi {
            ledger,
            metrics,
            admission,
            request_timeout,
        }
    }

    /// The call's tenant (set by the auth interceptor), its deadline, and its admission.
    fn begin<T>(&self, request: &Request<T>) -> Result<Call, Status> {
        let tenant = request
            .extensions()
            .get::<Tenant>()
            .cloned()
            .ok_or_else(|| {
                Status::from(LedgerError::Internal("no tenant on the request".into()))
            })?;
        telemetry::record_tenant(&tenant);
        let limit = Instant::now() + self.request_timeout;
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .map_or(limit, |t| limit.min(Instant::now() + t));
        let permit = self.observe(self.admission.admit(&tenant))?;
        Ok(Call {
            tenant,
            deadline,
            permit,
        })
    }

    /// Counts a call that failed before its work began, for the store's sake (or a bug's), and
    /// turns its error into the status sent. (The work's own errors are counted in its task,
    /// by [`run`]; every call's code around the service, by
    /// [`crate::observe::GrpcMetricsLayer`].)
    fn observe<T>(&self, result: Result<T, LedgerError>) -> Result<T, Status> {
        result.map_err(|e| {
            self.metrics.call_failed(&e);
            Status::from(e)
        })
    }
}

#[tonic::async_trait]
impl LedgerService for LedgerApi {
    async fn claim(
        &self,
        request: Request<pb::ClaimRequest>,
    ) -> Result<Response<pb::ClaimResponse>, Status> {
        let Call {
            tenant,
            deadline,
            permit,
        } = self.begin(&request)?;
        let r = request.into_inner();
        let mut input = ClaimInput {
            run_id: r.run_id,
            tool: r.tool,
            arguments_json: r.arguments_json,
            key: r.key,
            canonicalization: canonicalization(r.canonicalization)?,
            lease: duration("lease", r.lease)?,
            retention: duration("retention", r.retention)?,
            wait: duration("wait", r.wait)?,
            principal: r.principal,
        };
        telemetry::record_request(&input.tool, &input.key);
        // A wait ends a little before the call's deadline, so the caller gets IN_PROGRESS
        // rather than an expired call.
        if let Some(wait) = input.wait {
            let remaining = deadline.saturating_duration_since(Instant::now());
            // Leave time for the last read and the answer, even on a loaded machine.
            let reserve = (remaining / 5).clamp(ANSWER_RESERVE_MIN, ANSWER_RESERVE_MAX);
            input.wait = Some(wait.min(remaining.saturating_sub(reserve)));
        }
        let ledger = self.ledger.clone();
        // Counted in the task, with the store's change: a replay counts even if the caller's
        // deadline passed before it got the answer.
        let (metrics, tool) = (self.metrics.clone(), input.tool.clone());
        let out = run(&self.metrics, deadline, permit, async move {
            let out = ledger.claim(&tenant, input).await;
            metrics.claim(&tool, &out);
            out
        })
        .await;
        let out = out.map_err(Status::from)?;
        telemetry::record_claim(&out);
        Ok(Response::new(claim_response(out)))
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let Call {
            tenant,
            deadline,
            permit,
        } = self.begin(&request)?;
        let r = request.into_inner();
        let input = CompleteInput {
            key: r.key,
            claim_token: r.claim_token,
            status: final_status("status", r.status)?,
            result: r.result.to_vec(),
            error: r.error,
            retryable: r.retryable,
        };
        telemetry::record_request("", &input.key);
        let ledger = self.ledger.clone();
        let (metrics, status) = (self.metrics.clone(), input.status);
        let out = run(&self.metrics, deadline, permit, async move {
            let out = ledger.complete(&tenant, input).await;
            metrics.complete(status, &out);
            out
        })
        .await;
        let out = out.map_err(Status::from)?;
        telemetry::record_entry(&out.entry);
        Ok(Response::new(pb::CompleteResponse {
            entry: Some(entry(out.entry)),
            already_completed: out.already_completed,
        }))
    }

    async fn lookup(
        &self,
        request: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupResponse>, Status> {
        let Call {
            tenant,
            deadline,
            permit,
        } = self.begin(&request)?;
        let r = request.into_inner();
        let input = LookupInput {
            key: r.key,
            run_id: r.run_id,
            tool: r.tool,
            arguments_json: r.arguments_json,
            canonicalization: canonicalization(r.canonicalization)?,
        };
        telemetry::record_request(&input.tool, &input.key);
        let ledger = self.ledger.clone();
        let view = run(&self.metrics, deadline, permit, async move {
            ledger.lookup(&tenant, input).await
        })
        .await;
        let view = view.map_err(Status::from)?;
        telemetry::record_entry(&view);
        Ok(Response::new(pb::LookupResponse {
            entry: Some(audited_entry(view)),
        }))
    }

    async fn reconcile(
        &self,
        request: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        let Call {
            tenant,
            deadline,
            permit,
        } = self.begin(&request)?;
        let r = request.into_inner();
        let resolutions = r
            .resolutions
            .into_iter()
            .map(|res| {
                Ok(ResolutionInput {
                    key: res.key,
                    status: final_status("resolutions", res.status)?,
                    result: res.result.to_vec(),
                    error: res.error,
                    retryable: res.retryable,
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let input = ReconcileInput {
            older_than: duration("older_than", r.older_than)?,
            tool: r.tool,
            limit: r.limit,
            resolutions,
            resolve_only: r.resolve_only,
        };
        telemetry::record_request(&input.tool, "");
        let ledger = self.ledger.clone();
        let metrics = self.metrics.clone();
        let statuses: Vec<FinalStatus> = input.resolutions.iter().map(|r| r.status).collect();
        let out = run(&self.metrics, deadline, permit, async move {
            let out = ledger.reconcile(&tenant, input).await;
            if out.is_ok() {
                metrics.resolutions(statuses);
            }
            out
        })
        .await;
        let out = out.map_err(Status::from)?;
        Ok(Response::new(pb::ReconcileResponse {
            pending: out.pending.into_iter().map(entry).collect(),
            resolved: out.resolved.into_iter().map(entry).collect(),
        }))
    }

    async fn list_entries(
        &self,
        request: Request<pb::ListEntriesRequest>,
    ) -> Result<Response<pb::ListEntriesResponse>, Status> {
        let Call {
            tenant,
            deadline,
            permit,
        } = self.begin(&request)?;
        let r = request.into_inner();
        let input = ListInput {
            run_id: r.run_id,
            tool: r.tool,
            status: status_filter(r.status)?,
            started_after: instant("started_after", r.started_after)?,
            started_before: instant("started_before", r.started_before)?,
            page_size: u32::try_from(r.page_size).map_err(|_| {
                Status::from(LedgerError::invalid("page_size", "must not be negative"))
            })?,
            page_token: r.page_token,
        };
        telemetry::record_request(&input.tool, "");
        let ledger = self.ledger.clone();
        let out = run(&self.metrics, deadline, permit, async move {
            ledger.list_entries(&tenant, input).await
        })
        .await;
        let out = out.map_err(Status::from)?;
        Ok(Response::new(pb::ListEntriesResponse {
            entries: out.entries.into_iter().map(audited_entry).collect(),
            next_page_token: out.next_page_token,
        }))
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        let Call {
            tenant,
            deadline,
            permit,
        } = self.begin(&request)?;
        let r = request.into_inner();
        let input = RenewInput {
            key: r.key,
            claim_token: r.claim_token,
            lease: duration("lease", r.lease)?,
        };
        telemetry::record_request("", &input.key);
        let ledger = self.ledger.clone();
        let out = run(&self.metrics, deadline, permit, async move {
            ledger.renew_lease(&tenant, input).await
        })
        .await;
        let out = out.map_err(Status::from)?;
        telemetry::record_entry(&out);
        Ok(Response::new(pb::RenewLeaseResponse {
            entry: Some(entry(out)),
        }))
    }
}

/// A service answering `inner`'s library refusals as [`rewrite_library_errors`] describes: what
/// the server puts around the ledger service, inside its metrics and access log, so that the
/// rewrite happens once and both see the code the caller gets.
#[derive(Clone, Debug)]
pub struct LibraryErrors<S> {
    inner: S,
}

impl<S> LibraryErrors<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> LibraryErrors<S> {
        LibraryErrors { inner }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for LibraryErrors<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<http::Request<tonic::body::Body>> for LibraryErrors<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<B>,
            Error = std::convert::Infallible,
        > + Send,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(rewrite_library_errors(response.map(tonic::body::Body::new)))
        })
    }
}

/// tonic answers two kinds of bad input itself, before any handler runs: a request over the
/// message-size limit (OUT_OF_RANGE) and one that does not decode, such as a string field that
/// is not UTF-8 (INTERNAL). The contract answers limits with RESOURCE_EXHAUSTED (as gRPC itself
/// specifies for oversized messages), malformed input with INVALID_ARGUMENT, and every error
/// with an ErrorInfo: this rewrites those two answers, and passes every other one through.
fn rewrite_library_errors(
    response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let headers = response.headers();
    let code = headers.get("grpc-status").and_then(|v| v.to_str().ok());
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("");
    let said = |text: &str| message.contains(text) || message.contains(&text.replace(' ', "%20"));
    let (code, reason, text) = match code {
        Some("11") if said("message length too large") => (
            tonic::Code::ResourceExhausted,
            "MESSAGE_TOO_LARGE",
            "the request is larger than the server's --max-message-bytes",
        ),
        Some("13") if said("failed to decode Protobuf message") => (
            tonic::Code::InvalidArgument,
            "MALFORMED_MESSAGE",
            "the request is not a valid protobuf message of this method (a string field that \
             is not UTF-8, or a field of the wrong type)",
        ),
        _ => return response,
    };
    let mut details = tonic_types::ErrorDetails::new();
    details.set_error_info(
        reason,
        crate::error::ERROR_DOMAIN,
        std::collections::HashMap::new(),
    );
    <Status as tonic_types::StatusExt>::with_error_details(code, text, details).into_http()
}

fn margin(deadline: Instant) -> Duration {
    (deadline.saturating_duration_since(Instant::now()) / 10).min(DEADLINE_MARGIN_MAX)
}

/// Runs `work` in its own task, holding the call's admission `permit` until the work ends, so
/// that a cancelled or timed-out call never drops a write halfway; answers DEADLINE_EXCEEDED
/// shortly before the deadline if it is still running. The work's store errors are counted
/// in the task, once, also when the caller is no longer waiting.
async fn run<T, F>(
    metrics: &Arc<Metrics>,
    deadline: Instant,
    permit: OwnedSemaphorePermit,
    work: F,
) -> Result<T, LedgerError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, LedgerError>> + Send + 'static,
{
    let counted = metrics.clone();
    // In the call's span, so what the ledger and the store log is the call's.
    let task = tokio::spawn(
        async move {
            let done = work.await;
            if let Err(e) = &done {
                counted.call_failed(e);
            }
            drop(permit);
            done
        }
        .instrument(tracing::Span::current()),
    );
    match tokio::time::timeout_at(deadline - margin(deadline), task).await {
        Ok(joined) => joined.map_err(|e| {
            let e = LedgerError::Internal(format!("request task failed: {e}"));
            metrics.call_failed(&e);
            e
        })?,
        Err(_) => Err(LedgerError::DeadlineExceeded),
    }
}

/// Parses a `grpc-timeout` header value: up to 8 digits and a unit (H, M, S, m, u, n).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn canonicalization(value: i32) -> Result<Canonicalization, Status> {
    match pb::Canonicalization::try_from(value) {
        Ok(pb::Canonicalization::Unspecified | pb::Canonicalization::Jcs) => {
            Ok(Canonicalization::Jcs)
        }
        Ok(pb::Canonicalization::JcsLenient) => Ok(Canonicalization::JcsLenient),
        Err(_) => Err(LedgerError::invalid(
            "canonicalization",
            format!("{value} is not a Canonicalization value"),
        )
        .into()),
    }
}

/// A reported status of `field`: Complete accepts the three outcomes (Reconcile then refuses
/// UNKNOWN, which is no finding).
fn final_status(field: &'static str, value: i32) -> Result<FinalStatus, Status> {
    match pb::Status::try_from(value) {
        Ok(pb::Status::Succeeded) => Ok(FinalStatus::Succeeded),
        Ok(pb::Status::Failed) => Ok(FinalStatus::Failed),
        Ok(pb::Status::Unknown) => Ok(FinalStatus::Unknown),
        _ => Err(LedgerError::invalid(
            field,
            "must be STATUS_SUCCEEDED, STATUS_FAILED or STATUS_UNKNOWN",
        )
        .into()),
    }
}

/// A proto duration as a std one; unset stays `None`, negative or malformed is refused.
fn duration(
    field: &'static str,
    value: Option<prost_types::Duration>,
) -> Result<Option<Duration>, Status> {
    let Some(d) = value else { return Ok(None) };
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return Err(LedgerError::invalid(field, "must be a non-negative duration").into());
    }
    Ok(Some(
        Duration::from_secs(d.seconds.unsigned_abs())
            + Duration::from_nanos(d.nanos.unsigned_abs().into()),
    ))
}

fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn timestamp(m: Micros) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: m.0.div_euclid(1_000_000),
        nanos: i32::try_from(m.0.rem_euclid(1_000_000) * 1000).unwrap_or(0),
    }
}

fn status(s: crate::domain::Status) -> pb::Status {
    match s {
        crate::domain::Status::Attempting => pb::Status::Attempting,
        crate::domain::Status::Succeeded => pb::Status::Succeeded,
        crate::domain::Status::Failed => pb::Status::Failed,
        crate::domain::Status::Unknown => pb::Status::Unknown,
    }
}

/// A state a listing may filter by; unspecified means any.
fn status_filter(value: i32) -> Result<Option<crate::domain::Status>, Status> {
    use crate::domain::Status as S;
    match pb::Status::try_from(value) {
        Ok(pb::Status::Unspecified) => Ok(None),
        Ok(pb::Status::Attempting) => Ok(Some(S::Attempting)),
        Ok(pb::Status::Succeeded) => Ok(Some(S::Succeeded)),
        Ok(pb::Status::Failed) => Ok(Some(S::Failed)),
        Ok(pb::Status::Unknown) => Ok(Some(S::Unknown)),
        Err(_) => {
            Err(LedgerError::invalid("status", format!("{value} is not a Status value")).into())
        }
    }
}

/// A proto timestamp as microseconds since the epoch; unset stays `None`, malformed is
/// refused.
fn instant(
    field: &'static str,
    value: Option<prost_types::Timestamp>,
) -> Result<Option<Micros>, Status> {
    let Some(t) = value else { return Ok(None) };
    if !(0..1_000_000_000).contains(&t.nanos) {
        return Err(LedgerError::invalid(field, "nanos must be within 0..999999999").into());
    }
    t.seconds
        .checked_mul(1_000_000)
        .and_then(|us| us.checked_add(i64::from(t.nanos / 1000)))
        .map(|us| Some(Micros(us)))
        .ok_or_else(|| LedgerError::invalid(field, "is out of range").into())
}

/// An entry with the arguments kept for audit: what Lookup and ListEntries answer.
fn audited_entry(mut view: EntryView) -> pb::Entry {
    let arguments = view.entry.arguments.take().unwrap_or_default();
    pb::Entry {
        arguments_json: arguments,
        ..entry(view)
    }
}

/// An entry as Claim, Complete and Reconcile answer it: about the outcome, without the
/// stored arguments.
fn entry(view: EntryView) -> pb::Entry {
    let e = view.entry;
    pb::Entry {
        key: e.key,
        run_id: e.run_id,
        tool: e.tool,
        fingerprint: e.fingerprint,
        status: status(view.status).into(),
        attempt: e.attempt,
        result: e.result.into(),
        error: e.error,
        retryable: e.retryable,
        principal: e.principal,
        started_at: Some(timestamp(e.started_at)),
        finished_at: e.finished_at.map(timestamp),
        lease_expires_at: Some(timestamp(e.lease_expires_at)),
        expires_at: e.expires_at.map(timestamp),
        replay_count: e.replay_count,
        external_ref: view.external_ref,
        arguments_json: String::new(),
    }
}

fn claim_response(out: ClaimOutput) -> pb::ClaimResponse {
    let outcome = match out.outcome {
        Outcome::Claimed => pb::Outcome::Claimed,
        Outcome::Replayed => pb::Outcome::Replayed,
        Outcome::InProgress => pb::Outcome::InProgress,
        Outcome::PreviouslyFailed => pb::Outcome::PreviouslyFailed,
    };
    pb::ClaimResponse {
        outcome: outcome.into(),
        entry: Some(entry(out.entry)),
        claim_token: out.claim_token.unwrap_or_default(),
        note: out.note,
        retry_after: out.retry_after.map(proto_duration),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit() {
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("100u"), Some(Duration::from_micros(100)));
        assert_eq!(parse_grpc_timeout("100n"), Some(Duration::from_nanos(100)));
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
    }

    #[test]
    fn timestamps_split_micros_into_seconds_and_nanos() {
        let t = timestamp(Micros(1_700_000_000_123_456));
        assert_eq!((t.seconds, t.nanos), (1_700_000_000, 123_456_000));
        let before_epoch = timestamp(Micros(-1));
        assert_eq!(
            (before_epoch.seconds, before_epoch.nanos),
            (-1, 999_999_000)
        );
    }

    #[test]
    fn negative_durations_are_refused_and_unset_ones_stay_unset() {
        assert_eq!(duration("lease", None).ok(), Some(None));
        let neg = prost_types::Duration {
            seconds: -1,
            nanos: 0,
        };
        assert!(duration("lease", Some(neg)).is_err());
        let ok = prost_types::Duration {
            seconds: 1,
            nanos: 500_000_000,
        };
        assert_eq!(
            duration("lease", Some(ok)).ok(),
            Some(Some(Duration::from_millis(1500)))
        );
    }
}
