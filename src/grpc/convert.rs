//! Proto ↔ domain conversions: enums, durations and timestamps in, entries and answers out.

use std::time::Duration;

use tonic::Status;

use super::pb;
use crate::domain::canonical::Canonicalization;
use crate::domain::{
    Approval, ApprovalState, Decision, FinalStatus, HistoryEvent, HoldToken, Micros,
};
use crate::error::LedgerError;
use crate::ledger::{
    ClaimOutput, EntryView, Outcome, ResolutionOutcome, ResolutionResult, WaitFor,
};
use crate::observe::replay_rate::{ReplayFigures, SeriesFigures};

/// A refusal of `field`'s value, as the gRPC status the table gives it.
fn invalid(field: &'static str, message: impl Into<String>) -> Status {
    super::error::status(LedgerError::invalid(field, message))
}

pub(super) fn canonicalization(value: i32) -> Result<Canonicalization, Status> {
    match pb::Canonicalization::try_from(value) {
        Ok(pb::Canonicalization::Unspecified | pb::Canonicalization::Jcs) => {
            Ok(Canonicalization::Jcs)
        }
        Ok(pb::Canonicalization::JcsLenient) => Ok(Canonicalization::JcsLenient),
        Err(_) => Err(invalid(
            "canonicalization",
            format!("{value} is not a Canonicalization value"),
        )),
    }
}

/// How much of an entry a Claim or Complete answers with: the request's `view` (AIP-157).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum View {
    /// What the caller needs: on a Complete, the entry without the result it just sent.
    Basic,
    /// The whole answer, as before there were views (unset means this).
    Full,
}

/// A request's `view`; unset is the full view, a number that is no `EntryView` is refused.
pub(super) fn view(value: i32) -> Result<View, Status> {
    match pb::EntryView::try_from(value) {
        Ok(pb::EntryView::Unspecified | pb::EntryView::Full) => Ok(View::Full),
        Ok(pb::EntryView::Basic) => Ok(View::Basic),
        Err(_) => Err(invalid(
            "view",
            format!("{value} is not an EntryView value (ENTRY_VIEW_BASIC or ENTRY_VIEW_FULL)"),
        )),
    }
}

/// A Claim's `wait_for`; unset waits for attempts and decisions, as a wait always did; a
/// number that is no `WaitFor` is refused.
pub(super) fn wait_for(value: i32) -> Result<WaitFor, Status> {
    match pb::WaitFor::try_from(value) {
        Ok(pb::WaitFor::Unspecified | pb::WaitFor::AttemptOrDecision) => {
            Ok(WaitFor::AttemptOrDecision)
        }
        Ok(pb::WaitFor::Attempt) => Ok(WaitFor::Attempt),
        Err(_) => Err(invalid(
            "wait_for",
            format!(
                "{value} is not a WaitFor value (WAIT_FOR_ATTEMPT or \
                 WAIT_FOR_ATTEMPT_OR_DECISION)"
            ),
        )),
    }
}

/// A reported status of `field`: Complete accepts the three outcomes (Reconcile then refuses
/// UNKNOWN, which is no finding).
pub(super) fn final_status(field: &'static str, value: i32) -> Result<FinalStatus, Status> {
    match pb::Status::try_from(value) {
        Ok(pb::Status::Succeeded) => Ok(FinalStatus::Succeeded),
        Ok(pb::Status::Failed) => Ok(FinalStatus::Failed),
        Ok(pb::Status::Unknown) => Ok(FinalStatus::Unknown),
        _ => Err(invalid(
            field,
            "must be STATUS_SUCCEEDED, STATUS_FAILED or STATUS_UNKNOWN",
        )),
    }
}

/// A proto duration as a std one; unset stays `None`, negative or malformed is refused.
pub(super) fn duration(
    field: &'static str,
    value: Option<prost_types::Duration>,
) -> Result<Option<Duration>, Status> {
    let Some(d) = value else { return Ok(None) };
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return Err(invalid(field, "must be a non-negative duration"));
    }
    Ok(Some(
        Duration::from_secs(d.seconds.unsigned_abs())
            + Duration::from_nanos(d.nanos.unsigned_abs().into()),
    ))
}

pub(super) fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

pub(super) fn timestamp(m: Micros) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: m.0.div_euclid(1_000_000),
        nanos: i32::try_from(m.0.rem_euclid(1_000_000) * 1000).unwrap_or(0),
    }
}

pub(super) fn status(s: crate::domain::Status) -> pb::Status {
    match s {
        crate::domain::Status::Attempting => pb::Status::Attempting,
        crate::domain::Status::Succeeded => pb::Status::Succeeded,
        crate::domain::Status::Failed => pb::Status::Failed,
        crate::domain::Status::Unknown => pb::Status::Unknown,
        crate::domain::Status::AwaitingApproval => pb::Status::AwaitingApproval,
        crate::domain::Status::Denied => pb::Status::Denied,
    }
}

