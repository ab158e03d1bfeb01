//! Tenants: the credential chooses the tenant before anything else is read; a tenant cannot
//! read, complete or even detect another tenant's keys; health and reflection stay open.

use idempotency_ledger::grpc::pb;
use tonic::Code;
use tonic::Request;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

use crate::grpc_api::{ARGS, RUN, TOOL, assert_error, key_req, reflected_services, tokens_file};
use crate::support::{Backend, TestApp, claim_req, spawn_app_with, success};

on_every_backend!(
    another_tenants_key_is_indistinguishable_from_a_key_that_exists_nowhere,
    another_tenant_claiming_the_same_call_gets_its_own_entry_and_leaves_the_first_unchanged,
);

const ACME: &str = "token-acme";
const GLOBEX: &str = "token-globex";

/// A server with tenants acme and globex; the temp dir holds the tokens file.
async fn tenants_app(backend: Backend) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = tokens_file(&dir);
    let app = spawn_app_with(backend, |s| s.auth_tokens_file = Some(path)).await;
    (app, dir)
}

/// `message` with `authorization: <value>`.
fn with_auth<T>(message: T, value: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", value.parse().expect("header value"));
    request
}

/// `message` with `authorization: <credential>`, or with no credential at all.
fn request<T>(message: T, credential: Option<&str>) -> Request<T> {
    match credential {
        Some(value) => with_auth(message, value),
        None => Request::new(message),
    }
}

/// `message` with the bearer credential `token`.
fn as_tenant<T>(message: T, token: &str) -> Request<T> {
    with_auth(message, &format!("Bearer {token}"))
}

async fn claim_as(app: &TestApp, token: &str, req: pb::ClaimRequest) -> pb::ClaimResponse {
    app.client
        .clone()
        .claim(as_tenant(req, token))
        .await
        .expect("claim")
        .into_inner()
}

async fn lookup_as(app: &TestApp, token: &str, key: &str) -> Result<pb::Entry, tonic::Status> {
    app.client
        .clone()
        .lookup(as_tenant(key_req(key), token))
        .await
        .map(|r| crate::grpc_api::without_arguments(r.into_inner().entry.expect("entry")))
}

