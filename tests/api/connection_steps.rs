//! Every failure to open or use a connection to PostgreSQL is `UNAVAILABLE` `STORE_UNAVAILABLE`
//! with `RetryInfo`, never `INTERNAL`, whichever step it dies in: the TCP connect, the answer to
//! `SSLRequest`, the TLS handshake, the startup packet, authentication, or a statement on a live
//! connection. The real binary reaches a real cluster through the harness's TCP proxy, which
//! refuses, accepts and closes, or cuts each connection after `n` bytes in one direction, with
//! `n` chosen to land in the step; under `sslmode=prefer` and `sslmode=disable` (and `require`
//! where the cluster speaks TLS). While the proxy lets no connection through, health is
//! NOT_SERVING and every kind of call (Claim, Complete, Lookup, Reconcile) is answered so over
//! real gRPC; once it passes traffic again, the server serves without a restart. The probe's
//! log line shows where connections died, in sqlx's (or rustls') words.

use std::net::SocketAddr;
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

use crate::grpc_api::key_req;
use crate::support::clusters::{HBA_TLS_ONLY, LedgerProcess, Pki};
use crate::support::postgres::{ClusterSetup, PgCluster};
use crate::support::proxy::{Direction, Phase, Proxy};
use crate::support::{claim_req, reason, success};

const RUN: &str = "run-steps";
const TOOL: &str = "send_invoice";
/// What the probe logs when it finds the store unusable.
const NOT_READY: &str = "store not ready for calls: health NOT_SERVING";

/// A request that gives up after 15 s, so that a call stuck on a dead link fails the test
/// instead of hanging it.
fn bounded<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_secs(15));
    request
}

/// A database behind the proxy: the cluster's address and a harness URL naming the database
/// (`postgres://user[:password]@127.0.0.1:PORT/DB`), to which `query` is appended.
struct Target {
    upstream: SocketAddr,
    url: String,
}

impl Target {
    /// A new database on the cluster every test of the process shares.
    fn on_shared_cluster() -> Target {
        let cluster = PgCluster::shared();
        Target {
            upstream: addr_of(cluster),
            url: tokio::task::block_in_place(|| cluster.create_database()),
        }
    }
}

fn addr_of(cluster: &PgCluster) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], cluster.port()))
}

/// One answer of the ledger while the link is broken.
#[derive(Debug)]
#[allow(dead_code)]
struct Answer {
    call: &'static str,
    code: Code,
    reason: String,
    retry_info: bool,
}

impl Answer {
    fn of(call: &'static str, result: Result<(), tonic::Status>) -> Answer {
        match result {
            Ok(()) => Answer {
                call,
                code: Code::Ok,
                reason: String::new(),
                retry_info: false,
            },
            Err(status) => Answer {
                call,
                code: status.code(),
                reason: reason(&status),
                retry_info: status.get_details_retry_info().is_some(),
            },
        }
    }

    fn is_store_unavailable(&self) -> bool {
        self.code == Code::Unavailable && self.reason == "STORE_UNAVAILABLE" && self.retry_info
    }
}

/// An entry the server completed while the link was fine: the calls under the fault touch it.
struct Known {
    key: String,
    token: String,
}

