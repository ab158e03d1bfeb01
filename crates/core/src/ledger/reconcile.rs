//! Reconcile: apply what reconcilers found about unknown outcomes, each finding fenced by the
//! attempt it observed and the hold it was handed out under, then hand out the next unresolved
//! entries, held for the caller.

use std::time::Duration;

use super::{EntryView, Ledger, MAX_RACES};
use crate::domain::Tenant;
use crate::domain::fields::{HoldToken, Principal, ToolName};
use crate::domain::key::Key;
use crate::domain::{
    Completion, Entry, EventKind, FinalStatus, FindingDecision, HistoryEvent, Micros, StaleReason,
    decide_finding, marks_double_effect,
};
use crate::error::LedgerError;
use crate::reason::Reason;
use crate::storage::UnresolvedQuery;

/// What a reconciler found out about one entry, as a request states it (its key and hold
/// token parsed where it arrived).
#[derive(Clone, Debug)]
pub struct ResolutionInput {
    /// The entry's key.
    pub key: Key,
    /// `Succeeded` when the effect was found, `Failed` when it was not.
    pub status: FinalStatus,
    /// The result found, with `Succeeded`.
    pub result: Vec<u8>,
    /// What was (not) found, with `Failed`.
    pub error: String,
    /// With `Failed`: may the intent be tried again.
    pub retryable: bool,
    /// The attempt the read was about (the pending entry's); 0 is none, refused.
    pub attempt: u32,
    /// The hold the entry was handed out under; [`HoldToken::none`] is none, refused.
    pub hold_token: HoldToken,
}

/// A Reconcile: which unresolved entries to hand out, and the answers about earlier ones (its
/// tool, keys and principal parsed where it arrived; how many of them a call may send is the
/// ledger's limit, checked here).
#[derive(Clone, Debug, Default)]
pub struct ReconcileInput {
    /// Only entries whose attempt started at least this long ago.
    pub older_than: Option<Duration>,
    /// Only entries of this tool; `None` for all.
    pub tool: Option<ToolName>,
    /// How many to hand out; 0 for the server's default.
    pub limit: u32,
    /// Findings to apply first.
    pub resolutions: Vec<ResolutionInput>,
    /// Apply the resolutions only: hand out (and hold) nothing new.
    pub resolve_only: bool,
    /// Hand out only these keys (each if unresolved and not held by another reconciler);
    /// empty for any unresolved entry.
    pub keys: Vec<Key>,
    /// Who reconciles: recorded as `resolved_by` on every entry a resolution settles.
    pub principal: Principal,
}

/// A finding, checked: about which attempt of which entry, under which hold, and what it
/// found.
#[derive(Clone, Debug)]
pub struct Finding {
    /// The entry's key.
    pub key: Key,
    /// The attempt the read observed.
    pub attempt: u32,
    /// The hold it was gathered under: the newest hand-out's token, or none for an entry a
    /// person resolves in the console without a hand-out (it then applies only while the
    /// entry was never handed out since the page showed it).
    pub hold: HoldToken,
    /// What it found (a success with the result, or a failure).
    pub completion: Completion,
}

/// What became of one finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolutionOutcome {
    /// It settled the entry.
    Applied,
    /// It changed nothing: it no longer speaks for the entry.
    Stale(StaleReason),
    /// It changed nothing: the attempt it was about is resolved already.
    AlreadyResolved,
    /// There is no such entry (any more).
    NotFound,
}

impl ResolutionOutcome {
    /// The name counted in the metrics and written in logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ResolutionOutcome::Applied => "applied",
            ResolutionOutcome::Stale(_) => "stale",
            ResolutionOutcome::AlreadyResolved => "already_resolved",
            ResolutionOutcome::NotFound => "not_found",
        }
    }
}

/// What became of one finding, and the entry as it stands now.
#[derive(Clone, Debug)]
pub struct ResolutionResult {
    /// The finding's key.
    pub key: Key,
    /// What became of it.
    pub outcome: ResolutionOutcome,
    /// The entry as it stands now (`None` when not found).
    pub entry: Option<EntryView>,
    /// Why it was not applied, in words (empty when applied).
    pub note: String,
    /// Whether this finding marked the entry as a possible double effect.
    pub marked_double_effect: bool,
}

