//! The audit trail: ListEntries pages through a run with no gaps or repeats, filters by tool,
//! state and time, refuses a page token of another listing, keeps tenants apart, and keeps
//! each claim's arguments as `--store-arguments` says — secrets redacted by default while the
//! key is still derived from the whole arguments.

use std::collections::HashSet;
use std::time::Duration;

use idempotency_ledger::domain::canonical::{self, Canonicalization, JsonLimits};
use idempotency_ledger::domain::fields::{RunId, ToolName};
use idempotency_ledger::domain::key;
use idempotency_ledger::domain::time::Clock;
use idempotency_ledger::grpc::pb;
use idempotency_ledger::server::StoreArguments;
use tonic::{Code, Request};

use crate::grpc_api::assert_error;
use crate::support::{Backend, TestApp, claim_req, spawn_app, spawn_app_with, success};

on_every_backend!(
    list_entries_pages_through_a_run_of_several_hundred_entries_with_no_gaps_or_repeats,
    list_entries_filters_by_tool_state_and_start_time,
    a_page_token_continues_only_the_listing_that_made_it,
    secrets_in_arguments_are_redacted_for_audit_while_the_key_derives_from_them,
    store_arguments_none_keeps_nothing_and_full_keeps_everything,
    list_entries_shows_only_the_callers_tenant,
);

const RUN: &str = "run-audit";
const OTHER_RUN: &str = "run-other";

async fn list(app: &TestApp, req: pb::ListEntriesRequest) -> pb::ListEntriesResponse {
    app.client
        .clone()
        .list_entries(req)
        .await
        .unwrap_or_else(|e| panic!("ListEntries: {e:?}"))
        .into_inner()
}

/// Every entry of a listing, page by page; `between` runs after each page (writes racing it).
async fn list_all(
    app: &TestApp,
    req: pb::ListEntriesRequest,
    mut between: impl AsyncFnMut(usize),
) -> (Vec<pb::Entry>, usize) {
    let mut all = Vec::new();
    let mut pages = 0;
    let mut token = String::new();
    loop {
        let page = list(
            app,
            pb::ListEntriesRequest {
                page_token: token.clone(),
                ..req.clone()
            },
        )
        .await;
        pages += 1;
        assert!(
            page.entries.len() <= usize::try_from(req.page_size.max(1)).unwrap_or(usize::MAX),
            "a page holds at most page_size entries"
        );
        all.extend(page.entries);
        between(pages).await;
        if page.next_page_token.is_empty() {
            return (all, pages);
        }
        token = page.next_page_token;
    }
}

/// Claims `tool(args)` in `run` and returns (key, token).
async fn claim(app: &TestApp, run: &str, tool: &str, args: &str) -> (String, String) {
    let resp = app
        .client
        .clone()
        .claim(claim_req(run, tool, args))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(resp.outcome(), pb::Outcome::Claimed);
    (resp.entry.expect("entry").key, resp.claim_token)
}

fn started_micros(e: &pb::Entry) -> i64 {
    let t = e.started_at.as_ref().expect("started_at");
    t.seconds * 1_000_000 + i64::from(t.nanos / 1000)
}

