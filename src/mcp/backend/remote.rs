//! A ledger server as the gateway's ledger (`--ledger URL --ledger-token TOKEN`): each use is
//! one RPC, sent with the token (the server takes the tenant and the roles from it), and read
//! back in the ledger's own terms. A call that cannot reach the server is `Unavailable`, so the
//! gateway answers as it does when its own store is away: not sent, safe to try again.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use tonic::Request;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic_types::StatusExt;

use crate::domain::canonical::Canonicalization;
use crate::domain::{
    Approval, ApprovalState, ClaimKey, ClaimToken, Decision, Entry, FinalStatus, HoldToken, Key,
    Micros, Principal, RunId, Status, ToolName,
};
use crate::error::LedgerError;
use crate::grpc::pb;
use crate::grpc::pb::ledger_service_client::LedgerServiceClient;
use crate::ledger::{
    ClaimInput, ClaimOutput, CompleteInput, CompleteOutput, DecideInput, Decided, EntryView,
    Outcome, ReconcileInput, RenewInput, WaitFor,
};
use crate::reason::Reason;

/// How long an RPC may take beyond the wait it asks the server for.
const MARGIN: Duration = Duration::from_secs(10);

/// Why the server cannot be used as configured.
#[derive(Debug, thiserror::Error)]
#[error("--ledger {url}: {why}")]
pub struct RemoteError {
    /// The URL as given.
    url: String,
    /// What is wrong with it.
    why: String,
}

/// A ledger server, reached over one channel (opened on first use and again after a loss).
pub struct Remote {
    /// The client over the channel.
    client: LedgerServiceClient<Channel>,
    /// `authorization: Bearer <token>`, when a token was given.
    auth: Option<MetadataValue<Ascii>>,
}

