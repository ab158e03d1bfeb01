//! The entry and its state machine: what a Claim or a Complete does to an entry as it stands.
//!
//! The stores only apply compare-and-set writes; every decision about which write to attempt is
//! made here, from the entry the store returned, so the state table (docs/behaviour.md) is tested without
//! a database.

use super::approval::{Approval, ApprovalState};
use super::fields::{ClaimToken, HoldToken, Principal, RunId, ToolName};
use super::key::Key;
use super::time::Micros;

/// An entry's status as stored. `Attempting` past its lease is *reported* as `Unknown`
/// ([`Entry::effective_status`]) without any write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// Claimed; the attempt is in flight.
    Attempting,
    /// The effect happened; the result is stored.
    Succeeded,
    /// The effect did not happen (permanently, or retryably when `retryable`).
    Failed,
    /// Nobody knows whether the effect happened; it waits for a Complete or a reconciliation.
    Unknown,
    /// A person has been asked to decide; nothing was done. Never expires while it waits.
    AwaitingApproval,
    /// A person declined the call: terminal, kept for its retention like an outcome.
    Denied,
}

impl Status {
    /// The name stored in the database and shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Attempting => "ATTEMPTING",
            Status::Succeeded => "SUCCEEDED",
            Status::Failed => "FAILED",
            Status::Unknown => "UNKNOWN",
            Status::AwaitingApproval => "AWAITING_APPROVAL",
            Status::Denied => "DENIED",
        }
    }

    /// Parses a stored name; `None` for anything else.
    pub fn parse(s: &str) -> Option<Status> {
        Some(match s {
            "ATTEMPTING" => Status::Attempting,
            "SUCCEEDED" => Status::Succeeded,
            "FAILED" => Status::Failed,
            "UNKNOWN" => Status::Unknown,
            "AWAITING_APPROVAL" => Status::AwaitingApproval,
            "DENIED" => Status::Denied,
            _ => return None,
        })
    }

    /// Whether the entry has an outcome (SUCCEEDED, FAILED, or DENIED by a person), so
    /// retention applies.
    pub fn is_resolved(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed | Status::Denied)
    }
}

/// One intent of one tool call, as stored for one tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The derived or explicit key; unique per tenant.
    pub key: Key,
    /// The run that made the current attempt; `None` for an explicit key claimed without one
    /// (stored as the empty text).
    pub run_id: Option<RunId>,
    /// The tool's name.
    pub tool: ToolName,
    /// hex(sha256) of tool and canonical arguments; an explicit key must keep it.
    pub fingerprint: String,
    /// The stored status; see [`Entry::effective_status`] for what callers are told.
    pub status: Status,
    /// 1 for the first attempt, one more after each retryable failure.
    pub attempt: u32,
    /// The fencing token of the current attempt; only its holder may complete.
    pub claim_token: ClaimToken,
    /// The result (only when `Succeeded`), byte for byte.
    pub result: Vec<u8>,
    /// The error of a failure, or the claimant's note on an unknown outcome.
    pub error: String,
    /// With `Failed`: whether a new claim may try again.
    pub retryable: bool,
    /// Who claimed the current attempt; empty when nobody was named.
    pub principal: Principal,
    /// When the current attempt was claimed.
    pub started_at: Micros,
    /// When the entry was resolved; `None` while unresolved.
    pub finished_at: Option<Micros>,
    /// When the current attempt's lease ends.
    pub lease_expires_at: Micros,
    /// How long the entry is kept once resolved (chosen at claim time).
    pub retention: Micros,
    /// `finished_at + retention`; `None` while unresolved, because unresolved entries never expire.
    pub expires_at: Option<Micros>,
    /// How many times the stored result was replayed.
    pub replay_count: u64,
    /// The arguments kept for audit (canonical, redacted per policy), when stored and read:
    /// statements on the claim path do not read them back.
    pub arguments: Option<String>,
    /// Who settled an unknown outcome (a Reconcile's principal); empty when the claimant's
    /// own Complete resolved it, or while unresolved. A new attempt starts with it empty.
    pub resolved_by: Principal,
    /// The token of the entry's newest Reconcile hand-out, the fence of a finding about it;
    /// none until it is first handed out, and none again when an attempt starts over.
    pub hold_token: HoldToken,
    /// A finding said that an earlier attempt's effect exists while a later attempt was
    /// started (or after the attempt was recorded as not done): the intent may have acted
    /// twice. Set until a person acknowledges it; kept across attempts.
    pub possible_double_effect: bool,
    /// The person's decision the call needed, if it needed one.
    pub approval: Approval,
}