/// Claims and completes a fresh key through `client` (`tag` and `n` make the arguments).
async fn claim_and_complete(client: &mut LedgerServiceClient<Channel>, tag: &str, n: u32) -> Known {
    let claimed = client
        .claim(bounded(claim_req(
            RUN,
            TOOL,
            &format!(r#"{{"tag":"{tag}","n":{n}}}"#),
        )))
        .await
        .expect("a claim while the link is fine")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let key = claimed.entry.expect("entry").key;
    client
        .complete(bounded(success(&key, &claimed.claim_token, b"sent")))
        .await
        .expect("a completion while the link is fine");
    Known {
        key,
        token: claimed.claim_token,
    }
}

/// One call of each kind: a Claim of a fresh key, a Complete and a Lookup of `known`, a
/// Reconcile.
async fn one_of_each(
    client: &mut LedgerServiceClient<Channel>,
    known: &Known,
    n: u32,
) -> Vec<Answer> {
    let args = format!(r#"{{"during":{n},"key":"{}"}}"#, known.key);
    vec![
        Answer::of(
            "claim",
            client
                .claim(bounded(claim_req(RUN, TOOL, &args)))
                .await
                .map(drop),
        ),
        Answer::of(
            "complete",
            client
                .complete(bounded(success(&known.key, &known.token, b"sent")))
                .await
                .map(drop),
        ),
        Answer::of(
            "lookup",
            client.lookup(bounded(key_req(&known.key))).await.map(drop),
        ),
        Answer::of(
            "reconcile",
            client
                .reconcile(bounded(pb::ReconcileRequest {
                    limit: 10,
                    ..Default::default()
                }))
                .await
                .map(drop),
        ),
    ]
}

/// Where the proxy's fault stops the server's new connections.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// Nothing listens: the kernel refuses the connection.
    Refused,
    /// Accepted and closed before a byte is answered.
    ClosedAtAccept,
    /// Cut in this phase of the protocol, and in no other.
    CutIn(Phase),
}

/// Starts the binary on `target` through a new proxy (with `query` on the URL), checks that it
/// serves, applies `fault` to the proxy (which then resets every open connection, so that the
/// server must open new ones through the fault), and checks: health NOT_SERVING; the probe's
/// log line naming the cause with one of `evidence` (where connections died, in the driver's
/// words); a call of each kind answered UNAVAILABLE STORE_UNAVAILABLE with RetryInfo;
/// health still NOT_SERVING; the new connections stopped where `stop` says, each call's
/// among them (one call may take a connection opened before the fault, which the reset
/// closed: the store is unavailable to it all the same). Then the proxy passes traffic again and the same server serves.
async fn unavailable_while(
    target: &Target,
    query: &str,
    fault: impl Fn(&Proxy),
    stop: Stop,
    evidence: &[&str],
) {
    let proxy = Proxy::start(target.upstream).await;
    let url = format!("{}?{query}", proxy.url_for(&target.url));
    let server = LedgerProcess::spawn(
        &url,
        &["--db-acquire-timeout", "1s", "--db-max-connections", "4"],
    );
    server
        .wait_for_health(ServingStatus::Serving, Duration::from_secs(30))
        .await;
    let mut client = server.client().await;
    // Each run's own keys, on a database the test's other runs share.
    let tag = format!("{query} via {}", proxy.addr());
    let known = claim_and_complete(&mut client, &tag, 0).await;

    fault(&proxy);
    proxy.reset_all();
    let before = proxy.stats();
    let cuts_before = proxy.cuts_by_phase();
    server
        .wait_for_health(ServingStatus::NotServing, Duration::from_secs(15))
        .await;
    let line = wait_for_any(&server, evidence, Duration::from_secs(15)).await;
    eprintln!("{query}: {line}");
    assert!(
        line.contains(NOT_READY) && line.contains("kind=\"unavailable\""),
        "the probe's NOT_SERVING line names the cause as unavailable ({query}):\n{line}"
    );
    let answers = one_of_each(&mut client, &known, 1).await;
    assert!(
        answers.iter().all(Answer::is_store_unavailable),
        "every call while connections die there ({query}) is UNAVAILABLE STORE_UNAVAILABLE with \
         RetryInfo: {answers:#?}\n{}",
        server.log()
    );
    assert_eq!(
        server.health().await,
        Ok(ServingStatus::NotServing),
        "{}",
        server.log()
    );
    let after = proxy.stats();
    let calls = u64::try_from(answers.len()).expect("a count");
    let cuts_after = proxy.cuts_by_phase();
    let stopped = match stop {
        Stop::Refused => after.connections == before.connections,
        Stop::ClosedAtAccept => after.closed_at_accept >= before.closed_at_accept + calls,
        // A connection open when the fault was armed may carry a statement before the reset
        // closes it, and be cut in it (Ready): any other phase is the fault landing elsewhere.
        Stop::CutIn(phase) => cuts_before.iter().zip(&cuts_after).all(|((p, b), (_, a))| {
            if *p == phase {
                *a >= b + calls
            } else {
                a == b || *p == Phase::Ready
            }
        }),
    };
    assert!(
        stopped,
        "the server's new connections, one per call at least, stopped as {stop:?} says \
         ({query}): {before:?} -> {after:?}, cuts by phase {cuts_before:?} -> {cuts_after:?}"
    );

    proxy.clear();
    server
        .wait_for_health(ServingStatus::Serving, Duration::from_secs(20))
        .await;
    claim_and_complete(&mut client, &tag, 1).await;
    let found = client
        .lookup(bounded(key_req(&known.key)))
        .await
        .expect("the entry completed before the fault")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(found.status(), pb::Status::Succeeded);
    assert!(
        server.lines_with("internal").is_empty(),
        "nothing was internal ({query}):\n{}",
        server.log()
    );
}

/// The first log line with one of `needles`; panics with the log after `within`.
async fn wait_for_any(server: &LedgerProcess, needles: &[&str], within: Duration) -> String {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(line) = server
            .log()
            .lines()
            .find(|l| l.contains(NOT_READY) && needles.iter().any(|n| l.contains(n)))
        {
            return line.to_string();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no NOT_SERVING line with any of {needles:?} within {within:?}; the log:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the probe logs when every connection it opens is reset: an I/O error of sqlx's, where
/// the store opens a connection (not on a live one, which the fault's reset closed first).
const RESET_WHILE_OPENING: &str =
    "cannot open a connection: error communicating with database: Connection reset by peer";

/// The length of the server's answer to `SSLRequest` under `sslmode`: one byte, or none when
/// the client does not ask.
fn ssl_answer(query: &str) -> u64 {
    u64::from(!query.contains("sslmode=disable"))
}

/// The length of `SSLRequest` under `sslmode`: eight bytes, or none.
fn ssl_request(query: &str) -> u64 {
    8 * ssl_answer(query)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_tcp_connect_is_unavailable_with_retry_info() {
    let target = Target::on_shared_cluster();
    for query in ["sslmode=prefer", "sslmode=disable"] {
        unavailable_while(
            &target,
            query,
            |proxy| proxy.refuse_connections(true),
            Stop::Refused,
            &["Connection refused"],
        )
        .await;
    }
}

/// What HAProxy does while no backend passes its check: accept the connection and close it.
/// Under `prefer` sqlx reads the end of the stream as the answer 0x00 to its `SSLRequest`, a
/// `Protocol` error (INTERNAL before it was classified by where it arose); under `disable`,
/// as an I/O error where it waits for the authentication request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_accepts_and_closes_is_unavailable_not_internal() {
    let target = Target::on_shared_cluster();
    unavailable_while(
        &target,
        "sslmode=prefer",
        |proxy| proxy.close_new_connections(true),
        Stop::ClosedAtAccept,
        &["cannot open a connection: encountered unexpected or invalid data: unexpected response from SSLRequest: 0x00"],
    )
    .await;
    unavailable_while(
        &target,
        "sslmode=disable",
        |proxy| proxy.close_new_connections(true),
        Stop::ClosedAtAccept,
        &["cannot open a connection: error communicating with database: expected to read 5 bytes, got 0 bytes at EOF"],
    )
    .await;
}

/// PostgreSQL's first byte never arrives: the answer to `SSLRequest` (prefer), or the
/// authentication request (disable), meets a reset link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_at_postgres_first_answer_is_unavailable() {
    let target = Target::on_shared_cluster();
    for query in ["sslmode=prefer", "sslmode=disable"] {
        unavailable_while(
            &target,
            query,
            |proxy| proxy.cut_each_connection_after(Direction::ToClient, 0),
            Stop::CutIn(if query.contains("disable") {
                Phase::Startup
            } else {
                Phase::SslAnswer
            }),
            &[RESET_WHILE_OPENING],
        )
        .await;
    }
}

/// The startup packet reaches PostgreSQL cut short: the client's bytes end a few into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_in_the_startup_packet_is_unavailable() {
    let target = Target::on_shared_cluster();
    for query in ["sslmode=prefer", "sslmode=disable"] {
        let n = ssl_request(query) + 12;
        unavailable_while(
            &target,
            query,
            move |proxy| proxy.cut_each_connection_after(Direction::ToServer, n),
            Stop::CutIn(Phase::Startup),
            &[RESET_WHILE_OPENING],
        )
        .await;
    }
}

/// A cluster that speaks TLS only: the handshake is cut in the server's flight (its
/// ServerHello and certificate) or in the client's ClientHello.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_in_the_tls_handshake_is_unavailable() {
    let pki = Pki::new();
    let cluster = tokio::task::block_in_place(|| pki.cluster(HBA_TLS_ONLY));
    let target = Target {
        upstream: addr_of(&cluster),
        url: tokio::task::block_in_place(|| cluster.create_database()),
    };
    for query in ["sslmode=prefer", "sslmode=require"] {
        // One byte of the answer to SSLRequest ('S'), then a hundred of the server's flight.
        unavailable_while(
            &target,
            query,
            |proxy| proxy.cut_each_connection_after(Direction::ToClient, 1 + 100),
            Stop::CutIn(Phase::Tls),
            &[RESET_WHILE_OPENING],
        )
        .await;
    }
    // Eight bytes of SSLRequest, then forty of the ClientHello.
    unavailable_while(
        &target,
        "sslmode=prefer",
        |proxy| proxy.cut_each_connection_after(Direction::ToServer, 8 + 40),
        Stop::CutIn(Phase::Tls),
        &[RESET_WHILE_OPENING],
    )
    .await;
}

