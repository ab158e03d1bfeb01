//! The `LedgerService` implementation: a thin shell over [`Ledger`]; each RPC converts, runs
//! the use case on the call's own task bounded by the deadline (to its end, also when the call
//! is abandoned: [`super::deadline`]), and converts back.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::admission::{Admission, Admitted, HeldBytes};
use super::convert::{
    audited_entry, canonicalization, claim_response, duration, entry, final_status, history_event,
    instant, pending_entry, replay_rate_response, resolution_result, status_filter,
};
use super::deadline::{parse_grpc_timeout, run};
use super::error::CallError;
use super::pb;
use super::pb::ledger_service_server::LedgerService;
use crate::domain::key::ToolName;
use crate::domain::{FinalStatus, Tenant};
use crate::error::LedgerError;
use crate::ledger::{
    AcknowledgeInput, ClaimInput, CompleteInput, Ledger, ListInput, LookupInput, ReconcileInput,
    RenewInput, ResolutionInput,
};
use crate::observe::Metrics;
use crate::observe::telemetry;

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
        let input = ClaimInput {
            run_id: r.run_id,
            tool: r.tool,
            arguments_json: r.arguments_json,
            key: r.key,
            canonicalization: canonicalization(r.canonicalization)?,
            lease: duration("lease", r.lease)?,
            retention: duration("retention", r.retention)?,
            wait: duration("wait", r.wait)?,
            answer_by: Some(deadline),
            principal: r.principal,
        };
        telemetry::record_request(&input.tool, &input.key);
        let ledger = self.ledger.clone();
        // Counted in the task, with the store's change: a replay counts even if the caller's
        // deadline passed before it got the answer.
        let (metrics, tool) = (self.metrics.clone(), input.tool.clone());
        let out = run(&self.metrics, deadline, permit, async move {
            let out = ledger.claim(&tenant, input).await;
            metrics.claim(&tenant, &tool, &out);
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
        let with_history = r.include_history;
        let found = run(&self.metrics, deadline, permit, async move {
            let view = ledger.lookup(&tenant, input).await?;
            let history = if with_history {
                ledger.history(&tenant, &view.entry.key).await?
            } else {
                Vec::new()
            };
            Ok((view, history))
        })
        .await;
        let (view, history) = found.map_err(Status::from)?;
        telemetry::record_entry(&view);
        Ok(Response::new(pb::LookupResponse {
            entry: Some(audited_entry(view)),
            history: history.into_iter().map(history_event).collect(),
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
                    attempt: res.attempt,
                    hold_token: res.hold_token,
                })
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let input = ReconcileInput {
            older_than: duration("older_than", r.older_than)?,
            tool: r.tool,
            limit: r.limit,
            resolutions,
            resolve_only: r.resolve_only,
            keys: r.keys,
            principal: r.principal,
        };
        telemetry::record_request(&input.tool, "");
        let ledger = self.ledger.clone();
        let metrics = self.metrics.clone();
        let statuses: Vec<FinalStatus> = input.resolutions.iter().map(|r| r.status).collect();
        let out = run(&self.metrics, deadline, permit, async move {
            let out = ledger.reconcile(&tenant, input).await;
            if let Ok(out) = &out {
                metrics.resolutions(statuses);
                metrics.findings(&out.results);
            }
            out
        })
        .await;
        let out = out.map_err(Status::from)?;
        Ok(Response::new(pb::ReconcileResponse {
            pending: out.pending.into_iter().map(pending_entry).collect(),
            resolved: out.resolved.into_iter().map(entry).collect(),
            results: out.results.into_iter().map(resolution_result).collect(),
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
            possible_double_effect: r.possible_double_effect,
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

    async fn acknowledge_double_effect(
        &self,
        request: Request<pb::AcknowledgeDoubleEffectRequest>,
    ) -> Result<Response<pb::AcknowledgeDoubleEffectResponse>, Status> {
        let Call {
            tenant,
            deadline,
            permit,
        } = self.begin(&request)?;
        let r = request.into_inner();
        let input = AcknowledgeInput {
            key: r.key,
            note: r.note,
            principal: r.principal,
        };
        telemetry::record_request("", &input.key);
        let ledger = self.ledger.clone();
        let out = run(&self.metrics, deadline, permit, async move {
            ledger.acknowledge_double_effect(&tenant, input).await
        })
        .await;
        let out = out.map_err(Status::from)?;
        telemetry::record_entry(&out);
        Ok(Response::new(pb::AcknowledgeDoubleEffectResponse {
            entry: Some(audited_entry(out)),
        }))
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
            Some(ToolName::parse(&r.tool).map_err(|e| Status::from(LedgerError::from(e)))?)
        };
        telemetry::record_request(&r.tool, "");
        let figures = self
            .metrics
            .replay_figures(&tenant, tool.as_ref().map(ToolName::as_str));
        Ok(Response::new(replay_rate_response(figures)))
    }
}
