//! PostgreSQL as production runs it, for the TLS and failover tests: clusters that speak only
//! TLS with certificates from a test CA, a primary with a synchronous streaming standby, and the
//! real binary with every line of its log kept, whether or not it ever gets to serve.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::app::{STARTING, logged_addr, plain};
use super::postgres::{ClusterSetup, PgCluster, server_command};

/// `pg_hba.conf` that lets anyone in from 127.0.0.1 over TLS, and nobody without it.
pub const HBA_TLS_ONLY: &str = "\
# TYPE   DATABASE  USER  ADDRESS       METHOD
hostssl  all       all   127.0.0.1/32  trust
";

/// `pg_hba.conf` that wants a client certificate (whose CN names the user) for every database
/// but `postgres`, which the harness's own commands use without one; no line without TLS.
pub const HBA_CLIENT_CERT: &str = "\
# TYPE   DATABASE  USER      ADDRESS       METHOD
hostssl  postgres  postgres  127.0.0.1/32  trust
hostssl  all       all       127.0.0.1/32  cert
";

/// A test CA, another CA nobody trusts, a server certificate for `localhost` only and a client
/// certificate for the database user `postgres`; the client side's files are in `dir`.
pub struct Pki {
    /// `ca.pem`, `other-ca.pem`, `client.pem`, `client.key`, all readable by the test process
    /// (and the ledger binary it starts) only.
    pub dir: tempfile::TempDir,
    pub ca_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
}

impl Pki {
    pub fn new() -> Pki {
        let ca = new_ca("idempotency-ledger test CA");
        let other_ca = new_ca("a CA nobody trusts");

        let server_key = KeyPair::generate().expect("server key");
        let mut server = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        server.distinguished_name = common_name("localhost");
        let server = server.signed_by(&server_key, &ca).expect("server cert");

        let client_key = KeyPair::generate().expect("client key");
        let mut client = CertificateParams::new(Vec::<String>::new()).expect("params");
        // PostgreSQL's `cert` method takes the user name from the CN.
        client.distinguished_name = common_name("postgres");
        let client = client.signed_by(&client_key, &ca).expect("client cert");

        let dir = tempfile::tempdir().expect("temp dir");
        for (name, contents) in [
            ("ca.pem", ca.pem()),
            ("other-ca.pem", other_ca.pem()),
            ("client.pem", client.pem()),
            ("client.key", client_key.serialize_pem()),
        ] {
            std::fs::write(dir.path().join(name), contents).expect("write a PKI file");
        }
        Pki {
            dir,
            ca_pem: ca.pem(),
            server_cert_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
        }
    }

    /// A client-side file of this PKI (`ca.pem`, `other-ca.pem`, `client.pem`, `client.key`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A cluster with `ssl = on`, this PKI's server certificate and key (the key owned by the
    /// server user, mode 0600, as PostgreSQL demands), the CA as `ssl_ca_file` (so client
    /// certificates it signed are verified) and `hba` as its `pg_hba.conf`.
    pub fn cluster(&self, hba: &str) -> PgCluster {
        PgCluster::start_with(
            ClusterSetup::default()
                .file("server.crt", self.server_cert_pem.clone(), 0o644)
                .file("server.key", self.server_key_pem.clone(), 0o600)
                .file("root.crt", self.ca_pem.clone(), 0o644)
                .conf("ssl = on")
                .conf("ssl_cert_file = 'server.crt'")
                .conf("ssl_key_file = 'server.key'")
                .conf("ssl_ca_file = 'root.crt'")
                .hba(hba),
        )
    }
}

fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name = common_name(name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("ca key")).expect("ca")
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

/// `url` (a harness URL, `postgres://postgres@127.0.0.1:PORT/DB`) with its host replaced by
/// `host` and `query` (`sslmode=…&…`) appended.
pub fn url_with(url: &str, host: &str, query: &str) -> String {
    let rest = url
        .strip_prefix("postgres://postgres@127.0.0.1:")
        .unwrap_or_else(|| panic!("not a harness URL: {url}"));
    format!("postgres://postgres@{host}:{rest}?{query}")
}

/// A primary whose every commit waits for its streaming standby (`synchronous_standby_names =
/// '*'`), and that standby, made with `pg_basebackup -R` as the server user.
pub struct ReplicatedPair {
    pub primary: PgCluster,
    pub standby: PgCluster,
}

/// The physical replication slot the standby streams from.
const STANDBY_SLOT: &str = "pgharness_standby";

impl ReplicatedPair {
    /// Starts both and waits until the primary reports the standby streaming and synchronous.
    pub async fn start() -> ReplicatedPair {
        tokio::task::block_in_place(|| {
            let primary = PgCluster::start_with(
                ClusterSetup::default().conf("synchronous_standby_names = '*'"),
            );
            let port = primary.port();
            let standby = PgCluster::start_with(
                ClusterSetup::default()
                    .populate(move |data: &Path| base_backup(port, data))
                    // It inherits the primary's configuration: once promoted it has no standby
                    // of its own, and must not wait for one at every commit.
                    .conf("synchronous_standby_names = ''"),
            );
            ReplicatedPair { primary, standby }
        })
        .wait_until_synchronous()
        .await
    }