/// Authentication by password (SCRAM-SHA-256): the link is cut in PostgreSQL's
/// AuthenticationSASLContinue, after its AuthenticationSASL (24 bytes: the message, its
/// length, the code 10 and the one mechanism `SCRAM-SHA-256` without TLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_during_authentication_is_unavailable() {
    let cluster = tokio::task::block_in_place(|| {
        PgCluster::start_with(ClusterSetup::default().hba(
            "host postgres postgres 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 scram-sha-256\n",
        ))
    });
    // A cluster of this test's own: the names are free.
    let database = "steps_auth";
    {
        use sqlx::{Connection as _, Executor as _};
        let mut admin = sqlx::PgConnection::connect(&cluster.url("postgres"))
            .await
            .expect("connect as the harness");
        admin
            .execute("CREATE ROLE ledger LOGIN PASSWORD 'a-scram-secret'")
            .await
            .expect("create the role");
        admin
            .execute("CREATE DATABASE steps_auth OWNER ledger")
            .await
            .expect("create the database");
    }
    let target = Target {
        upstream: addr_of(&cluster),
        url: format!(
            "postgres://ledger:a-scram-secret@127.0.0.1:{}/{database}",
            cluster.port()
        ),
    };
    for query in ["sslmode=prefer", "sslmode=disable"] {
        let n = ssl_answer(query) + 24 + 20;
        unavailable_while(
            &target,
            query,
            move |proxy| proxy.cut_each_connection_after(Direction::ToClient, n),
            Stop::CutIn(Phase::Authentication),
            &[RESET_WHILE_OPENING],
        )
        .await;
    }
}