impl Remote {
    /// The server at `url` (`http://` or `https://`; an https server's certificate is checked
    /// against the PEM CA file `ca`), called with `token`.
    ///
    /// # Errors
    /// A URL that is no URL, a token that is not printable ASCII, an https URL without a CA or
    /// a CA file that cannot be read.
    pub fn new(url: &str, token: Option<&str>, ca: Option<&Path>) -> Result<Remote, RemoteError> {
        let error = |why: String| RemoteError {
            url: url.to_owned(),
            why,
        };
        let auth = token
            .map(|t| MetadataValue::try_from(format!("Bearer {t}")))
            .transpose()
            .map_err(|_| error("--ledger-token must be printable ASCII".into()))?;
        let mut endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| error(e.to_string()))?
            .connect_timeout(MARGIN);
        if endpoint.uri().scheme_str() == Some("https") {
            let ca = ca.ok_or_else(|| {
                error(
                    "an https:// ledger needs --ledger-ca (the CA that signed its certificate)"
                        .into(),
                )
            })?;
            let pem = std::fs::read(ca)
                .map_err(|e| error(format!("cannot read --ledger-ca {}: {e}", ca.display())))?;
            endpoint = endpoint
                .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
                .map_err(|e| error(e.to_string()))?;
        }
        Ok(Remote {
            client: LedgerServiceClient::new(endpoint.connect_lazy()),
            auth,
        })
    }

    /// `msg` with the credential, due within `timeout`.
    fn request<T>(&self, msg: T, timeout: Duration) -> Request<T> {
        let mut request = Request::new(msg);
        request.set_timeout(timeout);
        if let Some(auth) = &self.auth {
            request.metadata_mut().insert("authorization", auth.clone());
        }
        request
    }

    /// A Claim; with `window`, in the run of the call's window of intent.
    pub(super) async fn claim(
        &self,
        input: ClaimInput,
        window: Option<Duration>,
    ) -> Result<ClaimOutput, LedgerError> {
        let (run_id, key) = match (&input.key, window) {
            (_, Some(_)) => (String::new(), String::new()),
            (ClaimKey::Derived(run), None) => (run.as_str().to_owned(), String::new()),
            (ClaimKey::Explicit { key, run_id }, None) => (
                run_id
                    .as_ref()
                    .map(|r| r.as_str().to_owned())
                    .unwrap_or_default(),
                key.as_str().to_owned(),
            ),
        };
        let wait = input.wait.unwrap_or_default();
        let request = pb::ClaimRequest {
            run_id,
            tool: input.tool.as_str().to_owned(),
            arguments_json: input.arguments_json,
            key,
            canonicalization: match input.canonicalization {
                Canonicalization::Jcs => pb::Canonicalization::Jcs,
                Canonicalization::JcsLenient => pb::Canonicalization::JcsLenient,
            }
            .into(),
            lease: input.lease.map(duration),
            retention: input.retention.map(duration),
            wait: input.wait.map(duration),
            principal: input.principal.as_str().to_owned(),
            require_approval: input.require_approval,
            view: pb::EntryView::Full.into(),
            wait_for: match input.wait_for {
                WaitFor::Attempt => pb::WaitFor::Attempt,
                WaitFor::AttemptOrDecision => pb::WaitFor::AttemptOrDecision,
            }
            .into(),
            same_intent_within: window.map(duration),
        };
        let answer = self
            .client
            .clone()
            .claim(self.request(request, wait + MARGIN))
            .await
            .map_err(error)?
            .into_inner();
        Ok(ClaimOutput {
            outcome: outcome(answer.outcome)?,
            entry: entry(answer.entry)?,
            claim_token: (!answer.claim_token.is_empty())
                .then(|| ClaimToken::from_stored(answer.claim_token)),
            note: answer.note,
            retry_after: answer.retry_after.and_then(|d| d.try_into().ok()),
            asked: false,
        })
    }

    /// A Complete.
    pub(super) async fn complete(
        &self,
        input: CompleteInput,
    ) -> Result<CompleteOutput, LedgerError> {
        let request = pb::CompleteRequest {
            key: input.key.as_str().to_owned(),
            claim_token: input.claim_token.as_str().to_owned(),
            status: reported(input.status).into(),
            result: input.result.into(),
            error: input.error,
            retryable: input.retryable,
            view: pb::EntryView::Full.into(),
        };
        let answer = self
            .client
            .clone()
            .complete(self.request(request, MARGIN))
            .await
            .map_err(error)?
            .into_inner();
        Ok(CompleteOutput {
            entry: entry(answer.entry)?,
            already_completed: answer.already_completed,
        })
    }

    /// A RenewLease.
    pub(super) async fn renew_lease(&self, input: RenewInput) -> Result<(), LedgerError> {
        let request = pb::RenewLeaseRequest {
            key: input.key.as_str().to_owned(),
            claim_token: input.claim_token.as_str().to_owned(),
            lease: input.lease.map(duration),
        };
        self.client
            .clone()
            .renew_lease(self.request(request, MARGIN))
            .await
            .map_err(error)?;
        Ok(())
    }

    /// A Decide under the gateway's credential, the person named in the reason.
    pub(super) async fn decide(
        &self,
        input: DecideInput,
        approver: &Principal,
    ) -> Result<Decided, LedgerError> {
        let reason = if input.reason.is_empty() {
            format!("decided by {approver}")
        } else {
            format!("{} (decided by {approver})", input.reason)
        };
        let request = pb::DecideRequest {
            key: input.key.as_str().to_owned(),
            fingerprint: input.fingerprint,
            decision: match input.decision {
                Decision::Approve => pb::Decision::Approve,
                Decision::Deny => pb::Decision::Deny,
            }
            .into(),
            reason,
        };
        let answer = self
            .client
            .clone()
            .decide(self.request(request, MARGIN))
            .await
            .map_err(error)?
            .into_inner();
        let entry = entry(answer.entry)?;
        let approval = &entry.entry.approval;
        let took = approval
            .requested_at
            .zip(approval.decided_at)
            .map(|(asked, decided)| {
                Duration::from_micros(decided.0.saturating_sub(asked.0).unsigned_abs())
            });
        Ok(Decided {
            entry,
            changed: true,
            took,
        })
    }

    /// A Reconcile: the entries handed out, and for each finding whether it settled its entry.
    pub(super) async fn reconcile(
        &self,
        input: ReconcileInput,
    ) -> Result<(Vec<EntryView>, Vec<bool>), LedgerError> {
        let request = pb::ReconcileRequest {
            older_than: input.older_than.map(duration),
            tool: input.tool.map(String::from).unwrap_or_default(),
            limit: input.limit,
            resolutions: input
                .resolutions
                .into_iter()
                .map(|r| pb::Resolution {
                    key: r.key.into(),
                    status: reported(r.status).into(),
                    result: r.result.into(),
                    error: r.error,
                    retryable: r.retryable,
                    attempt: r.attempt,
                    hold_token: r.hold_token.into(),
                })
                .collect(),
            resolve_only: input.resolve_only,
            keys: input.keys.into_iter().map(String::from).collect(),
            principal: input.principal.into(),
        };
        let answer = self
            .client
            .clone()
            .reconcile(self.request(request, MARGIN))
            .await
            .map_err(error)?
            .into_inner();
        let pending = answer
            .pending
            .into_iter()
            .map(|e| entry(Some(e)))
            .collect::<Result<_, _>>()?;
        let applied = answer
            .results
            .iter()
            .map(|r| r.result == i32::from(pb::ResolutionOutcome::ResolutionApplied))
            .collect();
        Ok((pending, applied))
    }
}