/// The answer to a Reconcile.
#[derive(Clone, Debug)]
pub struct ReconcileOutput {
    /// Unresolved entries, oldest first, now held for the caller; each carries the hold
    /// token its finding must name.
    pub pending: Vec<EntryView>,
    /// The entries the resolutions named, as they stand afterwards.
    pub resolved: Vec<EntryView>,
    /// What became of each resolution, in the request's order.
    pub results: Vec<ResolutionResult>,
}

impl Ledger {
    /// Applies what reconcilers found, then hands out up to `limit` unresolved entries, oldest
    /// first, holding each for this caller for the reconcile lease under a fresh hold token.
    ///
    /// A finding applies only to the attempt it observed, under the hold it was given (see
    /// [`Ledger::settle`]); the others change nothing and are reported, logged and kept in
    /// the entry's history. Entries are handed out only once their outcome has been unknown
    /// for the reconcile grace.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed request (checked whole before anything is written),
    /// reason `UNFENCED_RESOLUTION` for a resolution without its attempt and hold token;
    /// `Unavailable`/`Internal` from the store.
    pub async fn reconcile(
        &self,
        tenant: &Tenant,
        input: ReconcileInput,
    ) -> Result<ReconcileOutput, LedgerError> {
        let max = self.limits.reconcile_max_limit;
        if input.resolutions.len() > max as usize {
            return Err(LedgerError::invalid(
                "resolutions",
                format!(
                    "{} resolutions; at most {max} per call",
                    input.resolutions.len()
                ),
            ));
        }
        let ReconcileInput {
            tool, principal, ..
        } = input;
        if input.keys.len() > max as usize {
            return Err(LedgerError::invalid(
                "keys",
                format!("{} keys; at most {max} per call", input.keys.len()),
            ));
        }
        let mut keys = Vec::with_capacity(input.keys.len());
        for key in input.keys {
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let mut findings = Vec::with_capacity(input.resolutions.len());
        for (i, r) in input.resolutions.into_iter().enumerate() {
            findings.push(self.check_resolution(i, r)?);
        }

        let mut resolved = Vec::with_capacity(findings.len());
        let mut results = Vec::with_capacity(findings.len());
        for finding in &findings {
            let result = self.settle(tenant, finding, &principal).await?;
            if let Some(view) = &result.entry
                && result.outcome != ResolutionOutcome::NotFound
            {
                resolved.push(view.clone());
            }
            results.push(result);
        }

        if input.resolve_only {
            return Ok(ReconcileOutput {
                pending: Vec::new(),
                resolved,
                results,
            });
        }
        let now = self.clock.now();
        let limit = match input.limit {
            0 if !keys.is_empty() => max,
            0 => self.limits.reconcile_default_limit,
            n => n.min(max),
        };
        keys.truncate(limit as usize);
        let older_than = input
            .older_than
            .map(Micros::from_duration)
            .unwrap_or_default();
        let hold_token = HoldToken::random()
            .map_err(|e| LedgerError::Internal(format!("no randomness for a hold token: {e}")))?;
        let query = UnresolvedQuery {
            now,
            started_before: now.minus(older_than),
            tool,
            limit,
            hold_until: now.plus(Micros::from_duration(self.limits.reconcile_lease)),
            keys,
            unknown_before: now.minus(Micros::from_duration(self.limits.reconcile_grace)),
            hold_token,
        };
        let pending = self
            .store
            .take_unresolved(tenant, &query)
            .await?
            .into_iter()
            .map(|e| self.view(e, now))
            .collect();
        Ok(ReconcileOutput {
            pending,
            resolved,
            results,
        })
    }

    /// Checks resolution `i` of a request whole (its key was parsed where it arrived): a final
    /// status with the fields that go with it, and its fence (attempt and hold token).
    fn check_resolution(&self, i: usize, r: ResolutionInput) -> Result<Finding, LedgerError> {
        if r.status == FinalStatus::Unknown {
            return Err(resolution_not_final(i));
        }
        if r.attempt == 0 || r.hold_token.is_none() {
            return Err(unfenced_resolution(i));
        }
        let completion = Completion::new(r.status, r.result, r.error, r.retryable)
            .map_err(LedgerError::from)
            .and_then(|c| self.check_size(&c).map(|()| c))
            .map_err(|e| match e {
                LedgerError::InvalidArgument {
                    reason,
                    message,
                    field,
                } => LedgerError::InvalidArgument {
                    field: "resolutions",
                    reason,
                    message: format!("[{i}].{field} {message}"),
                },
                other => other,
            })?;
        Ok(Finding {
            key: r.key,
            attempt: r.attempt,
            hold: r.hold_token,
            completion,
        })
    }

    /// Applies one finding if it still speaks for its entry (the entry still unresolved, at
    /// the attempt the finding observed, and its newest hold the finding's), in one
    /// conditional write that also records it in the entry's history; re-reads when a
    /// concurrent writer changed the entry meanwhile. A finding that does not apply changes
    /// nothing but the history, where it is kept with why; a found effect of an earlier
    /// attempt, while a later one was started, marks the entry as a possible double effect.
    ///
    /// # Errors
    /// `Unavailable`/`Internal` from the store.
    pub async fn settle(
        &self,
        tenant: &Tenant,
        finding: &Finding,
        principal: &Principal,
    ) -> Result<ResolutionResult, LedgerError> {
        for _ in 0..MAX_RACES {
            let now = self.clock.now();
            let Some(existing) = self.store.get(tenant, &finding.key).await? else {
                return Ok(not_found(finding));
            };
            let outcome = match decide_finding(&existing, finding.attempt, &finding.hold, now) {
                FindingDecision::NotFound => return Ok(not_found(finding)),
                FindingDecision::Apply => {
                    let done = Entry {
                        resolved_by: principal.clone(),
                        attempt: finding.attempt,
                        hold_token: finding.hold.clone(),
                        ..finding.completion.apply_to(&existing, now)
                    };
                    let note = HistoryEvent {
                        at: now,
                        attempt: finding.attempt,
                        kind: EventKind::FindingApplied,
                        principal: principal.clone(),
                        detail: found_in_words(&finding.completion),
                    };
                    match self.store.resolve(tenant, &done, now, &note).await? {
                        Some(has_waiters) => {
                            self.memory.remember(tenant, &done);
                            self.changed(tenant, &finding.key, has_waiters).await;
                            return Ok(ResolutionResult {
                                key: finding.key.clone(),
                                outcome: ResolutionOutcome::Applied,
                                entry: Some(self.view(done, now)),
                                note: String::new(),
                                marked_double_effect: false,
                            });
                        }
                        // Changed since the read: decide again on a fresh one.
                        None => continue,
                    }
                }
                FindingDecision::AlreadyResolved => ResolutionOutcome::AlreadyResolved,
                FindingDecision::Stale(reason) => ResolutionOutcome::Stale(reason),
            };
            return self
                .keep_unapplied(tenant, finding, principal, existing, outcome, now)
                .await;
        }
        Err(LedgerError::Internal(format!(
            "resolution of {} lost {MAX_RACES} races in a row",
            finding.key
        )))
    }

    /// Records a finding that changed nothing in the entry's history and the log, and marks
    /// a possible double effect when it says so.
    async fn keep_unapplied(
        &self,
        tenant: &Tenant,
        finding: &Finding,
        principal: &Principal,
        mut existing: Entry,
        outcome: ResolutionOutcome,
        now: Micros,
    ) -> Result<ResolutionResult, LedgerError> {
        let why = unapplied_in_words(&existing, finding.attempt, outcome, now);
        let event = HistoryEvent {
            at: now,
            attempt: finding.attempt,
            kind: if outcome == ResolutionOutcome::AlreadyResolved {
                EventKind::FindingAlreadyResolved
            } else {
                EventKind::FindingStale
            },
            principal: principal.clone(),
            detail: format!("{}; {why}", found_in_words(&finding.completion)),
        };
        self.store
            .append_history(tenant, &finding.key, &event)
            .await?;
        let found = finding.completion.final_status() == FinalStatus::Succeeded;
        tracing::warn!(
            key = finding.key.log_prefix(),
            attempt_seen = finding.attempt,
            attempt_now = existing.attempt,
            status_now = existing.effective_status(now).as_str(),
            principal = %principal,
            outcome = outcome.as_str(),
            reason = stale_reason(outcome),
            found,
            "a finding was not applied: {why}"
        );
        let marked = marks_double_effect(&existing, finding.attempt, found)
            && self
                .store
                .mark_double_effect(
                    tenant,
                    &finding.key,
                    &HistoryEvent {
                        kind: EventKind::PossibleDoubleEffect,
                        detail: format!(
                            "the effect of attempt {} exists, and {}: the intent may have \
                             acted twice",
                            finding.attempt,
                            if existing.attempt > finding.attempt {
                                format!("attempt {} was started since", existing.attempt)
                            } else {
                                "it had been recorded as not done (retryable)".to_owned()
                            }
                        ),
                        ..event
                    },
                )
                .await?;
        if marked {
            existing.possible_double_effect = true;
            tracing::error!(
                key = finding.key.log_prefix(),
                attempt_seen = finding.attempt,
                attempt_now = existing.attempt,
                principal = %principal,
                "possible double effect: a finding says an earlier attempt's effect exists \
                 while a later attempt was started; a person must look at it"
            );
        }
        let existing = self.with_unwritten_replays(tenant, existing);
        Ok(ResolutionResult {
            key: finding.key.clone(),
            outcome,
            entry: Some(self.view(existing, now)),
            note: why,
            marked_double_effect: marked,
        })
    }
}

/// The refusal of resolution `i` reporting UNKNOWN, which is no finding.
#[must_use]
pub fn resolution_not_final(i: usize) -> LedgerError {
    LedgerError::invalid(
        "resolutions",
        format!("[{i}].status must be STATUS_SUCCEEDED or STATUS_FAILED"),
    )
}

/// The refusal of resolution `i` without its fence: no attempt, or no hold token (an empty
/// one, refused where the request arrived, or [`HoldToken::none`]).
#[must_use]
pub fn unfenced_resolution(i: usize) -> LedgerError {
    LedgerError::InvalidArgument {
        field: "resolutions",
        reason: Reason::UnfencedResolution,
        message: format!(
            "[{i}] names no attempt or no hold_token: send the attempt and the hold_token of \
             the pending entry the finding is about (as Reconcile handed it out), so that a \
             late finding about an earlier attempt cannot settle a later one"
        ),
    }
}

fn not_found(finding: &Finding) -> ResolutionResult {
    ResolutionResult {
        key: finding.key.clone(),
        outcome: ResolutionOutcome::NotFound,
        entry: None,
        note: "no such entry (it expired, or never existed)".to_owned(),
        marked_double_effect: false,
    }
}

/// The stale reason's name, or empty for an outcome that is not stale.
fn stale_reason(outcome: ResolutionOutcome) -> &'static str {
    match outcome {
        ResolutionOutcome::Stale(reason) => reason.as_str(),
        _ => "",
    }
}

