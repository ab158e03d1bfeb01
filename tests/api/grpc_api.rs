//! The gRPC API through a real tonic client against a server on a port-0 listener: each RPC end
//! to end, each error code with its `ErrorInfo` reason and `BadRequest` field, the limits, the
//! shared key vectors, bytes that must survive the wire, and server reflection.

use std::collections::BTreeMap;
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use prost::Message;
use sha2::{Digest, Sha256};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

use crate::support::postgres::{PgCluster, StopMode};
use crate::support::{
    Backend, TestApp, TestDb, claim_req, spawn_app, spawn_app_on, spawn_app_with, success,
};

on_every_backend!(
    claim_complete_replay_and_lookup_work_end_to_end,
    every_malformed_field_is_invalid_argument_naming_the_field_and_changes_nothing,
    fields_parsed_where_a_request_arrives_are_refused_and_store_nothing,
    a_reused_explicit_key_is_failed_precondition_key_reused_with_different_request,
    a_stale_or_wrong_token_is_failed_precondition_stale_claim_token,
    a_different_outcome_for_a_resolved_entry_is_failed_precondition_already_resolved,
    an_absent_key_is_not_found_for_lookup_and_complete,
    nul_characters_in_arguments_and_nul_bytes_in_results_replay_byte_for_byte,
    a_result_over_max_result_bytes_is_refused_and_the_entry_unchanged_but_one_at_the_limit_is_stored,
    arguments_over_the_size_or_depth_limit_are_refused_and_ones_at_the_limit_accepted,
    every_key_vector_gives_its_key_and_fingerprint_or_its_refusal_through_the_server,
    renew_lease_extends_the_holders_lease_and_refuses_others_with_their_reasons,
);

pub(crate) const RUN: &str = "run-1";
pub(crate) const TOOL: &str = "issue_credit";
/// `{"amount":200,"currency":"EUR"}` with its members reordered: the key vector
/// `compact_arguments` of `testdata/key-vectors.json`.
pub(crate) const ARGS: &str = r#"{"currency":"EUR","amount":200}"#;
/// The vector's key and fingerprint of (RUN, TOOL, ARGS).
const ARGS_KEY: &str = "cec41f2a99c2a656eb1b597e73c0dfb9505fb23a674e800d042087649611423a";
const ARGS_FINGERPRINT: &str = "5f63c80f125923646a6ec9a41ba61c72232921246b0701490806e91b62ce016f";
const REPLAY_NOTE: &str = "This action was already performed in this run; returning the earlier \
    result. No new action was taken.";

/// Checks a status's code, its `ErrorInfo` (domain and reason) and, for a bad field, that its
/// `BadRequest` names exactly that field (and that there is no `BadRequest` otherwise).
#[track_caller]
pub(crate) fn assert_error(status: &tonic::Status, code: Code, reason: &str, field: Option<&str>) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        !status.message().is_empty(),
        "a message for people: {status:?}"
    );
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.domain, "idempotency.v1", "{status:?}");
    assert_eq!(info.reason, reason, "{status:?}");
    match field {
        Some(field) => {
            let bad = status
                .get_details_bad_request()
                .unwrap_or_else(|| panic!("no BadRequest in {status:?}"));
            let fields: Vec<&str> = bad
                .field_violations
                .iter()
                .map(|v| v.field.as_str())
                .collect();
            assert_eq!(fields, [field], "{status:?}");
            assert!(
                !bad.field_violations[0].description.is_empty(),
                "{status:?}"
            );
        }
        None => assert!(
            status.get_details_bad_request().is_none(),
            "no BadRequest expected: {status:?}"
        ),
    }
}

/// The key docs/behaviour.md derives, computed here independently of the library.
pub(crate) fn expected_key(domain: &str, run: &str, tool: &str, canonical: &str) -> String {
    let mut h = Sha256::new();
    for part in [domain, run, tool] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    h.update(canonical.as_bytes());
    hex::encode(h.finalize())
}

fn micros(t: Option<prost_types::Timestamp>) -> i64 {
    let t = t.expect("timestamp is set");
    t.seconds * 1_000_000 + i64::from(t.nanos) / 1000
}

fn wall_clock_micros() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    i64::try_from(d.as_micros()).expect("fits")
}

pub(crate) fn key_req(key: &str) -> pb::LookupRequest {
    pb::LookupRequest {
        key: key.into(),
        ..Default::default()
    }
}

fn derive_req(run: &str, tool: &str, args: &str) -> pb::LookupRequest {
    pb::LookupRequest {
        run_id: run.into(),
        tool: tool.into(),
        arguments_json: args.into(),
        ..Default::default()
    }
}

pub(crate) async fn claim_ok(app: &TestApp, req: pb::ClaimRequest) -> pb::ClaimResponse {
    app.client
        .clone()
        .claim(req)
        .await
        .expect("claim")
        .into_inner()
}

/// Reports the attempt `claimed` holds as UNKNOWN (its call timed out), as a claimant does.
pub(crate) async fn report_unknown(app: &TestApp, key: &str, claimed: &pb::ClaimResponse) {
    app.client
        .clone()
        .complete(pb::CompleteRequest {
            key: key.into(),
            claim_token: claimed.claim_token.clone(),
            status: pb::Status::Unknown.into(),
            error: "timeout".into(),
            ..Default::default()
        })
        .await
        .expect("report unknown");
}

/// The entry Lookup returns, without the arguments kept for audit (which Claim and Complete
/// answers leave out), so it compares equal to theirs; the arguments must be there.
pub(crate) async fn lookup_entry(app: &TestApp, req: pb::LookupRequest) -> pb::Entry {
    let entry = app
        .client
        .clone()
        .lookup(req)
        .await
        .expect("lookup")
        .into_inner()
        .entry
        .expect("entry");
    without_arguments(entry)
}

/// `entry` with its audit arguments checked (canonical JSON of an object) and cleared.
pub(crate) fn without_arguments(entry: pb::Entry) -> pb::Entry {
    assert!(
        entry.arguments_json.starts_with('{')
            && serde_json::from_str::<serde_json::Value>(&entry.arguments_json).is_ok(),
        "Lookup shows the stored arguments: {:?}",
        entry.arguments_json
    );
    pb::Entry {
        arguments_json: String::new(),
        ..entry
    }
}

