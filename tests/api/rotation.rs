//! Credentials rotated without a restart: the real server binary re-reads its tokens file and
//! its TLS certificate and key on SIGHUP, puts each in force whole, keeps the old one when the
//! new one does not parse, and no call fails while they are swapped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};
use tonic::{Code, Request};

use crate::support::{Backend, ServerProcess, TestDb, claim_req, plain, success};

/// `message` with the bearer credential `token`.
fn as_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

/// Sends `signal` (`HUP`, `TERM`) to the server process.
pub(crate) fn signal(server: &ServerProcess, signal: &str) {
    let pid = server.child.id().expect("running");
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success());
}

/// The server's log after start-up, without colour.
fn log_of(server: &ServerProcess) -> String {
    plain(&server.log.lock().expect("log"))
}

/// Waits until the server's log holds `needle` `n` times; panics with the log after 20 s.
pub(crate) async fn wait_for_log(server: &ServerProcess, needle: &str, n: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = log_of(server);
        if log.matches(needle).count() >= n {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} not logged {n} times within 20 s:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Replaces `path`'s contents at once, as operators (and configuration managers) do: the
/// server never reads a half-written file.
pub(crate) fn replace(path: &Path, contents: &[u8]) {
    let next = path.with_extension("next");
    std::fs::write(&next, contents).expect("write");
    std::fs::rename(&next, path).expect("rename");
}

/// A Claim of a fresh key as `token`: its code, OK or not.
async fn claim_code(client: &mut LedgerServiceClient<Channel>, token: &str, run: &str) -> Code {
    match client
        .claim(as_token(claim_req(run, "open_ticket", "{}"), token))
        .await
    {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

const TOKENS: &str = "# tenants\nacme tok-acme-1\nglobex tok-globex-1\nglobex tok-globex-2\n";

/// A server on SQLite with the tokens file `TOKENS` (the dir holds it as `tokens`).
async fn server_with_tokens(extra: &[&str]) -> (TestDb, tempfile::TempDir, ServerProcess) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("tokens");
    std::fs::write(&path, TOKENS).expect("write");
    let db = TestDb::new(Backend::Sqlite);
    let mut args = vec!["--auth-tokens-file", path.to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    let server = ServerProcess::start(&db.url, &args).await;
    (db, dir, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sighup_a_new_token_works_and_a_removed_one_is_refused_within_a_second() {
    let (_db, dir, server) = server_with_tokens(&[]).await;
    let mut client = server.client().await;
    assert_eq!(
        claim_code(&mut client, "tok-globex-1", "r-1").await,
        Code::Ok
    );
    assert_eq!(
        claim_code(&mut client, "tok-acme-2", "r-2").await,
        Code::Unauthenticated
    );

    replace(
        &dir.path().join("tokens"),
        b"acme tok-acme-1\nacme tok-acme-2\nglobex tok-globex-2\n",
    );
    let signalled = Instant::now();
    signal(&server, "HUP");
    loop {
        let added = claim_code(&mut client, "tok-acme-2", "r-3").await;
        let removed = claim_code(&mut client, "tok-globex-1", "r-4").await;
        if added == Code::Ok && removed == Code::Unauthenticated {
            break;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(1),
            "a second after SIGHUP the new token gets {added:?} and the removed one {removed:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let swapped = signalled.elapsed();
    // The new token is acme's: it sees acme's entries, and the kept tokens still work.
    let mine = client
        .claim(as_token(
            claim_req("r-1", "open_ticket", "{}"),
            "tok-acme-2",
        ))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(mine.outcome(), pb::Outcome::Claimed, "r-1 was globex's");
    let again = client
        .claim(as_token(
            claim_req("r-1", "open_ticket", "{}"),
            "tok-acme-1",
        ))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(again.outcome(), pb::Outcome::InProgress, "the same tenant");
    assert_eq!(
        claim_code(&mut client, "tok-globex-2", "r-5").await,
        Code::Ok
    );

    let log = wait_for_log(&server, "reload: the tokens file is in force", 1).await;
    let line = log
        .lines()
        .find(|l| l.contains("reload: the tokens file is in force"))
        .expect("line");
    assert!(
        line.contains("added=1") && line.contains("removed=1"),
        "{line}"
    );
    assert!(
        !log.contains("tok-"),
        "no token is ever logged (swapped after {swapped:?}):\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokens_file_that_does_not_parse_keeps_the_old_tokens_and_the_log_names_the_line() {
    let (_db, dir, server) = server_with_tokens(&[]).await;
    let path = dir.path().join("tokens");
    let mut client = server.client().await;
    // Line 3 has a token and no tenant (or a tenant and no token): which, the server cannot
    // know, so it repeats nothing of the line.
    replace(
        &path,
        b"acme tok-acme-1\nacme tok-acme-new\ntok-secret-alone\n",
    );
    signal(&server, "HUP");
    let log = wait_for_log(&server, "reload: the tokens file was not taken", 1).await;
    let line = log
        .lines()
        .find(|l| l.contains("reload: the tokens file was not taken"))
        .expect("line");
    assert!(line.contains("line 3"), "{line}");
    assert!(line.contains(&path.display().to_string()), "{line}");
    assert!(!log.contains("tok-"), "no token is ever logged:\n{log}");
    assert_eq!(
        claim_code(&mut client, "tok-globex-1", "r-1").await,
        Code::Ok
    );
    assert_eq!(
        claim_code(&mut client, "tok-acme-new", "r-2").await,
        Code::Unauthenticated,
        "nothing of the broken file is in force"
    );

    // A file that is gone (a deploy that removed it first) is the same: the old tokens stay.
    std::fs::remove_file(&path).expect("remove");
    signal(&server, "HUP");
    let log = wait_for_log(&server, "reload: the tokens file was not taken", 2).await;
    assert!(log.contains("cannot read"), "{log}");
    assert_eq!(
        claim_code(&mut client, "tok-globex-2", "r-3").await,
        Code::Ok
    );

    // And a good file afterwards is taken.
    replace(&path, b"acme tok-acme-new\n");
    signal(&server, "HUP");
    wait_for_log(&server, "reload: the tokens file is in force", 1).await;
    assert_eq!(
        claim_code(&mut client, "tok-acme-new", "r-4").await,
        Code::Ok
    );
    assert_eq!(
        claim_code(&mut client, "tok-globex-2", "r-5").await,
        Code::Unauthenticated
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_finishes_under_the_credential_it_started_with() {
    let (_db, dir, server) = server_with_tokens(&[]).await;
    let mut client = server.client().await;
    let first = client
        .claim(as_token(
            claim_req("r-wait", "open_ticket", "{}"),
            "tok-globex-1",
        ))
        .await
        .expect("claim")
        .into_inner();
    let key = first.entry.as_ref().expect("entry").key.clone();
    // A second claim waits for the first attempt, under tok-globex-1.
    let waiter = {
        let mut client = client.clone();
        tokio::spawn(async move {
            client
                .claim(as_token(
                    pb::ClaimRequest {
                        wait: Some(prost_types::Duration {
                            seconds: 20,
                            nanos: 0,
                        }),
                        ..claim_req("r-wait", "open_ticket", "{}")
                    },
                    "tok-globex-1",
                ))
                .await
        })
    };
    // Wait until the waiter is in the server (a claim that waits is IN_PROGRESS meanwhile).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter waits");

    replace(
        &dir.path().join("tokens"),
        b"acme tok-acme-1\nglobex tok-globex-2\n",
    );
    signal(&server, "HUP");
    wait_for_log(&server, "reload: the tokens file is in force", 1).await;
    assert_eq!(
        claim_code(&mut client, "tok-globex-1", "r-other").await,
        Code::Unauthenticated,
        "the removed token is refused for new calls"
    );
    assert!(!waiter.is_finished(), "the waiter still waits");
    // The tenant completes through its other token; the waiter, admitted under the removed
    // one, gets the result.
    client
        .complete(as_token(
            success(&key, &first.claim_token, b"done"),
            "tok-globex-2",
        ))
        .await
        .expect("complete");
    let waited = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter is answered")
        .expect("task")
        .expect("the call in flight is not refused")
        .into_inner();
    assert_eq!(waited.outcome(), pb::Outcome::Replayed);
    assert_eq!(waited.entry.expect("entry").result.as_ref(), b"done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_no_tokens_file_and_no_tls_changes_nothing_and_says_so() {
    let db = TestDb::new(Backend::Sqlite);
    let server = ServerProcess::start(&db.url, &[]).await;
    let mut client = server.client().await;
    signal(&server, "HUP");
    let log = wait_for_log(&server, "reload: nothing to re-read", 1).await;
    assert!(!log.contains("WARN"), "{log}");
    client
        .claim(claim_req("r-1", "open_ticket", "{}"))
        .await
        .expect("still serving, still one tenant without a credential");
    signal(&server, "HUP");
    wait_for_log(&server, "reload: nothing to re-read", 2).await;
    client
        .claim(claim_req("r-2", "open_ticket", "{}"))
        .await
        .expect("still serving");
}

/// A CA and a server certificate it signed for `name`, written to `dir` as
/// `<name>-ca.pem`, `<name>.pem` and `<name>.key`.
struct Issued {
    ca_pem: String,
    cert: PathBuf,
    key: PathBuf,
}

fn issue(dir: &Path, name: &str) -> Issued {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key")).expect("ca");
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec![name.to_string()])
        .expect("params")
        .signed_by(&key, &ca)
        .expect("cert");
    let issued = Issued {
        ca_pem: ca.pem(),
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    };
    std::fs::write(&issued.cert, cert.pem()).expect("write");
    std::fs::write(&issued.key, key.serialize_pem()).expect("write");
    issued
}

/// A new TLS connection to `port` that trusts only `ca_pem` and expects `name`.
async fn tls_channel(port: u16, ca_pem: &str, name: &str) -> Result<Channel, tonic::Status> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name(name);
    Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .expect("uri")
        .tls_config(tls)
        .expect("tls")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{e:?}")))
}

/// A Claim over `channel`: Ok, or the error.
async fn claim_over(channel: &Channel, run: &str) -> Result<(), tonic::Status> {
    LedgerServiceClient::new(channel.clone())
        .claim(claim_req(run, "open_ticket", "{}"))
        .await
        .map(|_| ())
}

/// A server on SQLite serving `live.pem`/`live.key` in a temp dir, first `first`'s.
async fn tls_server(first: &Issued, dir: &Path) -> (TestDb, ServerProcess, PathBuf, PathBuf) {
    let cert = dir.join("live.pem");
    let key = dir.join("live.key");
    std::fs::copy(&first.cert, &cert).expect("copy");
    std::fs::copy(&first.key, &key).expect("copy");
    let db = TestDb::new(Backend::Sqlite);
    let server = ServerProcess::start(
        &db.url,
        &[
            "--tls-cert",
            cert.to_str().expect("utf-8"),
            "--tls-key",
            key.to_str().expect("utf-8"),
        ],
    )
    .await;
    (db, server, cert, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sighup_new_connections_get_the_new_certificate_and_open_ones_keep_working() {
    let dir = tempfile::tempdir().expect("dir");
    let old = issue(dir.path(), "ledger-old.test");
    let new = issue(dir.path(), "ledger-new.test");
    let (_db, server, cert, key) = tls_server(&old, dir.path()).await;
    let port = server.addr.port();
    let open = tls_channel(port, &old.ca_pem, "ledger-old.test")
        .await
        .expect("the old certificate is served");
    claim_over(&open, "r-1").await.expect("claim");
    assert!(
        tls_channel(port, &new.ca_pem, "ledger-new.test")
            .await
            .is_err(),
        "the new certificate is not served yet"
    );

    replace(&cert, &std::fs::read(&new.cert).expect("read"));
    replace(&key, &std::fs::read(&new.key).expect("read"));
    signal(&server, "HUP");
    wait_for_log(
        &server,
        "reload: the TLS certificate and key are in force",
        1,
    )
    .await;

    let fresh = tls_channel(port, &new.ca_pem, "ledger-new.test")
        .await
        .expect("a new connection verifies the new certificate against the new CA and name");
    claim_over(&fresh, "r-2").await.expect("claim");
    assert!(
        tls_channel(port, &old.ca_pem, "ledger-old.test")
            .await
            .is_err(),
        "the old certificate is no longer served to new connections"
    );
    // The connection opened before the swap carries on (a reconnect would need the old
    // certificate, which is no longer served: this call can only succeed on it).
    claim_over(&open, "r-3")
        .await
        .expect("the open connection keeps working");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_or_mismatched_key_keeps_the_old_certificate_and_the_log_says_why() {
    let dir = tempfile::tempdir().expect("dir");
    let old = issue(dir.path(), "ledger-old.test");
    let new = issue(dir.path(), "ledger-new.test");
    let (_db, server, cert, key) = tls_server(&old, dir.path()).await;
    let port = server.addr.port();

    // A key that does not parse.
    replace(&key, b"-----BEGIN PRIVATE KEY-----\nsecret-key-material!\n");
    signal(&server, "HUP");
    let log = wait_for_log(&server, "reload: the TLS files were not taken", 1).await;
    assert!(log.contains("live.key"), "{log}");
    assert!(!log.contains("secret-key-material"), "{log}");
    let channel = tls_channel(port, &old.ca_pem, "ledger-old.test")
        .await
        .expect("the old certificate is still served");
    claim_over(&channel, "r-1").await.expect("claim");

    // A new certificate whose key was not replaced with it (a half-done deploy).
    replace(&key, &std::fs::read(&old.key).expect("read"));
    replace(&cert, &std::fs::read(&new.cert).expect("read"));
    signal(&server, "HUP");
    let log = wait_for_log(&server, "reload: the TLS files were not taken", 2).await;
    assert!(log.contains("does not match"), "{log}");
    let channel = tls_channel(port, &old.ca_pem, "ledger-old.test")
        .await
        .expect("the old certificate is still served");
    claim_over(&channel, "r-2").await.expect("claim");

    // Once the key follows, the pair is taken.
    replace(&key, &std::fs::read(&new.key).expect("read"));
    signal(&server, "HUP");
    wait_for_log(
        &server,
        "reload: the TLS certificate and key are in force",
        1,
    )
    .await;
    let channel = tls_channel(port, &new.ca_pem, "ledger-new.test")
        .await
        .expect("the new certificate is served");
    claim_over(&channel, "r-3").await.expect("claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_call_fails_while_tokens_and_certificates_are_swapped_by_several_sighups() {
    let dir = tempfile::tempdir().expect("dir");
    let other_dir = tempfile::tempdir().expect("dir");
    let one = issue(dir.path(), "localhost");
    let two = issue(other_dir.path(), "localhost");
    let (_db, server, cert, key) = {
        // tls_server, with a tokens file as well.
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, TOKENS).expect("write");
        let cert = dir.path().join("live.pem");
        let key = dir.path().join("live.key");
        std::fs::copy(&one.cert, &cert).expect("copy");
        std::fs::copy(&one.key, &key).expect("copy");
        let db = TestDb::new(Backend::Sqlite);
        let server = ServerProcess::start(
            &db.url,
            &[
                "--tls-cert",
                cert.to_str().expect("utf-8"),
                "--tls-key",
                key.to_str().expect("utf-8"),
                "--auth-tokens-file",
                tokens.to_str().expect("utf-8"),
            ],
        )
        .await;
        (db, server, cert, key)
    };
    let port = server.addr.port();
    // Clients trust both CAs, as clients do while a CA is rotated.
    let both = format!("{}{}", one.ca_pem, two.ca_pem);
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut loops = Vec::new();
    for client_no in 0..4 {
        let (stop, calls, both) = (stop.clone(), calls.clone(), both.clone());
        loops.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut channel = tls_channel(port, &both, "localhost").await?;
            let mut n = 0_u64;
            while !stop.load(Ordering::Acquire) {
                // Half the clients open a new connection every few calls, so handshakes run
                // across the swaps too; the others keep theirs throughout.
                if client_no % 2 == 1 && n.is_multiple_of(5) {
                    channel = tls_channel(port, &both, "localhost").await?;
                }
                let run = format!("loop-{client_no}-{n}");
                let claimed = LedgerServiceClient::new(channel.clone())
                    .claim(as_token(claim_req(&run, "open_ticket", "{}"), "tok-acme-1"))
                    .await;
                if let Err(status) = claimed {
                    errors.push(status);
                }
                n += 1;
                calls.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<Vec<tonic::Status>, tonic::Status>(errors)
        }));
    }
    let files = [
        (&one, "acme tok-acme-1\nglobex tok-globex-1\n"),
        (&two, "acme tok-acme-1\nacme tok-acme-2\n"),
    ];
    for round in 0..6_usize {
        let (issued, tokens) = files[(round + 1) % 2];
        replace(&cert, &std::fs::read(&issued.cert).expect("read"));
        replace(&key, &std::fs::read(&issued.key).expect("read"));
        replace(&dir.path().join("tokens"), tokens.as_bytes());
        let before = calls.load(Ordering::Relaxed);
        signal(&server, "HUP");
        wait_for_log(
            &server,
            "reload: the TLS certificate and key are in force",
            round + 1,
        )
        .await;
        wait_for_log(&server, "reload: the tokens file is in force", round + 1).await;
        // Calls run between the swaps, not only around them.
        let deadline = Instant::now() + Duration::from_secs(20);
        while calls.load(Ordering::Relaxed) < before + 20 {
            assert!(Instant::now() < deadline, "the clients stopped calling");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    stop.store(true, Ordering::Release);
    let mut failed = Vec::new();
    for l in loops {
        match l.await.expect("task") {
            Ok(errors) => failed.extend(errors),
            Err(status) => failed.push(status),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} calls failed across the swaps: {failed:?}",
        failed.len(),
        calls.load(Ordering::Relaxed)
    );
    signal(&server, "TERM");
}
