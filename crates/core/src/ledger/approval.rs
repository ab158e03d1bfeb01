//! Approvals: a person decides about a gated call (Decide), bound to the arguments they were
//! shown and recorded with the approver's credential; an undecided request or an unused
//! approval lapses (the sweeper records it); a paused run keeps its keys (ExtendRun, and the
//! decisions themselves); and the events a watcher streams (WatchApprovals).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;

use tracing::Instrument as _;

use super::claim::lapsed_note;
use super::{EntryView, Ledger, bounded};
use crate::domain::approval::{DecideOutcome, decide_decision};
use crate::domain::fields::{Principal, RunId};
use crate::domain::key::Key;
use crate::domain::{
    Approval, ApprovalState, Decision, EventKind, HistoryEvent, Micros, Policy, Tenant,
};
use crate::error::LedgerError;

/// The longest reason a person may give with a decision.
pub const MAX_REASON_BYTES: usize = 1024;

/// The approvals' state shared by a server's calls: the policy in force (swapped whole on
/// SIGHUP), a signal to the watchers of approval events, and the count of lapsed requests.
#[derive(Debug, Default)]
pub struct Approvals {
    /// Which calls need a person's decision.
    policy: ArcSwap<Policy>,
    /// Sent on every approval event this server records, to wake its watchers at once (other
    /// servers' events reach them by polling).
    changes: tokio::sync::Notify,
    /// Requests and approvals recorded as lapsed since the metrics last took the count.
    expired: AtomicU64,
}

impl Approvals {
    /// No call is gated until a policy is set.
    #[must_use]
    pub fn new(policy: Policy) -> Approvals {
        Approvals {
            policy: ArcSwap::from_pointee(policy),
            ..Approvals::default()
        }
    }

    /// The policy in force.
    #[must_use]
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Puts `policy` in force for the calls that start from now on.
    pub fn set_policy(&self, policy: Policy) {
        self.policy.store(Arc::new(policy));
    }

    /// Wakes this server's watchers: an approval event was recorded.
    pub(super) fn notify(&self) {
        self.changes.notify_waiters();
    }

    /// Counts `n` lapsed requests or approvals.
    pub(super) fn expired(&self, n: u64) {
        self.expired.fetch_add(n, Ordering::Relaxed);
        self.notify();
    }

    /// The lapsed requests counted since the last call (for the metrics' counter).
    pub fn take_expired(&self) -> u64 {
        self.expired.swap(0, Ordering::Relaxed)
    }

    /// Resolves when an approval event is recorded on this server (or spuriously).
    pub async fn changed(&self) {
        self.changes.notified().await;
    }
}

/// A person's decision, as a request states it (its key parsed where it arrived).
#[derive(Clone, Debug)]
pub struct DecideInput {
    /// The entry's key.
    pub key: Key,
    /// The fingerprint of the arguments the person was shown.
    pub fingerprint: String,
    /// Approve or deny.
    pub decision: Decision,
    /// Why, in the person's words.
    pub reason: String,
}

/// What a decision did.
#[derive(Clone, Debug)]
pub struct Decided {
    /// The entry as it stands.
    pub entry: EntryView,
    /// `false` when the same decision had been taken already (nothing changed).
    pub changed: bool,
    /// How long the person took, from the request to the decision (when it changed).
    pub took: Option<Duration>,
}

/// One approval event for a watcher.
#[derive(Clone, Debug)]
pub struct ApprovalEvent {
    /// Where a watcher resumes after it.
    pub cursor: i64,
    /// `requested`, `approved`, `denied`, `expired` or `used`.
    pub kind: &'static str,
    /// When.
    pub at: Micros,
    /// Who.
    pub principal: Principal,
    /// The entry as it stands now (`None` once it is gone).
    pub entry: Option<EntryView>,
}

impl Ledger {
    /// The server's approvals (policy, watchers, counts).
    pub fn approvals(&self) -> &Approvals {
        &self.approvals
    }

