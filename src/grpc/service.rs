//! The `LedgerService` implementation: a thin shell over [`Ledger`]; each RPC parses its
//! request into the use case's typed input (`inputs`), runs the use case on the call's own
//! task bounded by the deadline (to its end, also when the call is abandoned:
//! [`super::deadline`]), and converts back.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::admission::{Admission, Admitted, HeldBytes};
use super::convert::{
    View, audited_entry, claim_response, completed_entry, entry, history_event, pending_entry,
    replay_rate_response, resolution_result, timestamp,
};
use super::deadline::{parse_grpc_timeout, run};
use super::error::{CallError, status};
use super::inputs::{
    ClaimRequestInput, acknowledge_input, claim_input, complete_input, decide_input, extend_input,
    list_input, lookup_input, reconcile_input, renew_input,
};
use super::pb;
use super::pb::ledger_service_server::LedgerService;
use crate::credentials::Approver;
use crate::domain::fields::ToolName;
use crate::domain::{FinalStatus, Principal, RunId, Tenant};
use crate::error::LedgerError;
use crate::ledger::{
    AcknowledgeInput, CompleteInput, DecideInput, Ledger, ListInput, LookupInput, ReconcileInput,
    RenewInput, approval_cursor,
};
use crate::observe::{Metrics, telemetry};

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
    /// Its place among the calls running now and its request bytes; released when its work
    /// ends (the bytes also wait for the answer to be sent).
    permit: Admitted,
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
            .ok_or_else(|| status(LedgerError::Internal("no tenant on the request".into())))?;
        telemetry::record_tenant(&tenant);
        let limit = Instant::now() + self.request_timeout;
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .map_or(limit, |t| limit.min(Instant::now() + t));
        let running = self.observe(self.admission.admit(&tenant))?;
        let permit = Admitted::new(running, request.extensions().get::<HeldBytes>().cloned());
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
    fn observe<T>(&self, result: Result<T, CallError>) -> Result<T, Status> {
        result.map_err(|e| {
            if let CallError::Ledger(e) = &e {
                self.metrics.call_failed(e);
            }
            Status::from(e)
        })
    }

    /// One unary RPC, the same way for each: admitted (its tenant from the credential, its
    /// deadline), its request turned into the use case's input by `input` (given the deadline;
    /// a bad field is refused before any work), named in the call's span by [`Labels`], `work`
    /// run on the call's own task to its end within the deadline, and its output turned into
    /// the answer by `answer`.
    async fn unary<Req, In, Out, Resp, Fut>(
        &self,
        request: Request<Req>,
        input: impl FnOnce(Req, Instant) -> Result<In, Status>,
        work: impl FnOnce(Ledger, Tenant, In) -> Fut,
        answer: impl FnOnce(Out) -> Resp,
    ) -> Result<Response<Resp>, Status>
    where
        In: Labels,
        Out: Send + 'static,
        Fut: Future<Output = Result<Out, LedgerError>> + Send + 'static,
    {
        let Call {
            tenant,
            deadline,
            permit,
        } = self.begin(&request)?;
        let input = input(request.into_inner(), deadline)?;
        let (tool, key) = input.labels();
        telemetry::record_request(tool, key);
        // Boxed where made: a use case's future is KBs, else copied whole into `run` and its box.
        let work = Box::pin(work(self.ledger.clone(), tenant, input));
        let out = run(&self.metrics, deadline, permit, work)
            .await
            .map_err(Status::from)?;
        Ok(Response::new(answer(out)))
    }
}

/// How often a watcher reads the store for approval events of other servers (events of its
/// own server wake it at once).
const WATCH_POLL: Duration = Duration::from_millis(500);

/// The approval events one read of a watcher takes at most.
const WATCH_BATCH: u32 = 100;

/// The stream WatchApprovals answers with.
type ApprovalStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::WatchApprovalsResponse, Status>> + Send>,
>;

#[tonic::async_trait]
impl LedgerService for LedgerApi {
    type WatchApprovalsStream = ApprovalStream;

    async fn decide(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let approver = request
            .extensions()
            .get::<Approver>()
            .and_then(|a| a.0.clone());
        let metrics = self.metrics.clone();
        self.unary(
            request,
            |r, _| {
                let Some(approver) = approver else {
                    return Err(Status::from(CallError::PermissionDenied(
                        "this credential may not decide: Decide needs a credential with the \
                         approver role (the tokens file's third column, `approver`)",
                    )));
                };
                Ok((decide_input(r)?, approver))
            },
            |ledger, tenant, (input, approver)| async move {
                let choice = input.decision;
                let out = ledger.decide(&tenant, input, &approver).await;
                if let Ok(decided) = &out {
                    metrics.decided(choice, decided.changed, decided.took);
                }
                out.map(|out| (out, choice))
            },
            |(out, choice)| {
                telemetry::record_decision(&out.entry, choice, out.changed);
                pb::DecideResponse {
                    entry: Some(audited_entry(out.entry)),
                }
            },
        )
        .await
    }

