//! What a governed call's answer records: the upstream's answer read as an outcome (done, failed
//! retryably or for good, or unknown: an answer lost, or an error that may come after the tool
//! acted), its Complete, the lease renewed while the upstream works, and the answer of a call
//! whose own answer was lost once its paired read settled it.

use serde_json::Value;

use super::confirm::Settled;
use super::{Answer, Call, Gateway, Upstream};
use crate::domain::fields::ClaimToken;
use crate::domain::{FinalStatus, Tenant};
use crate::error::LedgerError;
use crate::ledger::{CompleteInput, RenewInput};
use crate::mcp::answers::{self, LOST_NOTE};
use crate::mcp::rpc;

/// What an answer records, and what the client is answered.
pub(super) struct Outcome {
    pub(super) status: FinalStatus,
    pub(super) result: Vec<u8>,
    pub(super) error: String,
    pub(super) retryable: bool,
    pub(super) reply: Option<Value>,
}

/// The upstream's `answer` to `call` (whose entry is `key`) read as an outcome.
pub(super) fn outcome_of(call: &Call<'_>, answer: Answer, key: &str) -> Outcome {
    let (status, result, error, retryable, reply) = match answer {
        Answer::Response(response) => match (response.get("result"), response.get("error")) {
            // The tool asks for input before it acts (the stateless revision's multi-round
            // trip): not an outcome. Nothing was done yet, so the attempt is a retryable
            // failure, and the client's next round (the same call with its answers) claims
            // the intent again and acts.
            (Some(result), _) if answers::asks_for_input(result) => (
                FinalStatus::Failed,
                Vec::new(),
                "the tool asked for input before acting (input_required): nothing was done \
                 yet"
                .to_string(),
                true,
                Some(response.clone()),
            ),
            (Some(result), _) if answers::is_error(result) => (
                FinalStatus::Failed,
                Vec::new(),
                answers::error_text(result),
                !call.once.errors_final,
                Some(response.clone()),
            ),
            (Some(result), _) => (
                FinalStatus::Succeeded,
                serde_json::to_vec(result).unwrap_or_default(),
                String::new(),
                false,
                Some(response.clone()),
            ),
            // A refusal of the request itself (malformed, no such method, bad params: an
            // unknown tool, arguments its schema refuses): the tool never ran.
            (None, Some(error)) if rpc::refused_before_acting(error) => (
                FinalStatus::Failed,
                Vec::new(),
                error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("the upstream refused the call")
                    .to_string(),
                true,
                Some(response.clone()),
            ),
            // Any other error (an internal one, a cancellation, a timeout of its own) may
            // come after the tool acted: its outcome is unknown.
            (None, error) => (
                FinalStatus::Unknown,
                Vec::new(),
                format!(
                    "the upstream answered with an error that does not say whether the tool \
                     acted: {}",
                    error.map_or_else(|| "no result".to_string(), Value::to_string)
                ),
                false,
                Some(rpc::result(
                    call.id,
                    answers::not_done("UNKNOWN", LOST_NOTE, key),
                )),
            ),
        },
        // Never sent: nothing was done, and the call may be made again.
        Answer::NotSent(why) => (
            FinalStatus::Failed,
            Vec::new(),
            why.clone(),
            true,
            Some(rpc::error(
                Some(call.id),
                rpc::UNAVAILABLE,
                &format!("the call was not sent: {why}. Nothing was done; it is safe to try again"),
            )),
        ),
        Answer::Lost(why) => (
            FinalStatus::Unknown,
            Vec::new(),
            why,
            false,
            Some(rpc::result(
                call.id,
                answers::not_done("UNKNOWN", LOST_NOTE, key),
            )),
        ),
    };
    Outcome {
        status,
        result,
        error,
        retryable,
        reply,
    }
}

impl Gateway {
    /// The answer to a call whose own answer was lost, once its paired read said what it
    /// could: the effect found (the read's result, marked replayed), not found (safe to call
    /// again), or still unknown.
    pub(super) async fn settled_answer(
        &self,
        call: &Call<'_>,
        unknown: &crate::ledger::EntryView,
        confirm: &crate::mcp::policy::Confirm,
        upstream: &dyn Upstream,
    ) -> Value {
        let key = unknown.entry.key.as_str();
        match self.settle(call, unknown, confirm, upstream).await {
            Settled::Found(stored) => serde_json::from_slice(&stored)
                .unwrap_or_else(|_| answers::not_done("SUCCEEDED", LOST_NOTE, key)),
            Settled::NotFound => answers::not_done(
                "FAILED",
                &format!(
                    "This action was not performed: its answer was lost, and {} found no trace \
                     of it. It is safe to call it again with the same arguments.",
                    confirm.tool
                ),
                key,
            ),
            Settled::Unsettled => answers::not_done("UNKNOWN", LOST_NOTE, key),
        }
    }

    /// Records the attempt's outcome, and returns the entry as recorded; a Complete that
    /// fails leaves the attempt to its lease's end (then UNKNOWN, for reconciliation), which
    /// the log says.
    pub(super) async fn record(
        &self,
        tenant: &Tenant,
        input: CompleteInput,
    ) -> Option<crate::ledger::EntryView> {
        let key = input.key.clone();
        let status = input.status;
        let result = self.backend.complete(tenant, input).await;
        self.metrics.complete(status, &result);
        match result {
            Ok(done) => {
                tracing::debug!(
                    key = key.log_prefix(),
                    tool = done.entry.entry.tool.as_str(),
                    status = done.entry.status.as_str(),
                    "a governed call acted; its outcome is recorded"
                );
                Some(done.entry)
            }
            Err(e) => {
                tracing::warn!(
                    key = key.log_prefix(),
                    error = %e,
                    "the outcome of a call that acted could not be recorded: it reads as unknown \
                     once its lease ends, for reconciliation"
                );
                None
            }
        }
    }

    /// Renews the attempt's lease every third of it while the upstream works; returns only
    /// when a renewal is refused (the lease ended meanwhile), which ends the wait as unknown.
    pub(super) async fn renew_while_waiting(
        &self,
        tenant: &Tenant,
        key: crate::domain::Key,
        token: ClaimToken,
    ) {
        let every = self.rules.lease / 3;
        loop {
            tokio::time::sleep(every).await;
            let input = RenewInput {
                key: key.clone(),
                claim_token: token.clone(),
                lease: Some(self.rules.lease),
            };
            match self.backend.renew_lease(tenant, input).await {
                Ok(_) => {}
                Err(LedgerError::LeaseEnded(_) | LedgerError::StaleClaimToken) => return,
                // The store is away: the next renewal may pass; the lease may end meanwhile.
                Err(e) => tracing::warn!(error = %e, "a lease renewal failed; trying again"),
            }
        }
    }
}