async fn list_entries_pages_through_a_run_of_several_hundred_entries_with_no_gaps_or_repeats(
    b: Backend,
) {
    let app = spawn_app(b).await;
    let mut expected = HashSet::new();
    for i in 0..360 {
        // Several entries share each start time (the clock moves every 7 claims), so the
        // cursor's tie-break by key is exercised too.
        if i % 7 == 0 {
            app.clock.advance(Duration::from_millis(3));
        }
        let (key, token) = claim(&app, RUN, "send_reply", &format!(r#"{{"n":{i}}}"#)).await;
        if i % 3 == 0 {
            app.client
                .clone()
                .complete(success(&key, &token, b"ok"))
                .await
                .expect("complete");
        }
        expected.insert(key);
        if i % 50 == 0 {
            claim(&app, OTHER_RUN, "send_reply", &format!(r#"{{"n":{i}}}"#)).await;
        }
    }
    let req = pb::ListEntriesRequest {
        run_id: RUN.into(),
        page_size: 37,
        ..Default::default()
    };
    // Other runs keep claiming while the listing pages: their entries never show up, and the
    // run's listing neither skips nor repeats.
    let racing = app.client.clone();
    let (entries, pages) = list_all(&app, req, async |page| {
        let mut c = racing.clone();
        c.claim(claim_req(
            OTHER_RUN,
            "send_reply",
            &format!(r#"{{"page":{page}}}"#),
        ))
        .await
        .expect("racing claim");
    })
    .await;
    assert_eq!(pages, 360 / 37 + 1, "ceil(360 / 37) pages");
    let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
    let unique: HashSet<&str> = keys.iter().copied().collect();
    assert_eq!(unique.len(), keys.len(), "no entry is listed twice");
    assert_eq!(
        unique,
        expected.iter().map(String::as_str).collect::<HashSet<_>>(),
        "every entry of the run, and only those"
    );
    assert!(entries.iter().all(|e| e.run_id == RUN));
    let order: Vec<(i64, &str)> = entries
        .iter()
        .map(|e| (started_micros(e), e.key.as_str()))
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "by started_at, then key");
    let succeeded = entries
        .iter()
        .filter(|e| e.status() == pb::Status::Succeeded)
        .count();
    assert_eq!(succeeded, 120, "every third entry was completed");

    // The default page size is 100; a page size over the maximum is shortened to 1000.
    let first = list(
        &app,
        pb::ListEntriesRequest {
            run_id: RUN.into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(first.entries.len(), 100);
    assert!(!first.next_page_token.is_empty());
    let whole = list(
        &app,
        pb::ListEntriesRequest {
            run_id: RUN.into(),
            page_size: 5000,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(whole.entries.len(), 360);
    assert!(whole.next_page_token.is_empty(), "the last page says so");
}

async fn list_entries_filters_by_tool_state_and_start_time(b: Backend) {
    let app = spawn_app(b).await;
    let t0 = app.clock.now().0;
    let (done_key, token) = claim(&app, RUN, "issue_credit", r#"{"n":1}"#).await;
    app.client
        .clone()
        .complete(success(&done_key, &token, b"credited"))
        .await
        .expect("complete");
    app.clock.advance(Duration::from_secs(10));
    let (failed_key, token) = claim(&app, RUN, "issue_credit", r#"{"n":2}"#).await;
    app.client
        .clone()
        .complete(pb::CompleteRequest {
            key: failed_key.clone(),
            claim_token: token,
            status: pb::Status::Failed.into(),
            error: "card declined".into(),
            ..Default::default()
        })
        .await
        .expect("complete failed");
    app.clock.advance(Duration::from_secs(10));
    let (in_flight_key, _) = claim(&app, RUN, "send_reply", r#"{"n":3}"#).await;
    let t_last = app.clock.now().0;

    let keys = async |req: pb::ListEntriesRequest| -> Vec<String> {
        list(
            &app,
            pb::ListEntriesRequest {
                run_id: RUN.into(),
                ..req
            },
        )
        .await
        .entries
        .into_iter()
        .map(|e| e.key)
        .collect()
    };
    let by_tool = keys(pb::ListEntriesRequest {
        tool: "issue_credit".into(),
        ..Default::default()
    })
    .await;
    assert_eq!(by_tool, vec![done_key.clone(), failed_key.clone()]);
    let state = |s: pb::Status| pb::ListEntriesRequest {
        status: s.into(),
        ..Default::default()
    };
    assert_eq!(
        keys(state(pb::Status::Succeeded)).await,
        vec![done_key.clone()]
    );
    assert_eq!(
        keys(state(pb::Status::Failed)).await,
        vec![failed_key.clone()]
    );
    assert_eq!(
        keys(state(pb::Status::Attempting)).await,
        vec![in_flight_key.clone()]
    );
    assert!(keys(state(pb::Status::Unknown)).await.is_empty());
    // Past its lease (60 s by default) the attempt reads as UNKNOWN, as Lookup says.
    app.clock.advance(Duration::from_secs(61));
    assert_eq!(
        keys(state(pb::Status::Unknown)).await,
        vec![in_flight_key.clone()]
    );
    assert!(keys(state(pb::Status::Attempting)).await.is_empty());

    let at = |us: i64| prost_types::Timestamp {
        seconds: us.div_euclid(1_000_000),
        nanos: i32::try_from(us.rem_euclid(1_000_000) * 1000).expect("nanos"),
    };
    let window = keys(pb::ListEntriesRequest {
        started_after: Some(at(t0 + 1)),
        started_before: Some(at(t_last)),
        ..Default::default()
    })
    .await;
    assert_eq!(
        window,
        vec![failed_key],
        "after is inclusive, before exclusive"
    );
    let from_last = keys(pb::ListEntriesRequest {
        started_after: Some(at(t_last)),
        ..Default::default()
    })
    .await;
    assert_eq!(from_last, vec![in_flight_key]);

    let refused = |req: pb::ListEntriesRequest| {
        let mut client = app.client.clone();
        async move { client.list_entries(req).await.expect_err("refused") }
    };
    assert_error(
        &refused(pb::ListEntriesRequest {
            page_size: -1,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "INVALID_FIELD",
        Some("page_size"),
    );
    assert_error(
        &refused(pb::ListEntriesRequest {
            status: 42,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "INVALID_FIELD",
        Some("status"),
    );
    assert_error(
        &refused(pb::ListEntriesRequest {
            started_after: Some(at(t_last)),
            started_before: Some(at(t0)),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "INVALID_FIELD",
        Some("started_before"),
    );
    assert_error(
        &refused(pb::ListEntriesRequest {
            started_after: Some(prost_types::Timestamp {
                seconds: 1,
                nanos: -1,
            }),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "INVALID_FIELD",
        Some("started_after"),
    );
    let bad_run = refused(pb::ListEntriesRequest {
        run_id: "x".repeat(10_000),
        ..Default::default()
    })
    .await;
    assert_eq!(bad_run.code(), Code::InvalidArgument, "{bad_run:?}");
}

async fn a_page_token_continues_only_the_listing_that_made_it(b: Backend) {
    let app = spawn_app(b).await;
    for i in 0..5 {
        claim(&app, RUN, "send_reply", &format!(r#"{{"n":{i}}}"#)).await;
    }
    let req = pb::ListEntriesRequest {
        run_id: RUN.into(),
        page_size: 2,
        ..Default::default()
    };
    let first = list(&app, req.clone()).await;
    assert_eq!(first.entries.len(), 2);
    let token = first.next_page_token;
    let mut client = app.client.clone();
    for other in [
        pb::ListEntriesRequest {
            run_id: OTHER_RUN.into(),
            ..req.clone()
        },
        pb::ListEntriesRequest {
            tool: "issue_credit".into(),
            ..req.clone()
        },
        pb::ListEntriesRequest {
            status: pb::Status::Succeeded.into(),
            ..req.clone()
        },
    ] {
        let err = client
            .list_entries(pb::ListEntriesRequest {
                page_token: token.clone(),
                ..other
            })
            .await
            .expect_err("another listing's token");
        assert_error(
            &err,
            Code::InvalidArgument,
            "INVALID_PAGE_TOKEN",
            Some("page_token"),
        );
    }
    for garbage in ["zz", "00", &hex_of("p1\0not-a-number\0x\0k"), &token[2..]] {
        let err = client
            .list_entries(pb::ListEntriesRequest {
                page_token: garbage.to_string(),
                ..req.clone()
            })
            .await
            .expect_err("not a token");
        assert_error(
            &err,
            Code::InvalidArgument,
            "INVALID_PAGE_TOKEN",
            Some("page_token"),
        );
    }
    // The page size may change between pages; the token still continues the same listing.
    let rest = list(
        &app,
        pb::ListEntriesRequest {
            page_token: token,
            page_size: 10,
            ..req
        },
    )
    .await;
    assert_eq!(rest.entries.len(), 3);
    assert!(rest.next_page_token.is_empty());
}

fn hex_of(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

const CANARY: &str = "CANARY-7c1e9d-do-not-store";

/// Arguments carrying the canary in members the default policy redacts, at several depths.
fn secret_arguments(canary: &str) -> String {
    format!(
        r#"{{"to":"ann@example.com","password":"{canary}","card":{{"card_number":"{canary}",
            "exp":"12/29"}},"headers":[{{"Authorization":"Bearer {canary}"}}],"amount":5}}"#
    )
}

async fn secrets_in_arguments_are_redacted_for_audit_while_the_key_derives_from_them(b: Backend) {
    let app = spawn_app(b).await;
    let args = secret_arguments(CANARY);
    let (key, _) = claim(&app, RUN, "send_email", &args).await;
    // The key is the derivation of the whole, unredacted arguments.
    let canonical = canonical::canonicalize(&args, Canonicalization::Jcs, &JsonLimits::default())
        .expect("canonical");
    let expected_key = key::derive_key(
        &RunId::parse(RUN).expect("run"),
        &ToolName::parse("send_email").expect("tool"),
        &canonical,
        Canonicalization::Jcs,
    );
    assert_eq!(key, expected_key);
    // Another secret is another intent, though both redact to the same text.
    let (other_key, _) = claim(&app, RUN, "send_email", &secret_arguments("other")).await;
    assert_ne!(other_key, key);

    let listed = list(
        &app,
        pb::ListEntriesRequest {
            run_id: RUN.into(),
            ..Default::default()
        },
    )
    .await
    .entries;
    assert_eq!(listed.len(), 2);
    let redacted = r#"{"amount":5,"card":{"card_number":"[REDACTED]","exp":"12/29"},"headers":[{"Authorization":"[REDACTED]"}],"password":"[REDACTED]","to":"ann@example.com"}"#;
    for entry in &listed {
        assert_eq!(entry.arguments_json, redacted);
        assert!(!entry.arguments_json.contains(CANARY));
    }
    let looked_up = app
        .client
        .clone()
        .lookup(pb::LookupRequest {
            key: key.clone(),
            ..Default::default()
        })
        .await
        .expect("lookup")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(looked_up.arguments_json, redacted);
    // Claim answers are about outcomes: no arguments there.
    let replay = app
        .client
        .clone()
        .claim(claim_req(RUN, "send_email", &args))
        .await
        .expect("claim again")
        .into_inner();
    assert_eq!(replay.entry.expect("entry").arguments_json, "");
}

async fn store_arguments_none_keeps_nothing_and_full_keeps_everything(b: Backend) {
    let none = spawn_app_with(b, |s| s.store_arguments = StoreArguments::None).await;
    claim(&none, RUN, "send_email", &secret_arguments(CANARY)).await;
    let listed = list(
        &none,
        pb::ListEntriesRequest {
            run_id: RUN.into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(listed.entries.len(), 1);
    assert_eq!(listed.entries[0].arguments_json, "");

    let full = spawn_app_with(b, |s| {
        s.store_arguments = StoreArguments::Full;
    })
    .await;
    claim(
        &full,
        RUN,
        "send_email",
        r#"{"b":"x","password":"p","a":1}"#,
    )
    .await;
    let listed = list(
        &full,
        pb::ListEntriesRequest {
            run_id: RUN.into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        listed.entries[0].arguments_json, r#"{"a":1,"b":"x","password":"p"}"#,
        "canonical, whole"
    );

    let extra = spawn_app_with(b, |s| {
        s.redact_fields = vec!["iban".into()];
    })
    .await;
    claim(
        &extra,
        RUN,
        "transfer",
        r#"{"IBAN":"DE89370400440532013000","token":"t","memo":"rent"}"#,
    )
    .await;
    let listed = list(
        &extra,
        pb::ListEntriesRequest {
            run_id: RUN.into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        listed.entries[0].arguments_json,
        r#"{"IBAN":"[REDACTED]","memo":"rent","token":"[REDACTED]"}"#,
        "--redact-field adds to the defaults"
    );
}

async fn list_entries_shows_only_the_callers_tenant(b: Backend) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tokens");
    std::fs::write(&path, "acme token-acme\nglobex token-globex\n").expect("tokens file");
    let app = spawn_app_with(b, |s| s.auth_tokens_file = Some(path)).await;
    let as_tenant = |token: &str, req: pb::ClaimRequest| {
        let mut r = Request::new(req);
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
        r
    };
    let mut client = app.client.clone();
    for i in 0..3 {
        client
            .claim(as_tenant(
                "token-acme",
                claim_req(RUN, "t", &format!(r#"{{"n":{i}}}"#)),
            ))
            .await
            .expect("acme claim");
    }
    client
        .claim(as_tenant("token-globex", claim_req(RUN, "t", r#"{"n":0}"#)))
        .await
        .expect("globex claim");
    let list_as = |token: &str| {
        let mut r = Request::new(pb::ListEntriesRequest {
            run_id: RUN.into(),
            ..Default::default()
        });
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
        r
    };
    let acme = client
        .list_entries(list_as("token-acme"))
        .await
        .expect("acme list")
        .into_inner();
    let globex = client
        .list_entries(list_as("token-globex"))
        .await
        .expect("globex list")
        .into_inner();
    assert_eq!(acme.entries.len(), 3);
    assert_eq!(globex.entries.len(), 1);
    let unauthenticated = client
        .list_entries(pb::ListEntriesRequest::default())
        .await
        .expect_err("no credential");
    assert_eq!(unauthenticated.code(), Code::Unauthenticated);
}