impl Entry {
    /// The run's id as stored and shown: empty when the entry has no run.
    pub fn run_id_str(&self) -> &str {
        self.run_id.as_ref().map_or("", RunId::as_str)
    }

    /// What callers are told: an attempt past its lease is `Unknown`.
    pub fn effective_status(&self, now: Micros) -> Status {
        match self.status {
            Status::Attempting if now >= self.lease_expires_at => Status::Unknown,
            status => status,
        }
    }

    /// A resolved entry past its retention counts as deleted, even before the pruner runs.
    pub fn is_expired(&self, now: Micros) -> bool {
        self.status.is_resolved() && self.expires_at.is_some_and(|at| now >= at)
    }

    /// When the call stopped awaiting a decision, if it awaits one whose request or approval
    /// lapsed by `now`: its `decide_by` or `execute_by`.
    pub fn lapsed_at(&self, now: Micros) -> Option<Micros> {
        let until = self.approval.runs_until()?;
        (self.status == Status::AwaitingApproval && now >= until).then_some(until)
    }

    /// The entry as its lapse at `at` records it (the stores' `EXPIRE_APPROVAL` writes the
    /// same): nothing was done, so FAILED and retryable, the approval EXPIRED, finished at the
    /// deadline and kept for its retention from then.
    #[must_use]
    pub fn lapsed(mut self, at: Micros) -> Entry {
        self.error = format!("the approval lapsed: {}", self.approval.lapsed_words());
        self.status = Status::Failed;
        self.retryable = true;
        self.approval.state = ApprovalState::Expired;
        self.finished_at = Some(at);
        self.expires_at = Some(at.plus(self.retention));
        self
    }

    /// The entry as it reads at `now`: a call whose request or approval lapsed reads lapsed
    /// from that moment, as [`Entry::lapsed`] will record it, before the sweep or a claim
    /// writes it (as an attempt past its lease reads UNKNOWN without a write).
    #[must_use]
    pub fn as_of(self, now: Micros) -> Entry {
        match self.lapsed_at(now) {
            Some(at) => self.lapsed(at),
            None => self,
        }
    }
}

/// The outcome a claimant (or a reconciler) reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinalStatus {
    /// The effect happened.
    Succeeded,
    /// The effect did not happen.
    Failed,
    /// The claimant does not know.
    Unknown,
}

impl FinalStatus {
    /// The stored status this outcome writes.
    pub fn status(self) -> Status {
        match self {
            FinalStatus::Succeeded => Status::Succeeded,
            FinalStatus::Failed => Status::Failed,
            FinalStatus::Unknown => Status::Unknown,
        }
    }
}

/// A reported outcome with its payload, in the shapes Complete allows: a result only with
/// success, `retryable` only with failure. Built from a request's fields by
/// [`Completion::new`], which refuses the other combinations, so no code after it needs to
/// check them again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The effect happened.
    Succeeded {
        /// The result, byte for byte.
        result: Vec<u8>,
        /// A note the claimant sent with its success (usually empty).
        error: String,
    },
    /// The effect did not happen.
    Failed {
        /// What went wrong.
        error: String,
        /// Whether the intent may be tried again.
        retryable: bool,
    },
    /// The claimant does not know whether the effect happened.
    Unknown {
        /// The claimant's note (a timeout, say).
        error: String,
    },
}