/// An entry's approval; unset when none was involved.
fn approval(a: Approval) -> Option<pb::Approval> {
    let state = match a.state {
        ApprovalState::None => return None,
        ApprovalState::Requested => pb::ApprovalState::Requested,
        ApprovalState::Approved => pb::ApprovalState::Approved,
        ApprovalState::Denied => pb::ApprovalState::Denied,
        ApprovalState::Expired => pb::ApprovalState::Expired,
        ApprovalState::Used => pb::ApprovalState::Used,
    };
    Some(pb::Approval {
        state: state.into(),
        requested_at: a.requested_at.map(timestamp),
        decide_by: a.decide_by.map(timestamp),
        decided_at: a.decided_at.map(timestamp),
        decided_by: a.decided_by.into(),
        reason: a.reason,
        execute_by: a.execute_by.map(timestamp),
    })
}

/// A decision as a request states it.
pub(super) fn decision(value: i32) -> Result<Decision, Status> {
    match pb::Decision::try_from(value) {
        Ok(pb::Decision::Approve) => Ok(Decision::Approve),
        Ok(pb::Decision::Deny) => Ok(Decision::Deny),
        _ => Err(invalid(
            "decision",
            "must be DECISION_APPROVE or DECISION_DENY",
        )),
    }
}

/// A state a listing may filter by; unspecified means any.
pub(super) fn status_filter(value: i32) -> Result<Option<crate::domain::Status>, Status> {
    use crate::domain::Status as S;
    match pb::Status::try_from(value) {
        Ok(pb::Status::Unspecified) => Ok(None),
        Ok(pb::Status::Attempting) => Ok(Some(S::Attempting)),
        Ok(pb::Status::Succeeded) => Ok(Some(S::Succeeded)),
        Ok(pb::Status::Failed) => Ok(Some(S::Failed)),
        Ok(pb::Status::Unknown) => Ok(Some(S::Unknown)),
        Ok(pb::Status::AwaitingApproval) => Ok(Some(S::AwaitingApproval)),
        Ok(pb::Status::Denied) => Ok(Some(S::Denied)),
        Err(_) => Err(invalid("status", format!("{value} is not a Status value"))),
    }
}

/// A proto timestamp as microseconds since the epoch; unset stays `None`, malformed is
/// refused.
pub(super) fn instant(
    field: &'static str,
    value: Option<prost_types::Timestamp>,
) -> Result<Option<Micros>, Status> {
    let Some(t) = value else { return Ok(None) };
    if !(0..1_000_000_000).contains(&t.nanos) {
        return Err(invalid(field, "nanos must be within 0..999999999"));
    }
    t.seconds
        .checked_mul(1_000_000)
        .and_then(|us| us.checked_add(i64::from(t.nanos / 1000)))
        .map(|us| Some(Micros(us)))
        .ok_or_else(|| invalid(field, "is out of range"))
}

/// A tenant's replay figures, as ReplayRate answers them.
pub(super) fn replay_rate_response(f: ReplayFigures) -> pb::ReplayRateResponse {
    pb::ReplayRateResponse {
        as_of: Some(timestamp(f.as_of)),
        bucket_width: Some(proto_duration(f.bucket)),
        total: Some(replay_series(&f.total)),
        tools: f.tools.iter().map(replay_series).collect(),
        alarm_window: Some(proto_duration(f.alarm_window)),
        alarm_min_claims: f.alarm_min_claims,
    }
}

fn replay_series(s: &SeriesFigures) -> pb::ReplaySeries {
    pb::ReplaySeries {
        tool: s.tool.clone(),
        folded: s.folded,
        buckets: s
            .buckets
            .iter()
            .map(|b| pb::ReplayBucket {
                start: Some(timestamp(b.start)),
                claims: b.claims,
                replays: b.replays,
                replay_ratio: b.ratio(),
                key_reuse_refusals: b.key_reuse_refusals,
                alarm: b.alarm,
            })
            .collect(),
        claims: s.claims(),
        replays: s.replays(),
        replay_ratio: s.ratio(),
        key_reuse_refusals: s.key_reuse_refusals(),
        window_claims: s.window.claims,
        window_replays: s.window.replays,
        alarm: s.alarm,
    }
}

/// An entry with the arguments kept for audit: what Lookup and ListEntries answer.
pub(super) fn audited_entry(mut view: EntryView) -> pb::Entry {
    let arguments = view.entry.arguments.take().unwrap_or_default();
    pb::Entry {
        arguments_json: arguments,
        ..entry(view)
    }
}

/// An entry Reconcile hands out: with the hold token its finding must send back.
pub(super) fn pending_entry(mut view: EntryView) -> pb::Entry {
    let hold_token = std::mem::replace(&mut view.entry.hold_token, HoldToken::none());
    pb::Entry {
        hold_token: hold_token.into(),
        ..entry(view)
    }
}

