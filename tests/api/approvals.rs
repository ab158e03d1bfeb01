//! Approvals, on every store: a gated call waits for a person's decision, bound to its exact
//! arguments; an approval lets one claim act, once, within its deadline; a denial is replayed;
//! an undecided request or an unused approval lapses and the next claim asks again; a paused
//! run keeps its keys.

use std::time::Duration;

use idempotency_ledger::domain::{
    ApprovalState, Decision, EventKind, FinalStatus, Policy, Principal, Status, Tenant,
};
use idempotency_ledger::error::LedgerError;
use idempotency_ledger::ledger::{
    ClaimInput, ClaimOutput, CompleteInput, DecideInput, Ledger, LookupInput, Outcome, WaitFor,
};
use idempotency_ledger::reason::Reason;

use crate::support::typed::{claim_input, key, principal, run_id, tool};
use crate::support::{Backend, TestLedger, test_limits};

on_every_store!(
    a_gated_claim_asks_a_person_and_does_nothing_until_a_decision,
    the_policy_gates_by_tool_and_threshold_and_a_claim_cannot_lift_a_gate,
    an_approval_binds_to_the_arguments_the_person_was_shown,
    an_approval_lets_exactly_one_of_many_concurrent_claims_act,
    a_denial_is_replayed_to_every_repeat_with_its_reason,
    a_second_decision_is_the_same_or_refused,
    an_undecided_request_lapses_at_decide_by_and_the_next_claim_asks_again,
    nothing_acts_after_execute_by,
    the_sweeper_records_lapsed_requests_and_the_next_claim_asks_again,
    a_paused_run_keeps_its_keys_and_the_decision_keeps_them_again,
    extend_run_keeps_a_runs_finished_entries,
    a_waiting_claim_wakes_on_the_decision,
    a_claim_waiting_for_attempts_answers_a_gated_repeat_at_once,
);

const RUN: &str = "run-approvals";
const REFUND: &str = "issue_refund";
const ARGS: &str = r#"{"order":"o-1","amount":250}"#;

fn tenant() -> Tenant {
    Tenant::default_tenant()
}

fn approver() -> Principal {
    Principal::parse("alice").expect("a principal")
}

fn gated(run: &str, args: &str) -> ClaimInput {
    ClaimInput {
        require_approval: true,
        principal: principal("agent-7"),
        ..claim_input(run, REFUND, args)
    }
}

async fn claim(ledger: &Ledger, input: ClaimInput) -> ClaimOutput {
    ledger.claim(&tenant(), input).await.expect("claim")
}

fn decision(out: &ClaimOutput, decision: Decision, reason: &str) -> DecideInput {
    DecideInput {
        key: out.entry.entry.key.clone(),
        fingerprint: out.entry.entry.fingerprint.clone(),
        decision,
        reason: reason.into(),
    }
}

async fn decide(ledger: &Ledger, input: DecideInput) -> Result<bool, LedgerError> {
    ledger
        .decide(&tenant(), input, &approver())
        .await
        .map(|d| d.changed)
}