    /// Records a person's decision about a call awaiting one. `approver` is the principal of
    /// the credential that decides (the approver role is checked before: see the gRPC and
    /// console layers); the decision binds to `input.fingerprint`, the arguments the person was
    /// shown. Either decision keeps the call's run (its finished entries get their retention
    /// again from now, in the decision's own transaction); approving lets the next claim act,
    /// once; denying finishes the entry as DENIED.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed fingerprint or a reason over 1 KiB; `NotFound`;
    /// `ApprovalMismatch` when the fingerprint is not the entry's; `NotAwaitingApproval` when
    /// the entry awaits no decision (or its request lapsed); `AlreadyDecided` for the other
    /// decision than the one taken. None of them changes anything.
    pub async fn decide(
        &self,
        tenant: &Tenant,
        input: DecideInput,
        approver: &Principal,
    ) -> Result<Decided, LedgerError> {
        checked_decision(&input)?;
        let key = &input.key;
        let fingerprint = input.fingerprint.as_str();
        let now = self.clock.now();
        let existing = self
            .store
            .get(tenant, key)
            .await?
            .filter(|e| !e.is_expired(now));
        let found = existing
            .as_ref()
            .map(|e| (&e.approval, e.fingerprint.as_str()));
        match decide_decision(found, fingerprint, input.decision, now) {
            DecideOutcome::NotFound => return Err(LedgerError::NotFound),
            DecideOutcome::Mismatch => return Err(LedgerError::ApprovalMismatch),
            DecideOutcome::NotAwaiting => {
                return Err(LedgerError::NotAwaitingApproval(not_awaiting_why(
                    existing.as_ref().map(|e| &e.approval),
                    now,
                )));
            }
            DecideOutcome::Conflicting => {
                return Err(LedgerError::AlreadyDecided(
                    existing.map_or("", |e| e.approval.state.as_str()),
                ));
            }
            DecideOutcome::AlreadyThat => {
                let entry = existing.ok_or(LedgerError::NotFound)?;
                return Ok(Decided {
                    entry: self.audit_view(self.with_unwritten_replays(tenant, entry), now),
                    changed: false,
                    took: None,
                });
            }
            DecideOutcome::Apply => {}
        }
        let requested_at = existing
            .as_ref()
            .and_then(|e| e.approval.requested_at)
            .unwrap_or(now);
        let decision = Approval {
            state: input.decision.state(),
            decided_at: Some(now),
            decided_by: approver.clone(),
            reason: input.reason.clone(),
            execute_by: (input.decision == Decision::Approve)
                .then(|| now.plus(Micros::from_duration(self.limits.approval_use_within))),
            ..Approval::default()
        };
        let note = HistoryEvent {
            at: now,
            attempt: existing.as_ref().map_or(1, |e| e.attempt),
            kind: match input.decision {
                Decision::Approve => EventKind::ApprovalApproved,
                Decision::Deny => EventKind::ApprovalDenied,
            },
            principal: approver.clone(),
            detail: if input.reason.is_empty() {
                "(no reason given)".to_string()
            } else {
                input.reason.clone()
            },
        };
        let Some(done) = self
            .store
            .decide(tenant, key, fingerprint, &decision, &note)
            .await?
        else {
            // Changed since the read (decided by someone else, lapsed): say what stands now.
            return Box::pin(self.decide(tenant, input, approver)).await;
        };
        tracing::info!(
            key = key.log_prefix(),
            tool = done.entry.tool.as_str(),
            principal = %approver,
            outcome = input.decision.as_str(),
            "a person decided about a call"
        );
        self.changed(tenant, key, done.has_waiters).await;
        self.approvals.notify();
        Ok(Decided {
            entry: self.audit_view(done.entry, now),
            changed: true,
            took: Some(now.minus(requested_at).to_duration()),
        })
    }