async fn claim_complete_replay_and_lookup_work_end_to_end(b: Backend) {
    let app = spawn_app(b).await;
    let mut client = app.client.clone();
    let before = wall_clock_micros();
    let mut req = claim_req(RUN, TOOL, ARGS);
    req.principal = "agent-7".into();
    let claimed = client.claim(req).await.expect("claim").into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    assert_eq!(claimed.claim_token.len(), 32, "{claimed:?}");
    assert!(
        claimed.claim_token.bytes().all(|c| c.is_ascii_hexdigit()),
        "{claimed:?}"
    );
    assert_eq!(claimed.note, "", "no note with CLAIMED");
    assert_eq!(claimed.retry_after, None);
    let entry = claimed.entry.clone().expect("entry");
    assert_eq!(entry.key, ARGS_KEY);
    assert_eq!(
        entry.key,
        expected_key("idem.v1", RUN, TOOL, r#"{"amount":200,"currency":"EUR"}"#)
    );
    assert_eq!(entry.fingerprint, ARGS_FINGERPRINT);
    assert_eq!(entry.run_id, RUN);
    assert_eq!(entry.tool, TOOL);
    assert_eq!(entry.principal, "agent-7");
    assert_eq!(entry.status(), pb::Status::Attempting);
    assert_eq!(entry.attempt, 1);
    assert!(entry.result.is_empty() && entry.error.is_empty() && !entry.retryable);
    assert_eq!(entry.replay_count, 0);
    assert_eq!(entry.external_ref, format!("idem-{}", &ARGS_KEY[..16]));
    let started = micros(entry.started_at);
    assert!(
        (before - 10_000_000..=wall_clock_micros() + 10_000_000).contains(&started),
        "started_at {started} is now"
    );
    assert_eq!(
        micros(entry.lease_expires_at) - started,
        60_000_000,
        "the default lease is 60 s"
    );
    assert_eq!(entry.finished_at, None);
    assert_eq!(entry.expires_at, None, "an unresolved entry never expires");

    let result = br#"{"credit_id":"cr-1"}"#;
    let completed = client
        .complete(success(ARGS_KEY, &claimed.claim_token, result))
        .await
        .expect("complete")
        .into_inner();
    assert!(!completed.already_completed);
    let done = completed.entry.expect("entry");
    assert_eq!(done.status(), pb::Status::Succeeded);
    assert_eq!(done.result, &result[..]);
    assert_eq!(done.attempt, 1);
    let finished = micros(done.finished_at);
    assert!(finished >= started);
    assert_eq!(
        micros(done.expires_at) - finished,
        86_400_000_000,
        "the default retention is 24 h"
    );
    assert_eq!(done.started_at, entry.started_at);

    // A retried Complete is a success that changes nothing.
    let repeated = client
        .complete(success(ARGS_KEY, &claimed.claim_token, result))
        .await
        .expect("repeat complete")
        .into_inner();
    assert!(repeated.already_completed);
    assert_eq!(repeated.entry.as_ref(), Some(&done));

    // The same intent, spelled differently.
    let again = client
        .claim(claim_req(
            RUN,
            TOOL,
            "{ \"amount\": 2e2,\n \"currency\": \"EUR\" }",
        ))
        .await
        .expect("claim again")
        .into_inner();
    assert_eq!(again.outcome(), pb::Outcome::Replayed);
    assert_eq!(again.note, REPLAY_NOTE);
    assert_eq!(again.claim_token, "", "no token with REPLAYED");
    let replayed = again.entry.expect("entry");
    assert_eq!(
        replayed.result,
        &result[..],
        "the stored result, byte for byte"
    );
    assert_eq!(replayed.replay_count, 1);
    assert_eq!(
        replayed,
        pb::Entry {
            replay_count: 1,
            ..done.clone()
        }
    );

    let by_key = lookup_entry(&app, key_req(ARGS_KEY)).await;
    assert_eq!(by_key, replayed);
    let by_derivation = lookup_entry(
        &app,
        derive_req(RUN, TOOL, r#"{"amount":200.0,"currency":"EUR"}"#),
    )
    .await;
    assert_eq!(by_derivation, replayed);
    // Lookup is read-only: no replay was counted.
    assert_eq!(lookup_entry(&app, key_req(ARGS_KEY)).await.replay_count, 1);
}

async fn every_malformed_field_is_invalid_argument_naming_the_field_and_changes_nothing(
    b: Backend,
) {
    let app = spawn_app(b).await;
    let mut client = app.client.clone();
    let secs = |seconds: i64| Some(prost_types::Duration { seconds, nanos: 0 });
    let base = || claim_req(RUN, TOOL, ARGS);
    let cases: Vec<(&str, pb::ClaimRequest, &str, &str)> = vec![
        (
            "duplicate member",
            claim_req(RUN, TOOL, r#"{"amount":200,"amount":300}"#),
            "DUPLICATE_MEMBER",
            "arguments_json",
        ),
        (
            "not JSON",
            claim_req(RUN, TOOL, "{amount:200}"),
            "INVALID_JSON",
            "arguments_json",
        ),
        (
            "no arguments",
            claim_req(RUN, TOOL, ""),
            "INVALID_JSON",
            "arguments_json",
        ),
        (
            "empty tool",
            claim_req(RUN, "", ARGS),
            "INVALID_FIELD",
            "tool",
        ),
        (
            "control character in tool",
            claim_req(RUN, "issue\ncredit", ARGS),
            "INVALID_FIELD",
            "tool",
        ),
        (
            "empty run",
            claim_req("", TOOL, ARGS),
            "INVALID_FIELD",
            "run_id",
        ),
        (
            "run over 256 bytes",
            claim_req(&"r".repeat(257), TOOL, ARGS),
            "INVALID_FIELD",
            "run_id",
        ),
        (
            "explicit key with a space",
            pb::ClaimRequest {
                key: "wf 1".into(),
                ..base()
            },
            "INVALID_FIELD",
            "key",
        ),
        (
            "unknown canonicalization",
            pb::ClaimRequest {
                canonicalization: 7,
                ..base()
            },
            "INVALID_FIELD",
            "canonicalization",
        ),
        (
            "negative lease",
            pb::ClaimRequest {
                lease: secs(-1),
                ..base()
            },
            "INVALID_FIELD",
            "lease",
        ),
        (
            "zero lease",
            pb::ClaimRequest {
                lease: secs(0),
                ..base()
            },
            "INVALID_FIELD",
            "lease",
        ),
        (
            "lease over 1 h",
            pb::ClaimRequest {
                lease: secs(3601),
                ..base()
            },
            "INVALID_FIELD",
            "lease",
        ),
        (
            "retention over 30 days",
            pb::ClaimRequest {
                retention: secs(30 * 86_400 + 1),
                ..base()
            },
            "INVALID_FIELD",
            "retention",
        ),
        (
            "negative wait",
            pb::ClaimRequest {
                wait: secs(-5),
                ..base()
            },
            "INVALID_FIELD",
            "wait",
        ),
    ];
    for (what, req, reason, field) in cases {
        let err = client.claim(req).await.expect_err(what);
        assert_eq!(err.code(), Code::InvalidArgument, "{what}: {err:?}");
        assert_error(&err, Code::InvalidArgument, reason, Some(field));
    }
    // None of them wrote anything, although most carried valid arguments.
    let absent = client
        .lookup(key_req(ARGS_KEY))
        .await
        .expect_err("nothing stored");
    assert_error(&absent, Code::NotFound, "ENTRY_NOT_FOUND", None);

    let lookups: Vec<(&str, pb::LookupRequest, &str, &str)> = vec![
        (
            "unknown canonicalization",
            pb::LookupRequest {
                canonicalization: 7,
                ..derive_req(RUN, TOOL, ARGS)
            },
            "INVALID_FIELD",
            "canonicalization",
        ),
        (
            "nothing to look up",
            pb::LookupRequest::default(),
            "INVALID_FIELD",
            "key",
        ),
        (
            "key and derivation together",
            pb::LookupRequest {
                key: ARGS_KEY.into(),
                ..derive_req(RUN, TOOL, ARGS)
            },
            "INVALID_FIELD",
            "key",
        ),
        (
            "duplicate member",
            derive_req(RUN, TOOL, r#"{"a":1,"a":1}"#),
            "DUPLICATE_MEMBER",
            "arguments_json",
        ),
    ];
    for (what, req, reason, field) in lookups {
        let err = client.lookup(req).await.expect_err(what);
        assert_error(&err, Code::InvalidArgument, reason, Some(field));
    }

    // Complete: a status that is not an outcome, and fields that do not go with the status.
    let claimed = claim_ok(&app, base()).await;
    let token = claimed.claim_token.clone();
    let stored = claimed.entry.expect("entry");
    let completes: Vec<(&str, pb::CompleteRequest, &str)> = vec![
        (
            "STATUS_ATTEMPTING",
            pb::CompleteRequest {
                status: pb::Status::Attempting.into(),
                ..success(ARGS_KEY, &token, b"")
            },
            "status",
        ),
        (
            "STATUS_UNSPECIFIED",
            pb::CompleteRequest {
                status: pb::Status::Unspecified.into(),
                ..success(ARGS_KEY, &token, b"")
            },
            "status",
        ),
        (
            "an unknown status number",
            pb::CompleteRequest {
                status: 9,
                ..success(ARGS_KEY, &token, b"")
            },
            "status",
        ),
        (
            "a result with STATUS_FAILED",
            pb::CompleteRequest {
                status: pb::Status::Failed.into(),
                ..success(ARGS_KEY, &token, b"r")
            },
            "result",
        ),
        (
            "retryable with STATUS_SUCCEEDED",
            pb::CompleteRequest {
                retryable: true,
                ..success(ARGS_KEY, &token, b"r")
            },
            "retryable",
        ),
        ("no claim token", success(ARGS_KEY, "", b"r"), "claim_token"),
        ("no key", success("", &token, b"r"), "key"),
    ];
    for (what, req, field) in completes {
        let err = client.complete(req).await.expect_err(what);
        assert_error(&err, Code::InvalidArgument, "INVALID_FIELD", Some(field));
    }
    assert_eq!(
        lookup_entry(&app, key_req(ARGS_KEY)).await,
        stored,
        "bad input never changes an entry"
    );
}

/// The refusals of the fields gRPC parses where a request arrives (tool, run_id, key,
/// principal, claim and hold tokens, which of Lookup's two forms a request means): the use cases
/// take them parsed, so these cases moved here from the conformance suite (`conformance`'s
/// `bad_input_is_refused_and_stores_nothing`, `a_stale_or_wrong_token_cannot_complete`,
/// `lookup_by_key_and_by_derivation_agree_and_change_nothing`,
/// `reconcile_with_keys_hands_out_only_those_keys_when_unresolved_and_not_held` and
/// `malformed_resolutions_are_refused_and_none_is_applied`,
/// `a_resolution_records_its_principal_as_resolved_by_until_a_new_attempt`; `approvals`'
/// `an_approval_binds_to_the_arguments_the_person_was_shown` and
/// `extend_run_keeps_a_runs_finished_entries`), each with its field and reason, and that
/// nothing was stored or changed.
async fn fields_parsed_where_a_request_arrives_are_refused_and_store_nothing(b: Backend) {
    let app = spawn_app(b).await;
    let mut client = app.client.clone();
    let explicit = |key: &str| pb::ClaimRequest {
        key: key.into(),
        ..claim_req("", TOOL, ARGS)
    };
    let claims: Vec<(&str, pb::ClaimRequest, &str)> = vec![
        ("empty tool", claim_req(RUN, "", ARGS), "tool"),
        ("control in tool", claim_req(RUN, "bad\ntool", ARGS), "tool"),
        ("no run and no key", claim_req("", TOOL, ARGS), "run_id"),
        (
            "run over 256 bytes",
            claim_req(&"r".repeat(257), TOOL, ARGS),
            "run_id",
        ),
        ("key with a space", explicit("has space"), "key"),
        ("key over 255 bytes", explicit(&"k".repeat(256)), "key"),
        (
            "control in principal",
            pb::ClaimRequest {
                principal: "a\u{7}b".into(),
                ..claim_req(RUN, TOOL, ARGS)
            },
            "principal",
        ),
    ];
    for (what, req, field) in claims {
        let err = client.claim(req).await.expect_err(what);
        assert_error(&err, Code::InvalidArgument, "INVALID_FIELD", Some(field));
    }
    // Nothing was stored: the valid request still claims first.
    let claimed = claim_ok(&app, claim_req(RUN, TOOL, ARGS)).await;
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let stored = claimed.entry.clone().expect("entry");

    // Complete without a token; Lookup with both forms or neither.
    let empty_token = client
        .complete(success(ARGS_KEY, "", b"x"))
        .await
        .expect_err("no token");
    assert_error(
        &empty_token,
        Code::InvalidArgument,
        "INVALID_FIELD",
        Some("claim_token"),
    );
    let both = pb::LookupRequest {
        key: ARGS_KEY.into(),
        run_id: RUN.into(),
        ..Default::default()
    };
    for (what, req) in [("both", both), ("neither", pb::LookupRequest::default())] {
        let err = client.lookup(req).await.expect_err(what);
        assert_error(&err, Code::InvalidArgument, "INVALID_FIELD", Some("key"));
    }
    assert_eq!(
        lookup_entry(&app, key_req(ARGS_KEY)).await,
        stored,
        "a refused call changes nothing"
    );

    // Decide about a malformed key; ExtendRun of no run.
    let decide = pb::DecideRequest {
        key: "bad key".into(),
        fingerprint: stored.fingerprint.clone(),
        decision: pb::Decision::Approve.into(),
        ..Default::default()
    };
    let err = client.decide(decide).await.expect_err("bad key");
    assert_error(&err, Code::InvalidArgument, "INVALID_FIELD", Some("key"));
    let err = client
        .extend_run(pb::ExtendRunRequest::default())
        .await
        .expect_err("no run");
    assert_error(&err, Code::InvalidArgument, "INVALID_FIELD", Some("run_id"));

    // Reconcile: malformed keys, and a malformed finding beside a good one, hold and apply
    // nothing.
    report_unknown(&app, ARGS_KEY, &claimed).await;
    for keys in [vec!["bad key".to_string()], vec![String::new()]] {
        let err = client
            .reconcile(pb::ReconcileRequest {
                keys,
                ..Default::default()
            })
            .await
            .expect_err("malformed key");
        assert_error(&err, Code::InvalidArgument, "INVALID_FIELD", Some("keys"));
        assert!(err.message().contains("[0]: "), "{err:?}");
    }
    let handed = client
        .reconcile(pb::ReconcileRequest {
            keys: vec![ARGS_KEY.into()],
            ..Default::default()
        })
        .await
        .expect("reconcile")
        .into_inner()
        .pending;
    assert_eq!(handed.len(), 1, "a refused call held nothing: {handed:?}");
    let good = pb::Resolution {
        key: ARGS_KEY.into(),
        status: pb::Status::Succeeded.into(),
        result: b"found".to_vec().into(),
        attempt: handed[0].attempt,
        hold_token: handed[0].hold_token.clone(),
        ..Default::default()
    };
    let bad_key = pb::Resolution {
        key: "bad key".into(),
        ..good.clone()
    };
    let no_hold = pb::Resolution {
        hold_token: String::new(),
        ..good.clone()
    };
    for (what, bad, reason) in [
        ("bad key", bad_key, "INVALID_FIELD"),
        ("no hold token", no_hold, "UNFENCED_RESOLUTION"),
    ] {
        let err = client
            .reconcile(pb::ReconcileRequest {
                resolutions: vec![good.clone(), bad],
                resolve_only: true,
                ..Default::default()
            })
            .await
            .expect_err(what);
        assert_error(&err, Code::InvalidArgument, reason, Some("resolutions"));
        assert!(err.message().contains("[1]"), "{what}: {err:?}");
    }
    let bad_principal = client
        .reconcile(pb::ReconcileRequest {
            resolutions: vec![good.clone()],
            resolve_only: true,
            principal: "bad\u{7}principal".into(),
            ..Default::default()
        })
        .await
        .expect_err("bad principal");
    assert_error(
        &bad_principal,
        Code::InvalidArgument,
        "INVALID_FIELD",
        Some("principal"),
    );
    let after = lookup_entry(&app, key_req(ARGS_KEY)).await;
    assert_eq!(after.status(), pb::Status::Unknown, "none applied");
}

async fn a_reused_explicit_key_is_failed_precondition_key_reused_with_different_request(
    b: Backend,
) {
    let app = spawn_app(b).await;
    let mut client = app.client.clone();
    let explicit = |args: &str, tool: &str| pb::ClaimRequest {
        key: "wf-7:step-3".into(),
        ..claim_req("", tool, args)
    };
    let first = claim_ok(&app, explicit(ARGS, TOOL)).await;
    assert_eq!(first.outcome(), pb::Outcome::Claimed);
    let stored = first.entry.expect("entry");
    assert_eq!(stored.key, "wf-7:step-3");
    assert_eq!(stored.fingerprint, ARGS_FINGERPRINT);
    assert_eq!(stored.run_id, "");

    for (args, tool) in [
        (r#"{"amount":250,"currency":"EUR"}"#, TOOL),
        (ARGS, "refund"),
    ] {
        let err = client
            .claim(explicit(args, tool))
            .await
            .expect_err("a reused key");
        assert_error(
            &err,
            Code::FailedPrecondition,
            "KEY_REUSED_WITH_DIFFERENT_REQUEST",
            None,
        );
    }
    // The same request under that key is no reuse.
    let same = claim_ok(&app, explicit(r#"{"amount":200,"currency":"EUR"}"#, TOOL)).await;
    assert_eq!(same.outcome(), pb::Outcome::InProgress);
    assert_eq!(lookup_entry(&app, key_req("wf-7:step-3")).await, stored);
}

async fn a_stale_or_wrong_token_is_failed_precondition_stale_claim_token(b: Backend) {
    let app = spawn_app(b).await;
    let mut client = app.client.clone();
    let first = claim_ok(&app, claim_req(RUN, TOOL, ARGS)).await;
    let stored = first.entry.clone().expect("entry");

    let wrong = "0".repeat(32);
    let err = client
        .complete(success(ARGS_KEY, &wrong, b"x"))
        .await
        .expect_err("a wrong token");
    assert_error(&err, Code::FailedPrecondition, "STALE_CLAIM_TOKEN", None);
    assert_eq!(lookup_entry(&app, key_req(ARGS_KEY)).await, stored);

    // A retryable failure lets a new attempt claim; the first token is stale from then on.
    client
        .complete(pb::CompleteRequest {
            key: ARGS_KEY.into(),
            claim_token: first.claim_token.clone(),
            status: pb::Status::Failed.into(),
            error: "503 from the payment API".into(),
            retryable: true,
            ..Default::default()
        })
        .await
        .expect("retryable failure");
    let second = claim_ok(&app, claim_req(RUN, TOOL, ARGS)).await;
    assert_eq!(second.outcome(), pb::Outcome::Claimed);
    assert_eq!(second.entry.as_ref().map(|e| e.attempt), Some(2));
    let err = client
        .complete(success(ARGS_KEY, &first.claim_token, b"late"))
        .await
        .expect_err("the first attempt's token");
    assert_error(&err, Code::FailedPrecondition, "STALE_CLAIM_TOKEN", None);
    let now = lookup_entry(&app, key_req(ARGS_KEY)).await;
    assert_eq!(now.status(), pb::Status::Attempting);
    assert_eq!(now.attempt, 2);
    assert!(now.result.is_empty());
}

async fn a_different_outcome_for_a_resolved_entry_is_failed_precondition_already_resolved(
    b: Backend,
) {
    let app = spawn_app(b).await;
    let mut client = app.client.clone();
    let first = claim_ok(&app, claim_req(RUN, TOOL, ARGS)).await;
    let token = first.claim_token;
    let done = client
        .complete(success(ARGS_KEY, &token, b"first"))
        .await
        .expect("complete")
        .into_inner()
        .entry
        .expect("entry");
    let others = [
        success(ARGS_KEY, &token, b"second"),
        pb::CompleteRequest {
            status: pb::Status::Failed.into(),
            error: "it failed after all".into(),
            ..success(ARGS_KEY, &token, b"")
        },
        pb::CompleteRequest {
            status: pb::Status::Unknown.into(),
            ..success(ARGS_KEY, &token, b"")
        },
    ];
    for other in others {
        let err = client
            .complete(other)
            .await
            .expect_err("a different outcome");
        assert_error(&err, Code::FailedPrecondition, "ALREADY_RESOLVED", None);
    }
    assert_eq!(
        lookup_entry(&app, key_req(ARGS_KEY)).await,
        done,
        "nothing changed"
    );
}

async fn an_absent_key_is_not_found_for_lookup_and_complete(b: Backend) {
    let app = spawn_app(b).await;
    let mut client = app.client.clone();
    let err = client.lookup(key_req(ARGS_KEY)).await.expect_err("absent");
    assert_error(&err, Code::NotFound, "ENTRY_NOT_FOUND", None);
    let err = client
        .lookup(derive_req(RUN, TOOL, ARGS))
        .await
        .expect_err("absent");
    assert_error(&err, Code::NotFound, "ENTRY_NOT_FOUND", None);
    let err = client
        .lookup(key_req("wf-1:step-1"))
        .await
        .expect_err("absent");
    assert_error(&err, Code::NotFound, "ENTRY_NOT_FOUND", None);
    let err = client
        .complete(success(ARGS_KEY, &"a".repeat(32), b"r"))
        .await
        .expect_err("absent");
    assert_error(&err, Code::NotFound, "ENTRY_NOT_FOUND", None);
    // Completing an absent key does not create it.
    let err = client
        .lookup(key_req(ARGS_KEY))
        .await
        .expect_err("still absent");
    assert_error(&err, Code::NotFound, "ENTRY_NOT_FOUND", None);
}

/// A server over a database of its own PostgreSQL cluster, which the test may stop.
pub(crate) async fn spawn_app_on_own_cluster(
    configure: impl FnOnce(&mut idempotency_ledger::server::Settings),
) -> (PgCluster, TestApp) {
    let cluster = PgCluster::start();
    // TestDb has no constructor for a given URL; its public fields take one.
    let mut db = TestDb::new(Backend::Sqlite);
    db.backend = Backend::Postgres;
    db.url = cluster.create_database();
    let app = spawn_app_on(db, configure).await;
    (cluster, app)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_is_unavailable_with_retry_info() {
    let (cluster, app) = spawn_app_on_own_cluster(|_| {}).await;
    let client = app.client.clone();
    let claimed = claim_ok(&app, claim_req(RUN, TOOL, ARGS)).await;
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    tokio::task::block_in_place(|| cluster.stop(StopMode::Fast));

    // Each call waits for the pool's 2 s acquire timeout; they wait side by side.
    let started = std::time::Instant::now();
    let (mut c1, mut c2, mut c3) = (client.clone(), client.clone(), client.clone());
    let (claim, lookup, complete) = tokio::join!(
        c1.claim(claim_req(RUN, TOOL, r#"{"amount":1}"#)),
        c2.lookup(key_req(ARGS_KEY)),
        c3.complete(success(ARGS_KEY, &claimed.claim_token, b"r")),
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "answered within the pool's acquire timeout: {took:?}"
    );
    for (rpc, answer) in [
        ("claim", claim.map(|_| ())),
        ("lookup", lookup.map(|_| ())),
        ("complete", complete.map(|_| ())),
    ] {
        let err = answer.expect_err(rpc);
        assert_error(&err, Code::Unavailable, "STORE_UNAVAILABLE", None);
        let retry = err
            .get_details_retry_info()
            .unwrap_or_else(|| panic!("{rpc}: no RetryInfo in {err:?}"));
        let delay = retry.retry_delay.expect("a retry delay");
        assert!(
            delay > Duration::ZERO && delay <= Duration::from_secs(60),
            "{delay:?}"
        );
        assert!(
            !err.message().contains("127.0.0.1"),
            "no internal detail: {err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_deadline_passes_first_is_deadline_exceeded() {
    let (cluster, app) = spawn_app_on_own_cluster(|_| {}).await;
    tokio::task::block_in_place(|| cluster.stop(StopMode::Fast));
    // Pooled connections that were open when the database stopped fail at once
    // (UNAVAILABLE); once they are gone, a call waits for a new connection (the pool's 2 s
    // acquire timeout) and its 1 s deadline comes first. (The server answers 50 ms before the
    // deadline; a shorter deadline let the client's own timer win on a loaded machine.)
    let mut attempts = 0;
    let (err, took) = loop {
        attempts += 1;
        let mut req = tonic::Request::new(claim_req(RUN, TOOL, ARGS));
        req.set_timeout(Duration::from_secs(1));
        let started = std::time::Instant::now();
        let err = app
            .client
            .clone()
            .claim(req)
            .await
            .expect_err("the database is down and the deadline short");
        if err.code() == Code::Unavailable && attempts < 40 {
            continue;
        }
        break (err, started.elapsed());
    };
    // The pool would wait for its 2 s acquire timeout; the 1 s deadline comes first.
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    // The server's answer, not the client's timer: tonic's client only sends the deadline
    // (grpc-timeout) and does not enforce it, so the status has the ledger's ErrorInfo.
    let info = err
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo: not the server's answer? {err:?}"));
    assert_eq!(info.reason, "DEADLINE_EXCEEDED", "{err:?}");
    assert_eq!(info.domain, "idempotency.v1", "{err:?}");
    assert!(
        took < Duration::from_millis(1800),
        "answered at the deadline, took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_hands_out_unknown_entries_and_applies_resolutions_over_grpc() {
    let app = spawn_app(Backend::Sqlite).await;
    let mut client = app.client.clone();
    // Two attempts time out: their claimants report UNKNOWN.
    let mut keys = Vec::new();
    for n in 0..2 {
        let claimed = claim_ok(
            &app,
            claim_req(RUN, "issue_credit", &format!("{{\"n\":{n}}}")),
        )
        .await;
        let key = claimed.entry.as_ref().expect("entry").key.clone();
        report_unknown(&app, &key, &claimed).await;
        keys.push(key);
    }
    let first = client
        .reconcile(pb::ReconcileRequest {
            tool: "issue_credit".into(),
            ..Default::default()
        })
        .await
        .expect("reconcile")
        .into_inner();
    let handed: Vec<String> = first.pending.iter().map(|e| e.key.clone()).collect();
    assert_eq!(handed.len(), 2, "{handed:?}");
    // Each hand-out carries its attempt and a hold token to send back with the finding.
    let fence = |key: &str| {
        let e = first
            .pending
            .iter()
            .find(|e| e.key == key)
            .expect("handed out");
        assert_eq!(e.hold_token.len(), 32, "{e:?}");
        (e.attempt, e.hold_token.clone())
    };
    let (attempt_0, hold_0) = fence(&keys[0]);
    let (attempt_1, hold_1) = fence(&keys[1]);
    assert!(
        first
            .pending
            .iter()
            .all(|e| e.status() == pb::Status::Unknown)
    );
    assert!(
        first
            .pending
            .iter()
            .all(|e| e.external_ref.starts_with("idem-"))
    );
    // Held: a second reconciler gets nothing now.
    let second = client
        .reconcile(pb::ReconcileRequest::default())
        .await
        .expect("reconcile")
        .into_inner();
    assert!(second.pending.is_empty(), "{:?}", second.pending);
    // The worker's tool read found the first effect, and not the second.
    let answered = client
        .reconcile(pb::ReconcileRequest {
            resolutions: vec![
                pb::Resolution {
                    key: keys[0].clone(),
                    status: pb::Status::Succeeded.into(),
                    result: b"found".to_vec().into(),
                    attempt: attempt_0,
                    hold_token: hold_0.clone(),
                    ..Default::default()
                },
                pb::Resolution {
                    key: keys[1].clone(),
                    status: pb::Status::Failed.into(),
                    error: "no such credit".into(),
                    retryable: true,
                    attempt: attempt_1,
                    hold_token: hold_1,
                    ..Default::default()
                },
            ],
            ..Default::default()
        })
        .await
        .expect("resolve")
        .into_inner();
    let statuses: Vec<pb::Status> = answered.resolved.iter().map(|e| e.status()).collect();
    assert_eq!(statuses, vec![pb::Status::Succeeded, pb::Status::Failed]);
    // One result per resolution, in order; no hold token outside a hand-out.
    let results: Vec<(String, pb::ResolutionOutcome)> = answered
        .results
        .iter()
        .map(|r| (r.key.clone(), r.result()))
        .collect();
    assert_eq!(
        results,
        [
            (keys[0].clone(), pb::ResolutionOutcome::ResolutionApplied),
            (keys[1].clone(), pb::ResolutionOutcome::ResolutionApplied)
        ]
    );
    assert!(answered.resolved.iter().all(|e| e.hold_token.is_empty()));
    // Sent again: the attempt is resolved; said so per resolution, with the entry.
    let again = client
        .reconcile(pb::ReconcileRequest {
            resolutions: vec![pb::Resolution {
                key: keys[0].clone(),
                status: pb::Status::Failed.into(),
                error: "late".into(),
                attempt: attempt_0,
                hold_token: hold_0,
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect("resolve again")
        .into_inner();
    assert_eq!(
        again.results[0].result(),
        pb::ResolutionOutcome::ResolutionAlreadyResolved
    );
    assert_eq!(
        again.results[0].entry.as_ref().map(|e| e.status()),
        Some(pb::Status::Succeeded)
    );
    // A resolution without its fence (an old client's) is refused, with what to send.
    let unfenced = client
        .reconcile(pb::ReconcileRequest {
            resolutions: vec![pb::Resolution {
                key: keys[1].clone(),
                status: pb::Status::Succeeded.into(),
                result: b"x".to_vec().into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect_err("unfenced");
    assert_error(
        &unfenced,
        Code::InvalidArgument,
        "UNFENCED_RESOLUTION",
        Some("resolutions"),
    );
    assert!(unfenced.message().contains("hold_token"), "{unfenced:?}");
    let replay = claim_ok(&app, claim_req(RUN, "issue_credit", r#"{"n":0}"#)).await;
    assert_eq!(replay.outcome(), pb::Outcome::Replayed);
    assert_eq!(&replay.entry.as_ref().expect("entry").result[..], b"found");
    let retry = claim_ok(&app, claim_req(RUN, "issue_credit", r#"{"n":1}"#)).await;
    assert_eq!(retry.outcome(), pb::Outcome::Claimed);
    assert_eq!(retry.entry.as_ref().expect("entry").attempt, 2);
    // A resolution with STATUS_UNKNOWN is no finding: refused, nothing applied.
    let refused = client
        .reconcile(pb::ReconcileRequest {
            resolutions: vec![pb::Resolution {
                key: keys[1].clone(),
                status: pb::Status::Unknown.into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect_err("unknown is not a finding");
    assert_eq!(refused.code(), Code::InvalidArgument);

    // Settling one entry at once: `keys` hands out only it, and the resolution records the
    // principal as resolved_by, which Lookup shows.
    let mut more = Vec::new();
    for n in 2..4 {
        let claimed = claim_ok(
            &app,
            claim_req(RUN, "issue_credit", &format!("{{\"n\":{n}}}")),
        )
        .await;
        let key = claimed.entry.as_ref().expect("entry").key.clone();
        report_unknown(&app, &key, &claimed).await;
        more.push(key);
    }
    let one = client
        .reconcile(pb::ReconcileRequest {
            keys: vec![more[1].clone()],
            principal: "worker-7".into(),
            ..Default::default()
        })
        .await
        .expect("reconcile by key")
        .into_inner();
    let handed: Vec<&str> = one.pending.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(handed, [more[1].as_str()]);
    let settled = client
        .reconcile(pb::ReconcileRequest {
            resolutions: vec![pb::Resolution {
                key: more[1].clone(),
                status: pb::Status::Succeeded.into(),
                result: b"found-7".to_vec().into(),
                attempt: one.pending[0].attempt,
                hold_token: one.pending[0].hold_token.clone(),
                ..Default::default()
            }],
            resolve_only: true,
            principal: "worker-7".into(),
            ..Default::default()
        })
        .await
        .expect("resolve by key")
        .into_inner();
    assert_eq!(settled.resolved[0].resolved_by, "worker-7");
    let looked = client
        .lookup(pb::LookupRequest {
            key: more[1].clone(),
            ..Default::default()
        })
        .await
        .expect("lookup")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(
        (looked.status(), looked.resolved_by.as_str()),
        (pb::Status::Succeeded, "worker-7")
    );
    let rest = client
        .reconcile(pb::ReconcileRequest::default())
        .await
        .expect("reconcile")
        .into_inner();
    let handed: Vec<&str> = rest.pending.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(handed, [more[0].as_str()], "the other entry was not taken");
    for (bad, field) in [
        (
            pb::ReconcileRequest {
                keys: vec!["no spaces".into()],
                ..Default::default()
            },
            "keys",
        ),
        (
            pb::ReconcileRequest {
                principal: "tab\there".into(),
                ..Default::default()
            },
            "principal",
        ),
    ] {
        let refused = client.reconcile(bad).await.expect_err("refused");
        assert_error(
            &refused,
            Code::InvalidArgument,
            "INVALID_FIELD",
            Some(field),
        );
    }
}

async fn nul_characters_in_arguments_and_nul_bytes_in_results_replay_byte_for_byte(b: Backend) {
    let app = spawn_app(b).await;
    let mut client = app.client.clone();
    // A JSON escape of U+0000, and the character itself escaped differently.
    let args = r#"{"memo":"a\u0000b"}"#;
    let claimed = claim_ok(&app, claim_req(RUN, TOOL, args)).await;
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let key = claimed.entry.as_ref().expect("entry").key.clone();
    assert_eq!(
        key,
        expected_key("idem.v1", RUN, TOOL, r#"{"memo":"a\u0000b"}"#)
    );
    // Without the NUL it is another intent: nothing was stripped.
    let other = claim_ok(&app, claim_req(RUN, TOOL, r#"{"memo":"ab"}"#)).await;
    assert_eq!(other.outcome(), pb::Outcome::Claimed);
    assert_ne!(other.entry.as_ref().expect("entry").key, key);

    let result = [0u8, 255, 0, 10, 0];
    client
        .complete(success(&key, &claimed.claim_token, &result))
        .await
        .expect("complete");
    let again = claim_ok(&app, claim_req(RUN, TOOL, r#"{ "memo" : "a\u0000b" }"#)).await;
    assert_eq!(again.outcome(), pb::Outcome::Replayed);
    let replayed = again.entry.expect("entry");
    assert_eq!(replayed.key, key);
    assert_eq!(replayed.result, &result[..]);
    assert_eq!(
        lookup_entry(&app, derive_req(RUN, TOOL, args)).await.result,
        &result[..]
    );
    assert_eq!(lookup_entry(&app, key_req(&key)).await.result, &result[..]);
}

async fn a_result_over_max_result_bytes_is_refused_and_the_entry_unchanged_but_one_at_the_limit_is_stored(
    b: Backend,
) {
    let app = spawn_app_with(b, |s| s.max_result_bytes = 64).await;
    let mut client = app.client.clone();
    let claimed = claim_ok(&app, claim_req(RUN, TOOL, ARGS)).await;
    let stored = claimed.entry.clone().expect("entry");

    let err = client
        .complete(success(ARGS_KEY, &claimed.claim_token, &[b'x'; 65]))
        .await
        .expect_err("65 bytes");
    assert_error(
        &err,
        Code::InvalidArgument,
        "RESULT_TOO_LARGE",
        Some("result"),
    );
    let seen = lookup_entry(&app, key_req(ARGS_KEY)).await;
    assert_eq!(seen, stored);
    assert_eq!(seen.status(), pb::Status::Attempting);
    assert!(seen.result.is_empty());

    let at_limit = [b'y'; 64];
    let done = client
        .complete(success(ARGS_KEY, &claimed.claim_token, &at_limit))
        .await
        .expect("64 bytes")
        .into_inner();
    assert_eq!(
        done.entry.as_ref().map(|e| e.status()),
        Some(pb::Status::Succeeded)
    );
    assert_eq!(
        lookup_entry(&app, key_req(ARGS_KEY)).await.result,
        &at_limit[..]
    );
}

async fn arguments_over_the_size_or_depth_limit_are_refused_and_ones_at_the_limit_accepted(
    b: Backend,
) {
    let app = spawn_app_with(b, |s| {
        s.max_arguments_bytes = 32;
        s.max_json_depth = 3;
    })
    .await;
    let mut client = app.client.clone();
    let padded = |n: usize| format!(r#"{{"a":"{}"}}"#, "x".repeat(n - 8));
    assert_eq!(padded(32).len(), 32);

    let err = client
        .claim(claim_req(RUN, TOOL, &padded(33)))
        .await
        .expect_err("33 bytes");
    assert_error(
        &err,
        Code::InvalidArgument,
        "ARGUMENTS_TOO_LARGE",
        Some("arguments_json"),
    );
    let err = client
        .lookup(derive_req(RUN, TOOL, &padded(33)))
        .await
        .expect_err("33 bytes");
    assert_error(
        &err,
        Code::InvalidArgument,
        "ARGUMENTS_TOO_LARGE",
        Some("arguments_json"),
    );
    let ok = claim_ok(&app, claim_req(RUN, TOOL, &padded(32))).await;
    assert_eq!(ok.outcome(), pb::Outcome::Claimed);

    let err = client
        .claim(claim_req(RUN, TOOL, r#"{"a":{"b":[[1]]}}"#))
        .await
        .expect_err("depth 4");
    assert_error(
        &err,
        Code::InvalidArgument,
        "JSON_TOO_DEEP",
        Some("arguments_json"),
    );
    let ok = claim_ok(&app, claim_req(RUN, TOOL, r#"{"a":{"b":[1]}}"#)).await;
    assert_eq!(
        ok.outcome(),
        pb::Outcome::Claimed,
        "depth 3 is at the limit"
    );
}

/// `testdata/key-vectors.json`, as far as this test reads it.
#[derive(serde::Deserialize)]
struct Vectors {
    limits: VectorLimits,
    cases: Vec<Vector>,
}

#[derive(serde::Deserialize, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct VectorLimits {
    max_bytes: usize,
    max_depth: usize,
}

#[derive(serde::Deserialize, Debug, Clone)]
struct Vector {
    name: String,
    run_id: String,
    tool: String,
    canonicalization: String,
    arguments_json: String,
    limits: Option<VectorLimits>,
    key: Option<String>,
    fingerprint: Option<String>,
    error: Option<String>,
}

/// Every vector of the shared file, claimed through the server and looked up by derivation. The
/// cases with limits of their own run on a server configured with those limits.
async fn every_key_vector_gives_its_key_and_fingerprint_or_its_refusal_through_the_server(
    b: Backend,
) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/key-vectors.json");
    let text = std::fs::read_to_string(path).expect("read key vectors");
    let vectors: Vectors = serde_json::from_str(&text).expect("parse key vectors");
    let mut by_limits: BTreeMap<VectorLimits, Vec<&Vector>> = BTreeMap::new();
    for case in &vectors.cases {
        by_limits
            .entry(case.limits.unwrap_or(vectors.limits))
            .or_default()
            .push(case);
    }
    // Each limits group on its own server; each server's cases in a few sequential streams.
    let mut apps = Vec::new();
    let mut streams = tokio::task::JoinSet::new();
    for (limits, cases) in by_limits {
        let app = spawn_app_with(b, |s| {
            s.max_arguments_bytes = limits.max_bytes;
            s.max_json_depth = limits.max_depth;
        })
        .await;
        for chunk in cases.chunks(cases.len().div_ceil(4)) {
            let mut client = app.client.clone();
            let chunk: Vec<Vector> = chunk.iter().map(|&c| c.clone()).collect();
            streams.spawn(async move {
                let mut results = Vec::new();
                for case in &chunk {
                    results.push(check_vector(&mut client, case).await);
                }
                results
            });
        }
        apps.push(app);
    }
    let (mut refused, mut derived, mut failures) = (0, 0, Vec::new());
    for result in streams.join_all().await.into_iter().flatten() {
        match result {
            Ok(VectorOutcome::Refused) => refused += 1,
            Ok(VectorOutcome::Derived) => derived += 1,
            Err(failure) => failures.push(failure),
        }
    }
    assert!(
        failures.is_empty(),
        "{} vector(s) disagree:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        refused >= 10 && derived >= 25,
        "refused {refused}, derived {derived}"
    );
}

enum VectorOutcome {
    Refused,
    Derived,
}

/// Claims one vector's call and, when it derives a key, looks it up by derivation too.
async fn check_vector(
    client: &mut LedgerServiceClient<Channel>,
    case: &Vector,
) -> Result<VectorOutcome, String> {
    let canonicalization = match case.canonicalization.as_str() {
        "JCS" => pb::Canonicalization::Jcs,
        "JCS_LENIENT" => pb::Canonicalization::JcsLenient,
        other => return Err(format!("{}: unknown canonicalization {other}", case.name)),
    };
    let req = pb::ClaimRequest {
        canonicalization: canonicalization.into(),
        ..claim_req(&case.run_id, &case.tool, &case.arguments_json)
    };
    let claimed = client.claim(req).await;
    let entry = match (&case.error, claimed) {
        (Some(want), Err(status)) => {
            let got = status.get_details_error_info().map(|i| i.reason);
            let field = status
                .get_details_bad_request()
                .and_then(|b| b.field_violations.first().map(|v| v.field.clone()));
            if status.code() == Code::InvalidArgument
                && got.as_deref() == Some(want.as_str())
                && field.as_deref() == Some("arguments_json")
            {
                return Ok(VectorOutcome::Refused);
            }
            return Err(format!(
                "{}: want INVALID_ARGUMENT {want} on arguments_json, got {:?} {got:?} on \
                 {field:?}: {}",
                case.name,
                status.code(),
                status.message()
            ));
        }
        (Some(want), Ok(resp)) => {
            return Err(format!(
                "{}: want refusal {want}, got {:?}",
                case.name,
                resp.into_inner().outcome()
            ));
        }
        (None, Err(status)) => {
            return Err(format!(
                "{}: want a key, got {:?} {}: {}",
                case.name,
                status.code(),
                crate::support::reason(&status),
                status.message()
            ));
        }
        (None, Ok(resp)) => resp.into_inner().entry.unwrap_or_default(),
    };
    let want = (case.key.as_deref(), case.fingerprint.as_deref());
    if (Some(entry.key.as_str()), Some(entry.fingerprint.as_str())) != want {
        return Err(format!(
            "{}: want key/fingerprint {want:?}, got ({}, {})",
            case.name, entry.key, entry.fingerprint
        ));
    }
    let lookup = pb::LookupRequest {
        canonicalization: canonicalization.into(),
        ..derive_req(&case.run_id, &case.tool, &case.arguments_json)
    };
    match client.lookup(lookup).await {
        Ok(found) => {
            let found = found.into_inner().entry.unwrap_or_default();
            if found.key != entry.key || found.fingerprint != entry.fingerprint {
                return Err(format!(
                    "{}: Lookup derived ({}, {}), Claim ({}, {})",
                    case.name, found.key, found.fingerprint, entry.key, entry.fingerprint
                ));
            }
            Ok(VectorOutcome::Derived)
        }
        Err(status) => Err(format!("{}: Lookup failed: {status:?}", case.name)),
    }
}

/// The service names a reflection service of either version lists, through `channel`.
pub(crate) async fn reflected_services(channel: Channel) -> (Vec<String>, Vec<String>) {
    use tonic_reflection::pb::{v1, v1alpha};
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1 reflection")
        .into_inner();
    let v1_names = match responses
        .message()
        .await
        .expect("v1 response")
        .and_then(|r| r.message_response)
    {
        Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("v1 ListServices answered {other:?}"),
    };

    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1alpha reflection")
        .into_inner();
    let v1alpha_names = match responses
        .message()
        .await
        .expect("v1alpha response")
        .and_then(|r| r.message_response)
    {
        Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("v1alpha ListServices answered {other:?}"),
    };
    (v1_names, v1alpha_names)
}

/// Writes a tokens file for tenants acme and globex into `dir`.
pub(crate) fn tokens_file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("tokens");
    std::fs::write(&path, "acme token-acme\nglobex token-globex\n# comment\n")
        .expect("write tokens");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1_and_v1alpha_list_the_ledger_and_health_without_a_credential() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = tokens_file(&dir);
    let app = spawn_app_with(Backend::Sqlite, |s| s.auth_tokens_file = Some(tokens)).await;
    // The ledger itself wants a credential on this server.
    let err = app
        .client
        .clone()
        .lookup(key_req(ARGS_KEY))
        .await
        .expect_err("no credential");
    assert_eq!(err.code(), Code::Unauthenticated);

    let (v1, v1alpha) = reflected_services(app.channel.clone()).await;
    for names in [&v1, &v1alpha] {
        for service in ["idempotency.v1.LedgerService", "grpc.health.v1.Health"] {
            assert!(
                names.iter().any(|n| n == service),
                "{service} missing from {names:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_returns_the_ledger_descriptor_for_its_service_symbol() {
    use tonic_reflection::pb::v1;
    let app = spawn_app(Backend::Sqlite).await;
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(app.channel.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1::server_reflection_request::MessageRequest::FileContainingSymbol(
                "idempotency.v1.LedgerService".into(),
            ),
        ),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    let files = match responses
        .message()
        .await
        .expect("response")
        .and_then(|r| r.message_response)
    {
        Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(f)) => {
            f.file_descriptor_proto
        }
        other => panic!("FileContainingSymbol answered {other:?}"),
    };
    let files: Vec<prost_types::FileDescriptorProto> = files
        .iter()
        .map(|bytes| {
            prost_types::FileDescriptorProto::decode(bytes.as_slice()).expect("descriptor")
        })
        .collect();
    let ledger = files
        .iter()
        .find(|f| f.name() == "idempotency/v1/ledger.proto")
        .unwrap_or_else(|| {
            panic!(
                "no ledger.proto in {:?}",
                files.iter().map(|f| f.name()).collect::<Vec<_>>()
            )
        });
    assert_eq!(ledger.package(), "idempotency.v1");
    let service = ledger
        .service
        .iter()
        .find(|s| s.name() == "LedgerService")
        .expect("LedgerService in the descriptor");
    let methods: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
    for rpc in ["Claim", "Complete", "Lookup", "Reconcile"] {
        assert!(methods.contains(&rpc), "{rpc} missing from {methods:?}");
    }
}

async fn renew_lease_extends_the_holders_lease_and_refuses_others_with_their_reasons(b: Backend) {
    let app = spawn_app(b).await;
    let mut client = app.client.clone();
    let first = claim_ok(&app, claim_req(RUN, TOOL, ARGS)).await;
    let stored = first.entry.clone().expect("entry");
    let renewal = |token: &str, seconds: i64| pb::RenewLeaseRequest {
        key: ARGS_KEY.into(),
        claim_token: token.into(),
        lease: Some(prost_types::Duration { seconds, nanos: 0 }),
    };

    let renewed = client
        .renew_lease(renewal(&first.claim_token, 600))
        .await
        .expect("the holder renews")
        .into_inner()
        .entry
        .expect("entry");
    let (before, after) = (
        stored.lease_expires_at.expect("lease"),
        renewed.lease_expires_at.expect("lease"),
    );
    assert!(
        after.seconds >= before.seconds + 500,
        "a 10-minute lease from now ends well after the default 60 s one: {before:?} -> {after:?}"
    );
    assert_eq!(renewed.status(), pb::Status::Attempting);
    assert_eq!(lookup_entry(&app, key_req(ARGS_KEY)).await, renewed);

    let err = client
        .renew_lease(renewal(&"0".repeat(32), 60))
        .await
        .expect_err("a wrong token");
    assert_error(&err, Code::FailedPrecondition, "STALE_CLAIM_TOKEN", None);
    let err = client
        .renew_lease(renewal(&first.claim_token, 2 * 3600))
        .await
        .expect_err("above --max-lease");
    assert_error(&err, Code::InvalidArgument, "INVALID_FIELD", Some("lease"));
    let err = client
        .renew_lease(pb::RenewLeaseRequest {
            key: "f".repeat(64),
            claim_token: first.claim_token.clone(),
            lease: None,
        })
        .await
        .expect_err("no such key");
    assert_error(&err, Code::NotFound, "ENTRY_NOT_FOUND", None);
    assert_eq!(lookup_entry(&app, key_req(ARGS_KEY)).await, renewed);

    client
        .complete(success(ARGS_KEY, &first.claim_token, b"done"))
        .await
        .expect("complete");
    let err = client
        .renew_lease(renewal(&first.claim_token, 60))
        .await
        .expect_err("resolved");
    assert_error(&err, Code::FailedPrecondition, "LEASE_ENDED", None);
    assert!(err.message().contains("SUCCEEDED"), "{err:?}");
}