async fn kinds(ledger: &Ledger, out: &ClaimOutput) -> Vec<EventKind> {
    ledger
        .history(&tenant(), &out.entry.entry.key)
        .await
        .expect("history")
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

async fn lookup(ledger: &Ledger, out: &ClaimOutput) -> idempotency_ledger::ledger::EntryView {
    ledger
        .lookup(&tenant(), LookupInput::by_key(out.entry.entry.key.clone()))
        .await
        .expect("lookup")
}

async fn a_gated_claim_asks_a_person_and_does_nothing_until_a_decision(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert_eq!(asked.outcome, Outcome::AwaitingApproval);
    assert!(asked.claim_token.is_none(), "nobody may act");
    assert!(asked.note.contains("approval") && asked.note.contains("Nothing was done"));
    let e = &asked.entry.entry;
    assert_eq!(
        (asked.entry.status, e.approval.state),
        (Status::AwaitingApproval, ApprovalState::Requested)
    );
    let decide_by = e.approval.decide_by.expect("a deadline");
    assert_eq!(
        decide_by.minus(e.approval.requested_at.expect("asked at")),
        idempotency_ledger::domain::Micros::from_duration(Duration::from_secs(72 * 3600))
    );
    // A repeat answers the same, and a Complete with any token is refused.
    let again = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert_eq!(again.outcome, Outcome::AwaitingApproval);
    let forged = t
        .ledger
        .complete(
            &tenant(),
            CompleteInput {
                key: e.key.clone(),
                claim_token: e.claim_token.clone(),
                status: FinalStatus::Succeeded,
                result: b"x".to_vec(),
                error: String::new(),
                retryable: false,
            },
        )
        .await;
    assert!(
        matches!(forged, Err(LedgerError::StaleClaimToken)),
        "{forged:?}"
    );
    assert_eq!(
        kinds(&t.ledger, &asked).await,
        [EventKind::ApprovalRequested]
    );

    // Approved: the next claim acts, once; its Complete is as any other's.
    assert!(
        decide(
            &t.ledger,
            decision(&asked, Decision::Approve, "ok to refund")
        )
        .await
        .expect("decide")
    );
    let acting = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert_eq!(acting.outcome, Outcome::Claimed);
    assert_eq!(acting.entry.entry.approval.state, ApprovalState::Used);
    assert_eq!(acting.entry.entry.approval.decided_by, "alice");
    let token = acting.claim_token.clone().expect("a token");
    t.ledger
        .complete(
            &tenant(),
            CompleteInput {
                key: e.key.clone(),
                claim_token: token,
                status: FinalStatus::Succeeded,
                result: b"refund rf-1".to_vec(),
                error: String::new(),
                retryable: false,
            },
        )
        .await
        .expect("complete");
    let replay = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert_eq!(replay.outcome, Outcome::Replayed);
    assert_eq!(replay.entry.entry.result, b"refund rf-1");
    assert_eq!(
        kinds(&t.ledger, &asked).await,
        [
            EventKind::ApprovalRequested,
            EventKind::ApprovalApproved,
            EventKind::ApprovalUsed
        ]
    );
}

async fn the_policy_gates_by_tool_and_threshold_and_a_claim_cannot_lift_a_gate(b: Backend) {
    let t = TestLedger::new(b).await;
    t.ledger.approvals().set_policy(
        Policy::parse("* issue_refund /amount > 100\n* delete_account\n").expect("policy"),
    );
    let plain = |tool: &str, args: &str| claim_input(RUN, tool, args);
    let small = claim(&t.ledger, plain(REFUND, r#"{"order":"o-2","amount":100}"#)).await;
    assert_eq!(small.outcome, Outcome::Claimed, "at the bound: not over it");
    let large = claim(
        &t.ledger,
        plain(REFUND, r#"{"order":"o-3","amount":100.5}"#),
    )
    .await;
    assert_eq!(large.outcome, Outcome::AwaitingApproval);
    let gone = claim(&t.ledger, plain("delete_account", r#"{"user":"u-1"}"#)).await;
    assert_eq!(gone.outcome, Outcome::AwaitingApproval);
    let other = claim(&t.ledger, plain("send_email", r#"{"to":"a@b"}"#)).await;
    assert_eq!(other.outcome, Outcome::Claimed);
    // The claim's own gate adds to the policy's; require_approval false lifts nothing.
    let asked = claim(
        &t.ledger,
        ClaimInput {
            require_approval: false,
            ..plain(REFUND, r#"{"order":"o-4","amount":500}"#)
        },
    )
    .await;
    assert_eq!(asked.outcome, Outcome::AwaitingApproval);
    // A policy swapped in applies to the claims that follow.
    t.ledger.approvals().set_policy(Policy::none());
    let after = claim(&t.ledger, plain(REFUND, r#"{"order":"o-5","amount":500}"#)).await;
    assert_eq!(after.outcome, Outcome::Claimed);
    // A gate applies when an entry is created: the one awaiting still awaits.
    let repeat = claim(
        &t.ledger,
        plain(REFUND, r#"{"order":"o-3","amount":100.5}"#),
    )
    .await;
    assert_eq!(repeat.outcome, Outcome::AwaitingApproval);
}

async fn an_approval_binds_to_the_arguments_the_person_was_shown(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(RUN, ARGS)).await;
    // The person was shown other arguments (another call's fingerprint): refused, nothing
    // changes.
    let other = claim(&t.ledger, gated(RUN, r#"{"order":"o-1","amount":2500}"#)).await;
    let mut wrong = decision(&asked, Decision::Approve, "looks fine");
    wrong.fingerprint = other.entry.entry.fingerprint.clone();
    let refused = decide(&t.ledger, wrong).await;
    assert!(
        matches!(refused, Err(LedgerError::ApprovalMismatch)),
        "{refused:?}"
    );
    assert_eq!(
        refused.map(|_| ()).unwrap_err().reason(),
        Reason::ApprovalMismatch
    );
    assert_eq!(
        lookup(&t.ledger, &asked).await.entry.approval.state,
        ApprovalState::Requested
    );
    // Approving one call leaves the changed arguments' call awaiting: another key, another
    // request.
    decide(&t.ledger, decision(&asked, Decision::Approve, "ok"))
        .await
        .expect("decide");
    let changed = claim(&t.ledger, gated(RUN, r#"{"order":"o-1","amount":2500}"#)).await;
    assert_eq!(changed.outcome, Outcome::AwaitingApproval);
    assert_ne!(changed.entry.entry.key, asked.entry.entry.key);
    // Malformed decisions are refused before anything is read. (A malformed key is no Key:
    // gRPC refuses it where the request arrives, see
    // `grpc_api::fields_parsed_where_a_request_arrives_are_refused_and_store_nothing`.)
    for (input, field) in [
        (
            DecideInput {
                fingerprint: "not-hex".into(),
                ..decision(&asked, Decision::Approve, "")
            },
            "fingerprint",
        ),
        (
            decision(&asked, Decision::Deny, &"x".repeat(1025)),
            "reason",
        ),
    ] {
        let refused = decide(&t.ledger, input).await;
        assert!(
            matches!(refused, Err(LedgerError::InvalidArgument { field: f, .. }) if f == field),
            "{field}: {refused:?}"
        );
    }
    let absent = decide(
        &t.ledger,
        DecideInput {
            key: key("f".repeat(64)),
            ..decision(&asked, Decision::Approve, "")
        },
    )
    .await;
    assert!(matches!(absent, Err(LedgerError::NotFound)), "{absent:?}");
    // A call that needed no approval has nothing to decide.
    let plain = claim(
        &t.ledger,
        ClaimInput {
            require_approval: false,
            tool: tool("send_email"),
            ..gated(RUN, "{}")
        },
    )
    .await;
    let nothing = decide(&t.ledger, decision(&plain, Decision::Approve, "")).await;
    assert!(
        matches!(nothing, Err(LedgerError::NotAwaitingApproval(_))),
        "{nothing:?}"
    );
}

async fn an_approval_lets_exactly_one_of_many_concurrent_claims_act(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(RUN, ARGS)).await;
    decide(&t.ledger, decision(&asked, Decision::Approve, "ok"))
        .await
        .expect("decide");
    // A second server over the same database (one process's pool on SQLite).
    let other = Ledger::new(t.db.store(4).await, t.clock.clone(), test_limits());
    let mut resumes = Vec::new();
    for i in 0..16 {
        let ledger = if i % 2 == 0 {
            t.ledger.clone()
        } else {
            other.clone()
        };
        resumes.push(tokio::spawn(async move {
            ledger.claim(&tenant(), gated(RUN, ARGS)).await
        }));
    }
    let mut outcomes = Vec::new();
    for r in resumes {
        outcomes.push(r.await.expect("join").expect("claim").outcome);
    }
    let claimed = outcomes.iter().filter(|o| **o == Outcome::Claimed).count();
    assert_eq!(claimed, 1, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Claimed | Outcome::InProgress)),
        "{outcomes:?}"
    );
}

async fn a_denial_is_replayed_to_every_repeat_with_its_reason(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(RUN, ARGS)).await;
    decide(
        &t.ledger,
        decision(&asked, Decision::Deny, "refunds over 200 need a manager"),
    )
    .await
    .expect("decide");
    for _ in 0..3 {
        let repeat = claim(&t.ledger, gated(RUN, ARGS)).await;
        assert_eq!(repeat.outcome, Outcome::Denied);
        assert!(repeat.claim_token.is_none());
        assert!(
            repeat.note.contains("refunds over 200 need a manager")
                && repeat.note.contains("not done")
                && repeat.note.contains("do not retry it unchanged"),
            "{}",
            repeat.note
        );
    }
    let entry = lookup(&t.ledger, &asked).await;
    assert_eq!(
        (entry.status, entry.entry.approval.state),
        (Status::Denied, ApprovalState::Denied)
    );
    assert_eq!(entry.entry.approval.decided_by, "alice");
    // Terminal and finished: it expires after its retention, and then the call asks anew.
    let expires_at = entry.entry.expires_at.expect("a denial expires");
    t.clock
        .advance(expires_at.minus(t.clock_now()).to_duration() + Duration::from_secs(1));
    let anew = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert_eq!(anew.outcome, Outcome::AwaitingApproval);
    assert_eq!(anew.entry.entry.attempt, 1);
}

async fn a_second_decision_is_the_same_or_refused(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert!(
        decide(&t.ledger, decision(&asked, Decision::Approve, "ok"))
            .await
            .expect("decide")
    );
    // The same again: a success that changed nothing.
    assert!(
        !decide(&t.ledger, decision(&asked, Decision::Approve, "ok again"))
            .await
            .expect("decide again")
    );
    let conflicting = decide(&t.ledger, decision(&asked, Decision::Deny, "no")).await;
    assert!(
        matches!(conflicting, Err(LedgerError::AlreadyDecided(_))),
        "{conflicting:?}"
    );
    let entry = lookup(&t.ledger, &asked).await;
    assert_eq!(
        (
            entry.entry.approval.state,
            entry.entry.approval.reason.as_str()
        ),
        (ApprovalState::Approved, "ok")
    );
    // Once used, approving is still the same decision; denying still refused.
    claim(&t.ledger, gated(RUN, ARGS)).await;
    assert!(
        !decide(&t.ledger, decision(&asked, Decision::Approve, ""))
            .await
            .expect("same")
    );
    assert!(matches!(
        decide(&t.ledger, decision(&asked, Decision::Deny, "")).await,
        Err(LedgerError::AlreadyDecided(_))
    ));
}

async fn an_undecided_request_lapses_at_decide_by_and_the_next_claim_asks_again(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(RUN, ARGS)).await;
    let decide_by = asked.entry.entry.approval.decide_by.expect("a deadline");
    t.clock
        .advance(decide_by.minus(t.clock_now()).to_duration() + Duration::from_secs(1));
    // Too late to decide: refused, nothing changes.
    let late = decide(
        &t.ledger,
        decision(&asked, Decision::Approve, "sorry, late"),
    )
    .await;
    assert!(
        matches!(&late, Err(LedgerError::NotAwaitingApproval(why)) if why.contains("lapsed")),
        "{late:?}"
    );
    // The next claim asks again: a new request, with new deadlines, the lapse on record.
    let again = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert_eq!(again.outcome, Outcome::AwaitingApproval);
    assert!(again.entry.entry.approval.requested_at > asked.entry.entry.approval.requested_at);
    assert_eq!(
        kinds(&t.ledger, &asked).await,
        [
            EventKind::ApprovalRequested,
            EventKind::ApprovalExpired,
            EventKind::ApprovalRequested
        ]
    );
    // And the new request can be decided.
    assert!(
        decide(&t.ledger, decision(&again, Decision::Approve, "ok"))
            .await
            .expect("decide")
    );
}

async fn nothing_acts_after_execute_by(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(RUN, ARGS)).await;
    decide(&t.ledger, decision(&asked, Decision::Approve, "ok"))
        .await
        .expect("decide");
    let execute_by = lookup(&t.ledger, &asked)
        .await
        .entry
        .approval
        .execute_by
        .expect("a deadline");
    assert_eq!(
        execute_by.minus(t.clock_now()),
        idempotency_ledger::domain::Micros::from_duration(Duration::from_secs(24 * 3600))
    );
    t.clock
        .advance(execute_by.minus(t.clock_now()).to_duration());
    // At execute_by the approval is spent: the claim asks again rather than acting.
    let late = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert_eq!(late.outcome, Outcome::AwaitingApproval);
    assert!(late.claim_token.is_none());
    assert_eq!(late.entry.entry.approval.state, ApprovalState::Requested);
    assert!(
        kinds(&t.ledger, &asked)
            .await
            .contains(&EventKind::ApprovalExpired)
    );
}

async fn the_sweeper_records_lapsed_requests_and_the_next_claim_asks_again(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(RUN, ARGS)).await;
    let approved = claim(&t.ledger, gated(RUN, r#"{"order":"o-9","amount":900}"#)).await;
    decide(&t.ledger, decision(&approved, Decision::Approve, "ok"))
        .await
        .expect("decide");
    assert_eq!(
        t.ledger.expire_lapsed_approvals(100).await.expect("sweep"),
        0
    );
    t.clock.advance(Duration::from_secs(73 * 3600));
    assert_eq!(
        t.ledger.expire_lapsed_approvals(100).await.expect("sweep"),
        2
    );
    assert_eq!(t.ledger.approvals().take_expired(), 2);
    for out in [&asked, &approved] {
        let entry = lookup(&t.ledger, out).await;
        assert_eq!(
            (
                entry.status,
                entry.entry.retryable,
                entry.entry.approval.state
            ),
            (Status::Failed, true, ApprovalState::Expired),
            "nothing was done"
        );
        assert!(
            entry.entry.error.contains("lapsed"),
            "{}",
            entry.entry.error
        );
        assert_eq!(
            kinds(&t.ledger, out).await.last(),
            Some(&EventKind::ApprovalExpired)
        );
    }
    // Recorded once.
    assert_eq!(
        t.ledger.expire_lapsed_approvals(100).await.expect("sweep"),
        0
    );
    // A retry of the lapsed call asks again; it does not act on the old request.
    let again = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert_eq!(again.outcome, Outcome::AwaitingApproval);
    assert_eq!(again.entry.entry.attempt, 2);
}

async fn a_paused_run_keeps_its_keys_and_the_decision_keeps_them_again(b: Backend) {
    let mut limits = test_limits();
    limits.approval_timeout = Duration::from_secs(3 * 24 * 3600);
    let t = TestLedger::with_limits(b, limits).await;
    // Before the pause: a call of the run finished, kept for a minute only.
    let lookup_done = claim(
        &t.ledger,
        ClaimInput {
            retention: Some(Duration::from_secs(60)),
            ..claim_input(RUN, "lookup_order", r#"{"order":"o-1"}"#)
        },
    )
    .await;
    t.ledger
        .complete(
            &tenant(),
            CompleteInput {
                key: lookup_done.entry.entry.key.clone(),
                claim_token: lookup_done.claim_token.clone().expect("token"),
                status: FinalStatus::Succeeded,
                result: b"order o-1: 250 EUR".to_vec(),
                error: String::new(),
                retryable: false,
            },
        )
        .await
        .expect("complete");
    // The run pauses for a person, for two days: far past the minute.
    let asked = claim(&t.ledger, gated(RUN, ARGS)).await;
    t.clock.advance(Duration::from_secs(2 * 24 * 3600));
    t.ledger.prune(100).await.expect("prune");
    let repeat_of_lookup = claim_input(RUN, "lookup_order", r#"{"order":"o-1"}"#);
    let kept = claim(&t.ledger, repeat_of_lookup.clone()).await;
    assert_eq!(
        kept.outcome,
        Outcome::Replayed,
        "the paused run's key is kept"
    );
    // The decision, and the approved call acts. The run's finished entries were kept until
    // the request's deadline plus their retention, and get at least their retention again
    // from the decision.
    decide(&t.ledger, decision(&asked, Decision::Approve, "ok"))
        .await
        .expect("decide");
    let acting = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert_eq!(acting.outcome, Outcome::Claimed);
    t.clock.advance(Duration::from_secs(50));
    t.ledger.prune(100).await.expect("prune");
    let resumed = claim(&t.ledger, repeat_of_lookup.clone()).await;
    assert_eq!(resumed.outcome, Outcome::Replayed, "after the decision");
    // Past the request's deadline plus the minute, with no run paused: retention holds again.
    let decide_by = asked.entry.entry.approval.decide_by.expect("a deadline");
    t.clock
        .advance(decide_by.minus(t.clock_now()).to_duration() + Duration::from_secs(61));
    t.ledger.prune(100).await.expect("prune");
    let later = claim(&t.ledger, repeat_of_lookup).await;
    assert_eq!(later.outcome, Outcome::Claimed);
}

async fn extend_run_keeps_a_runs_finished_entries(b: Backend) {
    let t = TestLedger::new(b).await;
    let input = ClaimInput {
        retention: Some(Duration::from_secs(60)),
        ..claim_input("run-paused-elsewhere", "lookup_order", r#"{"order":"o-7"}"#)
    };
    let done = claim(&t.ledger, input.clone()).await;
    t.ledger
        .complete(
            &tenant(),
            CompleteInput {
                key: done.entry.entry.key.clone(),
                claim_token: done.claim_token.clone().expect("token"),
                status: FinalStatus::Succeeded,
                result: b"ok".to_vec(),
                error: String::new(),
                retryable: false,
            },
        )
        .await
        .expect("complete");
    let (extended, kept_until) = t
        .ledger
        .extend_run(
            &tenant(),
            &run_id("run-paused-elsewhere"),
            Some(Duration::from_secs(3600)),
        )
        .await
        .expect("extend");
    assert_eq!(extended, 1);
    assert_eq!(
        kept_until,
        Some(
            t.clock_now()
                .plus(idempotency_ledger::domain::Micros::from_duration(
                    Duration::from_secs(3600)
                ))
        )
    );
    t.clock.advance(Duration::from_secs(1800));
    t.ledger.prune(100).await.expect("prune");
    assert_eq!(claim(&t.ledger, input).await.outcome, Outcome::Replayed);
    // Bounded by --max-retention. (A malformed run is no RunId: gRPC refuses it where the
    // request arrives, see
    // `grpc_api::fields_parsed_where_a_request_arrives_are_refused_and_store_nothing`.)
    let too_long = t
        .ledger
        .extend_run(
            &tenant(),
            &run_id("run-paused-elsewhere"),
            Some(Duration::from_secs(31 * 24 * 3600)),
        )
        .await;
    assert!(
        matches!(
            too_long,
            Err(LedgerError::InvalidArgument {
                field: "retention",
                ..
            })
        ),
        "{too_long:?}"
    );
}

async fn a_waiting_claim_wakes_on_the_decision(b: Backend) {
    let t = TestLedger::new(b).await;
    // The claim that asks a person answers at once, whatever its wait: only repeats wait.
    let asking_since = tokio::time::Instant::now();
    let asked = claim(
        &t.ledger,
        ClaimInput {
            wait: Some(Duration::from_secs(20)),
            ..gated(RUN, ARGS)
        },
    )
    .await;
    assert_eq!(asked.outcome, Outcome::AwaitingApproval);
    assert!(
        asking_since.elapsed() < Duration::from_secs(5),
        "the asking claim answered only after {:?}",
        asking_since.elapsed()
    );
    let waiter = {
        let ledger = t.ledger.clone();
        tokio::spawn(async move {
            ledger
                .claim(
                    &tenant(),
                    ClaimInput {
                        wait: Some(Duration::from_secs(20)),
                        ..gated(RUN, ARGS)
                    },
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = tokio::time::Instant::now();
    decide(&t.ledger, decision(&asked, Decision::Approve, "ok"))
        .await
        .expect("decide");
    let out = waiter.await.expect("join").expect("claim");
    assert_eq!(
        out.outcome,
        Outcome::Claimed,
        "the waiter takes the approval"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by the decision, not the end of its wait: {:?}",
        started.elapsed()
    );
}

async fn a_claim_waiting_for_attempts_answers_a_gated_repeat_at_once(b: Backend) {
    let t = TestLedger::new(b).await;
    let waiting_for_attempts = |input: ClaimInput| ClaimInput {
        wait: Some(Duration::from_secs(20)),
        wait_for: WaitFor::Attempt,
        ..input
    };
    // A repeat of a call awaiting a decision: answered at once, in one call, whatever its wait.
    let asked = claim(&t.ledger, gated(RUN, ARGS)).await;
    assert_eq!(asked.outcome, Outcome::AwaitingApproval);
    let since = tokio::time::Instant::now();
    let repeat = claim(&t.ledger, waiting_for_attempts(gated(RUN, ARGS))).await;
    assert_eq!(repeat.outcome, Outcome::AwaitingApproval);
    assert!(
        since.elapsed() < Duration::from_secs(5),
        "a gated repeat waited {:?} for a decision it did not ask to wait for",
        since.elapsed()
    );
    // A duplicate of an attempt in flight still waits for its result.
    let first = claim(
        &t.ledger,
        claim_input(RUN, "lookup_order", r#"{"order":"o-1"}"#),
    )
    .await;
    assert_eq!(first.outcome, Outcome::Claimed);
    let duplicate = {
        let ledger = t.ledger.clone();
        let input = waiting_for_attempts(claim_input(RUN, "lookup_order", r#"{"order":"o-1"}"#));
        tokio::spawn(async move { ledger.claim(&tenant(), input).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !duplicate.is_finished(),
        "the duplicate waits for the attempt"
    );
    t.ledger
        .complete(
            &tenant(),
            CompleteInput {
                key: first.entry.entry.key.clone(),
                claim_token: first.claim_token.clone().expect("token"),
                status: FinalStatus::Succeeded,
                result: b"order o-1".to_vec(),
                error: String::new(),
                retryable: false,
            },
        )
        .await
        .expect("complete");
    let out = duplicate.await.expect("join").expect("claim");
    assert_eq!(
        out.outcome,
        Outcome::Replayed,
        "woken with the attempt's result"
    );
    assert_eq!(out.entry.entry.result, b"order o-1");
}