/// Acme claims (RUN, TOOL, ARGS) and completes it with `result`; returns the entry and token.
async fn acme_succeeds(app: &TestApp, result: &[u8]) -> (pb::Entry, String) {
    let claimed = claim_as(app, ACME, claim_req(RUN, TOOL, ARGS)).await;
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let key = claimed.entry.expect("entry").key;
    let done = app
        .client
        .clone()
        .complete(as_tenant(success(&key, &claimed.claim_token, result), ACME))
        .await
        .expect("complete")
        .into_inner()
        .entry
        .expect("entry");
    (done, claimed.claim_token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_wrong_or_malformed_credential_is_unauthenticated_and_stores_nothing() {
    let (app, _dir) = tenants_app(Backend::Sqlite).await;
    let mut client = app.client.clone();
    let credentials: [Option<&str>; 5] = [
        None,
        Some("Bearer token-nope"),
        Some("Bearer "),
        Some("token-acme"),
        Some("Basic token-acme"),
    ];
    for credential in credentials {
        let err = client
            .claim(request(claim_req(RUN, TOOL, ARGS), credential))
            .await
            .expect_err("claim without a valid credential");
        assert_error(&err, Code::Unauthenticated, "UNAUTHENTICATED", None);
        let err = client
            .lookup(request(
                pb::LookupRequest {
                    run_id: RUN.into(),
                    tool: TOOL.into(),
                    arguments_json: ARGS.into(),
                    ..Default::default()
                },
                credential,
            ))
            .await
            .expect_err("lookup without a valid credential");
        assert_error(&err, Code::Unauthenticated, "UNAUTHENTICATED", None);
        let err = client
            .complete(request(
                success(&"a".repeat(64), &"b".repeat(32), b"r"),
                credential,
            ))
            .await
            .expect_err("complete without a valid credential");
        assert_error(&err, Code::Unauthenticated, "UNAUTHENTICATED", None);
        let err = client
            .reconcile(request(pb::ReconcileRequest::default(), credential))
            .await
            .expect_err("reconcile without a valid credential");
        assert_eq!(err.code(), Code::Unauthenticated, "{credential:?}: {err:?}");
    }
    // None of the refused claims was stored for anyone.
    for token in [ACME, GLOBEX] {
        let err = app
            .client
            .clone()
            .lookup(as_tenant(
                pb::LookupRequest {
                    run_id: RUN.into(),
                    tool: TOOL.into(),
                    arguments_json: ARGS.into(),
                    ..Default::default()
                },
                token,
            ))
            .await
            .expect_err("nothing stored");
        assert_error(&err, Code::NotFound, "ENTRY_NOT_FOUND", None);
    }
    // And the right credential works, with a lower-case scheme too.
    let claimed = app
        .client
        .clone()
        .claim(with_auth(claim_req(RUN, TOOL, ARGS), "bearer token-acme"))
        .await
        .expect("a valid credential")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_is_checked_before_validation() {
    let (app, _dir) = tenants_app(Backend::Sqlite).await;
    let mut client = app.client.clone();
    let bad_claim = || pb::ClaimRequest {
        canonicalization: 7,
        lease: Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        }),
        ..claim_req("", "", "{\"a\":1,\"a\":2}")
    };
    // With a credential, the body is refused as it should be...
    let err = client
        .claim(as_tenant(bad_claim(), ACME))
        .await
        .expect_err("invalid body");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // ...without one, the caller learns nothing about the body.
    for request in [
        Request::new(bad_claim()),
        with_auth(bad_claim(), "Bearer wrong"),
    ] {
        let err = client.claim(request).await.expect_err("no credential");
        assert_error(&err, Code::Unauthenticated, "UNAUTHENTICATED", None);
    }
    let err = client
        .lookup(Request::new(pb::LookupRequest::default()))
        .await
        .expect_err("no credential");
    assert_error(&err, Code::Unauthenticated, "UNAUTHENTICATED", None);
    let err = client
        .complete(Request::new(pb::CompleteRequest {
            status: pb::Status::Attempting.into(),
            ..Default::default()
        }))
        .await
        .expect_err("no credential");
    assert_error(&err, Code::Unauthenticated, "UNAUTHENTICATED", None);
}

/// Everything a caller can observe of an error, for comparison.
#[derive(Debug, PartialEq)]
struct Observed {
    code: Code,
    message: String,
    reason: Option<String>,
    domain: Option<String>,
    info_metadata: Option<std::collections::BTreeMap<String, String>>,
    details: Vec<u8>,
    metadata: Vec<(String, Vec<u8>)>,
}

fn observe(status: &tonic::Status) -> Observed {
    let info = status.get_details_error_info();
    let mut metadata: Vec<(String, Vec<u8>)> = status
        .metadata()
        .clone()
        .into_headers()
        .iter()
        // `date` is the HTTP response's clock, not something the ledger chose.
        .filter(|(name, _)| name.as_str() != "date")
        .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
        .collect();
    metadata.sort();
    Observed {
        code: status.code(),
        message: status.message().to_string(),
        reason: info.as_ref().map(|i| i.reason.clone()),
        domain: info.as_ref().map(|i| i.domain.clone()),
        info_metadata: info.map(|i| i.metadata.into_iter().collect()),
        details: status.details().to_vec(),
        metadata,
    }
}

async fn another_tenants_key_is_indistinguishable_from_a_key_that_exists_nowhere(b: Backend) {
    let (app, _dir) = tenants_app(b).await;
    let mut client = app.client.clone();
    let (acme_entry, acme_token) = acme_succeeds(&app, b"credit cr-1").await;
    let key = acme_entry.key.clone();
    // A derived key of the same shape that nobody claimed.
    let nowhere = "0123456789abcdef".repeat(4);
    assert_eq!(nowhere.len(), key.len());

    // Lookup by key.
    let theirs = lookup_as(&app, GLOBEX, &key)
        .await
        .expect_err("acme's key for globex");
    let absent = lookup_as(&app, GLOBEX, &nowhere)
        .await
        .expect_err("a key nobody has");
    assert_error(&theirs, Code::NotFound, "ENTRY_NOT_FOUND", None);
    assert_eq!(observe(&theirs), observe(&absent));
    // The absent key reads the same for acme too.
    let absent_for_acme = lookup_as(&app, ACME, &nowhere)
        .await
        .expect_err("absent for acme");
    assert_eq!(observe(&absent_for_acme), observe(&absent));

    // Lookup by derivation.
    let derive = |args: &str| pb::LookupRequest {
        run_id: RUN.into(),
        tool: TOOL.into(),
        arguments_json: args.into(),
        ..Default::default()
    };
    let theirs = client
        .lookup(as_tenant(derive(ARGS), GLOBEX))
        .await
        .expect_err("acme's derivation for globex");
    let absent = client
        .lookup(as_tenant(
            derive(r#"{"amount":201,"currency":"EUR"}"#),
            GLOBEX,
        ))
        .await
        .expect_err("a derivation nobody claimed");
    assert_eq!(observe(&theirs), observe(&absent));

    // Complete, even with acme's real token.
    let theirs = client
        .complete(as_tenant(
            success(&key, &acme_token, b"credit cr-1"),
            GLOBEX,
        ))
        .await
        .expect_err("globex completes acme's key with acme's token");
    let absent = client
        .complete(as_tenant(
            success(&nowhere, &acme_token, b"credit cr-1"),
            GLOBEX,
        ))
        .await
        .expect_err("globex completes a key nobody has");
    assert_error(&theirs, Code::NotFound, "ENTRY_NOT_FOUND", None);
    assert_eq!(observe(&theirs), observe(&absent));
    let theirs = client
        .complete(as_tenant(
            pb::CompleteRequest {
                status: pb::Status::Failed.into(),
                error: "overwritten by globex".into(),
                ..success(&key, &acme_token, b"")
            },
            GLOBEX,
        ))
        .await
        .expect_err("globex records another outcome on acme's key");
    assert_error(&theirs, Code::NotFound, "ENTRY_NOT_FOUND", None);

    // Acme's entry is as it was.
    assert_eq!(
        lookup_as(&app, ACME, &key).await.expect("acme's entry"),
        acme_entry
    );
}

async fn another_tenant_claiming_the_same_call_gets_its_own_entry_and_leaves_the_first_unchanged(
    b: Backend,
) {
    let (app, _dir) = tenants_app(b).await;
    let (acme_entry, _) = acme_succeeds(&app, b"acme's result").await;

    let globex = claim_as(&app, GLOBEX, claim_req(RUN, TOOL, ARGS)).await;
    assert_eq!(globex.outcome(), pb::Outcome::Claimed, "not acme's replay");
    let globex_entry = globex.entry.clone().expect("entry");
    assert_eq!(
        globex_entry.key, acme_entry.key,
        "the key does not depend on the tenant"
    );
    assert_eq!(globex_entry.attempt, 1);
    assert_eq!(globex_entry.status(), pb::Status::Attempting);
    assert!(globex_entry.result.is_empty());
    assert_eq!(
        lookup_as(&app, ACME, &acme_entry.key).await.expect("acme"),
        acme_entry
    );

    app.client
        .clone()
        .complete(as_tenant(
            success(&globex_entry.key, &globex.claim_token, b"globex's result"),
            GLOBEX,
        ))
        .await
        .expect("globex completes its own");

    let acme_again = claim_as(&app, ACME, claim_req(RUN, TOOL, ARGS)).await;
    assert_eq!(acme_again.outcome(), pb::Outcome::Replayed);
    let replayed = acme_again.entry.expect("entry");
    assert_eq!(replayed.result, &b"acme's result"[..]);
    assert_eq!(replayed.replay_count, 1);
    let globex_now = lookup_as(&app, GLOBEX, &globex_entry.key)
        .await
        .expect("globex");
    assert_eq!(globex_now.result, &b"globex's result"[..]);
    assert_eq!(globex_now.replay_count, 0, "acme's replay is not globex's");
    assert_eq!(
        lookup_as(&app, ACME, &acme_entry.key).await.expect("acme"),
        pb::Entry {
            replay_count: 1,
            ..acme_entry
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_answer_without_a_credential_on_a_server_with_tenants() {
    let (app, _dir) = tenants_app(Backend::Sqlite).await;
    assert_eq!(
        app.health("").await.expect("health"),
        ServingStatus::Serving
    );
    assert_eq!(
        app.health("idempotency.v1.LedgerService")
            .await
            .expect("health"),
        ServingStatus::Serving
    );
    let (v1, v1alpha) = reflected_services(app.channel.clone()).await;
    assert!(
        v1.iter().any(|s| s == "idempotency.v1.LedgerService"),
        "{v1:?}"
    );
    assert!(
        v1alpha.iter().any(|s| s == "idempotency.v1.LedgerService"),
        "{v1alpha:?}"
    );
    // While the ledger itself still wants one.
    let err = app
        .client
        .clone()
        .claim(claim_req(RUN, TOOL, ARGS))
        .await
        .expect_err("no credential");
    assert_error(&err, Code::Unauthenticated, "UNAUTHENTICATED", None);
}