    async fn wait_until_synchronous(self) -> ReplicatedPair {
        use sqlx::Connection as _;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let state: Result<Option<String>, sqlx::Error> = async {
                let mut conn = sqlx::PgConnection::connect(&self.primary.url("postgres")).await?;
                let state = sqlx::query_scalar(
                    "SELECT state || '/' || sync_state FROM pg_stat_replication LIMIT 1",
                )
                .fetch_optional(&mut conn)
                .await?;
                let _ = conn.close().await;
                Ok(state)
            }
            .await;
            let last = match state {
                Ok(Some(s)) if s == "streaming/sync" => return self,
                other => format!("{other:?}"),
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "the standby did not stream synchronously within 20 s (pg_stat_replication: \
                 {last})\n--- standby log ---\n{}",
                self.standby.server_log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `pg_is_in_recovery()` of a cluster, asked directly (not through any proxy).
    pub async fn in_recovery(cluster: &PgCluster) -> bool {
        use sqlx::Connection as _;
        let mut conn = sqlx::PgConnection::connect(&cluster.url("postgres"))
            .await
            .expect("connect to the cluster");
        let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await
            .expect("pg_is_in_recovery()");
        let _ = conn.close().await;
        in_recovery
    }
}

/// `pg_basebackup -R` of the primary at `port` into `data`: a standby's data directory, with
/// `standby.signal` and `primary_conninfo`, streaming from a slot of its own.
fn base_backup(port: u16, data: &Path) -> Result<(), String> {
    let mut cmd = server_command("pg_basebackup");
    for var in [
        "PGOPTIONS",
        "PGSERVICE",
        "PGSERVICEFILE",
        "PGSSLMODE",
        "PGPASSWORD",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd
        .args(["-h", "127.0.0.1", "-U", "postgres", "-p"])
        .arg(port.to_string())
        .arg("-D")
        .arg(data)
        .args([
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
            "-C",
            "-S",
            STANDBY_SLOT,
        ])
        .output()
        .map_err(|e| format!("cannot run pg_basebackup: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "pg_basebackup failed: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The real `idempotency-ledger` binary with every line of its stderr kept from the start,
/// whether or not its store ever lets it serve (unlike `ServerProcess`, which waits until
/// it does).
pub struct LedgerProcess {
    pub child: tokio::process::Child,
    log: Arc<Mutex<String>>,
}

impl LedgerProcess {
    /// Starts the binary on a port the kernel picks (its log says which) with
    /// `--database-url url`, a 200 ms health probe, and `extra` flags; returns at once.
    pub fn spawn(url: &str, extra: &[&str]) -> LedgerProcess {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut child = super::app::ledger_command()
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--database-url")
            .arg(url)
            .arg("--health-probe-interval")
            .arg("200ms")
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn idempotency-ledger");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut sink = sink.lock().expect("log");
                sink.push_str(&plain(&line));
                sink.push('\n');
            }
        });
        LedgerProcess { child, log }
    }

    /// Where it listens, once its start-up line says (within 20 s).
    pub async fn addr(&self) -> SocketAddr {
        let line = self.wait_for_log(STARTING, Duration::from_secs(20)).await;
        logged_addr(&line, STARTING, "listen")
            .unwrap_or_else(|| panic!("no address in the start-up line: {line}"))
    }

    /// Everything the server logged so far, without colour escapes.
    pub fn log(&self) -> String {
        self.log.lock().expect("log").clone()
    }

    /// The log's lines that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// Waits until a line containing `needle` is logged, and returns it; panics with the
    /// log after `within`.
    pub async fn wait_for_log(&self, needle: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(line) = self.lines_with(needle).into_iter().next() {
                return line;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no log line with {needle:?} within {within:?}; the log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub async fn channel(&self) -> Result<Channel, tonic::transport::Error> {
        Channel::from_shared(format!("http://{}", self.addr().await))
            .expect("uri")
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
    }

    /// A client, once the server listens (within 20 s).
    pub async fn client(&self) -> LedgerServiceClient<Channel> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match self.channel().await {
                Ok(channel) => return LedgerServiceClient::new(channel),
                Err(e) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "the server does not listen ({} log lines): {e}; its log:\n{}",
                    self.log().lines().count(),
                    self.log()
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The server's health ("" service), or why it could not be asked.
    pub async fn health(&self) -> Result<ServingStatus, String> {
        let channel = self.channel().await.map_err(|e| e.to_string())?;
        HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
            .map(|r| r.into_inner().status())
            .map_err(|s| s.to_string())
    }

    /// Polls health until it reports `want`; panics with the log after `within`.
    pub async fn wait_for_health(&self, want: ServingStatus, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let got = self.health().await;
            if got == Ok(want) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "health did not become {want:?} within {within:?}; last: {got:?}; the log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the process still runs (it never exited, so it was never restarted).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}