/// A statement on a live connection meets a link cut in the middle of it: the server's
/// answer (a Lookup's 64 KiB result) or the client's statement (a Claim's 64 KiB arguments)
/// is cut after 16 KiB of it. Small statements (the probe's) still pass, so health is not
/// the point here: every call that carries more than the cut is UNAVAILABLE, and the next
/// ones are answered once the link passes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_statement_is_unavailable() {
    let target = Target::on_shared_cluster();
    for query in ["sslmode=prefer", "sslmode=disable"] {
        let proxy = Proxy::start(target.upstream).await;
        let url = format!("{}?{query}", proxy.url_for(&target.url));
        let server = LedgerProcess::spawn(&url, &["--db-acquire-timeout", "1s"]);
        server
            .wait_for_health(ServingStatus::Serving, Duration::from_secs(30))
            .await;
        let mut client = server.client().await;
        let large = "r".repeat(64 * 1024);
        let claimed = client
            .claim(bounded(claim_req(
                RUN,
                TOOL,
                &format!(r#"{{"large":"result","query":"{query}"}}"#),
            )))
            .await
            .expect("claim")
            .into_inner();
        let key = claimed.entry.expect("entry").key;
        client
            .complete(bounded(success(
                &key,
                &claimed.claim_token,
                large.as_bytes(),
            )))
            .await
            .expect("complete with a large result");

        let mut answers = Vec::new();
        proxy.cut_each_connection_after(Direction::ToClient, 16 * 1024);
        for _ in 0..3 {
            answers.push(Answer::of(
                "lookup",
                client.lookup(bounded(key_req(&key))).await.map(drop),
            ));
        }
        proxy.stop_cutting_each_connection();
        proxy.cut_each_connection_after(Direction::ToServer, 16 * 1024);
        for n in 0..3 {
            let args = format!(r#"{{"n":{n},"query":"{query}","large":"{large}"}}"#);
            answers.push(Answer::of(
                "claim",
                client
                    .claim(bounded(claim_req(RUN, TOOL, &args)))
                    .await
                    .map(drop),
            ));
        }
        assert!(
            answers.iter().all(Answer::is_store_unavailable),
            "every call cut mid-statement ({query}) is UNAVAILABLE STORE_UNAVAILABLE with \
             RetryInfo: {answers:#?}\n{}",
            server.log()
        );
        assert!(
            proxy.cuts_at(Phase::Ready) >= 6
                && proxy.stats().connection_cuts == proxy.cuts_at(Phase::Ready),
            "each call was cut in the middle of its statement, on a ready connection: {:?}",
            proxy.cuts_by_phase()
        );

        proxy.clear();
        let found = client
            .lookup(bounded(key_req(&key)))
            .await
            .expect("a lookup once the link passes")
            .into_inner()
            .entry
            .expect("entry");
        assert_eq!(found.result, large.as_bytes());
        client
            .claim(bounded(claim_req(
                RUN,
                TOOL,
                &format!(r#"{{"after":"{large}","query":"{query}"}}"#),
            )))
            .await
            .expect("a large claim once the link passes");
        assert!(
            server.lines_with("internal").is_empty(),
            "nothing was internal ({query}):\n{}",
            server.log()
        );
    }
}