    /// Keeps every finished entry of the run at least `retention` from now (the default
    /// retention when unset, at most `--max-retention`). Returns how many entries it extended
    /// and the earliest expiry among the run's finished entries.
    ///
    /// # Errors
    /// `InvalidArgument` for a retention above `--max-retention`; `Unavailable`/`Internal` from
    /// the store.
    pub async fn extend_run(
        &self,
        tenant: &Tenant,
        run_id: &RunId,
        retention: Option<Duration>,
    ) -> Result<(u64, Option<Micros>), LedgerError> {
        let retention = bounded(
            "retention",
            retention,
            self.limits.default_retention,
            self.limits.max_retention,
        )?;
        let until = self.clock.now().plus(Micros::from_duration(retention));
        let extended = self.store.extend_run(tenant, run_id, until).await?;
        let kept_until = self.store.run_kept_until(tenant, run_id).await?;
        tracing::info!(
            run_id = run_id.as_str(),
            extended,
            "a run's entries were kept longer (ExtendRun)"
        );
        Ok((extended, kept_until))
    }

    /// Records, up to `batch` at a time, the requests that went undecided past `decide_by`
    /// and the approvals unused past `execute_by` (the claims that meet them record it too):
    /// each entry becomes FAILED retryable, approval EXPIRED, finished at its deadline, so that
    /// its next claim asks again. Each lapse recorded is logged, counted once (the write is
    /// fenced on the entry still awaiting), and exported as a span with an event when traces
    /// are on. Returns how many it recorded.
    ///
    /// # Errors
    /// `Unavailable`/`Internal` from the store.
    pub async fn expire_lapsed_approvals(&self, batch: u32) -> Result<u64, LedgerError> {
        let now = self.clock.now();
        let mut expired = 0;
        for (tenant, key) in self.store.lapsed_approvals(now, batch).await? {
            let Some(existing) = self.store.get(&tenant, &key).await? else {
                continue;
            };
            let Some(at) = existing.lapsed_at(now) else {
                continue; // decided or used since the pick
            };
            let note = lapsed_note(&existing, now);
            let error = existing.clone().lapsed(at).error;
            let span = tracing::info_span!(
                target: crate::TRACE_TARGET,
                "ledger.approval_lapsed",
                ledger.tool = existing.tool.as_str(),
                ledger.attempt = i64::from(existing.attempt),
                ledger.key_prefix = key.log_prefix(),
            );
            let recorded = self
                .store
                .expire_approval(&tenant, &key, &error, at, now, &note)
                .instrument(span.clone())
                .await?;
            if let Some(done) = recorded {
                expired += 1;
                span.in_scope(|| {
                    tracing::info!(target: crate::TRACE_TARGET, detail = %note.detail, "approval lapsed");
                });
                tracing::info!(
                    key = key.log_prefix(),
                    tool = done.entry.tool.as_str(),
                    lapsed_at = %crate::domain::time::rfc3339(at),
                    "an approval lapsed: {}",
                    note.detail
                );
                self.changed(&tenant, &key, done.has_waiters).await;
            }
        }
        if expired > 0 {
            self.approvals.expired(expired);
        }
        Ok(expired)
    }

    /// When the next request or approval lapses, if any call awaits a decision: what the
    /// sweep that records lapses as they happen waits for.
    ///
    /// # Errors
    /// `Unavailable`/`Internal` from the store.
    pub async fn next_lapse(&self) -> Result<Option<Duration>, LedgerError> {
        let now = self.clock.now();
        Ok(self.store.next_lapse().await?.map(|at| {
            if at > now {
                at.minus(now).to_duration()
            } else {
                Duration::ZERO
            }
        }))
    }