impl Completion {
    /// The outcome a request's fields describe.
    ///
    /// # Errors
    /// [`InvalidField`](super::fields::InvalidField) for field `result` when a result comes with
    /// another status than success, and for field `retryable` when it is set with another
    /// status than failure.
    pub fn new(
        status: FinalStatus,
        result: Vec<u8>,
        error: String,
        retryable: bool,
    ) -> Result<Completion, super::fields::InvalidField> {
        use super::fields::InvalidField;
        if !result.is_empty() && status != FinalStatus::Succeeded {
            return Err(InvalidField {
                field: "result",
                message: "is stored only with STATUS_SUCCEEDED; describe a failure in error"
                    .to_owned(),
            });
        }
        if retryable && status != FinalStatus::Failed {
            return Err(InvalidField {
                field: "retryable",
                message: "applies only to STATUS_FAILED".to_owned(),
            });
        }
        Ok(match status {
            FinalStatus::Succeeded => Completion::Succeeded { result, error },
            FinalStatus::Failed => Completion::Failed { error, retryable },
            FinalStatus::Unknown => Completion::Unknown { error },
        })
    }

    /// A success with `result` and no note.
    #[must_use]
    pub fn success(result: Vec<u8>) -> Completion {
        Completion::Succeeded {
            result,
            error: String::new(),
        }
    }

    /// What happened.
    #[must_use]
    pub fn final_status(&self) -> FinalStatus {
        match self {
            Completion::Succeeded { .. } => FinalStatus::Succeeded,
            Completion::Failed { .. } => FinalStatus::Failed,
            Completion::Unknown { .. } => FinalStatus::Unknown,
        }
    }

    /// The stored status this outcome writes.
    #[must_use]
    pub fn status(&self) -> Status {
        self.final_status().status()
    }

    /// The result stored with it: empty unless it is a success.
    #[must_use]
    pub fn result(&self) -> &[u8] {
        match self {
            Completion::Succeeded { result, .. } => result,
            Completion::Failed { .. } | Completion::Unknown { .. } => &[],
        }
    }

    /// The error (or note) stored with it.
    #[must_use]
    pub fn error(&self) -> &str {
        match self {
            Completion::Succeeded { error, .. }
            | Completion::Failed { error, .. }
            | Completion::Unknown { error } => error,
        }
    }

    /// Whether a new claim may try again: only a retryable failure.
    #[must_use]
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Completion::Failed {
                retryable: true,
                ..
            }
        )
    }

    /// The entry after this outcome is applied at `now`.
    #[must_use]
    pub fn apply_to(&self, entry: &Entry, now: Micros) -> Entry {
        let resolved = self.status().is_resolved();
        Entry {
            status: self.status(),
            result: self.result().to_vec(),
            error: self.error().to_owned(),
            retryable: self.retryable(),
            finished_at: resolved.then_some(now),
            expires_at: resolved.then(|| now.plus(entry.retention)),
            ..entry.clone()
        }
    }

    /// Whether `entry` already records exactly this outcome.
    #[must_use]
    pub fn is_recorded_in(&self, entry: &Entry) -> bool {
        entry.status == self.status()
            && entry.result == self.result()
            && entry.error == self.error()
            && entry.retryable == self.retryable()
    }
}

/// The compare-and-set conditions of the stores' single-entry writes. Each is the `WHERE`
/// clause of one statement in `storage::sql` (and of its multi-row form), written here in
/// Rust: the decisions in this module choose which write to attempt, and these say when a
/// store applies it. The integration test `predicates` holds both stores to them on random
/// entries, boundaries included.
pub mod cas {
    use super::{ClaimToken, Entry, HoldToken, Micros, Status};

    /// REPLAY: a success that is still there for a request with `fingerprint` at `now`.
    pub fn replays(e: &Entry, fingerprint: &str, now: Micros) -> bool {
        e.status == Status::Succeeded
            && e.fingerprint == fingerprint
            && e.expires_at.is_some_and(|at| at > now)
    }

