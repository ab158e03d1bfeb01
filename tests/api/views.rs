//! The `view` of Claim and Complete (AIP-157 partial responses) through a real tonic client:
//! unset and `ENTRY_VIEW_FULL` answer as before, `ENTRY_VIEW_BASIC` leaves out the result a
//! Complete just sent but never the result a replayed Claim needs, and a value that is no
//! `EntryView` is refused and changes nothing.

use tonic::Code;

use idempotency_ledger::grpc::pb;

use crate::grpc_api::{ARGS, RUN, TOOL, assert_error, claim_ok, key_req, lookup_entry};
use crate::support::{Backend, TestApp, claim_req, spawn_app, success};

on_every_backend!(
    the_basic_view_leaves_out_the_result_a_complete_sent_and_keeps_the_rest,
    a_replayed_claim_carries_the_stored_result_in_every_view,
    a_view_that_is_no_entry_view_is_refused_and_changes_nothing,
);

const RESULT: &[u8] = br#"{"credit_id":"cr-1"}"#;

fn claim_in(view: pb::EntryView) -> pb::ClaimRequest {
    pb::ClaimRequest {
        view: view.into(),
        ..claim_req(RUN, TOOL, ARGS)
    }
}

fn complete_in(key: &str, token: &str, view: pb::EntryView) -> pb::CompleteRequest {
    pb::CompleteRequest {
        view: view.into(),
        ..success(key, token, RESULT)
    }
}

async fn complete_ok(app: &TestApp, req: pb::CompleteRequest) -> pb::CompleteResponse {
    let mut client = app.client.clone();
    client.complete(req).await.expect("complete").into_inner()
}

async fn the_basic_view_leaves_out_the_result_a_complete_sent_and_keeps_the_rest(b: Backend) {
    let app = spawn_app(b).await;
    let basic_claim = claim_ok(&app, claim_in(pb::EntryView::Basic)).await;
    assert_eq!(basic_claim.outcome(), pb::Outcome::Claimed);
    let claimed = basic_claim.entry.clone().expect("entry");
    assert!(claimed.arguments_json.is_empty(), "{claimed:?}");
    assert_eq!(
        claimed,
        lookup_entry(&app, key_req(&claimed.key)).await,
        "a claimed entry's basic view is all of it but the audit arguments"
    );

    let key = claimed.key.clone();
    let token = basic_claim.claim_token.clone();
    let basic = complete_ok(&app, complete_in(&key, &token, pb::EntryView::Basic)).await;
    assert!(!basic.already_completed);
    let basic = basic.entry.expect("entry");
    assert_eq!(basic.status(), pb::Status::Succeeded);
    assert!(
        basic.result.is_empty() && basic.arguments_json.is_empty(),
        "no echo of what was sent: {basic:?}"
    );

    // The same Complete again, in each view: the full answers are today's, with the result.
    let mut answers = Vec::new();
    for view in [
        pb::EntryView::Unspecified,
        pb::EntryView::Full,
        pb::EntryView::Basic,
    ] {
        let again = complete_ok(&app, complete_in(&key, &token, view)).await;
        assert!(again.already_completed, "{view:?}");
        answers.push(again.entry.expect("entry"));
    }
    let [unset, full, basic_again] = <[pb::Entry; 3]>::try_from(answers).expect("three");
    assert_eq!(unset, full, "unset means ENTRY_VIEW_FULL");
    assert_eq!(full.result, RESULT, "the full view echoes the result");
    assert!(
        full.arguments_json.is_empty(),
        "Complete never carries them"
    );
    assert_eq!(basic_again, basic);
    assert_eq!(
        basic,
        pb::Entry {
            result: Default::default(),
            ..full.clone()
        },
        "the basic view differs from the full one by the result alone"
    );
    assert_eq!(
        lookup_entry(&app, key_req(&key)).await,
        full,
        "the result is stored all the same"
    );
}

async fn a_replayed_claim_carries_the_stored_result_in_every_view(b: Backend) {
    let app = spawn_app(b).await;
    let first = claim_ok(&app, claim_in(pb::EntryView::Basic)).await;
    let key = first.entry.expect("entry").key;
    complete_ok(
        &app,
        complete_in(&key, &first.claim_token, pb::EntryView::Basic),
    )
    .await;
    let mut replays = Vec::new();
    for view in [
        pb::EntryView::Basic,
        pb::EntryView::Unspecified,
        pb::EntryView::Full,
    ] {
        let replay = claim_ok(&app, claim_in(view)).await;
        assert_eq!(replay.outcome(), pb::Outcome::Replayed, "{view:?}");
        let entry = replay.entry.expect("entry");
        assert_eq!(
            entry.result, RESULT,
            "{view:?}: the stored result, byte for byte"
        );
        assert!(entry.arguments_json.is_empty(), "{view:?}");
        replays.push(pb::Entry {
            replay_count: 0,
            ..entry
        });
    }
    assert!(
        replays.windows(2).all(|w| w[0] == w[1]),
        "a replay answers the same entry in every view: {replays:?}"
    );
}

async fn a_view_that_is_no_entry_view_is_refused_and_changes_nothing(b: Backend) {
    let app = spawn_app(b).await;
    let mut client = app.client.clone();
    let bad_claim = pb::ClaimRequest {
        view: 3,
        ..claim_req(RUN, TOOL, ARGS)
    };
    let err = client.claim(bad_claim).await.expect_err("view 3");
    assert_error(&err, Code::InvalidArgument, "INVALID_FIELD", Some("view"));
    let claimed = claim_ok(&app, claim_req(RUN, TOOL, ARGS)).await;
    assert_eq!(
        claimed.outcome(),
        pb::Outcome::Claimed,
        "the refused Claim claimed nothing"
    );
    let entry = claimed.entry.expect("entry");

    let bad_complete = pb::CompleteRequest {
        view: -1,
        ..success(&entry.key, &claimed.claim_token, RESULT)
    };
    let err = client.complete(bad_complete).await.expect_err("view -1");
    assert_error(&err, Code::InvalidArgument, "INVALID_FIELD", Some("view"));
    assert_eq!(
        lookup_entry(&app, key_req(&entry.key)).await,
        entry,
        "the refused Complete recorded nothing"
    );
}