    /// The tenant's approval events after `cursor` (from now when `None`: see
    /// [`approval_cursor`]), oldest first, at most `limit`, each with its entry as it stands.
    /// With no event yet, an empty list and the cursor to go on from.
    ///
    /// # Errors
    /// `Unavailable`/`Internal` from the store.
    pub async fn approval_events(
        &self,
        tenant: &Tenant,
        cursor: Option<i64>,
        limit: u32,
    ) -> Result<(Vec<ApprovalEvent>, i64), LedgerError> {
        let Some(after) = cursor else {
            return Ok((Vec::new(), self.store.last_history_id(tenant).await?));
        };
        let now = self.clock.now();
        let mut events = Vec::new();
        let mut last = after;
        for (id, event, key) in self.store.approval_events(tenant, after, limit).await? {
            last = id;
            let Some(kind) = event.kind.approval_event() else {
                continue;
            };
            let entry = self
                .store
                .get(tenant, &key)
                .await?
                .filter(|e| !e.is_expired(now))
                .map(|e| self.audit_view(e, now));
            events.push(ApprovalEvent {
                cursor: id,
                kind,
                at: event.at,
                principal: event.principal,
                entry,
            });
        }
        Ok((events, last))
    }
}

/// A watcher's cursor as it sends it (WatchApprovals' `after`): empty is none (from now), else
/// an event's cursor as this server gave it.
///
/// # Errors
/// `InvalidArgument` for field `after` when the text is no cursor this server gives (not a
/// non-negative integer).
pub fn approval_cursor(text: &str) -> Result<Option<i64>, LedgerError> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse::<i64>()
        .ok()
        .filter(|c| *c >= 0)
        .map(Some)
        .ok_or_else(|| {
            LedgerError::invalid(
                "after",
                "is not a cursor this server gave: pass an event's cursor as it is",
            )
        })
}

/// Why a decision found nothing to decide, in words.
fn not_awaiting_why(approval: Option<&Approval>, now: Micros) -> String {
    let at = |m: Option<Micros>| m.map(crate::domain::time::rfc3339).unwrap_or_default();
    match approval {
        Some(a) if a.state == ApprovalState::Requested && a.lapsed(now) => format!(
            "its request lapsed undecided at {}; the next claim of the call asks again",
            at(a.decide_by)
        ),
        Some(a) if a.state == ApprovalState::Expired => {
            "its approval lapsed; the next claim of the call asks again".to_string()
        }
        _ => "no person's decision was asked for this entry".to_string(),
    }
}

/// Checks a decision's fields (its key was parsed where it arrived): the fingerprint as 64
/// lowercase hex characters, the reason at most [`MAX_REASON_BYTES`] without control
/// characters (a line break allowed).
fn checked_decision(input: &DecideInput) -> Result<(), LedgerError> {
    let fingerprint = input.fingerprint.as_str();
    if fingerprint.len() != 64
        || !fingerprint
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(LedgerError::invalid(
            "fingerprint",
            "must be the entry's fingerprint as shown with the arguments: 64 lowercase hex \
             characters",
        ));
    }
    if input.reason.len() > MAX_REASON_BYTES {
        return Err(LedgerError::invalid(
            "reason",
            format!(
                "is {} bytes; at most {MAX_REASON_BYTES}",
                input.reason.len()
            ),
        ));
    }
    if input.reason.chars().any(|c| c.is_control() && c != '\n') {
        return Err(LedgerError::invalid(
            "reason",
            "must not hold control characters",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watchers_cursor_is_empty_or_a_cursor_this_server_gives() {
        assert_eq!(approval_cursor("").expect("from now"), None);
        assert_eq!(approval_cursor("0").expect("a cursor"), Some(0));
        assert_eq!(approval_cursor("42").expect("a cursor"), Some(42));
        for bad in ["-1", "x", " 42", "4.2", "99999999999999999999"] {
            match approval_cursor(bad) {
                Err(LedgerError::InvalidArgument { field, message, .. }) => {
                    assert_eq!(field, "after", "{bad}");
                    assert!(
                        message.contains("not a cursor this server gave"),
                        "{message}"
                    );
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
