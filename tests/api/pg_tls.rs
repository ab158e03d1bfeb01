//! TLS to PostgreSQL as libpq's URL parameters ask for it (`sslmode`, `sslrootcert`, `sslcert`,
//! `sslkey`), against clusters that speak only TLS (`hostssl` lines alone) with a server
//! certificate for `localhost` from a test CA: the real binary connects and says the link is
//! encrypted, and every way of getting it wrong keeps health NOT_SERVING with one log line that
//! says why, in the words of whoever refused, however many probes fail the same way.

use std::time::Duration;

use idempotency_ledger::grpc::pb;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::grpc_api::key_req;
use crate::support::clusters::{HBA_CLIENT_CERT, HBA_TLS_ONLY, LedgerProcess, Pki, url_with};
use crate::support::postgres::PgCluster;
use crate::support::{claim_req, success};

/// What the probe logs when it finds the store unusable.
const NOT_READY: &str = "store not ready for calls: health NOT_SERVING";

/// A new database on `cluster` (a blocking call, hence `block_in_place`).
fn database(cluster: &PgCluster) -> String {
    tokio::task::block_in_place(|| cluster.create_database())
}

fn cluster(pki: &Pki, hba: &str) -> PgCluster {
    tokio::task::block_in_place(|| pki.cluster(hba))
}

/// The database name at the end of a harness URL.
fn db_name(url: &str) -> &str {
    url.rsplit('/').next().expect("a database name")
}

/// Claims, completes, looks up and replays one key through `server`.
async fn serves_claims(server: &LedgerProcess) {
    let mut client = server.client().await;
    let args = r#"{"to":"ops@example.com"}"#;
    let claimed = client
        .claim(claim_req("run-tls", "send_email", args))
        .await
        .expect("a claim over the encrypted store")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let key = claimed.entry.expect("entry").key;
    client
        .complete(success(&key, &claimed.claim_token, b"sent"))
        .await
        .expect("complete");
    let found = client
        .lookup(key_req(&key))
        .await
        .expect("lookup")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(found.status(), pb::Status::Succeeded);
    assert_eq!(found.result, &b"sent"[..]);
    let replay = client
        .claim(claim_req("run-tls", "send_email", args))
        .await
        .expect("replay")
        .into_inner();
    assert_eq!(replay.outcome(), pb::Outcome::Replayed);
}

/// Starts the binary on `url`, which `cluster` refuses, and checks what it does about it: one
/// NOT_SERVING line whose error contains every one of `words` (and says where the store is),
/// health NOT_SERVING, ledger calls UNAVAILABLE; and, while `cluster` logs `pg_says` for at
/// least three more refused connections (the probe kept trying), still that one line.
async fn refused(cluster: &PgCluster, url: &str, words: &[&str], pg_says: &str) -> String {
    let server = LedgerProcess::spawn(url, &[]);
    let line = server
        .wait_for_log(NOT_READY, Duration::from_secs(20))
        .await;
    for word in words {
        assert!(line.contains(word), "{word:?} in the log line:\n{line}");
    }
    assert!(
        line.contains("error=") && line.contains("port=") && line.contains("user=postgres"),
        "the error and where the store is:\n{line}"
    );
    assert_eq!(
        server.health().await,
        Ok(ServingStatus::NotServing),
        "{}",
        server.log()
    );
    let err = server
        .client()
        .await
        .claim(claim_req("run-tls", "send_email", "{}"))
        .await
        .expect_err("no claim without a store");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    // The probe runs every 200 ms: the server saw the same refusal several times more.
    let seen = server_log_count(cluster, pg_says);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server_log_count(cluster, pg_says) < seen + 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "PostgreSQL did not log {pg_says:?} three more times within 10 s (the probe stopped \
             trying?); its log:\n{}",
            cluster.server_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        server.lines_with(NOT_READY).len(),
        1,
        "a cause that does not change is logged once, not once per probe:\n{}",
        server.log()
    );
    assert_eq!(server.health().await, Ok(ServingStatus::NotServing));
    line
}