    /// FINISH: the claimant's `token` on an unresolved attempt: ATTEMPTING (in its lease or
    /// past it), or also UNKNOWN when `also_unknown`.
    pub fn finishes(e: &Entry, token: &ClaimToken, also_unknown: bool) -> bool {
        e.claim_token == *token
            && (e.status == Status::Attempting || (e.status == Status::Unknown && also_unknown))
    }

    /// RENEW: the holder's `token` on an attempt whose lease has not ended at `now`.
    pub fn renews(e: &Entry, token: &ClaimToken, now: Micros) -> bool {
        e.claim_token == *token && e.status == Status::Attempting && e.lease_expires_at > now
    }

    /// RESOLVE: a finding about `attempt`, gathered under the hold `hold`, settles the entry
    /// only while its outcome is unknown at `now` (UNKNOWN, or an attempt past its lease), it is
    /// still at that attempt, and that hold is still its newest (an expired hold that nobody
    /// replaced still counts: the finding is still the newest evidence).
    pub fn resolves(e: &Entry, attempt: u32, hold: &HoldToken, now: Micros) -> bool {
        is_unknown(e, now) && e.attempt == attempt && e.hold_token == *hold
    }

    /// An outcome nobody knows at `now`: UNKNOWN, or an attempt past its lease. What
    /// Reconcile may hand out, and what a finding may settle.
    pub fn is_unknown(e: &Entry, now: Micros) -> bool {
        e.status == Status::Unknown || (e.status == Status::Attempting && e.lease_expires_at <= now)
    }

    /// RESTART: a resolved entry that still carries the `token` the claimant read.
    pub fn restarts(e: &Entry, token: &ClaimToken) -> bool {
        e.claim_token == *token && e.status.is_resolved()
    }
}

/// What a Claim of an existing entry must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimDecision {
    /// The entry expired: the key is free, start over at attempt 1 (replacing the old row).
    StartOver,
    /// The last attempt failed retryably: start attempt + 1.
    Retry,
    /// Return the stored result.
    Replay,
    /// Return the stored permanent error.
    PreviouslyFailed,
    /// An attempt is in flight or its outcome unknown: do not act.
    InProgress,
    /// An explicit key came back with other arguments: a caller bug, refused.
    KeyReused,
    /// A person has been asked and has not decided: do not act.
    AwaitingApproval,
    /// A person approved: take the approval (compare-and-set) and act, once.
    UseApproval,
    /// The request (or the approval) lapsed unused: ask the person again.
    RequestAgain,
    /// A person declined: do not act.
    Denied,
}

/// Decides what a Claim with `fingerprint` does to `existing` at `now`.
pub fn decide_claim(existing: &Entry, fingerprint: &str, now: Micros) -> ClaimDecision {
    if existing.is_expired(now) {
        return ClaimDecision::StartOver;
    }
    if existing.fingerprint != fingerprint {
        return ClaimDecision::KeyReused;
    }
    match existing.status {
        Status::Succeeded => ClaimDecision::Replay,
        // A request that lapsed is recorded as a retryable failure (nothing was done): the
        // next attempt must be approved again, as the first had to be.
        Status::Failed
            if existing.retryable && existing.approval.state == ApprovalState::Expired =>
        {
            ClaimDecision::RequestAgain
        }
        // An approved attempt that failed retryably: its approval covers a retry before its
        // `execute_by`; after it, a person is asked again.
        Status::Failed if existing.retryable && !existing.approval.covers_retry_at(now) => {
            ClaimDecision::RequestAgain
        }
        Status::Failed if existing.retryable => ClaimDecision::Retry,
        Status::Failed => ClaimDecision::PreviouslyFailed,
        Status::Attempting | Status::Unknown => ClaimDecision::InProgress,
        Status::Denied => ClaimDecision::Denied,
        Status::AwaitingApproval if existing.approval.lapsed(now) => ClaimDecision::RequestAgain,
        Status::AwaitingApproval if existing.approval.state == ApprovalState::Approved => {
            ClaimDecision::UseApproval
        }
        Status::AwaitingApproval => ClaimDecision::AwaitingApproval,
    }
}

