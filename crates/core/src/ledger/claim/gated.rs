//! The claims a person's approval gates: asking (the call awaits a decision), the answer
//! while one is due, using an approval given, and asking again once one lapsed.

use std::time::Duration;

use super::{ClaimOutput, Outcome, PreparedClaim};
use crate::domain::Tenant;
use crate::domain::fields::Principal;
use crate::domain::{Approval, Entry, EventKind, HistoryEvent, Micros, Status};
use crate::error::LedgerError;
use crate::ledger::Ledger;
use crate::ledger::model_notes::awaiting_note;

/// The target of this module's events: the claim module's, where they were logged before
/// they moved here (log filters and pipelines name it).
const LOG_TARGET: &str = "idempotency_ledger::ledger::claim";

impl Ledger {
    /// `fresh` as a call awaiting a decision: status AWAITING_APPROVAL, its request open until
    /// the approval timeout from `now` (its lease the same: no attempt runs meanwhile).
    pub(super) fn awaiting(&self, _request: &PreparedClaim, fresh: &Entry, now: Micros) -> Entry {
        let decide_by = now.plus(Micros::from_duration(self.limits.approval_timeout));
        Entry {
            status: Status::AwaitingApproval,
            lease_expires_at: decide_by,
            approval: Approval::requested(now, decide_by),
            ..fresh.clone()
        }
    }

    /// The history event of a new request.
    pub(super) fn requested_note(&self, asked: &Entry, why: &str) -> HistoryEvent {
        HistoryEvent {
            at: asked.started_at,
            attempt: asked.attempt,
            kind: EventKind::ApprovalRequested,
            principal: asked.principal.clone(),
            detail: format!(
                "a person was asked ({why}); to be decided by {}",
                asked
                    .approval
                    .decide_by
                    .map(crate::domain::time::rfc3339)
                    .unwrap_or_default()
            ),
        }
    }

    /// A request was made (and, in its transaction, the run's finished entries kept at least
    /// until a decision is due plus their retention: a paused run keeps its keys): watchers are
    /// told, and the caller is answered AWAITING_APPROVAL.
    pub(super) fn requested(&self, asked: Entry, now: Micros) -> ClaimOutput {
        tracing::info!(
            target: LOG_TARGET,
            key = asked.key.log_prefix(),
            tool = asked.tool.as_str(),
            principal = %asked.principal,
            "a person was asked to approve a call"
        );
        self.approvals.notify();
        ClaimOutput {
            asked: true,
            ..self.awaiting_answer(asked, now)
        }
    }

    /// The answer to a claim of `entry`, which awaits a person's decision.
    pub(super) fn awaiting_answer(&self, entry: Entry, now: Micros) -> ClaimOutput {
        let note = awaiting_note(&entry);
        let retry_after = approval_retry_after(&entry, now);
        self.answer(
            Outcome::AwaitingApproval,
            entry,
            now,
            note,
            Some(retry_after),
        )
    }

    /// Uses the approval `existing` holds: the call acts now, as a new attempt with `fresh`'s
    /// token; `None` when another claim changed the entry first.
    pub(super) async fn use_approval(
        &self,
        tenant: &Tenant,
        request: &PreparedClaim,
        existing: &Entry,
        fresh: Entry,
        now: Micros,
    ) -> Result<Option<ClaimOutput>, LedgerError> {
        let attempt = Entry {
            approval: existing.approval.clone(),
            attempt: existing.attempt,
            possible_double_effect: existing.possible_double_effect,
            ..request.new_entry(now, existing.attempt, fresh.claim_token)
        };
        let note = HistoryEvent {
            at: now,
            attempt: attempt.attempt,
            kind: EventKind::ApprovalUsed,
            principal: attempt.principal.clone(),
            detail: "the approved call was claimed: it acts now, once".to_string(),
        };
        if let Some(used) = self.store.use_approval(tenant, &attempt, &note).await? {
            tracing::info!(
                target: LOG_TARGET,
                key = used.key.log_prefix(),
                tool = used.tool.as_str(),
                principal = %used.principal,
                "an approval was used: the call acts"
            );
            self.approvals.notify();
            return Ok(Some(self.claimed(used, now)));
        }
        Ok(None)
    }

    /// Asks a person again for a call whose earlier request or approval lapsed, or that ended
    /// and is gated now; `None` when another claim changed the entry first.
    pub(super) async fn request_again(
        &self,
        tenant: &Tenant,
        request: &PreparedClaim,
        existing: &Entry,
        fresh: Entry,
        now: Micros,
    ) -> Result<Option<ClaimOutput>, LedgerError> {
        let why = request
            .gate
            .clone()
            .unwrap_or_else(|| "the call needed approval before, and it lapsed".to_string());
        // A new request is a new attempt (its lapse, recorded or not, ended the last one); an
        // expired entry starts over.
        let attempt = if existing.is_expired(now) {
            1
        } else {
            existing.attempt.saturating_add(1)
        };
        let fresh_attempt = Entry {
            possible_double_effect: existing.possible_double_effect && !existing.is_expired(now),
            ..request.new_entry(now, attempt, fresh.claim_token.clone())
        };
        let asked = self.awaiting(request, &fresh_attempt, now);
        let mut notes = Vec::with_capacity(2);
        if existing.status == Status::AwaitingApproval {
            // Lapsed at claim time, before the sweeper recorded it.
            notes.push(lapsed_note(existing, now));
        }
        notes.push(self.requested_note(&asked, &why));
        if self
            .store
            .request_again(tenant, &existing.claim_token, &asked, &notes)
            .await?
        {
            if existing.status == Status::AwaitingApproval {
                self.approvals.expired(1);
            }
            return Ok(Some(self.requested(asked, now)));
        }
        Ok(None)
    }
}

/// When a claim that awaits a decision is worth sending again: in a minute, or at the
/// deadline if that is sooner (the request then lapses, and a claim asks again).
fn approval_retry_after(entry: &Entry, now: Micros) -> Duration {
    let left = entry
        .approval
        .decide_by
        .map_or(Duration::ZERO, |by| by.minus(now).to_duration());
    left.clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// The history event of a request or approval that lapsed: at its deadline (`now` when it
/// has none, which an entry awaiting a decision always has).
pub(in crate::ledger) fn lapsed_note(existing: &Entry, now: Micros) -> HistoryEvent {
    HistoryEvent {
        at: existing.approval.runs_until().unwrap_or(now),
        attempt: existing.attempt,
        kind: EventKind::ApprovalExpired,
        principal: Principal::none(),
        detail: existing.approval.lapsed_words(),
    }
}
