//! Claim: canonicalize the arguments (its other fields come parsed), derive the key, insert
//! the entry (the primary key decides among concurrent claimants), or read what the key holds
//! and answer from it; with a wait, hold the call while an attempt is in flight.

use crate::reason::Reason;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use super::model_notes::{IN_FLIGHT_NOTE, UNKNOWN_NOTE, denied_note, failed_note, replay_note};
use super::replay_memory::Recalled;
use super::{EntryView, Ledger, MAX_RACES, UNKNOWN_RETRY_AFTER, bounded, new_claim_token};
use crate::domain::Tenant;
use crate::domain::canonical::{self, Canonicalization};
use crate::domain::fields::{ClaimToken, HoldToken, Principal, RunId, ToolName};
use crate::domain::key::{self, ClaimKey, Key};
use crate::domain::{Approval, ClaimDecision, Entry, Micros, Status, decide_claim};
use crate::error::LedgerError;

mod gated;

pub(super) use gated::lapsed_note;

/// A Claim, its fields parsed where it arrived (durations converted; `None` means unset).
/// The arguments stay text: the claim canonicalizes them under the ledger's JSON limits.
#[derive(Clone, Debug)]
pub struct ClaimInput {
    /// The tool.
    pub tool: ToolName,
    /// The arguments as JSON text; always required.
    pub arguments_json: String,
    /// The key, explicit or derived from the run, and the run.
    pub key: ClaimKey,
    /// How the arguments are canonicalized.
    pub canonicalization: Canonicalization,
    /// The lease asked for.
    pub lease: Option<Duration>,
    /// The retention asked for.
    pub retention: Option<Duration>,
    /// How long to wait for an attempt in flight, as asked (bounded here by `--max-wait` and by
    /// `answer_by`).
    pub wait: Option<Duration>,
    /// What the wait waits for: an attempt in flight, and a decision due unless the caller
    /// asked for the attempt only.
    pub wait_for: WaitFor,
    /// When the caller stops listening (its deadline): a wait ends in time to answer before.
    pub answer_by: Option<Instant>,
    /// Who asks.
    pub principal: Principal,
    /// Ask a person first, whatever the server's approval policy says.
    pub require_approval: bool,
}

/// What a claim with a wait waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WaitFor {
    /// An attempt in flight, and a person's decision that an earlier claim asked for.
    #[default]
    AttemptOrDecision,
    /// Only an attempt in flight: a call awaiting a decision is answered at once (a decision
    /// may take days), so that a client's repeat costs one call whatever it meets.
    Attempt,
}

/// What a Claim found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The caller holds the claim and must act.
    Claimed,
    /// The stored result is returned; no action.
    Replayed,
    /// An attempt is in flight or unknown; no action.
    InProgress,
    /// The stored permanent error is returned; no action.
    PreviouslyFailed,
    /// A person has been asked to decide; no action.
    AwaitingApproval,
    /// A person declined; no action.
    Denied,
}

impl Outcome {
    /// Every outcome, in the proto's order.
    pub const ALL: [Outcome; 6] = [
        Outcome::Claimed,
        Outcome::Replayed,
        Outcome::InProgress,
        Outcome::PreviouslyFailed,
        Outcome::AwaitingApproval,
        Outcome::Denied,
    ];

    /// The name the proto gives it, without the `OUTCOME_` prefix (logs, metrics labels).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Claimed => "CLAIMED",
            Outcome::Replayed => "REPLAYED",
            Outcome::InProgress => "IN_PROGRESS",
            Outcome::PreviouslyFailed => "PREVIOUSLY_FAILED",
            Outcome::AwaitingApproval => "AWAITING_APPROVAL",
            Outcome::Denied => "DENIED",
        }
    }
}

/// The answer to a Claim.
#[derive(Clone, Debug)]
pub struct ClaimOutput {
    /// What the caller should do.
    pub outcome: Outcome,
    /// The entry after the claim.
    pub entry: EntryView,
    /// The fencing token, with `Claimed` only.
    pub claim_token: Option<ClaimToken>,
    /// A sentence for the model; empty with `Claimed`.
    pub note: String,
    /// With `InProgress`: when trying again is worthwhile.
    pub retry_after: Option<Duration>,
    /// With `AwaitingApproval`: this claim asked the person (it made the request, or asked
    /// again after one lapsed), so it answers at once; only a repeat waits for the decision.
    pub asked: bool,
}

