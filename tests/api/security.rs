//! Security checks as tests: secrets in arguments and results never reach the logs, and SQL
//! is only ever built from constant text with bound parameters. (Tenant isolation and
//! authentication before validation are in `tenants.rs`.)

use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tonic::transport::Channel;

use crate::support::{Backend, STARTING, TestDb, claim_req, success, wait_for_logged_addr};

const CANARY: &str = "CANARY-7f1d9c-sk_live_do_not_log";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_and_results_never_appear_in_the_logs() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend);
        let log_dir = tempfile::tempdir().expect("dir");
        let log_path = log_dir.path().join("server.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        // The most verbose level our crate and sqlx log at.
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-ledger"))
            .args(["--listen", "127.0.0.1:0", "--database-url", &db.url])
            .env(
                "RUST_LOG",
                "trace,h2=info,hyper=info,tower=info,tonic=debug",
            )
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn");
        let port = wait_for_logged_addr(&log_path, STARTING, "listen")
            .await
            .port();
        let channel = connect(port).await;
        let mut client = LedgerServiceClient::new(channel);
        let args = format!("{{\"card_number\":\"{CANARY}\",\"amount\":5}}");
        let claimed = client
            .claim(claim_req("run-secret", "charge_card", &args))
            .await
            .expect("claim")
            .into_inner();
        let key = claimed.entry.as_ref().expect("entry").key.clone();
        client
            .complete(success(
                &key,
                &claimed.claim_token,
                format!("{{\"receipt\":\"{CANARY}\"}}").as_bytes(),
            ))
            .await
            .expect("complete");
        client
            .claim(claim_req("run-secret", "charge_card", &args))
            .await
            .expect("replay");
        client
            .lookup(pb::LookupRequest {
                key: key.clone(),
                ..Default::default()
            })
            .await
            .expect("lookup");
        // Refused requests carrying the canary are not logged either.
        let _ = client
            .claim(claim_req(
                "run-secret",
                "charge_card",
                &format!("{{\"a\":\"{CANARY}\",\"a\":1}}"),
            ))
            .await;
        let _ = client
            .complete(pb::CompleteRequest {
                key: key.clone(),
                claim_token: CANARY.into(),
                status: pb::Status::Failed.into(),
                error: CANARY.into(),
                ..Default::default()
            })
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        child.start_kill().expect("kill");
        let _ = child.wait().await;
        let text = std::fs::read_to_string(&log_path).expect("read log");
        assert!(
            text.contains("claim"),
            "{backend:?}: the log is verbose enough to matter"
        );
        assert!(
            text.lines().count() > 20,
            "{backend:?}: only {} lines",
            text.lines().count()
        );
        assert!(
            !text.contains(CANARY),
            "{backend:?}: the canary leaked into the log"
        );
    }
}

async fn connect(port: u16) -> Channel {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(channel) = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("uri")
            .connect()
            .await
        {
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
            let serving = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .is_ok_and(|r| r.into_inner().status == 1);
            if serving {
                return channel;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "server did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn sql_is_only_built_from_constant_text_with_bound_parameters() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    let mut violations = Vec::new();
    let mut stack = vec![dir];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            // sqlx 0.9 only takes `&'static str` or an explicit AssertSqlSafe: the latter is
            // the one way to run text built at run time, and it must not appear.
            if text.contains("AssertSqlSafe") {
                violations.push(format!("{}: AssertSqlSafe", path.display()));
            }
            for call in ["sqlx::query(", "sqlx::query_as(", "sqlx::query_scalar("] {
                for (at, _) in text.match_indices(call) {
                    checked += 1;
                    // The argument may start on the next line, where rustfmt puts it.
                    let arg = text[at + call.len()..].trim_start();
                    let constant = arg.starts_with("sql::")
                        || arg.starts_with("Self::")
                        || arg.starts_with("self::")
                        || arg.starts_with('"');
                    if !constant {
                        let line = text[..at].lines().count();
                        let shown: String = arg.chars().take(60).collect();
                        violations.push(format!("{}:{line}: {call}{shown}", path.display()));
                    }
                }
            }
        }
    }
    assert!(
        checked >= 10,
        "found only {checked} query calls: the check looks in the wrong place"
    );
    assert!(
        violations.is_empty(),
        "SQL not from a constant: {violations:#?}"
    );
}
