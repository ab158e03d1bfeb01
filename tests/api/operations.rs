//! What operators touch besides the RPCs: the Prometheus endpoint and TLS.

use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use crate::support::{Backend, claim_req, free_port, spawn_app_with, success};

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect metrics");
    socket
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut body = String::new();
    socket.read_to_string(&mut body).await.expect("read");
    body
}

#[tokio::test]
async fn the_metrics_endpoint_counts_each_outcome_and_code() {
    let metrics_addr: std::net::SocketAddr =
        format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut app = spawn_app_with(Backend::Sqlite, |s| s.metrics_listen = Some(metrics_addr)).await;
    let first = app
        .client
        .claim(claim_req("run-m", "send_reply", r#"{"to":"ana"}"#))
        .await
        .expect("claim")
        .into_inner();
    let key = first.entry.as_ref().expect("entry").key.clone();
    app.client
        .complete(success(&key, &first.claim_token, b"sent"))
        .await
        .expect("complete");
    for _ in 0..3 {
        app.client
            .claim(claim_req("run-m", "send_reply", r#"{"to":"ana"}"#))
            .await
            .expect("replay");
    }
    let refused = app
        .client
        .complete(success(&key, "not-the-token", b"x"))
        .await
        .expect_err("stale token");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    let text = scrape(metrics_addr).await;
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    for line in [
        "ledger_claims_total{outcome=\"claimed\"} 1\n",
        "ledger_claims_total{outcome=\"replayed\"} 3\n",
        "ledger_claims_total{outcome=\"in_progress\"} 0\n",
        "grpc_method=\"Claim\",grpc_code=\"OK\"} 4\n",
        "grpc_method=\"Complete\",grpc_code=\"OK\"} 1\n",
        "grpc_method=\"Complete\",grpc_code=\"FAILED_PRECONDITION\"} 1\n",
        "ledger_store_up 1\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert!(!text.contains(&key), "keys are never labels");
    app.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn the_server_speaks_tls_with_the_given_certificate() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let dir = tempfile::tempdir().expect("dir");
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert_path, cert.cert.pem()).expect("write cert");
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).expect("write key");

    let db = crate::support::TestDb::new(Backend::Sqlite);
    let url = db.url.clone();
    let port = free_port();
    let server = crate::support::ServerProcess::start_on(
        &url,
        port,
        &[
            "--tls-cert",
            cert_path.to_str().expect("utf-8"),
            "--tls-key",
            key_path.to_str().expect("utf-8"),
        ],
    )
    .await;
    assert!(
        server.startup_log.contains("tls=true"),
        "{}",
        server.startup_log
    );

    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(cert.cert.pem()))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .expect("uri")
        .tls_config(tls)
        .expect("tls config")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("TLS connect");
    let out = LedgerServiceClient::new(channel)
        .claim(claim_req("run-tls", "open_ticket", "{}"))
        .await
        .expect("claim over TLS")
        .into_inner();
    assert_eq!(out.outcome(), pb::Outcome::Claimed);

    // A plaintext client cannot talk to it.
    let plaintext = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("uri")
        .connect()
        .await;
    if let Ok(channel) = plaintext {
        let refused = LedgerServiceClient::new(channel)
            .claim(claim_req("run-tls", "open_ticket", "{}"))
            .await;
        assert!(
            refused.is_err(),
            "plaintext must not be served: {refused:?}"
        );
    }
}