/// A reported outcome as the proto's status.
fn reported(status: FinalStatus) -> pb::Status {
    match status {
        FinalStatus::Succeeded => pb::Status::Succeeded,
        FinalStatus::Failed => pb::Status::Failed,
        FinalStatus::Unknown => pb::Status::Unknown,
    }
}

/// A std duration as a proto one.
fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// The server's answer broke the API: a bug on one side, told as such.
fn unreadable(what: &str) -> LedgerError {
    LedgerError::Internal(format!(
        "the ledger server answered {what}, which this gateway cannot read (are both the same \
         version?)"
    ))
}

/// A Claim's outcome.
fn outcome(value: i32) -> Result<Outcome, LedgerError> {
    Ok(match pb::Outcome::try_from(value) {
        Ok(pb::Outcome::Claimed) => Outcome::Claimed,
        Ok(pb::Outcome::Replayed) => Outcome::Replayed,
        Ok(pb::Outcome::InProgress) => Outcome::InProgress,
        Ok(pb::Outcome::PreviouslyFailed) => Outcome::PreviouslyFailed,
        Ok(pb::Outcome::AwaitingApproval) => Outcome::AwaitingApproval,
        Ok(pb::Outcome::Denied) => Outcome::Denied,
        _ => return Err(unreadable(&format!("the outcome {value}"))),
    })
}

/// An entry's status.
fn status(value: i32) -> Result<Status, LedgerError> {
    Ok(match pb::Status::try_from(value) {
        Ok(pb::Status::Attempting) => Status::Attempting,
        Ok(pb::Status::Succeeded) => Status::Succeeded,
        Ok(pb::Status::Failed) => Status::Failed,
        Ok(pb::Status::Unknown) => Status::Unknown,
        Ok(pb::Status::AwaitingApproval) => Status::AwaitingApproval,
        Ok(pb::Status::Denied) => Status::Denied,
        _ => return Err(unreadable(&format!("the status {value}"))),
    })
}

/// A proto time as the ledger's.
fn micros(t: Option<prost_types::Timestamp>) -> Option<Micros> {
    t.map(|t| Micros(t.seconds * 1_000_000 + i64::from(t.nanos / 1000)))
}

/// An entry's approval (none when the server sent none).
fn approval(a: Option<pb::Approval>) -> Approval {
    let Some(a) = a else {
        return Approval::default();
    };
    let state = match pb::ApprovalState::try_from(a.state) {
        Ok(pb::ApprovalState::Requested) => ApprovalState::Requested,
        Ok(pb::ApprovalState::Approved) => ApprovalState::Approved,
        Ok(pb::ApprovalState::Denied) => ApprovalState::Denied,
        Ok(pb::ApprovalState::Expired) => ApprovalState::Expired,
        Ok(pb::ApprovalState::Used) => ApprovalState::Used,
        _ => ApprovalState::None,
    };
    Approval {
        state,
        requested_at: micros(a.requested_at),
        decide_by: micros(a.decide_by),
        decided_at: micros(a.decided_at),
        decided_by: Principal::from_stored(a.decided_by),
        reason: a.reason,
        execute_by: micros(a.execute_by),
    }
}