/// What a RenewLease does to `existing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewDecision {
    /// The entry does not exist any more (it expired).
    NotFound,
    /// The token is not the current attempt's.
    StaleToken,
    /// The attempt is resolved, reported UNKNOWN, or past its lease: a reconciler may already
    /// be asking the world about it, so its lease cannot come back.
    LeaseEnded,
    /// Extend the lease (compare-and-set on the token, ATTEMPTING, and the lease not ended).
    Apply,
}

/// Decides what renewing the lease of `existing` with `token` does at `now`: applied exactly
/// when the RENEW statement applies ([`cas::renews`]).
pub fn decide_renew(existing: &Entry, token: &ClaimToken, now: Micros) -> RenewDecision {
    if existing.is_expired(now) {
        return RenewDecision::NotFound;
    }
    if existing.claim_token != *token {
        return RenewDecision::StaleToken;
    }
    if cas::renews(existing, token, now) {
        RenewDecision::Apply
    } else {
        RenewDecision::LeaseEnded
    }
}

/// Why a finding changed nothing although its entry is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleReason {
    /// The entry is at a later attempt than the one the finding observed.
    LaterAttempt,
    /// The entry is at another attempt than the finding names, not a later one (a finding
    /// about an attempt that never was).
    OtherAttempt,
    /// The entry was handed out again since (another hold), so the finding's holder no longer
    /// speaks for it.
    HoldReplaced,
    /// The attempt is still in its lease: nobody may say yet that its outcome is unknown.
    NotUnknown,
}

impl StaleReason {
    /// The name counted in the metrics and written in logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            StaleReason::LaterAttempt => "later_attempt",
            StaleReason::OtherAttempt => "other_attempt",
            StaleReason::HoldReplaced => "hold_replaced",
            StaleReason::NotUnknown => "not_unknown",
        }
    }
}

/// What a finding (a Reconcile resolution, a person's in the console) does to `existing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FindingDecision {
    /// The entry does not exist any more (it expired).
    NotFound,
    /// The attempt the finding observed is resolved already: nothing to settle.
    AlreadyResolved,
    /// The finding no longer speaks for the entry.
    Stale(StaleReason),
    /// Settle the entry (compare-and-set on [`cas::resolves`]).
    Apply,
}

/// Decides what a finding about `attempt`, gathered under `hold`, does to `existing` at
/// `now`: applied exactly when the RESOLVE statement applies ([`cas::resolves`]).
pub fn decide_finding(
    existing: &Entry,
    attempt: u32,
    hold: &HoldToken,
    now: Micros,
) -> FindingDecision {
    if existing.is_expired(now) {
        return FindingDecision::NotFound;
    }
    if existing.attempt > attempt {
        return FindingDecision::Stale(StaleReason::LaterAttempt);
    }
    if existing.attempt != attempt {
        return FindingDecision::Stale(StaleReason::OtherAttempt);
    }
    if existing.status.is_resolved() {
        return FindingDecision::AlreadyResolved;
    }
    if existing.hold_token != *hold {
        return FindingDecision::Stale(StaleReason::HoldReplaced);
    }
    if cas::resolves(existing, attempt, hold, now) {
        FindingDecision::Apply
    } else {
        FindingDecision::Stale(StaleReason::NotUnknown)
    }
}

/// Whether a finding that the effect of `attempt` exists (`found`), arriving when the entry
/// is `existing` and not applied to it, means the intent may have acted twice: a later
/// attempt was started (it may have acted too), or the attempt was recorded as a retryable
/// failure (the next claim acts again). A finding of no effect never does.
pub fn marks_double_effect(existing: &Entry, attempt: u32, found: bool) -> bool {
    found
        && (existing.attempt > attempt
            || (existing.attempt == attempt
                && existing.status == Status::Failed
                && existing.retryable))
}

