//! Connections an operator can bound: the real binary under the 1024-descriptor soft limit
//! that service managers give, with 1,500 connections opened at it that never send a byte,
//! still answers a new client within 2 s, and its log says what happened; connections that
//! send nothing are closed after the idle timeout, while a live client's idle channel is kept
//! by the keepalive pings it answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::support::{ServerProcess, TestDb, claim_req};

const IDLE_CONNECTIONS: usize = 1500;

/// Starts the binary on a fresh SQLite file with its open-files limit set to `soft`/`hard`.
async fn server_with_descriptor_limit(
    db: &TestDb,
    soft: u64,
    hard: u64,
    extra: &[&str],
) -> ServerProcess {
    ServerProcess::start_with(&db.url, 0, extra, move |command| {
        // SAFETY: setrlimit is async-signal-safe, and the closure touches nothing else.
        unsafe {
            command.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    })
    .await
}

/// Opens `n` TCP connections to `addr` that never send a byte. A server that stops
/// accepting fills its listen backlog, and then connecting blocks: that must not happen
/// within 20 s (the idle timeout, 60 s by default, is not what makes room).
async fn silent_connections(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    // This test process needs more than 1024 descriptors itself.
    idempotency_ledger::connections::raise_descriptor_limit().expect("raise our own limit");
    tokio::time::timeout(Duration::from_secs(20), async {
        let mut open = Vec::with_capacity(n);
        for _ in 0..n {
            open.push(TcpStream::connect(addr).await.expect("connect"));
        }
        open
    })
    .await
    .expect("the server keeps accepting while silent connections pile up")
}

/// A new client's claim (of a new key, `n`) is answered within 2 s.
async fn a_new_client_is_answered_quickly(server: &ServerProcess, n: u32) {
    let answered = tokio::time::timeout(Duration::from_secs(2), async {
        let mut client = LedgerServiceClient::new(server.channel().await);
        client
            .claim(claim_req(
                "run-1",
                "issue_credit",
                &format!(r#"{{"amount":{n}}}"#),
            ))
            .await
    })
    .await
    .expect("a new client is answered within 2 s")
    .expect("the claim succeeds");
    assert_eq!(answered.into_inner().outcome(), pb::Outcome::Claimed);
}

fn log_of(server: &ServerProcess) -> String {
    format!(
        "{}{}",
        server.startup_log,
        server.log.lock().expect("log").as_str()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_1024_soft_limit_the_server_raises_it_and_answers_beside_1500_idle_connections() {
    // A service manager's limits: 1024 soft, a larger hard limit (raising the hard limit for
    // the child needs root, as CI runs).
    let hard = 8192;
    let db = TestDb::new(crate::support::Backend::Sqlite);
    let server = server_with_descriptor_limit(&db, 1024, hard, &[]).await;
    let log = log_of(&server);
    assert!(
        log.contains("open_files_soft_limit_at_start=1024")
            && log.contains(&format!("open_files_soft_limit={hard}")),
        "the start-up log names both limits:\n{log}"
    );
    let _idle = silent_connections(server.addr, IDLE_CONNECTIONS).await;
    a_new_client_is_answered_quickly(&server, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_hard_limit_at_1024_too_silent_connections_make_room_for_a_new_client() {
    let db = TestDb::new(crate::support::Backend::Sqlite);
    let server = server_with_descriptor_limit(&db, 1024, 1024, &[]).await;
    let _idle = silent_connections(server.addr, IDLE_CONNECTIONS).await;
    a_new_client_is_answered_quickly(&server, 1).await;
    a_new_client_is_answered_quickly(&server, 2).await;
    let log = log_of(&server);
    assert!(
        log.contains("open_files_hard_limit=1024") && log.contains("max_connections=944"),
        "the cap derived from the limit is logged:\n{log}"
    );
    assert_eq!(
        log.matches("connection limit reached").count(),
        1,
        "one warning for the episode, not one per connection:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_accept_loop_backs_off_warns_once_and_makes_room() {
    let db = TestDb::new(crate::support::Backend::Sqlite);
    // A cap above what the descriptors allow: accepts fail with EMFILE before it is reached.
    let server =
        server_with_descriptor_limit(&db, 1024, 1024, &["--max-connections", "5000"]).await;
    let _idle = silent_connections(server.addr, IDLE_CONNECTIONS).await;
    a_new_client_is_answered_quickly(&server, 1).await;
    let log = log_of(&server);
    assert!(
        log.contains("is above what the open-files limit leaves"),
        "the start-up log warns of the cap:\n{log}"
    );
    assert_eq!(
        log.matches("out of file descriptors").count(),
        1,
        "one warning for the episode:\n{log}"
    );
}

/// Counts the TCP connections a channel makes.
#[derive(Clone, Default)]
struct CountingConnector(Arc<AtomicUsize>);

impl tower::Service<http::Uri> for CountingConnector {
    type Response = hyper_util::rt::TokioIo<TcpStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let count = self.0.clone();
        Box::pin(async move {
            count.fetch_add(1, Ordering::SeqCst);
            let addr = format!(
                "{}:{}",
                uri.host().unwrap_or_default(),
                uri.port_u16().unwrap_or(80)
            );
            Ok(hyper_util::rt::TokioIo::new(
                TcpStream::connect(addr).await?,
            ))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_after_the_idle_timeout_and_a_live_idle_one_is_kept() {
    let db = TestDb::new(crate::support::Backend::Sqlite);
    let server = ServerProcess::start(
        &db.url,
        &[
            "--connection-idle-timeout",
            "2s",
            "--http2-keepalive-interval",
            "500ms",
            "--http2-keepalive-timeout",
            "1s",
        ],
    )
    .await;

    // A live client: one call, then idle for three idle timeouts, then another call on the
    // same connection (answering the server's pings kept it).
    let connects = CountingConnector::default();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("uri")
        .connect_with_connector(connects.clone())
        .await
        .expect("connect");
    let mut client = LedgerServiceClient::new(channel);
    client
        .claim(claim_req("run-1", "issue_credit", r#"{"n":1}"#))
        .await
        .expect("claim");

    // A silent one, opened at the same time: the server closes it.
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    let started = tokio::time::Instant::now();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match silent.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {} // the server's HTTP/2 preface, if it sent one
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "a connection that never speaks is closed by the server"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "not before the idle timeout: {:?}",
        started.elapsed()
    );

    tokio::time::sleep(Duration::from_secs(4)).await;
    client
        .claim(claim_req("run-1", "issue_credit", r#"{"n":2}"#))
        .await
        .expect("claim after idling");
    assert_eq!(
        connects.0.load(Ordering::SeqCst),
        1,
        "the idle live connection was kept, not closed and reopened"
    );
}