/// An entry as the server answered it, read as the store's rows are (not validated again).
/// What the API does not carry (the retention, the current claim token) is left empty: the
/// gateway does not read it.
fn entry(e: Option<pb::Entry>) -> Result<EntryView, LedgerError> {
    let e = e.ok_or_else(|| unreadable("no entry"))?;
    let status = status(e.status)?;
    Ok(EntryView {
        entry: Entry {
            key: Key::from_stored(e.key),
            run_id: (!e.run_id.is_empty()).then(|| RunId::from_stored(e.run_id)),
            tool: ToolName::from_stored(e.tool),
            fingerprint: e.fingerprint,
            status,
            attempt: e.attempt,
            claim_token: ClaimToken::from_stored(String::new()),
            result: e.result.to_vec(),
            error: e.error,
            retryable: e.retryable,
            principal: Principal::from_stored(e.principal),
            started_at: micros(e.started_at).unwrap_or(Micros(0)),
            finished_at: micros(e.finished_at),
            lease_expires_at: micros(e.lease_expires_at).unwrap_or(Micros(0)),
            retention: Micros(0),
            expires_at: micros(e.expires_at),
            replay_count: e.replay_count,
            arguments: (!e.arguments_json.is_empty()).then_some(e.arguments_json),
            resolved_by: Principal::from_stored(e.resolved_by),
            hold_token: if e.hold_token.is_empty() {
                HoldToken::none()
            } else {
                HoldToken::from_stored(e.hold_token)
            },
            possible_double_effect: e.possible_double_effect,
            approval: approval(e.approval),
        },
        status,
        external_ref: e.external_ref,
    })
}

/// A refusal or a failure of an RPC as the ledger's error: the ones the gateway tells apart
/// by their `ErrorInfo` reason, the rest as the server's message; a server that cannot be
/// reached, or did not answer in time, is `Unavailable`.
fn error(s: tonic::Status) -> LedgerError {
    let reason = s
        .get_details_error_info()
        .and_then(|info| Reason::from_str(&info.reason).ok());
    let message = s.message().to_owned();
    match (s.code(), reason) {
        (_, Some(Reason::KeyReusedWithDifferentRequest)) => LedgerError::KeyReused,
        (_, Some(Reason::StaleClaimToken)) => LedgerError::StaleClaimToken,
        (_, Some(Reason::LeaseEnded)) => LedgerError::LeaseEnded("ended"),
        (_, Some(Reason::ApprovalMismatch)) => LedgerError::ApprovalMismatch,
        (_, Some(Reason::AlreadyDecided)) => LedgerError::AlreadyDecided("decided"),
        (_, Some(Reason::NotAwaitingApproval)) => LedgerError::NotAwaitingApproval(message),
        (_, Some(Reason::EntryNotFound)) => LedgerError::NotFound,
        (tonic::Code::InvalidArgument, reason) => LedgerError::InvalidArgument {
            field: "the ledger server",
            reason: reason.unwrap_or(Reason::InvalidField),
            message,
        },
        (tonic::Code::Internal, _) => LedgerError::Internal(message),
        (code, _) => LedgerError::Unavailable(format!("the ledger server: {code:?}: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_reads_as_the_ledgers_error_by_its_reason() {
        let refused = |code, reason: Reason| {
            let mut details = tonic_types::ErrorDetails::new();
            details.set_error_info(
                reason.as_str(),
                "idempotency.v1",
                std::collections::HashMap::new(),
            );
            error(tonic::Status::with_error_details(code, "why", details))
        };
        assert!(matches!(
            refused(
                tonic::Code::FailedPrecondition,
                Reason::KeyReusedWithDifferentRequest
            ),
            LedgerError::KeyReused
        ));
        assert!(matches!(
            refused(tonic::Code::FailedPrecondition, Reason::LeaseEnded),
            LedgerError::LeaseEnded(_)
        ));
        assert!(matches!(
            refused(tonic::Code::InvalidArgument, Reason::ArgumentsNotObject),
            LedgerError::InvalidArgument {
                reason: Reason::ArgumentsNotObject,
                ..
            }
        ));
        assert!(matches!(
            error(tonic::Status::unavailable("connection refused")),
            LedgerError::Unavailable(_)
        ));
        assert!(matches!(
            error(tonic::Status::deadline_exceeded("late")),
            LedgerError::Unavailable(_)
        ));
    }

    #[test]
    fn a_url_that_cannot_be_used_is_refused_before_any_call() {
        let e = Remote::new("https://ledger:50051", None, None)
            .err()
            .expect("no CA");
        assert!(e.to_string().contains("--ledger-ca"), "{e}");
        let e = Remote::new("http://ledger:50051", Some("bad\ntoken"), None)
            .err()
            .expect("a token with a newline");
        assert!(e.to_string().contains("printable ASCII"), "{e}");
    }
}