/// What a finding found, in words, for the history.
fn found_in_words(completion: &Completion) -> String {
    match completion {
        Completion::Succeeded { result, .. } => {
            format!(
                "found: the effect exists (result of {} bytes)",
                result.len()
            )
        }
        Completion::Failed { error, retryable } => format!(
            "not found{}{}",
            if *retryable {
                " (retryable)"
            } else {
                " (permanent)"
            },
            if error.is_empty() {
                String::new()
            } else {
                format!(": {error}")
            }
        ),
        Completion::Unknown { error } => format!("unknown: {error}"),
    }
}

/// Why a finding about `attempt` changed nothing, in words.
fn unapplied_in_words(
    existing: &Entry,
    attempt: u32,
    outcome: ResolutionOutcome,
    now: Micros,
) -> String {
    let status = existing.effective_status(now).as_str();
    match outcome {
        ResolutionOutcome::Stale(StaleReason::LaterAttempt) => format!(
            "stale: attempt {} was started since (now {status})",
            existing.attempt
        ),
        ResolutionOutcome::Stale(StaleReason::OtherAttempt) => format!(
            "stale: the entry is at attempt {}, not {attempt} (now {status})",
            existing.attempt
        ),
        ResolutionOutcome::Stale(StaleReason::HoldReplaced) => format!(
            "stale: the entry was handed out again since, to another hold (attempt {}, \
             {status})",
            existing.attempt
        ),
        ResolutionOutcome::Stale(StaleReason::NotUnknown) => format!(
            "stale: attempt {} is still in its lease ({status}), not unknown",
            existing.attempt
        ),
        ResolutionOutcome::AlreadyResolved => format!(
            "attempt {} was already resolved as {status}{}",
            existing.attempt,
            if existing.resolved_by.is_empty() {
                String::new()
            } else {
                format!(" by {}", existing.resolved_by)
            }
        ),
        ResolutionOutcome::Applied | ResolutionOutcome::NotFound => String::new(),
    }
}
