//! Complete: record a claimant's outcome, fenced by its claim token, and answer after it is
//! committed; a repeat of the same outcome is `already_completed`.

use super::{EntryView, Ledger, MAX_RACES};
use crate::domain::Tenant;
use crate::domain::fields::ClaimToken;
use crate::domain::key::Key;
use crate::domain::{CompleteDecision, Completion, FinalStatus, Micros, Status, decide_complete};
use crate::error::LedgerError;
use crate::reason::Reason;
use crate::storage::{Finish, Finished};

/// A Complete, its key and token parsed where it arrived.
#[derive(Clone, Debug)]
pub struct CompleteInput {
    /// The entry's key.
    pub key: Key,
    /// The token from the claim.
    pub claim_token: ClaimToken,
    /// The reported outcome.
    pub status: FinalStatus,
    /// The result, only with success.
    pub result: Vec<u8>,
    /// The error, with failure or unknown.
    pub error: String,
    /// With failure: may the intent be tried again.
    pub retryable: bool,
}

/// The answer to a Complete.
#[derive(Clone, Debug)]
pub struct CompleteOutput {
    /// The entry as stored.
    pub entry: EntryView,
    /// True when this outcome had already been recorded.
    pub already_completed: bool,
}

impl Ledger {
    /// Records the outcome of a claimed attempt; answers after it is committed.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or oversized outcome; `NotFound`, `StaleClaimToken` or
    /// `AlreadyResolved` as the entry stands (nothing changes); `Unavailable`/`Internal` from
    /// the store.
    pub async fn complete(
        &self,
        tenant: &Tenant,
        input: CompleteInput,
    ) -> Result<CompleteOutput, LedgerError> {
        let CompleteInput {
            key, claim_token, ..
        } = input;
        let completion = Completion::new(input.status, input.result, input.error, input.retryable)?;
        self.check_size(&completion)?;
        let mut finish = Finish {
            key,
            claim_token,
            completion,
            now: self.clock.now(),
            also_unknown: false,
        };
        // The common case in one statement: the claimant completes its own attempt in flight.
        if let Some(done) = self.store.finish(tenant, &finish).await? {
            return Ok(self.completed(tenant, done, finish.now).await);
        }
        // Otherwise read the entry to learn what to answer, and write only if the domain says so.
        for _ in 0..MAX_RACES {
            let now = self.clock.now();
            let Some(existing) = self.store.get(tenant, &finish.key).await? else {
                return Err(LedgerError::NotFound);
            };
            match decide_complete(&existing, &finish.claim_token, &finish.completion, now) {
                CompleteDecision::NotFound => return Err(LedgerError::NotFound),
                CompleteDecision::StaleToken => return Err(LedgerError::StaleClaimToken),
                CompleteDecision::AlreadyResolved => {
                    return Err(LedgerError::AlreadyResolved(existing.status.as_str()));
                }
                CompleteDecision::AlreadyCompleted => {
                    let existing = self.with_unwritten_replays(tenant, existing);
                    return Ok(CompleteOutput {
                        entry: self.view(existing, now),
                        already_completed: true,
                    });
                }
                CompleteDecision::Apply => {
                    finish.now = now;
                    finish.also_unknown = true;
                    if let Some(done) = self.store.finish(tenant, &finish).await? {
                        return Ok(self.completed(tenant, done, now).await);
                    }
                }
            }
        }
        Err(LedgerError::Internal(format!(
            "complete of {} lost {MAX_RACES} races in a row",
            finish.key
        )))
    }

    /// The answer to a Complete that wrote its outcome, after waking whoever waits for it.
    pub(super) async fn completed(
        &self,
        tenant: &Tenant,
        done: Finished,
        now: Micros,
    ) -> CompleteOutput {
        if done.entry.status == Status::Succeeded {
            self.recent_keys.insert(tenant, &done.entry.key);
        }
        self.memory.remember(tenant, &done.entry);
        self.changed(tenant, &done.entry.key, done.has_waiters)
            .await;
        CompleteOutput {
            entry: self.view(done.entry, now),
            already_completed: false,
        }
    }

    /// The server's limit on a reported outcome: its result and its error each within
    /// `--max-result-bytes`. (Which fields go with which status, [`Completion::new`] has
    /// already checked.)
    pub(super) fn check_size(&self, outcome: &Completion) -> Result<(), LedgerError> {
        let max = self.limits.max_result_bytes;
        let too_large = |field: &'static str, len: usize| LedgerError::InvalidArgument {
            field,
            reason: Reason::ResultTooLarge,
            message: format!("is {len} bytes; the limit is {max}"),
        };
        if outcome.result().len() > max {
            return Err(too_large("result", outcome.result().len()));
        }
        if outcome.error().len() > max {
            return Err(too_large("error", outcome.error().len()));
        }
        Ok(())
    }
}