impl Ledger {
    /// Claims a key before acting. With a wait, holds the call while the entry is in flight.
    ///
    /// # Errors
    /// `InvalidArgument` for malformed arguments or a duration out of bounds (nothing is
    /// written); `KeyReused` for an explicit key with other arguments; `Unavailable`/`Internal`
    /// from the store.
    pub async fn claim(
        &self,
        tenant: &Tenant,
        input: ClaimInput,
    ) -> Result<ClaimOutput, LedgerError> {
        let request = self.prepare_claim(tenant, input)?;
        let output = self.claim_once(tenant, &request).await?;
        let until = match request.wait {
            Some(wait) if !wait.is_zero() && in_flight(&output, request.wait_for) => {
                Instant::now() + wait
            }
            _ => return Ok(output),
        };
        // The wait is a span of its own in the call's trace; its target is
        // `observe::traces::TARGET` (above this module): only the trace exporter sees it.
        let span = tracing::info_span!(target: crate::TRACE_TARGET, "ledger.claim_wait");
        self.wait_out(tenant, &request, until)
            .instrument(span)
            .await
    }

    /// Holds a claim whose entry is in flight until it is not (answering then), or until
    /// `until` (answering what is true then).
    async fn wait_out(
        &self,
        tenant: &Tenant,
        request: &PreparedClaim,
        until: Instant,
    ) -> Result<ClaimOutput, LedgerError> {
        // Wait: register first, then mark the entry so other servers announce its change,
        // then re-read in the loop, so that no completion can slip between read and sleep.
        // Only other servers read the mark: a store no other server shares gets no write.
        let watch = self.waits.watch(tenant, &request.key);
        if self.store.shared() {
            self.store.mark_waiting(tenant, &request.key).await?;
        }
        loop {
            let changed = watch.notified();
            let output = self.claim_once(tenant, request).await?;
            if !in_flight(&output, request.wait_for) || Instant::now() >= until {
                return Ok(output);
            }
            // The lease ending turns the attempt unknown: answer then too.
            let lease_left = output
                .entry
                .entry
                .lease_expires_at
                .minus(self.clock.now())
                .to_duration();
            let wake_at = until.min(Instant::now() + lease_left);
            let _parked = self.waits.waiting();
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// Canonicalizes a claim's arguments, derives its key and fingerprint, checks its
    /// durations, and says whether a new entry of it needs a person's decision; nothing is
    /// written on error.
    pub(super) fn prepare_claim(
        &self,
        tenant: &Tenant,
        input: ClaimInput,
    ) -> Result<PreparedClaim, LedgerError> {
        let ClaimInput {
            tool,
            principal,
            key,
            ..
        } = input;
        let (fingerprint, canonical, value) =
            self.canonical_request(&tool, &input.arguments_json, input.canonicalization)?;
        let arguments = self.limits.arguments.stored(&value, &canonical);
        let (key, run_id) = key.into_key(&tool, &canonical, input.canonicalization);
        let lease = bounded(
            "lease",
            input.lease,
            self.limits.default_lease,
            self.limits.max_lease,
        )?;
        let retention = bounded(
            "retention",
            input.retention,
            self.limits.default_retention,
            self.limits.max_retention,
        )?;
        // The server's policy may gate the call; the claim may ask for a gate itself, never lift
        // one. Only a tool the policy names has its arguments looked at.
        let gate = if input.require_approval {
            Some("the claim asked for approval (require_approval)".to_string())
        } else {
            let policy = self.approvals.policy();
            if policy.mentions(tool.as_str()) {
                policy
                    .gate(tenant.as_str(), tool.as_str(), &canonical)
                    .map(|rule| format!("the approval policy's line {}", rule.line))
            } else {
                None
            }
        };
        Ok(PreparedClaim {
            key,
            run_id,
            tool,
            fingerprint,
            principal,
            gate,
            lease: Micros::from_duration(lease),
            retention: Micros::from_duration(retention),
            wait: input
                .wait
                .map(|w| bounded_wait(w, self.limits.max_wait, input.answer_by)),
            wait_for: input.wait_for,
            arguments,
        })
    }

    /// Canonicalizes the arguments and returns (fingerprint, canonical text, the value the
    /// text was written from).
    pub(super) fn canonical_request(
        &self,
        tool: &ToolName,
        arguments_json: &str,
        mode: Canonicalization,
    ) -> Result<(String, String, canonical::Value), LedgerError> {
        if arguments_json.is_empty() {
            // The same reason as the shared key vectors give for empty text, with a hint.
            return Err(LedgerError::InvalidArgument {
                field: "arguments_json",
                reason: Reason::InvalidJson,
                message: "is required (empty text is not JSON); a tool without arguments sends {}"
                    .to_string(),
            });
        }
        let (value, canonical) =
            canonical::canonical_value(arguments_json, mode, &self.limits.json)
                .map_err(|e| LedgerError::from_canonical("arguments_json", e))?;
        Ok((key::fingerprint(tool, &canonical, mode), canonical, value))
    }

    /// One pass of the claim: insert, or read and act on what is there.
    async fn claim_once(
        &self,
        tenant: &Tenant,
        request: &PreparedClaim,
    ) -> Result<ClaimOutput, LedgerError> {
        // A finished entry this server remembers answers without the store.
        if let Some(answer) = self.remembered(tenant, request) {
            return answer;
        }
        // A key this server saw succeed recently is most likely a repeat: try the replay
        // first, which spares the insert (and its wait on the row lock of a concurrent replay).
        let mut replay_tried = false;
        if self.recent_keys.probably_contains(tenant, &request.key) {
            replay_tried = true;
            if let Some(answer) = self.replay_first(tenant, request).await? {
                return Ok(answer);
            }
        }
        for _ in 0..MAX_RACES {
            let now = self.clock.now();
            let fresh = request.new_entry(now, 1, new_claim_token()?);
            if let Some(why) = &request.gate {
                let asked = self.awaiting(request, &fresh, now);
                let note = self.requested_note(&asked, why);
                if self.store.insert_request(tenant, &asked, &note).await? {
                    return Ok(self.requested(asked, now));
                }
            } else if self.store.insert(tenant, &fresh).await? {
                return Ok(self.claimed(fresh, now));
            }
            // The row exists. The most common reason is a repeat of a finished call: replay it
            // in one statement (unless that was just tried and missed).
            if !std::mem::take(&mut replay_tried)
                && let Some(entry) = self
                    .store
                    .replay(tenant, &request.key, &request.fingerprint, now)
                    .await?
            {
                self.recent_keys.insert(tenant, &request.key);
                self.memory.remember(tenant, &entry);
                let note = replay_note(&entry);
                return Ok(self.answer(Outcome::Replayed, entry, now, note, None));
            }
            // Otherwise read it in its own statement (a CTE on the insert would not see a row
            // committed after its snapshot) and let the domain decide.
            let Some(existing) = self.store.get(tenant, &request.key).await? else {
                continue; // pruned in between: insert again
            };
            let mut decision = decide_claim(&existing, &request.fingerprint, now);
            // An expired entry is gone: starting over creates the entry anew, gated or not.
            if decision == ClaimDecision::StartOver && request.gate.is_some() {
                decision = ClaimDecision::RequestAgain;
            }
            match decision {
                ClaimDecision::KeyReused => return Err(LedgerError::KeyReused),
                ClaimDecision::AwaitingApproval => return Ok(self.awaiting_answer(existing, now)),
                ClaimDecision::Denied => {
                    let note = denied_note(&existing);
                    return Ok(self.answer(Outcome::Denied, existing, now, note, None));
                }
                ClaimDecision::UseApproval => {
                    if let Some(out) = self
                        .use_approval(tenant, request, &existing, fresh, now)
                        .await?
                    {
                        return Ok(out);
                    }
                }
                ClaimDecision::RequestAgain => {
                    if let Some(out) = self
                        .request_again(tenant, request, &existing, fresh, now)
                        .await?
                    {
                        return Ok(out);
                    }
                }
                decision @ (ClaimDecision::StartOver | ClaimDecision::Retry) => {
                    if let Some(out) = self
                        .restart(tenant, request, decision, &existing, fresh, now)
                        .await?
                    {
                        return Ok(out);
                    }
                }
                // Became a success after the replay statement looked: go round again.
                ClaimDecision::Replay => {}
                ClaimDecision::PreviouslyFailed => {
                    self.memory.remember(tenant, &existing);
                    let note = failed_note(&existing);
                    return Ok(self.answer(Outcome::PreviouslyFailed, existing, now, note, None));
                }
                ClaimDecision::InProgress => return Ok(self.in_progress(existing, now)),
            }
        }
        Err(LedgerError::Internal(format!(
            "claim of {} lost {MAX_RACES} races in a row",
            request.key
        )))
    }

    /// The replay of a key this server saw succeed recently, tried before the insert; `None`
    /// when the store holds no finished entry of this request under the key.
    async fn replay_first(
        &self,
        tenant: &Tenant,
        request: &PreparedClaim,
    ) -> Result<Option<ClaimOutput>, LedgerError> {
        let now = self.clock.now();
        if let Some(entry) = self
            .store
            .replay(tenant, &request.key, &request.fingerprint, now)
            .await?
        {
            self.memory.remember(tenant, &entry);
            let note = replay_note(&entry);
            return Ok(Some(self.answer(Outcome::Replayed, entry, now, note, None)));
        }
        Ok(None)
    }

    /// The answer of a finished entry this server remembers, without the store; `None` when
    /// it remembers none.
    fn remembered(
        &self,
        tenant: &Tenant,
        request: &PreparedClaim,
    ) -> Option<Result<ClaimOutput, LedgerError>> {
        let remembered =
            self.memory
                .recall(tenant, &request.key, &request.fingerprint, self.clock.now());
        let recalled = remembered?;
        let now = self.clock.now();
        Some(match recalled {
            Recalled::Replay(entry) => {
                let note = replay_note(&entry);
                Ok(self.answer(Outcome::Replayed, entry, now, note, None))
            }
            Recalled::PreviouslyFailed(entry) => {
                let note = failed_note(&entry);
                Ok(self.answer(Outcome::PreviouslyFailed, entry, now, note, None))
            }
            Recalled::KeyReused => Err(LedgerError::KeyReused),
        })
    }

    /// Starts a new attempt of `existing` (a retry continues its attempts; an expired entry
    /// starts over) with `fresh`'s token; `None` when another claim changed the entry first.
    async fn restart(
        &self,
        tenant: &Tenant,
        request: &PreparedClaim,
        decision: ClaimDecision,
        existing: &Entry,
        fresh: Entry,
        now: Micros,
    ) -> Result<Option<ClaimOutput>, LedgerError> {
        // A retry continues the entry's attempts; an expired entry starts over.
        let attempt = if decision == ClaimDecision::Retry {
            existing.attempt.saturating_add(1)
        } else {
            1
        };
        let next = Entry {
            // The mark stays across attempts (RESTART leaves it as stored).
            possible_double_effect: existing.possible_double_effect,
            ..request.new_entry(now, attempt, fresh.claim_token)
        };
        if self
            .store
            .restart(tenant, &existing.claim_token, &next)
            .await?
        {
            return Ok(Some(self.claimed(next, now)));
        }
        Ok(None)
    }

    /// The answer to a claim of an entry in flight: its attempt is in its lease, or unknown.
    fn in_progress(&self, existing: Entry, now: Micros) -> ClaimOutput {
        let status = existing.effective_status(now);
        let (note, retry_after) = if status == Status::Attempting {
            let remaining = existing.lease_expires_at.minus(now).to_duration();
            (
                IN_FLIGHT_NOTE.to_string(),
                remaining.clamp(Duration::from_millis(100), Duration::from_secs(1)),
            )
        } else {
            (UNKNOWN_NOTE.to_string(), UNKNOWN_RETRY_AFTER)
        };
        self.answer(Outcome::InProgress, existing, now, note, Some(retry_after))
    }

    pub(super) fn claimed(&self, entry: Entry, now: Micros) -> ClaimOutput {
        let token = entry.claim_token.clone();
        ClaimOutput {
            outcome: Outcome::Claimed,
            entry: self.view(entry, now),
            claim_token: Some(token),
            note: String::new(),
            retry_after: None,
            asked: false,
        }
    }

    fn answer(
        &self,
        outcome: Outcome,
        entry: Entry,
        now: Micros,
        note: String,
        retry_after: Option<Duration>,
    ) -> ClaimOutput {
        ClaimOutput {
            outcome,
            entry: self.view(entry, now),
            claim_token: None,
            note,
            retry_after,
            asked: false,
        }
    }
}

/// How much of a call's remaining time a waiting claim keeps for its last read and its
/// answer: a fifth, within these bounds, so that even on a loaded machine the caller gets
/// IN_PROGRESS rather than an expired call.
const ANSWER_RESERVE_MIN: Duration = Duration::from_millis(50);
const ANSWER_RESERVE_MAX: Duration = Duration::from_millis(250);

/// The one bound on a claim's wait: what it asked, at most `max_wait`, and ending in time to
/// answer before `answer_by`.
fn bounded_wait(asked: Duration, max_wait: Duration, answer_by: Option<Instant>) -> Duration {
    let wait = asked.min(max_wait);
    match answer_by {
        Some(deadline) => {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let reserve = (remaining / 5).clamp(ANSWER_RESERVE_MIN, ANSWER_RESERVE_MAX);
            wait.min(remaining.saturating_sub(reserve))
        }
        None => wait,
    }
}

/// Whether a claim found an attempt still in flight, or (when it waits for decisions too) a
/// decision still to come that an earlier claim asked for: what a waiting claim waits out.
fn in_flight(output: &ClaimOutput, wait_for: WaitFor) -> bool {
    (output.outcome == Outcome::InProgress && output.entry.status == Status::Attempting)
        || (wait_for == WaitFor::AttemptOrDecision
            && output.outcome == Outcome::AwaitingApproval
            && !output.asked)
}

/// A validated claim with its derived key.
#[derive(Clone, Debug)]
pub(super) struct PreparedClaim {
    key: Key,
    run_id: Option<RunId>,
    tool: ToolName,
    fingerprint: String,
    principal: Principal,
    lease: Micros,
    retention: Micros,
    wait: Option<Duration>,
    wait_for: WaitFor,
    /// What is stored of the arguments (see [`ArgumentsPolicy`]).
    arguments: Option<String>,
    /// Why a new entry of this call needs a person's decision; `None` when it does not.
    pub(super) gate: Option<String>,
}

impl PreparedClaim {
    /// The same call claimed in `run`: its key derived from the run and the call's `canonical`
    /// arguments (canonicalized as `mode`).
    pub(super) fn in_run(&self, run: RunId, canonical: &str, mode: Canonicalization) -> Self {
        let key = Key::derive(&run, &self.tool, canonical, mode);
        PreparedClaim {
            key,
            run_id: Some(run),
            ..self.clone()
        }
    }

    pub(super) fn new_entry(&self, now: Micros, attempt: u32, claim_token: ClaimToken) -> Entry {
        Entry {
            key: self.key.clone(),
            run_id: self.run_id.clone(),
            tool: self.tool.clone(),
            fingerprint: self.fingerprint.clone(),
            status: Status::Attempting,
            attempt,
            claim_token,
            result: Vec::new(),
            error: String::new(),
            retryable: false,
            principal: self.principal.clone(),
            started_at: now,
            finished_at: None,
            lease_expires_at: now.plus(self.lease),
            retention: self.retention,
            expires_at: None,
            replay_count: 0,
            arguments: self.arguments.clone(),
            resolved_by: Principal::none(),
            hold_token: HoldToken::none(),
            possible_double_effect: false,
            approval: Approval::default(),
        }
    }
}