/// What a Complete does to `existing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompleteDecision {
    /// The entry does not exist any more (it expired).
    NotFound,
    /// The token is not the current attempt's.
    StaleToken,
    /// This exact outcome is already stored: succeed without a write.
    AlreadyCompleted,
    /// A different outcome is already stored: refuse.
    AlreadyResolved,
    /// Write the outcome (compare-and-set on the token and an unresolved status).
    Apply,
}

/// Decides what completing `existing` with `token` and `completion` does at `now`.
pub fn decide_complete(
    existing: &Entry,
    token: &ClaimToken,
    completion: &Completion,
    now: Micros,
) -> CompleteDecision {
    if existing.is_expired(now) {
        return CompleteDecision::NotFound;
    }
    // A call awaiting a decision has no claimant yet: no token is its claim's.
    if existing.claim_token != *token || existing.status == Status::AwaitingApproval {
        return CompleteDecision::StaleToken;
    }
    if existing.status.is_resolved() {
        return if completion.is_recorded_in(existing) {
            CompleteDecision::AlreadyCompleted
        } else {
            CompleteDecision::AlreadyResolved
        };
    }
    // Unresolved (ATTEMPTING, possibly past its lease, or UNKNOWN): the claimant may still
    // resolve it, or repeat its own UNKNOWN report.
    if existing.status == Status::Unknown && completion.is_recorded_in(existing) {
        CompleteDecision::AlreadyCompleted
    } else {
        CompleteDecision::Apply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Micros = Micros(1_000_000_000);

    fn entry(status: Status) -> Entry {
        Entry {
            key: Key::from_stored("k".into()),
            run_id: Some(RunId::from_stored("run".into())),
            tool: ToolName::from_stored("tool".into()),
            fingerprint: "fp".into(),
            status,
            attempt: 1,
            claim_token: tok(),
            result: Vec::new(),
            error: String::new(),
            retryable: false,
            principal: Principal::none(),
            started_at: NOW,
            finished_at: None,
            lease_expires_at: NOW.plus(Micros(60_000_000)),
            retention: Micros(3_600_000_000),
            expires_at: None,
            replay_count: 0,
            arguments: None,
            resolved_by: Principal::none(),
            hold_token: HoldToken::none(),
            possible_double_effect: false,
            approval: Approval::default(),
        }
    }

    fn resolved(status: Status, retryable: bool) -> Entry {
        let completion = if status == Status::Succeeded {
            success(b"r")
        } else {
            Completion::Failed {
                error: "e".into(),
                retryable,
            }
        };
        completion.apply_to(&entry(Status::Attempting), NOW)
    }

    fn success(result: &[u8]) -> Completion {
        Completion::success(result.to_vec())
    }

    fn tok() -> ClaimToken {
        ClaimToken::from_stored("tok".into())
    }

    #[test]
    fn a_completion_cannot_carry_a_result_without_success_or_retry_without_failure() {
        let result_with_failure =
            Completion::new(FinalStatus::Failed, b"r".to_vec(), "e".into(), false);
        assert_eq!(result_with_failure.map_err(|e| e.field), Err("result"));
        let result_with_unknown =
            Completion::new(FinalStatus::Unknown, b"r".to_vec(), String::new(), false);
        assert_eq!(result_with_unknown.map_err(|e| e.field), Err("result"));
        let retry_after_success =
            Completion::new(FinalStatus::Succeeded, b"r".to_vec(), String::new(), true);
        assert_eq!(retry_after_success.map_err(|e| e.field), Err("retryable"));
        let retry_unknown = Completion::new(FinalStatus::Unknown, Vec::new(), "t".into(), true);
        assert_eq!(retry_unknown.map_err(|e| e.field), Err("retryable"));
        assert_eq!(
            Completion::new(FinalStatus::Failed, Vec::new(), "e".into(), true),
            Ok(Completion::Failed {
                error: "e".into(),
                retryable: true
            })
        );
        assert_eq!(
            Completion::new(FinalStatus::Succeeded, b"r".to_vec(), "note".into(), false),
            Ok(Completion::Succeeded {
                result: b"r".to_vec(),
                error: "note".into()
            })
        );
    }

    #[test]
    fn an_attempt_past_its_lease_reads_as_unknown() {
        let e = entry(Status::Attempting);
        assert_eq!(e.effective_status(NOW), Status::Attempting);
        assert_eq!(e.effective_status(e.lease_expires_at), Status::Unknown);
    }

    #[test]
    fn each_row_of_the_state_table_decides_its_claim() {
        assert_eq!(
            decide_claim(&entry(Status::Attempting), "fp", NOW),
            ClaimDecision::InProgress
        );
        assert_eq!(
            decide_claim(&entry(Status::Unknown), "fp", NOW),
            ClaimDecision::InProgress
        );
        let expired_lease = entry(Status::Attempting);
        assert_eq!(
            decide_claim(&expired_lease, "fp", expired_lease.lease_expires_at),
            ClaimDecision::InProgress
        );
        assert_eq!(
            decide_claim(&resolved(Status::Succeeded, false), "fp", NOW),
            ClaimDecision::Replay
        );
        assert_eq!(
            decide_claim(&resolved(Status::Failed, false), "fp", NOW),
            ClaimDecision::PreviouslyFailed
        );
        assert_eq!(
            decide_claim(&resolved(Status::Failed, true), "fp", NOW),
            ClaimDecision::Retry
        );
    }

    #[test]
    fn a_reused_key_with_another_fingerprint_is_refused_unless_expired() {
        let e = resolved(Status::Succeeded, false);
        assert_eq!(decide_claim(&e, "other", NOW), ClaimDecision::KeyReused);
        let after = e.expires_at.map(|at| at.plus(Micros(1))).unwrap_or(NOW);
        assert_eq!(decide_claim(&e, "other", after), ClaimDecision::StartOver);
        assert_eq!(decide_claim(&e, "fp", after), ClaimDecision::StartOver);
    }

    #[test]
    fn a_finding_settles_only_the_attempt_and_hold_it_was_about() {
        let hold = HoldToken::from_stored("h1".into());
        let other = HoldToken::from_stored("h2".into());
        let mut held = entry(Status::Unknown);
        held.hold_token = hold.clone();
        assert_eq!(decide_finding(&held, 1, &hold, NOW), FindingDecision::Apply);
        // An expired hold that nobody replaced still settles: the stored token is unchanged.
        assert_eq!(
            decide_finding(&held, 1, &hold, Micros(i64::MAX - 1)),
            FindingDecision::Apply
        );
        assert_eq!(
            decide_finding(&held, 1, &other, NOW),
            FindingDecision::Stale(StaleReason::HoldReplaced)
        );
        let mut later = held.clone();
        later.attempt = 2;
        assert_eq!(
            decide_finding(&later, 1, &hold, NOW),
            FindingDecision::Stale(StaleReason::LaterAttempt)
        );
        assert_eq!(
            decide_finding(&held, 2, &hold, NOW),
            FindingDecision::Stale(StaleReason::OtherAttempt)
        );
        let mut live = entry(Status::Attempting);
        live.hold_token = hold.clone();
        assert_eq!(
            decide_finding(&live, 1, &hold, NOW),
            FindingDecision::Stale(StaleReason::NotUnknown)
        );
        assert_eq!(
            decide_finding(&live, 1, &hold, live.lease_expires_at),
            FindingDecision::Apply
        );
        let done = resolved(Status::Succeeded, false);
        assert_eq!(
            decide_finding(&done, 1, &HoldToken::none(), NOW),
            FindingDecision::AlreadyResolved
        );
        let gone = done.expires_at.unwrap_or(NOW);
        assert_eq!(
            decide_finding(&done, 1, &HoldToken::none(), gone),
            FindingDecision::NotFound
        );
        // Every decision to apply is one the store's write applies, and no other.
        for (e, attempt, h, at) in [
            (&held, 1, &hold, NOW),
            (&held, 1, &other, NOW),
            (&later, 1, &hold, NOW),
            (&live, 1, &hold, NOW),
        ] {
            assert_eq!(
                decide_finding(e, attempt, h, at) == FindingDecision::Apply,
                cas::resolves(e, attempt, h, at)
            );
        }
    }

    #[test]
    fn only_a_found_effect_of_an_earlier_or_failed_attempt_marks_a_double_effect() {
        let mut later = entry(Status::Unknown);
        later.attempt = 2;
        assert!(marks_double_effect(&later, 1, true));
        assert!(!marks_double_effect(&later, 1, false));
        assert!(!marks_double_effect(&later, 2, true));
        let retryable = resolved(Status::Failed, true);
        assert!(marks_double_effect(&retryable, 1, true));
        assert!(!marks_double_effect(
            &resolved(Status::Failed, false),
            1,
            true
        ));
        assert!(!marks_double_effect(
            &resolved(Status::Succeeded, false),
            1,
            true
        ));
    }

    #[test]
    fn unresolved_entries_never_expire() {
        let mut e = entry(Status::Unknown);
        e.expires_at = Some(NOW);
        assert!(!e.is_expired(Micros(i64::MAX)));
    }

    #[test]
    fn resolving_sets_finish_and_expiry_but_unknown_does_not() {
        let e = success(b"ok").apply_to(&entry(Status::Attempting), NOW);
        assert_eq!(e.finished_at, Some(NOW));
        assert_eq!(e.expires_at, Some(NOW.plus(e.retention)));
        let unknown = Completion::Unknown {
            error: "timeout".into(),
        };
        let u = unknown.apply_to(&entry(Status::Attempting), NOW);
        assert_eq!(
            (u.status, u.finished_at, u.expires_at),
            (Status::Unknown, None, None)
        );
    }

    #[test]
    fn only_the_current_token_may_complete() {
        let e = entry(Status::Attempting);
        assert_eq!(
            decide_complete(
                &e,
                &ClaimToken::from_stored("old".into()),
                &success(b"x"),
                NOW
            ),
            CompleteDecision::StaleToken
        );
        assert_eq!(
            decide_complete(&e, &tok(), &success(b"x"), NOW),
            CompleteDecision::Apply
        );
    }

    #[test]
    fn a_claimant_may_complete_after_its_lease_expired() {
        let e = entry(Status::Attempting);
        assert_eq!(
            decide_complete(
                &e,
                &tok(),
                &success(b"x"),
                e.lease_expires_at.plus(Micros(1))
            ),
            CompleteDecision::Apply
        );
    }

    #[test]
    fn an_identical_complete_is_already_completed_and_a_different_one_is_refused() {
        let done = success(b"r").apply_to(&entry(Status::Attempting), NOW);
        assert_eq!(
            decide_complete(&done, &tok(), &success(b"r"), NOW),
            CompleteDecision::AlreadyCompleted
        );
        assert_eq!(
            decide_complete(&done, &tok(), &success(b"other"), NOW),
            CompleteDecision::AlreadyResolved
        );
    }

    #[test]
    fn an_unknown_entry_may_still_be_resolved_or_reported_again() {
        let unknown = Completion::Unknown {
            error: "timeout".into(),
        };
        let u = unknown.apply_to(&entry(Status::Attempting), NOW);
        assert_eq!(
            decide_complete(&u, &tok(), &unknown, NOW),
            CompleteDecision::AlreadyCompleted
        );
        assert_eq!(
            decide_complete(&u, &tok(), &success(b"x"), NOW),
            CompleteDecision::Apply
        );
    }

    #[test]
    fn completing_an_expired_entry_finds_nothing() {
        let done = success(b"r").apply_to(&entry(Status::Attempting), NOW);
        let later = done.expires_at.unwrap_or(NOW);
        assert_eq!(
            decide_complete(&done, &tok(), &success(b"r"), later),
            CompleteDecision::NotFound
        );
    }

    #[test]
    fn status_names_round_trip() {
        for s in [
            Status::Attempting,
            Status::Succeeded,
            Status::Failed,
            Status::Unknown,
        ] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("attempting"), None);
    }
}
