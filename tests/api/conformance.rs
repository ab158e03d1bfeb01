//! The storage conformance suite: every row of the state table (docs/behaviour.md) and every bullet of
//! Claim, Complete and Lookup, written once against the [`Ledger`] and run on SQLite and on
//! PostgreSQL. A behaviour only one backend is tested for is not a behaviour of the product.
//!
//! Each test starts from one set-up call and speaks through the helpers of `calls` (the intent,
//! the Ledger's calls, the inputs); what it checks is all here.

use std::time::Duration;

use idempotency_ledger::domain::canonical::Canonicalization;
use idempotency_ledger::domain::{Entry, FinalStatus, Key, Principal, Status, Tenant};
use idempotency_ledger::error::LedgerError;
use idempotency_ledger::ledger::{
    ClaimInput, EntryView, Ledger, Limits, ListInput, LookupInput, Outcome, ReconcileInput,
};

use crate::support::{Backend, TestLedger, test_limits};

mod calls;

use calls::*;

/// Asserts that `result` matches `pattern`, showing it when not.
macro_rules! assert_matches {
    ($result:expr, $pattern:pat $(,)?) => {{
        let result = &$result;
        assert!(matches!(result, $pattern), "{result:?}");
    }};
}

on_every_store!(
    a_first_claim_is_claimed_with_attempt_one_and_a_token,
    a_retry_with_reordered_arguments_replays_the_first_result,
    concurrent_replays_are_numbered_one_by_one_and_lookup_and_listing_show_the_count,
    a_new_run_is_a_new_intent_and_claims_again,
    a_claim_while_attempting_is_in_progress_and_not_executed,
    an_attempt_past_its_lease_reads_unknown_and_is_not_reexecuted,
    a_reported_unknown_is_in_progress_until_the_claimant_resolves_it,
    a_permanent_failure_is_previously_failed_with_its_error,
    a_retryable_failure_is_claimed_again_with_attempt_two_and_a_new_token,
    an_explicit_key_with_other_arguments_is_refused_and_changes_nothing,
    an_explicit_key_with_the_same_arguments_replays,
    the_lenient_form_trims_and_drops_nulls_and_never_shares_keys_with_jcs,
    leases_and_retention_have_defaults_and_limits,
    a_finished_entry_past_its_retention_is_a_new_claim,
    unresolved_entries_never_expire,
    bad_input_is_refused_and_stores_nothing,
    a_stale_or_wrong_token_cannot_complete,
    a_claimant_may_complete_after_its_lease_expired_unless_resolved_since,
    an_identical_complete_is_already_completed_and_a_different_one_changes_nothing,
    completing_an_absent_or_other_tenants_key_is_not_found,
    nul_bytes_in_arguments_and_results_survive_byte_for_byte,
    a_result_over_the_limit_is_refused_and_the_entry_unchanged,
    result_and_retryable_only_go_with_their_status,
    lookup_by_key_and_by_derivation_agree_and_change_nothing,
    a_waiting_claim_returns_the_result_once_the_attempt_completes,
    a_waiting_claim_takes_over_after_a_retryable_failure,
    a_wait_ends_with_in_progress_when_nothing_happens,
    a_waiter_wakes_on_the_complete_not_at_the_end_of_its_wait,
    fifty_waiters_all_get_the_result,
    of_fifty_waiters_exactly_one_takes_over_after_a_retryable_failure,
    a_waiter_answers_unknown_when_the_lease_ends,
    reconcile_hands_out_only_unknown_entries_oldest_first_by_tool_and_age,
    concurrent_reconcilers_get_disjoint_entries_until_the_hold_passes,
    a_found_resolution_makes_the_next_claim_replay_it,
    a_not_found_retryable_resolution_makes_the_next_claim_attempt_two,
    resolving_a_resolved_or_live_entry_changes_nothing,
    the_claimants_late_complete_wins_over_a_later_resolution,
    malformed_resolutions_are_refused_and_none_is_applied,
    pruning_removes_expired_finished_entries_and_keeps_unresolved_ones,
    the_holder_renews_its_lease_and_a_duplicate_stays_in_progress,
    renewing_with_a_stale_token_or_after_the_lease_ended_changes_nothing,
    resolve_only_applies_the_resolutions_and_hands_out_nothing,
    reconcile_with_keys_hands_out_only_those_keys_when_unresolved_and_not_held,
    a_resolution_records_its_principal_as_resolved_by_until_a_new_attempt,
    replays_answered_from_memory_reach_the_store_and_another_server_in_one_write,
    a_replay_on_the_server_that_did_not_complete_reads_the_store_once_then_remembers,
    what_is_remembered_expires_on_the_ledgers_clock_and_a_reused_key_is_still_refused,
    a_retryable_failure_is_never_answered_from_memory_and_a_permanent_one_is,
    with_the_memory_off_every_replay_is_counted_in_the_store_at_once,
);

async fn a_first_claim_is_claimed_with_attempt_one_and_a_token(b: Backend) {
    let t = TestLedger::new(b).await;
    let out = claim_the_intent(&t.ledger).await;
    assert_eq!(out.outcome, Outcome::Claimed);
    assert_eq!(out.entry.status, Status::Attempting);
    assert_eq!(out.entry.entry.attempt, 1);
    assert_eq!(out.entry.entry.key.as_str().len(), 64);
    assert_eq!(out.entry.entry.run_id_str(), RUN);
    assert_eq!(out.entry.entry.tool, TOOL);
    assert!(out.note.is_empty());
    assert_eq!(token(&out).len(), 32);
    assert_eq!(
        out.entry.external_ref,
        format!("idem-{}", &out.entry.entry.key.as_str()[..16])
    );
    let lease = out.entry.entry.lease_expires_at.0 - out.entry.entry.started_at.0;
    assert_eq!(lease, 60_000_000, "default lease is 60 s");
}

async fn a_retry_with_reordered_arguments_replays_the_first_result(b: Backend) {
    let (t, first, key) = claimed_on(b).await;
    let completed = succeed(&t.ledger, &first, b"{\"credit_id\":\"cr-1\"}").await;
    assert!(!completed.already_completed);
    assert_eq!(completed.entry.status, Status::Succeeded);

    // Same intent, other key order, whitespace and number spelling.
    let again = claim(
        &t.ledger,
        RUN,
        TOOL,
        r#"{ "currency": "EUR", "amount": 2e2, "customer": "c-42" }"#,
    )
    .await;
    assert_eq!(again.outcome, Outcome::Replayed);
    assert_eq!(again.entry.entry.key, key);
    assert_eq!(again.entry.entry.result, b"{\"credit_id\":\"cr-1\"}");
    assert_eq!(again.entry.entry.replay_count, 1);
    assert!(again.claim_token.is_none());
    assert!(
        again.note.contains("already performed in this run"),
        "{}",
        again.note
    );
    assert!(
        again.note.contains("No new action was taken"),
        "{}",
        again.note
    );

    let third = claim(
        &t.ledger,
        RUN,
        TOOL,
        r#"{"amount":200.0,"currency":"EUR","customer":"c-42"}"#,
    )
    .await;
    assert_eq!(third.outcome, Outcome::Replayed);
    assert_eq!(third.entry.entry.replay_count, 2);
    assert_eq!(lookup_found(&t.ledger, &key).await.entry.replay_count, 2);
}