/// An entry as Claim, Complete and Reconcile answer it: about the outcome, without the
/// stored arguments, and without a hold token (only a hand-out carries one: see
/// [`pending_entry`]).
pub(super) fn entry(view: EntryView) -> pb::Entry {
    let e = view.entry;
    pb::Entry {
        key: e.key.into(),
        run_id: e.run_id.map(String::from).unwrap_or_default(),
        tool: e.tool.into(),
        fingerprint: e.fingerprint,
        status: status(view.status).into(),
        attempt: e.attempt,
        result: e.result.into(),
        error: e.error,
        retryable: e.retryable,
        principal: e.principal.into(),
        started_at: Some(timestamp(e.started_at)),
        finished_at: e.finished_at.map(timestamp),
        lease_expires_at: Some(timestamp(e.lease_expires_at)),
        expires_at: e.expires_at.map(timestamp),
        replay_count: e.replay_count,
        external_ref: view.external_ref,
        arguments_json: String::new(),
        resolved_by: e.resolved_by.into(),
        hold_token: String::new(),
        possible_double_effect: e.possible_double_effect,
        approval: approval(e.approval),
    }
}

/// The entry a Complete answers with in `view`: the basic view leaves out the result, which
/// is the one the caller sent (a Complete succeeds only when it recorded that result or found
/// it recorded), so it is neither converted nor encoded again.
pub(super) fn completed_entry(mut e: EntryView, view: View) -> pb::Entry {
    if view == View::Basic {
        e.entry.result = Vec::new();
    }
    entry(e)
}

/// What became of one resolution.
pub(super) fn resolution_result(r: ResolutionResult) -> pb::ResolutionResult {
    let outcome = match r.outcome {
        ResolutionOutcome::Applied => pb::ResolutionOutcome::ResolutionApplied,
        ResolutionOutcome::Stale(_) => pb::ResolutionOutcome::ResolutionStale,
        ResolutionOutcome::AlreadyResolved => pb::ResolutionOutcome::ResolutionAlreadyResolved,
        ResolutionOutcome::NotFound => pb::ResolutionOutcome::ResolutionNotFound,
    };
    pb::ResolutionResult {
        key: r.key.into(),
        result: outcome.into(),
        entry: r.entry.map(entry),
        note: r.note,
    }
}

/// One event of an entry's history.
pub(super) fn history_event(e: HistoryEvent) -> pb::HistoryEvent {
    pb::HistoryEvent {
        at: Some(timestamp(e.at)),
        kind: e.kind.as_str().to_owned(),
        attempt: e.attempt,
        principal: e.principal.into(),
        detail: e.detail,
    }
}

fn outcome(o: Outcome) -> pb::Outcome {
    match o {
        Outcome::Claimed => pb::Outcome::Claimed,
        Outcome::Replayed => pb::Outcome::Replayed,
        Outcome::InProgress => pb::Outcome::InProgress,
        Outcome::PreviouslyFailed => pb::Outcome::PreviouslyFailed,
        Outcome::AwaitingApproval => pb::Outcome::AwaitingApproval,
        Outcome::Denied => pb::Outcome::Denied,
    }
}

pub(super) fn claim_response(out: ClaimOutput) -> pb::ClaimResponse {
    pb::ClaimResponse {
        outcome: outcome(out.outcome).into(),
        entry: Some(entry(out.entry)),
        claim_token: out.claim_token.map(String::from).unwrap_or_default(),
        note: out.note,
        retry_after: out.retry_after.map(proto_duration),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_logs_and_metrics_use_are_the_protos() {
        // The domain names its outcomes and statuses for logs, metrics and the store; they are
        // the proto's names without the enum's prefix, so an operator reads one spelling.
        for o in Outcome::ALL {
            assert_eq!(
                outcome(o).as_str_name(),
                format!("OUTCOME_{}", o.as_str()),
                "{o:?}"
            );
        }
        for s in [
            crate::domain::Status::Attempting,
            crate::domain::Status::Succeeded,
            crate::domain::Status::Failed,
            crate::domain::Status::Unknown,
            crate::domain::Status::AwaitingApproval,
            crate::domain::Status::Denied,
        ] {
            assert_eq!(
                status(s).as_str_name(),
                format!("STATUS_{}", s.as_str()),
                "{s:?}"
            );
        }
    }

    #[test]
    fn timestamps_split_micros_into_seconds_and_nanos() {
        let t = timestamp(Micros(1_700_000_000_123_456));
        assert_eq!((t.seconds, t.nanos), (1_700_000_000, 123_456_000));
        let before_epoch = timestamp(Micros(-1));
        assert_eq!(
            (before_epoch.seconds, before_epoch.nanos),
            (-1, 999_999_000)
        );
    }

    #[test]
    fn negative_durations_are_refused_and_unset_ones_stay_unset() {
        assert_eq!(duration("lease", None).ok(), Some(None));
        let neg = prost_types::Duration {
            seconds: -1,
            nanos: 0,
        };
        assert!(duration("lease", Some(neg)).is_err());
        let ok = prost_types::Duration {
            seconds: 1,
            nanos: 500_000_000,
        };
        assert_eq!(
            duration("lease", Some(ok)).ok(),
            Some(Some(Duration::from_millis(1500)))
        );
    }
}