fn server_log_count(cluster: &PgCluster, needle: &str) -> usize {
    cluster.server_log().matches(needle).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_verify_full_and_the_test_ca_the_server_connects_serves_claims_and_logs_the_link_encrypted()
 {
    let pki = Pki::new();
    let cluster = cluster(&pki, HBA_TLS_ONLY);
    let url = url_with(
        &database(&cluster),
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            pki.path("ca.pem").display()
        ),
    );
    let server = LedgerProcess::spawn(&url, &[]);
    server
        .wait_for_health(ServingStatus::Serving, Duration::from_secs(20))
        .await;
    let line = server
        .wait_for_log("store connection", Duration::from_secs(1))
        .await;
    for word in [
        "encrypted=true",
        "tls=\"TLSv1.3\"",
        "sslmode=\"verify-full\"",
    ] {
        assert!(line.contains(word), "{word} in:\n{line}");
    }
    assert!(
        server.lines_with(NOT_READY).is_empty(),
        "never refused:\n{}",
        server.log()
    );
    serves_claims(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_a_ca_the_url_does_not_trust_is_refused_and_logged_once_with_why()
{
    let pki = Pki::new();
    let cluster = cluster(&pki, HBA_TLS_ONLY);
    let url = url_with(
        &database(&cluster),
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            pki.path("other-ca.pem").display()
        ),
    );
    // rustls' word for a certificate no trusted CA signed.
    refused(
        &cluster,
        &url,
        &[
            "invalid peer certificate",
            "UnknownIssuer",
            "host=localhost",
        ],
        "could not accept SSL connection",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_certificate_for_another_host_name_and_the_log_names_both() {
    let pki = Pki::new();
    let cluster = cluster(&pki, HBA_TLS_ONLY);
    // The certificate is for `localhost` only: 127.0.0.1 is another name.
    let url = url_with(
        &database(&cluster),
        "127.0.0.1",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            pki.path("ca.pem").display()
        ),
    );
    refused(
        &cluster,
        &url,
        &[
            "invalid peer certificate",
            "not valid for name \"127.0.0.1\"",
            "localhost",
        ],
        "could not accept SSL connection",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_disable_against_a_tls_only_cluster_is_refused_in_postgres_own_words() {
    let pki = Pki::new();
    let cluster = cluster(&pki, HBA_TLS_ONLY);
    let db_url = database(&cluster);
    let url = url_with(&db_url, "127.0.0.1", "sslmode=disable");
    let pg_words = format!(
        "no pg_hba.conf entry for host \"127.0.0.1\", user \"postgres\", database \"{}\", no \
         encryption",
        db_name(&db_url)
    );
    refused(&cluster, &url, &[&pg_words], "no pg_hba.conf entry").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_certificate_the_server_connects_where_pg_hba_demands_one() {
    use sqlx::Connection as _;
    let pki = Pki::new();
    let cluster = cluster(&pki, HBA_CLIENT_CERT);
    let url = url_with(
        &database(&cluster),
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            pki.path("ca.pem").display(),
            pki.path("client.pem").display(),
            pki.path("client.key").display()
        ),
    );
    let server = LedgerProcess::spawn(&url, &[]);
    server
        .wait_for_health(ServingStatus::Serving, Duration::from_secs(20))
        .await;
    let line = server
        .wait_for_log("store connection", Duration::from_secs(1))
        .await;
    assert!(line.contains("encrypted=true"), "{line}");
    serves_claims(&server).await;

    // PostgreSQL's side: the server's sessions were authenticated by the certificate.
    let mut admin = sqlx::PgConnection::connect(&url_with(
        &cluster.url("postgres"),
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            pki.path("ca.pem").display()
        ),
    ))
    .await
    .expect("connect as the harness");
    let (sessions, by_certificate): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl AND s.client_dn = '/CN=postgres') \
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = 'idempotency-ledger'",
    )
    .fetch_one(&mut admin)
    .await
    .expect("pg_stat_ssl");
    assert!(sessions > 0, "the server has sessions open");
    assert_eq!(
        by_certificate, sessions,
        "every session of the server presented its certificate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_certificate_the_server_is_refused_where_pg_hba_demands_one() {
    let pki = Pki::new();
    let cluster = cluster(&pki, HBA_CLIENT_CERT);
    let url = url_with(
        &database(&cluster),
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            pki.path("ca.pem").display()
        ),
    );
    let pg_words = "connection requires a valid client certificate";
    let line = refused(&cluster, &url, &[pg_words], pg_words).await;
    // The link itself was fine: the refusal is the database's, not a TLS failure.
    assert!(!line.contains("invalid peer certificate"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_database_stops_letting_the_server_in_calls_answer_unavailable_not_internal() {
    let pki = Pki::new();
    let cluster = cluster(&pki, HBA_CLIENT_CERT);
    let url = url_with(
        &database(&cluster),
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            pki.path("ca.pem").display(),
            pki.path("client.pem").display(),
            pki.path("client.key").display()
        ),
    );
    let server = LedgerProcess::spawn(&url, &["--db-acquire-timeout", "2s"]);
    server
        .wait_for_health(ServingStatus::Serving, Duration::from_secs(20))
        .await;
    let mut client = server.client().await;
    client
        .claim(claim_req("run-tls", "send_email", r#"{"n":0}"#))
        .await
        .expect("a claim while the database lets the server in");

    // An operator's change (a revoked certificate, a rotated password, a pg_hba.conf line)
    // refuses the server's new sessions: the database's condition, not the ledger's bug.
    let hba = cluster.data_dir().join("pg_hba.conf");
    std::fs::write(
        &hba,
        "hostssl postgres postgres 127.0.0.1/32 trust\nhostssl all all 127.0.0.1/32 reject\n",
    )
    .expect("rewrite pg_hba.conf");
    tokio::task::block_in_place(|| cluster.restart());

    let line = server
        .wait_for_log("pg_hba.conf rejects connection", Duration::from_secs(10))
        .await;
    assert!(line.contains(NOT_READY), "{line}");
    assert_eq!(server.health().await, Ok(ServingStatus::NotServing));
    let mut answers = Vec::new();
    for n in 1..=5 {
        let args = format!(r#"{{"n":{n}}}"#);
        let err = client
            .claim(claim_req("run-tls", "send_email", &args))
            .await
            .expect_err("no claim while the database refuses the server");
        answers.push(format!("{:?} {}", err.code(), crate::support::reason(&err)));
    }
    assert!(
        answers.iter().all(|a| a == "Unavailable STORE_UNAVAILABLE"),
        "a database that refuses the server's sessions is unavailable, not an internal error \
         (the kind of every other condition an operator can act on): {answers:?}\n{line}"
    );
}