/// "`replay_count` goes up by one", also when the replays come at once: each counts under
/// the entry's lock, so the answers are 1 to N, each once, and Lookup and ListEntries show N.
async fn concurrent_replays_are_numbered_one_by_one_and_lookup_and_listing_show_the_count(
    b: Backend,
) {
    const REPLAYS: u64 = 16;
    let (t, _, key) = succeeded_on(b, b"cr-1").await;
    let mut replays = Vec::new();
    for _ in 0..REPLAYS {
        let ledger = t.ledger.clone();
        replays.push(tokio::spawn(async move {
            claim(&ledger, RUN, TOOL, ARGS).await
        }));
    }
    let mut counts = Vec::new();
    for replay in replays {
        let out = replay.await.expect("join");
        assert_eq!(out.outcome, Outcome::Replayed);
        assert_eq!(out.entry.entry.result, b"cr-1");
        counts.push(out.entry.entry.replay_count);
    }
    counts.sort_unstable();
    assert_eq!(counts, (1..=REPLAYS).collect::<Vec<_>>());
    assert_eq!(
        lookup_found(&t.ledger, &key).await.entry.replay_count,
        REPLAYS
    );
    let listed = list_ok(
        &t.ledger,
        ListInput {
            run_id: Some(run_id(RUN)),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(listed.entries.len(), 1);
    assert_eq!(listed.entries[0].entry.replay_count, REPLAYS);
}

async fn a_new_run_is_a_new_intent_and_claims_again(b: Backend) {
    let t = TestLedger::new(b).await;
    let first = claim(&t.ledger, "run-1", TOOL, ARGS).await;
    succeed(&t.ledger, &first, b"ok").await;
    let other_run = claim(&t.ledger, "run-2", TOOL, ARGS).await;
    assert_eq!(other_run.outcome, Outcome::Claimed);
    assert_ne!(other_run.entry.entry.key, first.entry.entry.key);
    // A corrected amount is a new operation too.
    let corrected = claim(
        &t.ledger,
        "run-1",
        TOOL,
        r#"{"customer":"c-42","amount":250,"currency":"EUR"}"#,
    )
    .await;
    assert_eq!(corrected.outcome, Outcome::Claimed);
    // And so is another tool with the same arguments.
    let other_tool = claim(&t.ledger, "run-1", "open_ticket", ARGS).await;
    assert_eq!(other_tool.outcome, Outcome::Claimed);
}

async fn a_claim_while_attempting_is_in_progress_and_not_executed(b: Backend) {
    let (t, first, _) = claimed_on(b).await;
    let second = claim_the_intent(&t.ledger).await;
    assert_eq!(second.outcome, Outcome::InProgress);
    assert_eq!(second.entry.status, Status::Attempting);
    assert!(second.claim_token.is_none());
    assert!(second.note.contains("do not repeat it"), "{}", second.note);
    let hint = second.retry_after.expect("retry_after with IN_PROGRESS");
    assert!(
        hint >= Duration::from_millis(100) && hint <= Duration::from_secs(1),
        "{hint:?}"
    );
    // The in-flight claim is untouched: same token, same attempt.
    let entry = lookup_found(&t.ledger, &first.entry.entry.key).await;
    assert_eq!(entry.entry.claim_token, token(&first));
    assert_eq!(entry.entry.attempt, 1);
}

async fn an_attempt_past_its_lease_reads_unknown_and_is_not_reexecuted(b: Backend) {
    let (t, first) = claimed_with(b, leased(RUN, Duration::from_secs(5))).await;
    t.clock.advance(Duration::from_secs(6));
    let again = claim_the_intent(&t.ledger).await;
    assert_eq!(again.outcome, Outcome::InProgress);
    assert_eq!(again.entry.status, Status::Unknown);
    assert!(again.note.contains("unknown"), "{}", again.note);
    assert_eq!(again.retry_after, Some(Duration::from_secs(30)));
    let seen = lookup_found(&t.ledger, &first.entry.entry.key).await;
    assert_eq!(
        seen.status,
        Status::Unknown,
        "Lookup reports it as unknown too"
    );
    assert_eq!(
        seen.entry.status,
        Status::Attempting,
        "no background write was needed"
    );
}

async fn a_reported_unknown_is_in_progress_until_the_claimant_resolves_it(b: Backend) {
    let (t, first, _) = claimed_on(b).await;
    let unknown = unknown_report(&first, "timed out after 30s");
    let out = complete_ok(&t.ledger, unknown.clone()).await;
    assert_eq!(out.entry.status, Status::Unknown);
    assert!(out.entry.entry.expires_at.is_none());
    let again = claim_the_intent(&t.ledger).await;
    assert_eq!(again.outcome, Outcome::InProgress);
    assert_eq!(again.entry.status, Status::Unknown);
    // Reporting the same unknown again is a no-op success.
    let repeat = complete_ok(&t.ledger, unknown).await;
    assert!(repeat.already_completed);
    // The same token may still resolve it.
    let resolved = succeed(&t.ledger, &first, b"found").await;
    assert_eq!(resolved.entry.status, Status::Succeeded);
    let replay = claim_the_intent(&t.ledger).await;
    assert_eq!(replay.outcome, Outcome::Replayed);
    assert_eq!(replay.entry.entry.result, b"found");
}

async fn a_permanent_failure_is_previously_failed_with_its_error(b: Backend) {
    let (t, first, _) = claimed_on(b).await;
    fail(&t.ledger, &first, "account closed", false).await;
    let again = claim_the_intent(&t.ledger).await;
    assert_eq!(again.outcome, Outcome::PreviouslyFailed);
    assert_eq!(again.entry.status, Status::Failed);
    assert_eq!(again.entry.entry.error, "account closed");
    assert!(!again.entry.entry.retryable);
    assert!(again.note.contains("account closed"), "{}", again.note);
    assert!(again.claim_token.is_none());
    assert_eq!(again.entry.entry.attempt, 1);
}

async fn a_retryable_failure_is_claimed_again_with_attempt_two_and_a_new_token(b: Backend) {
    let (t, first, key) = claimed_on(b).await;
    fail(&t.ledger, &first, "503 from the payment API", true).await;
    let second = claim_the_intent(&t.ledger).await;
    assert_eq!(second.outcome, Outcome::Claimed);
    assert_eq!(second.entry.entry.attempt, 2);
    assert_eq!(second.entry.status, Status::Attempting);
    assert_ne!(token(&second), token(&first));
    assert!(second.entry.entry.error.is_empty() && !second.entry.entry.retryable);
    // The first claimant is fenced off now.
    let stale = complete(
        &t.ledger,
        done(&key, &token(&first), FinalStatus::Succeeded, b"late"),
    )
    .await;
    assert_matches!(stale, Err(LedgerError::StaleClaimToken));
    let ok = complete_ok(
        &t.ledger,
        done(&key, &token(&second), FinalStatus::Succeeded, b"second"),
    )
    .await;
    assert_eq!(ok.entry.entry.attempt, 2);
    assert_eq!(
        claim_the_intent(&t.ledger).await.entry.entry.result,
        b"second"
    );
}

async fn an_explicit_key_with_other_arguments_is_refused_and_changes_nothing(b: Backend) {
    let t = TestLedger::new(b).await;
    let mut input = claim_input(RUN, TOOL, ARGS);
    input.key = claim_key("wf-7:step-3", "");
    let first = claim_ok(&t.ledger, input.clone()).await;
    assert_eq!(first.outcome, Outcome::Claimed);
    assert_eq!(first.entry.entry.key, "wf-7:step-3");
    assert_eq!(first.entry.entry.fingerprint.len(), 64);
    let mut other = input.clone();
    other.arguments_json = r#"{"customer":"c-42","amount":999,"currency":"EUR"}"#.into();
    let refused = claim_result(&t.ledger, other).await;
    assert_matches!(refused, Err(LedgerError::KeyReused));
    let mut other_tool = input.clone();
    other_tool.tool = tool("refund");
    assert_matches!(
        claim_result(&t.ledger, other_tool).await,
        Err(LedgerError::KeyReused)
    );
    let entry = lookup_found(&t.ledger, "wf-7:step-3").await;
    assert_eq!(
        entry.entry, first.entry.entry,
        "a refused reuse changes nothing"
    );
}

async fn an_explicit_key_with_the_same_arguments_replays(b: Backend) {
    let t = TestLedger::new(b).await;
    let mut input = claim_input(RUN, TOOL, ARGS);
    input.key = claim_key("wf-7:step-4", "");
    let first = claim_ok(&t.ledger, input.clone()).await;
    complete_ok(
        &t.ledger,
        done("wf-7:step-4", &token(&first), FinalStatus::Succeeded, b"r"),
    )
    .await;
    input.arguments_json = r#"{"currency":"EUR","customer":"c-42","amount":200}"#.into();
    let again = claim_ok(&t.ledger, input).await;
    assert_eq!(again.outcome, Outcome::Replayed);
    assert!(again.note.contains("already performed"), "{}", again.note);
    assert_ne!(again.entry.external_ref, "");
    assert!(again.entry.external_ref.starts_with("idem-"));
}

async fn the_lenient_form_trims_and_drops_nulls_and_never_shares_keys_with_jcs(b: Backend) {
    let t = TestLedger::new(b).await;
    let lenient = |args: &str| {
        let mut i = claim_input(RUN, "send_reply", args);
        i.canonicalization = Canonicalization::JcsLenient;
        i
    };
    let first = claim_ok(&t.ledger, lenient(r#"{"to":"ana","body":"hello"}"#)).await;
    succeed(&t.ledger, &first, b"sent").await;
    let padded = claim_ok(
        &t.ledger,
        lenient(r#"{"body":"  hello\n","to":" ana","cc":null}"#),
    )
    .await;
    assert_eq!(padded.outcome, Outcome::Replayed);
    assert_eq!(padded.entry.entry.key, first.entry.entry.key);
    let strict = claim(
        &t.ledger,
        RUN,
        "send_reply",
        r#"{"to":"ana","body":"hello"}"#,
    )
    .await;
    assert_eq!(
        strict.outcome,
        Outcome::Claimed,
        "JCS and lenient keys never collide"
    );
    assert_ne!(strict.entry.entry.key, first.entry.entry.key);
}

async fn leases_and_retention_have_defaults_and_limits(b: Backend) {
    let t = TestLedger::new(b).await;
    let with = |lease: Option<Duration>, retention: Option<Duration>, run: &str| {
        let mut i = claim_input(run, TOOL, ARGS);
        i.lease = lease;
        i.retention = retention;
        i
    };
    for (field, input) in [
        ("lease", with(Some(Duration::from_secs(3601)), None, "r-a")),
        ("lease", with(Some(Duration::ZERO), None, "r-b")),
        (
            "retention",
            with(None, Some(Duration::from_secs(31 * 86_400)), "r-c"),
        ),
        ("retention", with(None, Some(Duration::ZERO), "r-d")),
    ] {
        let run = input.key.run_id().expect("a run").to_string();
        match claim_result(&t.ledger, input).await {
            Err(LedgerError::InvalidArgument { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field} out of range should be refused: {other:?}"),
        }
        let looked = lookup_result(&t.ledger, intent(&run, TOOL, ARGS)).await;
        assert!(
            matches!(looked, Err(LedgerError::NotFound)),
            "nothing stored: {looked:?}"
        );
    }
    let out = claim_ok(
        &t.ledger,
        with(
            Some(Duration::from_secs(3600)),
            Some(Duration::from_secs(30 * 86_400)),
            "r-e",
        ),
    )
    .await;
    let e = &out.entry.entry;
    assert_eq!(e.lease_expires_at.0 - e.started_at.0, 3_600_000_000);
    let finished = complete_ok(
        &t.ledger,
        done(&e.key, &token(&out), FinalStatus::Succeeded, b"x"),
    )
    .await;
    let f = &finished.entry.entry;
    let kept = f.expires_at.expect("expires").0 - f.finished_at.expect("finished").0;
    assert_eq!(kept, 30 * 86_400 * 1_000_000);
    // Default retention: 24 h.
    let plain = claim(&t.ledger, "r-f", TOOL, ARGS).await;
    let plain_done = succeed(&t.ledger, &plain, b"x").await;
    let p = &plain_done.entry.entry;
    assert_eq!(
        p.expires_at.expect("expires").0 - p.finished_at.expect("finished").0,
        86_400_000_000
    );
}

async fn a_finished_entry_past_its_retention_is_a_new_claim(b: Backend) {
    let t = TestLedger::new(b).await;
    let input = retained(RUN, Duration::from_secs(60));
    let first = claim_ok(&t.ledger, input.clone()).await;
    let key = first.entry.entry.key.to_string();
    succeed(&t.ledger, &first, b"old").await;
    t.clock.advance(Duration::from_secs(59));
    assert_eq!(
        claim_ok(&t.ledger, input.clone()).await.outcome,
        Outcome::Replayed
    );
    t.clock.advance(Duration::from_secs(2));
    assert_matches!(
        lookup_key(&t.ledger, &key).await,
        Err(LedgerError::NotFound)
    );
    let fresh = claim_ok(&t.ledger, input).await;
    assert_eq!(fresh.outcome, Outcome::Claimed);
    assert_eq!(fresh.entry.entry.attempt, 1);
    assert_eq!(fresh.entry.entry.replay_count, 0);
    assert!(fresh.entry.entry.result.is_empty());
    let stale = complete(
        &t.ledger,
        done(&key, &token(&first), FinalStatus::Succeeded, b"old"),
    )
    .await;
    assert_matches!(stale, Err(LedgerError::StaleClaimToken));
}

async fn unresolved_entries_never_expire(b: Backend) {
    let (t, _, key) = claimed_on(b).await;
    t.clock.advance(Duration::from_secs(365 * 86_400));
    let seen = lookup_key(&t.ledger, &key)
        .await
        .expect("still there a year later");
    assert_eq!(seen.status, Status::Unknown);
    assert_eq!(
        claim_the_intent(&t.ledger).await.outcome,
        Outcome::InProgress
    );
}

/// Arguments a claim cannot canonicalize. (A malformed tool, run id, key or principal cannot
/// be put in a [`ClaimInput`] any more: gRPC refuses those where the request arrives, tested in
/// `grpc_api::fields_parsed_where_a_request_arrives_are_refused_and_store_nothing`.)
async fn bad_input_is_refused_and_stores_nothing(b: Backend) {
    let t = TestLedger::new(b).await;
    let cases: Vec<(ClaimInput, &str, &str)> = vec![
        (
            claim_input(RUN, TOOL, r#"{"a":1,"a":2}"#),
            "arguments_json",
            "DUPLICATE_MEMBER",
        ),
        (
            claim_input(RUN, TOOL, "{not json"),
            "arguments_json",
            "INVALID_JSON",
        ),
        (
            claim_input(RUN, TOOL, r#"{"n":9007199254740993}"#),
            "arguments_json",
            "UNSAFE_INTEGER",
        ),
        (
            claim_input(RUN, TOOL, r#"{"s":"\ud800"}"#),
            "arguments_json",
            "LONE_SURROGATE",
        ),
        (claim_input(RUN, TOOL, ""), "arguments_json", "INVALID_JSON"),
    ];
    for (input, want_field, want_reason) in cases {
        match claim_result(&t.ledger, input.clone()).await {
            Err(LedgerError::InvalidArgument {
                field,
                reason,
                message,
            }) => {
                assert_eq!(
                    (field, reason.as_str()),
                    (want_field, want_reason),
                    "{message}"
                );
                assert!(!message.is_empty());
            }
            other => panic!("{input:?} should be refused: {other:?}"),
        }
    }
    let deep = format!("{{\"a\":{}1{}}}", "[".repeat(64), "]".repeat(64));
    match claim_result(&t.ledger, claim_input(RUN, TOOL, &deep)).await {
        Err(LedgerError::InvalidArgument { reason, .. }) => assert_eq!(reason, "JSON_TOO_DEEP"),
        other => panic!("too deep should be refused: {other:?}"),
    }
    // Nothing was stored: the valid request still claims first.
    assert_eq!(claim_the_intent(&t.ledger).await.outcome, Outcome::Claimed);
}

async fn a_stale_or_wrong_token_cannot_complete(b: Backend) {
    let (t, _, key) = claimed_on(b).await;
    let wrong = complete(
        &t.ledger,
        done(
            &key,
            "0123456789abcdef0123456789abcdef",
            FinalStatus::Succeeded,
            b"x",
        ),
    )
    .await;
    assert_matches!(wrong, Err(LedgerError::StaleClaimToken));
    let entry = lookup_found(&t.ledger, &key).await;
    assert_eq!(
        entry.entry.status,
        Status::Attempting,
        "a refused complete changes nothing"
    );
    // An empty token is no ClaimToken: gRPC refuses it where the request arrives (see
    // `grpc_api::fields_parsed_where_a_request_arrives_are_refused_and_store_nothing`).
}

async fn a_claimant_may_complete_after_its_lease_expired_unless_resolved_since(b: Backend) {
    let (t, first, _) = claimed_on(b).await;
    t.clock.advance(Duration::from_secs(120));
    let late = succeed(&t.ledger, &first, b"late but true").await;
    assert_eq!(late.entry.status, Status::Succeeded);
    assert_eq!(
        claim_the_intent(&t.ledger).await.entry.entry.result,
        b"late but true"
    );
    // Once resolved, a different late outcome is refused.
    let conflicting = complete(
        &t.ledger,
        failed(&first.entry.entry.key, &token(&first), "oops", true),
    )
    .await;
    assert_matches!(conflicting, Err(LedgerError::AlreadyResolved(_)));
}

async fn an_identical_complete_is_already_completed_and_a_different_one_changes_nothing(
    b: Backend,
) {
    let (t, first, key) = claimed_on(b).await;
    let ok = done(&key, &token(&first), FinalStatus::Succeeded, b"result-1");
    let once = complete_ok(&t.ledger, ok.clone()).await;
    assert!(!once.already_completed);
    let twice = complete_ok(&t.ledger, ok).await;
    assert!(twice.already_completed);
    assert_eq!(twice.entry.entry, once.entry.entry);
    for different in [
        done(&key, &token(&first), FinalStatus::Succeeded, b"result-2"),
        failed(&key, &token(&first), "nope", false),
        done(&key, &token(&first), FinalStatus::Unknown, b""),
    ] {
        let refused = complete(&t.ledger, different).await;
        assert_matches!(refused, Err(LedgerError::AlreadyResolved("SUCCEEDED")));
    }
    assert_eq!(lookup_found(&t.ledger, &key).await.entry, once.entry.entry);
}

async fn completing_an_absent_or_other_tenants_key_is_not_found(b: Backend) {
    let (t, first, key) = claimed_on(b).await;
    let absent = complete(
        &t.ledger,
        done("0".repeat(64), &token(&first), FinalStatus::Succeeded, b"x"),
    )
    .await;
    assert_matches!(absent, Err(LedgerError::NotFound));
    let other = Tenant::parse("globex").expect("tenant");
    let theirs = t
        .ledger
        .complete(
            &other,
            done(&key, &token(&first), FinalStatus::Succeeded, b"x"),
        )
        .await;
    assert_matches!(theirs, Err(LedgerError::NotFound));
    let looked = t
        .ledger
        .lookup(&other, LookupInput::by_key(calls::key(&key)))
        .await;
    assert!(matches!(looked, Err(LedgerError::NotFound)));
    // The other tenant's own claim of the same intent is independent.
    let own = t
        .ledger
        .claim(&other, claim_input(RUN, TOOL, ARGS))
        .await
        .expect("claim");
    assert_eq!(own.outcome, Outcome::Claimed);
    assert_eq!(own.entry.entry.key, key, "same derivation, separate entry");
    assert_eq!(
        lookup_found(&t.ledger, &key).await.entry.claim_token,
        token(&first)
    );
}

async fn nul_bytes_in_arguments_and_results_survive_byte_for_byte(b: Backend) {
    let t = TestLedger::new(b).await;
    let args = r#"{"memo":"a\u0000b","n":1}"#;
    let first = claim(&t.ledger, RUN, TOOL, args).await;
    let result: Vec<u8> = vec![0, 159, 146, 150, 0, b'{', 0xff, 0];
    succeed(&t.ledger, &first, &result).await;
    let again = claim(&t.ledger, RUN, TOOL, r#"{"n":1,"memo":"a\u0000b"}"#).await;
    assert_eq!(again.outcome, Outcome::Replayed);
    assert_eq!(again.entry.entry.result, result);
    // A different string (no NUL) is a different intent.
    let other = claim(&t.ledger, RUN, TOOL, r#"{"memo":"ab","n":1}"#).await;
    assert_eq!(other.outcome, Outcome::Claimed);
}

async fn a_result_over_the_limit_is_refused_and_the_entry_unchanged(b: Backend) {
    let limits = Limits {
        max_result_bytes: 16,
        ..test_limits()
    };
    let t = TestLedger::with_limits(b, limits).await;
    let first = claim_the_intent(&t.ledger).await;
    let key = first.entry.entry.key.to_string();
    let big = complete(
        &t.ledger,
        done(&key, &token(&first), FinalStatus::Succeeded, &[b'x'; 17]),
    )
    .await;
    match big {
        Err(LedgerError::InvalidArgument { field, reason, .. }) => {
            assert_eq!((field, reason.as_str()), ("result", "RESULT_TOO_LARGE"));
        }
        other => panic!("a result over the limit should be refused: {other:?}"),
    }
    let entry = lookup_found(&t.ledger, &key).await;
    assert_eq!(entry.entry, first.entry.entry, "entry unchanged");
    let fits = succeed(&t.ledger, &first, &[b'x'; 16]).await;
    assert_eq!(fits.entry.entry.result.len(), 16);
}

async fn result_and_retryable_only_go_with_their_status(b: Backend) {
    let (t, first, key) = claimed_on(b).await;
    let mut result_on_failure = failed(&key, &token(&first), "x", false);
    result_on_failure.result = b"r".to_vec();
    let mut retryable_on_success = done(&key, &token(&first), FinalStatus::Succeeded, b"r");
    retryable_on_success.retryable = true;
    for (input, field) in [
        (result_on_failure, "result"),
        (retryable_on_success, "retryable"),
    ] {
        match complete(&t.ledger, input).await {
            Err(LedgerError::InvalidArgument { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field} should be refused: {other:?}"),
        }
    }
    assert_eq!(lookup_found(&t.ledger, &key).await.entry, first.entry.entry);
}

async fn lookup_by_key_and_by_derivation_agree_and_change_nothing(b: Backend) {
    let (t, _, key) = succeeded_on(b, b"r").await;
    let by_key = lookup_key(&t.ledger, &key).await.expect("by key");
    let derived = lookup_ok(
        &t.ledger,
        intent(
            RUN,
            TOOL,
            r#"{"currency":"EUR","amount":200,"customer":"c-42"}"#,
        ),
    )
    .await;
    assert_eq!(
        derived.entry.arguments.as_deref(),
        Some(r#"{"amount":200,"currency":"EUR","customer":"c-42"}"#),
        "the canonical arguments, kept for audit"
    );
    assert_eq!(
        by_key,
        EntryView {
            entry: Entry {
                arguments: None,
                resolved_by: Principal::none(),
                ..derived.entry
            },
            ..derived
        }
    );
    assert_eq!(by_key.entry.replay_count, 0, "lookups are not replays");
    assert_eq!(
        lookup_key(&t.ledger, &key).await.expect("again"),
        by_key,
        "read-only"
    );
    let missing = lookup_result(&t.ledger, intent("run-9", TOOL, ARGS)).await;
    assert!(matches!(missing, Err(LedgerError::NotFound)));
    // A request with both a key and the fields, or with neither, is no LookupInput: gRPC
    // refuses it where it arrives (see
    // `grpc_api::fields_parsed_where_a_request_arrives_are_refused_and_store_nothing`).
}

async fn a_waiting_claim_returns_the_result_once_the_attempt_completes(b: Backend) {
    let (t, first, _) = claimed_on(b).await;
    let ledger = t.ledger.clone();
    let waiter = tokio::spawn(async move {
        let input = waiting(RUN, Duration::from_secs(10));
        let started = tokio::time::Instant::now();
        let out = claim_ok(&ledger, input).await;
        (out, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    succeed(&t.ledger, &first, b"done").await;
    let (out, waited) = waiter.await.expect("join");
    assert_eq!(out.outcome, Outcome::Replayed);
    assert_eq!(out.entry.entry.result, b"done");
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

async fn a_waiting_claim_takes_over_after_a_retryable_failure(b: Backend) {
    let (t, first, _) = claimed_on(b).await;
    let ledger = t.ledger.clone();
    let waiter = tokio::spawn(async move {
        let input = waiting(RUN, Duration::from_secs(20));
        claim_ok(&ledger, input).await
    });
    // The failure is written only once the waiter found attempt 1 in flight and sleeps until a
    // change: a claim that arrived after it would be claimed without waiting for anything.
    until_waiting(&t.ledger, 1).await;
    fail(&t.ledger, &first, "connection reset", true).await;
    let out = waiter.await.expect("join");
    assert_eq!(out.outcome, Outcome::Claimed);
    assert_eq!(out.entry.entry.attempt, 2);
    assert_eq!(t.ledger.waits().waiting_claims(), 0, "the wait ended");
}

async fn a_wait_ends_with_in_progress_when_nothing_happens(b: Backend) {
    let t = TestLedger::new(b).await;
    claim_the_intent(&t.ledger).await;
    let input = waiting(RUN, Duration::from_millis(400));
    let started = tokio::time::Instant::now();
    let out = claim_ok(&t.ledger, input).await;
    let waited = started.elapsed();
    assert_eq!(out.outcome, Outcome::InProgress);
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

async fn a_waiter_wakes_on_the_complete_not_at_the_end_of_its_wait(b: Backend) {
    // No poll of the key wakes it either: only the Complete can, within the bound below.
    let limits = Limits {
        wait_poll_interval: Duration::from_secs(600),
        ..test_limits()
    };
    let t = TestLedger::with_limits(b, limits).await;
    let first = claim_the_intent(&t.ledger).await;
    let ledger = t.ledger.clone();
    let waiter = tokio::spawn(async move {
        let out = claim_ok(&ledger, waiting(RUN, Duration::from_secs(25))).await;
        (out, tokio::time::Instant::now())
    });
    until_waiting(&t.ledger, 1).await;
    succeed(&t.ledger, &first, b"r").await;
    let completed_at = tokio::time::Instant::now();
    let (out, answered_at) = waiter.await.expect("join");
    assert_eq!(out.outcome, Outcome::Replayed);
    // Woken at once (well under a millisecond when idle); a bound a loaded two-core machine
    // holds, and far below the 25 s the wait would last unwoken.
    let latency = answered_at.saturating_duration_since(completed_at);
    assert!(
        latency < Duration::from_secs(5),
        "woke {latency:?} after the complete"
    );
}

async fn fifty_waiters_all_get_the_result(b: Backend) {
    let (t, first, key) = claimed_on(b).await;
    let mut waiters = Vec::new();
    for _ in 0..50 {
        let ledger = t.ledger.clone();
        waiters.push(tokio::spawn(async move {
            claim_result(&ledger, waiting(RUN, Duration::from_secs(15))).await
        }));
    }
    // Until the waiters wait (a loaded machine may take a while to start fifty claims): they
    // share one watch, never more.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while t.ledger.waits().watched_keys() == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        t.ledger.waits().watched_keys(),
        1,
        "fifty waiters share one watch"
    );
    succeed(&t.ledger, &first, b"shared").await;
    for w in waiters {
        let out = w.await.expect("join").expect("waiting claim");
        assert_eq!(out.outcome, Outcome::Replayed);
        assert_eq!(out.entry.entry.result, b"shared");
    }
    let seen = lookup_found(&t.ledger, &key).await;
    assert_eq!(seen.entry.replay_count, 50);
}

async fn of_fifty_waiters_exactly_one_takes_over_after_a_retryable_failure(b: Backend) {
    let (t, first, key) = claimed_on(b).await;
    let (answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..50 {
        let ledger = t.ledger.clone();
        let answers = answers.clone();
        tokio::spawn(async move {
            let out = claim_ok(&ledger, waiting(RUN, Duration::from_secs(25))).await;
            let _ = answers.send(out);
        });
    }
    drop(answers);
    // All fifty found attempt 1 in flight and wait before it fails: none can take over by
    // arriving late.
    until_waiting(&t.ledger, 50).await;
    fail(&t.ledger, &first, "503", true).await;
    // The one that takes over answers first.
    let taker = tokio::time::timeout(Duration::from_secs(10), answered.recv())
        .await
        .expect("one waiter takes over within 10 s")
        .expect("an answer");
    assert_eq!(taker.outcome, Outcome::Claimed);
    assert_eq!(taker.entry.entry.attempt, 2);
    // The others wait on, for attempt 2 now.
    until_waiting(&t.ledger, 49).await;
    complete_ok(
        &t.ledger,
        done(&key, &token(&taker), FinalStatus::Succeeded, b"second"),
    )
    .await;
    let mut replayed = 0;
    while let Some(out) = tokio::time::timeout(Duration::from_secs(10), answered.recv())
        .await
        .expect("every waiter answers within 10 s of attempt 2's completion")
    {
        assert_eq!(out.outcome, Outcome::Replayed, "{out:?}");
        assert_eq!(out.entry.entry.result, b"second");
        replayed += 1;
    }
    assert_eq!(replayed, 49);
}

async fn a_waiter_answers_unknown_when_the_lease_ends(b: Backend) {
    let (t, _) = claimed_with(b, leased(RUN, Duration::from_secs(1))).await;
    // Real time passes for the waiter's timer; the manual clock is moved past the lease so the
    // re-read sees it expired.
    let ledger = t.ledger.clone();
    let waiter =
        tokio::spawn(
            async move { claim_result(&ledger, waiting(RUN, Duration::from_secs(10))).await },
        );
    tokio::time::sleep(Duration::from_millis(200)).await;
    t.clock.advance(Duration::from_secs(2));
    let started = tokio::time::Instant::now();
    let out = waiter.await.expect("join").expect("waiting claim");
    assert_eq!(out.outcome, Outcome::InProgress);
    assert_eq!(out.entry.status, Status::Unknown);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

async fn reconcile_hands_out_only_unknown_entries_oldest_first_by_tool_and_age(b: Backend) {
    let t = TestLedger::new(b).await;
    // Not handed out: an attempt whose lease outlasts the test, and a success.
    let long = leased("live", Duration::from_secs(3600));
    let live = claim_ok(&t.ledger, long).await;
    let ok = claim(&t.ledger, "ok", TOOL, ARGS).await;
    succeed(&t.ledger, &ok, b"r").await;
    // Handed out: an attempt whose lease expires, and reported unknowns of two tools.
    let short = leased("expired", Duration::from_secs(1));
    let expired = claim_ok(&t.ledger, short).await;
    t.clock.advance(Duration::from_secs(2));
    let credits = unknown_entries(&t, TOOL, 3).await;
    let tickets = unknown_entries(&t, "open_ticket", 2).await;
    t.clock.advance(Duration::from_secs(1));

    let mut want = vec![expired.entry.entry.key.to_string()];
    want.extend(credits.iter().cloned());
    let all = reconcile(
        &t.ledger,
        ReconcileInput {
            tool: Some(tool(TOOL)),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(all, want, "unknown entries of the tool, oldest first");
    assert!(!all.contains(&live.entry.entry.key.to_string()));

    t.clock.advance(Duration::from_secs(61)); // past the reconcile hold
    let old_only = reconcile(
        &t.ledger,
        ReconcileInput {
            older_than: Some(Duration::from_millis(62_045)),
            ..Default::default()
        },
    )
    .await;
    // Only the expired attempt and the first credit started 62.045 s ago or earlier (the
    // credits started 10 ms apart, 2 s after it, and 64.05 s have passed).
    assert_eq!(old_only, want[..2].to_vec());
    t.clock.advance(Duration::from_secs(61));
    let limited = reconcile(
        &t.ledger,
        ReconcileInput {
            limit: 2,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(limited, want[..2].to_vec());
    let rest = reconcile(&t.ledger, ReconcileInput::default()).await;
    let mut expected_rest = want[2..].to_vec();
    expected_rest.extend(tickets);
    assert_eq!(rest, expected_rest);
}

async fn concurrent_reconcilers_get_disjoint_entries_until_the_hold_passes(b: Backend) {
    let (t, keys) = unknown_on(b, 12).await;
    // A second server: its own pool over the same database.
    let other = Ledger::new(t.db.store(4).await, t.clock.clone(), test_limits());
    let ask = |ledger: Ledger| async move {
        reconcile(
            &ledger,
            ReconcileInput {
                limit: 8,
                ..Default::default()
            },
        )
        .await
    };
    let (a, b2) = tokio::join!(ask(t.ledger.clone()), ask(other.clone()));
    let mut all: Vec<String> = a.iter().chain(b2.iter()).cloned().collect();
    all.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(all, want, "every entry handed out once: {a:?} / {b2:?}");
    assert!(
        reconcile(&other, ReconcileInput::default())
            .await
            .is_empty(),
        "all held"
    );
    t.clock.advance(Duration::from_secs(61));
    assert_eq!(
        reconcile(&other, ReconcileInput::default()).await.len(),
        12,
        "hold passed"
    );
}

async fn reconcile_with_keys_hands_out_only_those_keys_when_unresolved_and_not_held(b: Backend) {
    let t = TestLedger::new(b).await;
    let long = leased("live", Duration::from_secs(3600));
    let live = claim_ok(&t.ledger, long).await;
    let live_key = live.entry.entry.key.to_string();
    let ok = claim(&t.ledger, "ok", TOOL, ARGS).await;
    let ok_key = ok.entry.entry.key.to_string();
    succeed(&t.ledger, &ok, b"r").await;
    let unknown = unknown_entries(&t, TOOL, 3).await;
    let ticket = unknown_entries(&t, "open_ticket", 1).await;
    let with_keys = |keys: &[&String]| ReconcileInput {
        keys: keys.iter().map(calls::key).collect(),
        ..Default::default()
    };

    // Only the named unknown entry: not the live attempt, the success or an absent key, and
    // no other unknown entry although the limit would allow them.
    let absent = "f".repeat(64);
    assert_eq!(
        reconcile(
            &t.ledger,
            with_keys(&[&unknown[1], &live_key, &ok_key, &absent, &unknown[1]])
        )
        .await,
        vec![unknown[1].clone()]
    );
    // Held now: not again, by keys or by a general pick; the other named key is free.
    assert!(
        reconcile(&t.ledger, with_keys(&[&unknown[1]]))
            .await
            .is_empty()
    );
    assert_eq!(
        reconcile(&t.ledger, with_keys(&[&unknown[0], &unknown[1]])).await,
        vec![unknown[0].clone()]
    );
    // A tool filter still applies to the named keys.
    assert!(
        reconcile(
            &t.ledger,
            ReconcileInput {
                tool: Some(tool("open_ticket")),
                ..with_keys(&[&unknown[2]])
            }
        )
        .await
        .is_empty()
    );
    assert_eq!(
        reconcile(&t.ledger, ReconcileInput::default()).await,
        vec![unknown[2].clone(), ticket[0].clone()],
        "the general pick skips the entries held by keys"
    );
    t.clock.advance(Duration::from_secs(61)); // past the reconcile hold
    assert_eq!(
        reconcile(&t.ledger, with_keys(&[&unknown[1]])).await,
        vec![unknown[1].clone()]
    );

    // More keys than one call may take are refused and hold nothing. (A malformed key is no
    // Key: gRPC refuses it where the request arrives, see
    // `grpc_api::fields_parsed_where_a_request_arrives_are_refused_and_store_nothing`.)
    let too_many = vec![calls::key("k"); Limits::default().reconcile_max_limit as usize + 1];
    let refused = reconcile_result(
        &t.ledger,
        ReconcileInput {
            keys: too_many,
            ..Default::default()
        },
    )
    .await;
    assert_matches!(
        refused,
        Err(LedgerError::InvalidArgument { field: "keys", .. })
    );
    assert_eq!(
        reconcile(&t.ledger, with_keys(&[&unknown[0]])).await,
        vec![unknown[0].clone()],
        "a refused call held nothing"
    );
}

async fn a_resolution_records_its_principal_as_resolved_by_until_a_new_attempt(b: Backend) {
    let (t, keys) = unknown_on(b, 2).await;
    let by = |principal: &str, findings| ReconcileInput {
        resolutions: findings,
        principal: calls::principal(principal),
        resolve_only: true,
        ..Default::default()
    };
    let findings = fenced(
        &t,
        vec![
            finding(&keys[0], FinalStatus::Succeeded, b"found", false),
            finding(&keys[1], FinalStatus::Failed, b"", true),
        ],
    )
    .await;
    let out = reconcile_ok(&t.ledger, by("reconciler@host-1", findings)).await;
    let resolved_by: Vec<&str> = out
        .resolved
        .iter()
        .map(|v| v.entry.resolved_by.as_str())
        .collect();
    assert_eq!(resolved_by, ["reconciler@host-1"; 2]);
    let found = lookup_found(&t.ledger, &keys[0]).await;
    assert_eq!(found.entry.resolved_by, "reconciler@host-1");
    let listed = list_ok(
        &t.ledger,
        ListInput {
            run_id: Some(run_id("run-0")),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(listed.entries[0].entry.resolved_by, "reconciler@host-1");

    // A resolution of an entry already resolved changes nothing, its resolver included.
    let late = fenced(&t, vec![finding(&keys[0], FinalStatus::Failed, b"", true)]).await;
    reconcile_ok(&t.ledger, by("someone-else", late)).await;
    assert_eq!(lookup_found(&t.ledger, &keys[0]).await, found);

    // The retryable failure's next attempt is the claimant's again: no resolver, and its own
    // Complete records none.
    let again = claim(&t.ledger, "run-1", TOOL, ARGS).await;
    assert_eq!(again.entry.entry.attempt, 2);
    assert_eq!(again.entry.entry.resolved_by, "");
    complete_ok(
        &t.ledger,
        done(&keys[1], &token(&again), FinalStatus::Succeeded, b"done"),
    )
    .await;
    let completed = lookup_found(&t.ledger, &keys[1]).await;
    assert_eq!(
        (completed.status, completed.entry.resolved_by.as_str()),
        (Status::Succeeded, "")
    );

    // A malformed principal is no Principal: gRPC refuses it where the request arrives, before
    // anything is applied (see
    // `grpc_api::fields_parsed_where_a_request_arrives_are_refused_and_store_nothing`).
}

async fn a_found_resolution_makes_the_next_claim_replay_it(b: Backend) {
    let (t, keys) = unknown_on(b, 1).await;
    let out = resolve(
        &t,
        vec![finding(
            &keys[0],
            FinalStatus::Succeeded,
            b"found-by-ref",
            false,
        )],
    )
    .await;
    assert_eq!(out, vec![(keys[0].clone(), Status::Succeeded)]);
    let replay = claim(&t.ledger, "run-0", TOOL, ARGS).await;
    assert_eq!(replay.outcome, Outcome::Replayed);
    assert_eq!(replay.entry.entry.result, b"found-by-ref");
    assert!(replay.entry.entry.expires_at.is_some());
    assert!(
        reconcile(&t.ledger, ReconcileInput::default())
            .await
            .is_empty()
    );
}

async fn a_not_found_retryable_resolution_makes_the_next_claim_attempt_two(b: Backend) {
    let (t, keys) = unknown_on(b, 2).await;
    resolve(
        &t,
        vec![
            finding(&keys[0], FinalStatus::Failed, b"", true),
            finding(&keys[1], FinalStatus::Failed, b"", false),
        ],
    )
    .await;
    let again = claim(&t.ledger, "run-0", TOOL, ARGS).await;
    assert_eq!(again.outcome, Outcome::Claimed);
    assert_eq!(again.entry.entry.attempt, 2);
    let permanent = claim(&t.ledger, "run-1", TOOL, ARGS).await;
    assert_eq!(permanent.outcome, Outcome::PreviouslyFailed);
    assert_eq!(permanent.entry.entry.error, "not found");
}

async fn resolving_a_resolved_or_live_entry_changes_nothing(b: Backend) {
    let (t, keys) = unknown_on(b, 1).await;
    resolve(
        &t,
        vec![finding(&keys[0], FinalStatus::Succeeded, b"first", false)],
    )
    .await;
    let before = lookup_found(&t.ledger, &keys[0]).await;
    let live = claim(&t.ledger, "live", TOOL, ARGS).await;
    let live_key = live.entry.entry.key.to_string();
    let out = resolve(
        &t,
        vec![
            finding(&keys[0], FinalStatus::Failed, b"", true),
            finding(&live_key, FinalStatus::Succeeded, b"guess", false),
            finding("f".repeat(64), FinalStatus::Succeeded, b"nobody", false),
        ],
    )
    .await;
    assert_eq!(
        out,
        vec![
            (keys[0].clone(), Status::Succeeded),
            (live_key.clone(), Status::Attempting)
        ],
        "an absent key is left out"
    );
    assert_eq!(lookup_found(&t.ledger, &keys[0]).await, before);
    assert_eq!(
        lookup_found(&t.ledger, &live_key).await.entry,
        live.entry.entry
    );
}

async fn the_claimants_late_complete_wins_over_a_later_resolution(b: Backend) {
    let (t, first) = claimed_with(b, leased(RUN, Duration::from_secs(1))).await;
    let key = first.entry.entry.key.to_string();
    t.clock.advance(Duration::from_secs(5));
    assert_eq!(
        reconcile(&t.ledger, ReconcileInput::default()).await,
        vec![key.clone()]
    );
    // The claimant answers late, before the reconciler: its outcome stands.
    succeed(&t.ledger, &first, b"claimant").await;
    let out = resolve(&t, vec![finding(&key, FinalStatus::Failed, b"", true)]).await;
    assert_eq!(out, vec![(key.clone(), Status::Succeeded)]);
    assert_eq!(
        claim_the_intent(&t.ledger).await.entry.entry.result,
        b"claimant"
    );
}

async fn malformed_resolutions_are_refused_and_none_is_applied(b: Backend) {
    let (t, keys) = unknown_on(b, 2).await;
    let bad_sets = vec![
        vec![
            finding(&keys[0], FinalStatus::Succeeded, b"ok", false),
            finding(&keys[1], FinalStatus::Unknown, b"", false),
        ],
        vec![
            finding(&keys[0], FinalStatus::Succeeded, b"ok", false),
            finding(
                &keys[1],
                FinalStatus::Failed,
                b"result with a failure",
                false,
            ),
        ],
    ];
    // A finding with a malformed key is no ResolutionInput: gRPC refuses it where the request
    // arrives (see
    // `grpc_api::fields_parsed_where_a_request_arrives_are_refused_and_store_nothing`).
    for findings in bad_sets {
        let findings = fenced(&t, findings).await;
        let refused = reconcile_result(
            &t.ledger,
            ReconcileInput {
                resolutions: findings,
                ..Default::default()
            },
        )
        .await;
        assert_matches!(
            refused,
            Err(LedgerError::InvalidArgument {
                field: "resolutions",
                ..
            })
        );
    }
    for key in &keys {
        assert_eq!(lookup_found(&t.ledger, key).await.status, Status::Unknown);
    }
}

async fn pruning_removes_expired_finished_entries_and_keeps_unresolved_ones(b: Backend) {
    let t = TestLedger::new(b).await;
    let mut finished = Vec::new();
    for i in 0..5 {
        let input = retained(&format!("done-{i}"), Duration::from_secs(60));
        let out = claim_ok(&t.ledger, input).await;
        succeed(&t.ledger, &out, b"r").await;
        finished.push(out.entry.entry.key.to_string());
    }
    let kept_longer = retained("kept", Duration::from_secs(3600));
    let kept = claim_ok(&t.ledger, kept_longer).await;
    succeed(&t.ledger, &kept, b"r").await;
    let unresolved = unknown_entries(&t, TOOL, 2).await;
    let attempting = claim(&t.ledger, "attempting", TOOL, ARGS).await;

    assert_eq!(
        t.ledger.prune(2).await.expect("prune"),
        0,
        "nothing expired yet"
    );
    t.clock.advance(Duration::from_secs(61));
    // Batches of two: three statements delete the five, a fourth finds none.
    assert_eq!(t.ledger.prune(2).await.expect("prune"), 5);
    let store = t.ledger.store();
    for key in &finished {
        assert!(
            store
                .get(&tenant(), &Key::from_stored(key.clone()))
                .await
                .expect("get")
                .is_none(),
            "{key} pruned"
        );
    }
    assert!(
        store
            .get(&tenant(), &kept.entry.entry.key)
            .await
            .expect("get")
            .is_some()
    );
    t.clock.advance(Duration::from_secs(10 * 365 * 86_400));
    assert_eq!(
        t.ledger.prune(100).await.expect("prune"),
        1,
        "the longer retention ends too"
    );
    let unresolved = unresolved.iter().map(|k| Key::from_stored(k.clone()));
    for key in unresolved.chain([attempting.entry.entry.key.clone()]) {
        assert!(
            store.get(&tenant(), &key).await.expect("get").is_some(),
            "unresolved stay"
        );
    }
    // A pruned key is a new claim.
    let again = claim(&t.ledger, "done-0", TOOL, ARGS).await;
    assert_eq!(again.outcome, Outcome::Claimed);
    assert_eq!(again.entry.entry.attempt, 1);
}

async fn the_holder_renews_its_lease_and_a_duplicate_stays_in_progress(b: Backend) {
    let (t, first) = claimed_with(b, leased(RUN, Duration::from_secs(10))).await;
    let key = first.entry.entry.key.to_string();
    t.clock.advance(Duration::from_secs(8));
    let renewed = renew_ok(
        &t.ledger,
        renewal(&key, &token(&first), Some(Duration::from_secs(10))),
    )
    .await;
    let now = idempotency_ledger::domain::time::Clock::now(&*t.clock);
    assert_eq!(
        renewed.entry.lease_expires_at,
        now.plus(idempotency_ledger::domain::Micros::from_duration(
            Duration::from_secs(10)
        )),
        "the new lease counts from now"
    );
    assert_eq!(renewed.status, Status::Attempting);
    assert_eq!(renewed.entry.claim_token, first.entry.entry.claim_token);
    assert_eq!(renewed.entry.attempt, 1);
    // Past the first lease, inside the renewed one: still someone's attempt, not unknown.
    t.clock.advance(Duration::from_secs(5));
    let duplicate = claim_the_intent(&t.ledger).await;
    assert_eq!(duplicate.outcome, Outcome::InProgress);
    assert_eq!(duplicate.entry.status, Status::Attempting);
    assert_eq!(
        reconcile(&t.ledger, ReconcileInput::default()).await,
        Vec::<String>::new(),
        "a renewed attempt is nobody's to reconcile"
    );
    // The holder completes as usual, and the renewal left nothing else behind.
    succeed(&t.ledger, &first, b"ok").await;
    assert_eq!(claim_the_intent(&t.ledger).await.outcome, Outcome::Replayed);
}

async fn renewing_with_a_stale_token_or_after_the_lease_ended_changes_nothing(b: Backend) {
    let t = TestLedger::new(b).await;
    let renew = |key: &str, token: &str| {
        let (ledger, key, token) = (t.ledger.clone(), key.to_string(), token.to_string());
        async move { renew_result(&ledger, renewal(&key, &token, None)).await }
    };
    // A wrong token, on an attempt in its lease.
    let live = claim(&t.ledger, "live", TOOL, ARGS).await;
    let live_key = live.entry.entry.key.to_string();
    assert_matches!(
        renew(&live_key, "not-the-token").await,
        Err(LedgerError::StaleClaimToken)
    );
    // A lease above the server's maximum is refused before anything is read.
    let too_long = renew_result(
        &t.ledger,
        renewal(&live_key, &token(&live), Some(Duration::from_secs(7200))),
    )
    .await;
    assert_matches!(
        too_long,
        Err(LedgerError::InvalidArgument { field: "lease", .. })
    );
    assert_eq!(
        lookup_found(&t.ledger, &live_key).await.entry,
        live.entry.entry,
        "refused renewals changed nothing"
    );

    // Resolved: the lease is over for good.
    let resolved = claim(&t.ledger, "resolved", TOOL, ARGS).await;
    let resolved_key = resolved.entry.entry.key.to_string();
    succeed(&t.ledger, &resolved, b"r").await;
    assert_matches!(
        renew(&resolved_key, &token(&resolved)).await,
        Err(LedgerError::LeaseEnded("SUCCEEDED"))
    );

    // Reported UNKNOWN by its claimant: a reconciler may be asking the world already.
    let reported = claim(&t.ledger, "reported", TOOL, ARGS).await;
    let reported_key = reported.entry.entry.key.to_string();
    complete_ok(&t.ledger, unknown_report(&reported, "timeout")).await;
    assert_matches!(
        renew(&reported_key, &token(&reported)).await,
        Err(LedgerError::LeaseEnded("UNKNOWN"))
    );

    // Past its lease: it reads UNKNOWN, and renewing cannot bring it back.
    let lapsed = claim(&t.ledger, "lapsed", TOOL, ARGS).await;
    let lapsed_key = lapsed.entry.entry.key.to_string();
    t.clock.advance(Duration::from_secs(61));
    let before = lookup_found(&t.ledger, &lapsed_key).await;
    assert_eq!(before.status, Status::Unknown);
    assert_matches!(
        renew(&lapsed_key, &token(&lapsed)).await,
        Err(LedgerError::LeaseEnded("UNKNOWN"))
    );
    assert_eq!(lookup_found(&t.ledger, &lapsed_key).await, before);

    // An earlier attempt's token, after a retryable failure and a new claim.
    let retried = claim(&t.ledger, "retried", TOOL, ARGS).await;
    let retried_key = retried.entry.entry.key.to_string();
    fail(&t.ledger, &retried, "declined", true).await;
    let second = claim(&t.ledger, "retried", TOOL, ARGS).await;
    assert_eq!(second.entry.entry.attempt, 2);
    assert_matches!(
        renew(&retried_key, &token(&retried)).await,
        Err(LedgerError::StaleClaimToken)
    );
    renew(&retried_key, &token(&second))
        .await
        .expect("the current holder renews");

    // No such key (or another tenant's, which reads the same).
    assert_matches!(
        renew(&"a".repeat(64), "token").await,
        Err(LedgerError::NotFound)
    );
    let other = Tenant::parse("other").expect("tenant");
    assert_matches!(
        t.ledger
            .renew_lease(&other, renewal(&retried_key, &token(&second), None))
            .await,
        Err(LedgerError::NotFound)
    );
}

async fn resolve_only_applies_the_resolutions_and_hands_out_nothing(b: Backend) {
    let (t, keys) = unknown_on(b, 3).await;
    let findings = fenced(
        &t,
        vec![finding(&keys[0], FinalStatus::Succeeded, b"found", false)],
    )
    .await;
    let out = reconcile_ok(
        &t.ledger,
        ReconcileInput {
            resolutions: findings,
            resolve_only: true,
            ..Default::default()
        },
    )
    .await;
    assert!(out.pending.is_empty(), "{:?}", out.pending);
    assert_eq!(out.resolved.len(), 1);
    assert_eq!(out.resolved[0].status, Status::Succeeded);
    // Nothing was held: the next reconciler gets the other two at once.
    assert_eq!(
        reconcile(&t.ledger, ReconcileInput::default()).await,
        keys[1..].to_vec()
    );
}

// ---------------------------------------------------------------------------------------------
// The replay memory: finished entries a server remembers to answer repeats without the store
// (`--replay-memory-bytes`), their counts written in batches.

async fn replays_answered_from_memory_reach_the_store_and_another_server_in_one_write(b: Backend) {
    let t = TestLedger::new(b).await;
    let other = other_server(&t).await;
    let key = succeeded_entry(&t.ledger, RUN, b"cr-1").await;
    for n in 1..=5 {
        let out = claim_the_intent(&t.ledger).await;
        assert_eq!(out.outcome, Outcome::Replayed);
        assert_eq!(out.entry.entry.replay_count, n);
    }
    // This server counts its own unwritten replays; the other reads the store, which has
    // none yet (the count may lag there until the write).
    assert_eq!(replay_count_on(&t.ledger, &key).await, 5);
    assert_eq!(replay_count_on(&other, &key).await, 0);
    assert_eq!(t.ledger.flush_replay_counts().await.expect("write"), 1);
    assert_eq!(replay_count_on(&other, &key).await, 5);
    assert_eq!(
        replay_count_on(&t.ledger, &key).await,
        5,
        "not counted twice"
    );
    assert_eq!(
        t.ledger.flush_replay_counts().await.expect("write"),
        0,
        "nothing left to write"
    );
    // Counting goes on from there, and the next write adds only what is new.
    let out = claim_the_intent(&t.ledger).await;
    assert_eq!(out.entry.entry.replay_count, 6);
    t.ledger.flush_replay_counts().await.expect("write");
    assert_eq!(replay_count_on(&other, &key).await, 6);
}

async fn a_replay_on_the_server_that_did_not_complete_reads_the_store_once_then_remembers(
    b: Backend,
) {
    let t = TestLedger::new(b).await;
    let other = other_server(&t).await;
    let key = succeeded_entry(&t.ledger, RUN, b"cr-1").await;
    // The other server never saw the entry: its first replay is the store's, counted there.
    let first = claim(&other, RUN, TOOL, ARGS).await;
    assert_eq!(
        (first.outcome, first.entry.entry.result.as_slice()),
        (Outcome::Replayed, &b"cr-1"[..])
    );
    assert_eq!(first.entry.entry.replay_count, 1);
    assert_eq!(replay_count_on(&t.ledger, &key).await, 1);
    // Its next replays come from its memory: not in the store until it writes them.
    for n in 2..=4 {
        let out = claim(&other, RUN, TOOL, ARGS).await;
        assert_eq!(out.outcome, Outcome::Replayed);
        assert_eq!(out.entry.entry.result, b"cr-1", "byte for byte");
        assert_eq!(out.entry.entry.replay_count, n);
    }
    assert_eq!(replay_count_on(&t.ledger, &key).await, 1);
    assert_eq!(replay_count_on(&other, &key).await, 4);
    other.flush_replay_counts().await.expect("write");
    assert_eq!(replay_count_on(&t.ledger, &key).await, 4);
    // Both servers' memories count into the one stored count.
    claim_the_intent(&t.ledger).await;
    claim(&other, RUN, TOOL, ARGS).await;
    t.ledger.flush_replay_counts().await.expect("write");
    other.flush_replay_counts().await.expect("write");
    let third = other_server(&t).await;
    assert_eq!(replay_count_on(&third, &key).await, 6);
}

async fn what_is_remembered_expires_on_the_ledgers_clock_and_a_reused_key_is_still_refused(
    b: Backend,
) {
    let t = TestLedger::new(b).await;
    let input = retained(RUN, Duration::from_secs(10));
    let first = claim_ok(&t.ledger, input.clone()).await;
    succeed(&t.ledger, &first, b"short").await;
    assert_eq!(claim_the_intent(&t.ledger).await.outcome, Outcome::Replayed);
    t.clock.advance(Duration::from_secs(10));
    let again = claim_ok(&t.ledger, input).await;
    assert_eq!(
        (again.outcome, again.entry.entry.attempt),
        (Outcome::Claimed, 1),
        "expired: a new claim, not a remembered replay"
    );

    // An explicit key with other arguments is refused, remembered or not; with its own
    // arguments it replays.
    let explicit = ClaimInput {
        key: claim_key("wf-1:step-1", RUN),
        ..claim_input(RUN, TOOL, ARGS)
    };
    let claimed = claim_ok(&t.ledger, explicit.clone()).await;
    complete_ok(
        &t.ledger,
        done(
            "wf-1:step-1",
            &token(&claimed),
            FinalStatus::Succeeded,
            b"x",
        ),
    )
    .await;
    let reused = ClaimInput {
        arguments_json: r#"{"customer":"c-42","amount":300,"currency":"EUR"}"#.into(),
        ..explicit.clone()
    };
    for _ in 0..2 {
        assert_matches!(
            claim_result(&t.ledger, reused.clone()).await,
            Err(LedgerError::KeyReused)
        );
    }
    assert_eq!(
        claim_ok(&t.ledger, explicit).await.outcome,
        Outcome::Replayed
    );
}

async fn a_retryable_failure_is_never_answered_from_memory_and_a_permanent_one_is(b: Backend) {
    let t = TestLedger::new(b).await;
    let other = other_server(&t).await;
    let first = claim_the_intent(&t.ledger).await;
    let key = first.entry.entry.key.to_string();
    fail(&t.ledger, &first, "busy", true).await;
    let second = claim_the_intent(&t.ledger).await;
    assert_eq!(
        (second.outcome, second.entry.entry.attempt),
        (Outcome::Claimed, 2)
    );
    // The other server claims the same key while attempt 2 runs: in progress, from the store.
    assert_eq!(
        claim(&other, RUN, TOOL, ARGS).await.outcome,
        Outcome::InProgress
    );
    complete_ok(
        &t.ledger,
        failed(&key, &token(&second), "card declined", false),
    )
    .await;
    for ledger in [&t.ledger, &other, &t.ledger, &other] {
        let out = claim(ledger, RUN, TOOL, ARGS).await;
        assert_eq!(out.outcome, Outcome::PreviouslyFailed);
        assert_eq!(out.entry.entry.error, "card declined");
        assert!(!out.note.is_empty());
    }
    t.ledger.flush_replay_counts().await.expect("write");
    other.flush_replay_counts().await.expect("write");
    assert_eq!(
        replay_count_on(&t.ledger, &key).await,
        0,
        "a failure is no replay"
    );
}

async fn with_the_memory_off_every_replay_is_counted_in_the_store_at_once(b: Backend) {
    let t = TestLedger::with_limits(
        b,
        Limits {
            replay_memory_bytes: 0,
            ..test_limits()
        },
    )
    .await;
    let other = other_server(&t).await;
    let key = succeeded_entry(&t.ledger, RUN, b"cr-1").await;
    for n in 1..=3 {
        assert_eq!(
            claim_the_intent(&t.ledger).await.entry.entry.replay_count,
            n
        );
    }
    assert_eq!(t.ledger.flush_replay_counts().await.expect("write"), 0);
    assert_eq!(replay_count_on(&other, &key).await, 3);
    assert_eq!(t.ledger.replay_memory_bytes(), 0);
}