    async fn extend_run(
        &self,
        request: Request<pb::ExtendRunRequest>,
    ) -> Result<Response<pb::ExtendRunResponse>, Status> {
        self.unary(
            request,
            |r, _| extend_input(r).map(|(run_id, retention)| ExtendInput(run_id, retention)),
            |ledger, tenant, ExtendInput(run_id, retention)| async move {
                ledger.extend_run(&tenant, &run_id, retention).await
            },
            |(extended, kept_until)| pb::ExtendRunResponse {
                extended,
                kept_until: kept_until.map(timestamp),
            },
        )
        .await
    }

    async fn watch_approvals(
        &self,
        request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        // Admitted like any call, then released: a watch may last for hours and must not hold
        // a place among the calls running now.
        let Call { tenant, .. } = self.begin(&request)?;
        let after = approval_cursor(&request.into_inner().after).map_err(status)?;
        let ledger = self.ledger.clone();
        let (first, mut cursor) = ledger
            .approval_events(&tenant, after, WATCH_BATCH)
            .await
            .map_err(status)?;
        let (sender, receiver) = tokio::sync::mpsc::channel(WATCH_BATCH as usize);
        tokio::spawn(async move {
            let mut batch = first;
            loop {
                for event in batch.drain(..) {
                    let answer = pb::WatchApprovalsResponse {
                        cursor: event.cursor.to_string(),
                        kind: event.kind.to_string(),
                        at: Some(timestamp(event.at)),
                        principal: event.principal.into(),
                        entry: event.entry.map(audited_entry),
                    };
                    if sender.send(Ok(answer)).await.is_err() {
                        return; // The watcher went away.
                    }
                }
                tokio::select! {
                    () = ledger.approvals().changed() => {}
                    () = tokio::time::sleep(WATCH_POLL) => {}
                    () = sender.closed() => return,
                }
                match ledger
                    .approval_events(&tenant, Some(cursor), WATCH_BATCH)
                    .await
                {
                    Ok((events, last)) => {
                        cursor = last;
                        batch = events;
                    }
                    Err(e) => {
                        let _ = sender.send(Err(status(e))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    async fn claim(
        &self,
        request: Request<pb::ClaimRequest>,
    ) -> Result<Response<pb::ClaimResponse>, Status> {
        // Counted in the task, with the store's change: a replay counts even if the caller's
        // deadline passed before it got the answer.
        let metrics = self.metrics.clone();
        self.unary(
            request,
            claim_input,
            |ledger, tenant, ClaimRequestInput { input, window }| async move {
                let tool = input.tool.clone();
                let out = match window {
                    Some(within) => ledger.claim_within(&tenant, input, within).await,
                    None => ledger.claim(&tenant, input).await,
                };
                metrics.claim(&tenant, tool.as_str(), &out);
                out
            },
            |out| {
                telemetry::record_claim(&out);
                claim_response(out)
            },
        )
        .await
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let metrics = self.metrics.clone();
        self.unary(
            request,
            |r, _| complete_input(r),
            |ledger, tenant, (input, view)| async move {
                let status = input.status;
                let out = ledger.complete(&tenant, input).await;
                metrics.complete(status, &out);
                out.map(|out| (out, view))
            },
            |(out, view)| {
                telemetry::record_entry(&out.entry);
                pb::CompleteResponse {
                    entry: Some(completed_entry(out.entry, view)),
                    already_completed: out.already_completed,
                }
            },
        )
        .await
    }

    async fn lookup(
        &self,
        request: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupResponse>, Status> {
        self.unary(
            request,
            |r, _| {
                let with_history = r.include_history;
                Ok((lookup_input(r)?, with_history))
            },
            |ledger, tenant, (input, with_history)| async move {
                let view = ledger.lookup(&tenant, input).await?;
                let history = if with_history {
                    ledger.history(&tenant, &view.entry.key).await?
                } else {
                    Vec::new()
                };
                Ok((view, history))
            },
            |(view, history)| {
                telemetry::record_entry(&view);
                pb::LookupResponse {
                    entry: Some(audited_entry(view)),
                    history: history.into_iter().map(history_event).collect(),
                }
            },
        )
        .await
    }

    async fn reconcile(
        &self,
        request: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        let metrics = self.metrics.clone();
        self.unary(
            request,
            |r, _| reconcile_input(r),
            |ledger, tenant, input| async move {
                let statuses: Vec<FinalStatus> =
                    input.resolutions.iter().map(|r| r.status).collect();
                let out = ledger.reconcile(&tenant, input).await;
                if let Ok(out) = &out {
                    metrics.resolutions(statuses);
                    metrics.findings(&out.results);
                }
                out
            },
            |out| pb::ReconcileResponse {
                pending: out.pending.into_iter().map(pending_entry).collect(),
                resolved: out.resolved.into_iter().map(entry).collect(),
                results: out.results.into_iter().map(resolution_result).collect(),
            },
        )
        .await
    }

    async fn list_entries(
        &self,
        request: Request<pb::ListEntriesRequest>,
    ) -> Result<Response<pb::ListEntriesResponse>, Status> {
        self.unary(
            request,
            |r, _| list_input(r),
            |ledger, tenant, input| async move { ledger.list_entries(&tenant, input).await },
            |out| pb::ListEntriesResponse {
                entries: out.entries.into_iter().map(audited_entry).collect(),
                next_page_token: out.next_page_token,
            },
        )
        .await
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        self.unary(
            request,
            |r, _| renew_input(r),
            |ledger, tenant, input| async move { ledger.renew_lease(&tenant, input).await },
            |out| {
                telemetry::record_entry(&out);
                pb::RenewLeaseResponse {
                    entry: Some(entry(out)),
                }
            },
        )
        .await
    }

    async fn acknowledge_double_effect(
        &self,
        request: Request<pb::AcknowledgeDoubleEffectRequest>,
    ) -> Result<Response<pb::AcknowledgeDoubleEffectResponse>, Status> {
        self.unary(
            request,
            |r, _| acknowledge_input(r),
            |ledger, tenant, input| async move {
                ledger.acknowledge_double_effect(&tenant, input).await
            },
            |out| {
                telemetry::record_entry(&out);
                pb::AcknowledgeDoubleEffectResponse {
                    entry: Some(audited_entry(out)),
                }
            },
        )
        .await
    }

    async fn replay_rate(
        &self,
        request: Request<pb::ReplayRateRequest>,
    ) -> Result<Response<pb::ReplayRateResponse>, Status> {
        // Answered from memory: admitted like any call (so it is shed and rate-limited alike),
        // with no task of its own, since it never waits for the store.
        let Call { tenant, .. } = self.begin(&request)?;
        let r = request.into_inner();
        let tool = if r.tool.is_empty() {
            None
        } else {
            Some(ToolName::parse(&r.tool).map_err(|e| status(LedgerError::from(e)))?)
        };
        telemetry::record_request(&r.tool, "");
        let figures = self
            .metrics
            .replay_figures(&tenant, tool.as_ref().map(ToolName::as_str));
        Ok(Response::new(replay_rate_response(figures)))
    }
}

/// What a call's span is labelled with: its tool and key, where its request names them.
trait Labels {
    /// The tool, or "", and the key, or "".
    fn labels(&self) -> (&str, &str);
}

/// ExtendRun's input: the run and the retention its entries keep at least (the default when
/// none).
struct ExtendInput(RunId, Option<Duration>);

impl Labels for ExtendInput {
    fn labels(&self) -> (&str, &str) {
        ("", "")
    }
}

impl Labels for (DecideInput, Principal) {
    fn labels(&self) -> (&str, &str) {
        ("", self.0.key.as_str())
    }
}

impl Labels for ClaimRequestInput {
    fn labels(&self) -> (&str, &str) {
        let key = self.input.key.explicit().map_or("", |k| k.as_str());
        (self.input.tool.as_str(), key)
    }
}

impl Labels for (CompleteInput, View) {
    fn labels(&self) -> (&str, &str) {
        ("", self.0.key.as_str())
    }
}

impl Labels for (LookupInput, bool) {
    fn labels(&self) -> (&str, &str) {
        match &self.0 {
            LookupInput::ByKey(key) => ("", key.as_str()),
            LookupInput::ByIntent { tool, .. } => (tool.as_str(), ""),
        }
    }
}

impl Labels for ReconcileInput {
    fn labels(&self) -> (&str, &str) {
        (self.tool.as_ref().map_or("", ToolName::as_str), "")
    }
}

impl Labels for ListInput {
    fn labels(&self) -> (&str, &str) {
        (self.tool.as_ref().map_or("", ToolName::as_str), "")
    }
}

impl Labels for RenewInput {
    fn labels(&self) -> (&str, &str) {
        ("", self.key.as_str())
    }
}

impl Labels for AcknowledgeInput {
    fn labels(&self) -> (&str, &str) {
        ("", self.key.as_str())
    }
}
