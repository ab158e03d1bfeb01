//! A failover in the standard high-availability topology, all on loopback: two ledger servers
//! reach PostgreSQL through HAProxy, which sends connections to whichever node Patroni's REST
//! API calls the primary (`GET /primary`); two Patroni nodes in synchronous mode keep their
//! leader lock in etcd. While clients call Claim, Complete and Reconcile on both servers, the
//! leader's Patroni and its postmaster are killed (SIGKILL); the standby is promoted once the
//! lock's TTL runs out. Meanwhile HAProxy has no server to send a connection to, so it accepts
//! each and closes it: every call in the switch is answered UNAVAILABLE with RetryInfo (none
//! INTERNAL), health is NOT_SERVING until the new primary answers and SERVING after, nothing
//! acknowledged is lost and no key is claimed twice.
//!
//! Patroni, etcd and HAProxy are Debian's packages (`.ci/run` installs them); without one of
//! them the test says so and passes without running. Patroni's timings are small (ttl 10 s,
//! loop_wait 1 s, retry_timeout 3 s), and its first node is made from the harness's `initdb`
//! template rather than by `initdb`, so the whole test takes well under a minute and a half.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

use crate::grpc_api::key_req;
use crate::support::clusters::LedgerProcess;
use crate::support::postgres::{as_server_user, bin_dir, template_data_dir};
use crate::support::{claim_req, free_port, reason, success};

const PATRONI: &str = "/usr/bin/patroni";
const RUN: &str = "run-ha";
const TOOL: &str = "ship_order";

/// Where the failover is, as the workers stamp what they were told.
const BEFORE: u8 = 0;
/// From the kill until both servers report SERVING again.
const SWITCH: u8 = 1;
const AFTER: u8 = 2;

/// The binaries the topology needs, or the first one missing.
fn missing_binary() -> Option<String> {
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
            || Path::new("/usr/sbin").join(name).is_file()
    };
    if !Path::new(PATRONI).is_file() {
        return Some(format!("{PATRONI} (Debian's patroni)"));
    }
    for (name, package) in [("etcd", "etcd-server"), ("haproxy", "haproxy")] {
        if !on_path(name) {
            return Some(format!("{name} (Debian's {package})"));
        }
    }
    None
}

/// `/usr/sbin/haproxy` or whatever `haproxy` is on PATH.
fn haproxy() -> PathBuf {
    let sbin = Path::new("/usr/sbin/haproxy");
    if sbin.is_file() {
        sbin.to_path_buf()
    } else {
        PathBuf::from("haproxy")
    }
}

/// One Patroni node: its REST API and PostgreSQL ports, its data directory and its process.
struct Node {
    name: &'static str,
    rest: u16,
    pg: u16,
    data: PathBuf,
    patroni: tokio::process::Child,
}

impl Node {
    /// The postmaster's pid, while its pid file names a live one.
    fn postmaster(&self) -> Option<u32> {
        let pid_file = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        let pid = pid_file.lines().next()?.trim().parse::<u32>().ok()?;
        alive(pid).then_some(pid)
    }

    /// The id of the postmaster's System V shared memory segment (line 7 of its pid file).
    fn shared_memory_id(&self) -> Option<String> {
        let pid_file = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        let id = pid_file.lines().nth(6)?.split_whitespace().nth(1)?;
        id.parse::<u64>().is_ok().then(|| id.to_string())
    }

    /// The HTTP status of `GET path` on its REST API (0 when it does not answer).
    async fn rest_status(&self, path: &str) -> u16 {
        http_status(self.rest, path).await
    }
}

/// The HTTP status of `GET path` on `127.0.0.1:port`, or 0 when nothing answers within 1 s.
async fn http_status(port: u16, path: &str) -> u16 {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        // "HTTP/1.0 200"
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(1), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// etcd, two Patroni nodes and HAProxy in front of them, in one temporary directory; every
/// process ends with it (and the postmasters Patroni started, through a watchdog that also
/// runs if the test process dies).
struct Topology {
    dir: tempfile::TempDir,
    nodes: Vec<Node>,
    haproxy_port: u16,
    _etcd: tokio::process::Child,
    _haproxy: tokio::process::Child,
    /// Closing it (at drop, or when the test process dies) sets the watchdog off.
    _watchdog: std::process::ChildStdin,
}

/// What the watchdog does once its stdin closes: an immediate shutdown of every postmaster
/// under the directory (SIGQUIT, then SIGKILL), then the directory goes.
const WATCHDOG: &str = r#"
read -r _
for pidfile in "$HA_DIR"/data-*/postmaster.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(head -n 1 "$pidfile")
    [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null
done
sleep 1
for pidfile in "$HA_DIR"/data-*/postmaster.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(head -n 1 "$pidfile")
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
done
rm -rf -- "$HA_DIR"
"#;

impl Topology {
    async fn start() -> Topology {
        let dir = tempfile::Builder::new()
            .prefix("ha-failover-")
            .tempdir()
            .expect("temp dir");
        let watchdog = std::process::Command::new("sh")
            .args(["-c", WATCHDOG])
            .env("HA_DIR", dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn the watchdog")
            .stdin
            .take()
            .expect("the watchdog's stdin");
        let (etcd_client, etcd_peer) = (free_port(), free_port());
        let etcd = tokio::process::Command::new("etcd")
            .args(["--name", "e1", "--data-dir"])
            .arg(dir.path().join("etcd"))
            .arg("--listen-client-urls")
            .arg(format!("http://127.0.0.1:{etcd_client}"))
            .arg("--advertise-client-urls")
            .arg(format!("http://127.0.0.1:{etcd_client}"))
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{etcd_peer}"))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://127.0.0.1:{etcd_peer}"))
            .arg("--initial-cluster")
            .arg(format!("e1=http://127.0.0.1:{etcd_peer}"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log_file(dir.path(), "etcd.log"))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn etcd");
        // Patroni's custom bootstrap: a copy of the harness's template instead of initdb.
        let bootstrap = dir.path().join("bootstrap.sh");
        std::fs::write(
            &bootstrap,
            format!(
                "#!/bin/sh\nfor a; do case \"$a\" in --datadir=*) d=\"${{a#--datadir=}}\";; esac; \
                 done\ncp -a '{}' \"$d\" && : > \"$d/pgharness-cluster.conf\"\n",
                template_data_dir().display()
            ),
        )
        .expect("write the bootstrap script");
        set_mode(&bootstrap, 0o755);
        while http_status(etcd_client, "/health").await != 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut nodes = Vec::new();
        for name in ["pg1", "pg2"] {
            let (rest, pg) = (free_port(), free_port());
            let data = dir.path().join(format!("data-{name}"));
            let config = dir.path().join(format!("{name}.yml"));
            std::fs::write(
                &config,
                patroni_config(name, rest, pg, etcd_client, &data, dir.path(), &bootstrap),
            )
            .expect("write a Patroni configuration");
            let patroni =
                tokio::process::Command::from(as_server_user(Path::new(PATRONI), dir.path()))
                    .arg(&config)
                    .stdout(log_file(dir.path(), &format!("{name}.log")))
                    .stderr(log_file(dir.path(), &format!("{name}.log")))
                    .kill_on_drop(true)
                    .spawn()
                    .expect("spawn patroni");
            nodes.push(Node {
                name,
                rest,
                pg,
                data,
                patroni,
            });
        }
        let haproxy_port = free_port();
        let config = dir.path().join("haproxy.cfg");
        std::fs::write(&config, haproxy_config(haproxy_port, &nodes)).expect("haproxy.cfg");
        let haproxy = tokio::process::Command::new(haproxy())
            .arg("-f")
            .arg(&config)
            .arg("-db")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log_file(dir.path(), "haproxy.log"))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn haproxy");
        Topology {
            dir,
            nodes,
            haproxy_port,
            _etcd: etcd,
            _haproxy: haproxy,
            _watchdog: watchdog,
        }
    }

    /// Waits until one node is the primary and the other its synchronous standby.
    async fn wait_until_replicated(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            for (i, node) in self.nodes.iter().enumerate() {
                let other = &self.nodes[1 - i];
                if node.rest_status("/primary").await == 200
                    && other.rest_status("/sync").await == 200
                {
                    return i;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no primary with a synchronous standby within {within:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A URL for `database` through HAProxy.
    fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}",
            self.haproxy_port
        )
    }

    /// The tails of every process's log, for failure messages.
    fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["etcd.log", "pg1.log", "pg2.log", "haproxy.log"] {
            let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            // Patroni's REST server logs a traceback each time HAProxy's check hangs up
            // before the body: noise.
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| {
                    !(l.starts_with(' ')
                        || l.starts_with("Traceback")
                        || l.contains("Exception happened")
                        || l.starts_with("BrokenPipeError")
                        || l.starts_with("ConnectionResetError"))
                })
                .collect();
            out.push_str(&format!(
                "--- {name} ---\n{}\n",
                lines[lines.len().saturating_sub(30)..].join("\n")
            ));
        }
        out
    }
}

impl Drop for Topology {
    /// Every Patroni first (SIGKILL, so that none restarts PostgreSQL), then an immediate
    /// shutdown of every postmaster they left (SIGQUIT, SIGKILL if one lingers), before the
    /// directory goes; etcd and HAProxy end with their handles.
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.patroni.start_kill();
        }
        let postmasters: Vec<u32> = self.nodes.iter().filter_map(Node::postmaster).collect();
        for pid in &postmasters {
            signal(*pid, "-QUIT");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while postmasters.iter().any(|pid| alive(*pid)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for pid in postmasters.iter().filter(|pid| alive(**pid)) {
            signal(*pid, "-KILL");
        }
    }
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(
        |stat| matches!(stat.rsplit_once(") "), Some((_, rest)) if !rest.starts_with(['Z', 'X'])),
    )
}

/// Sends `signal` (`-QUIT`, `-KILL`) to `pid` through the `kill` command, to stay free of
/// libc; a process already gone is no error.
fn signal(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .expect("a log file")
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A Patroni node's configuration: small timings, synchronous mode, trust on loopback, the
/// harness's template as the bootstrap, and a superuser `postgres` as the harness uses.
fn patroni_config(
    name: &str,
    rest: u16,
    pg: u16,
    etcd: u16,
    data: &Path,
    dir: &Path,
    bootstrap: &Path,
) -> String {
    format!(
        "scope: ledger-ha
name: {name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{etcd}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: false
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: 'on'
        max_wal_senders: 5
        max_replication_slots: 5
        max_connections: 100
        fsync: 'off'
        full_page_writes: 'off'
  method: harness
  harness:
    command: {bootstrap}
    no_params: false
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/pgpass-{name}
  pg_hba:
  - host replication replicator 127.0.0.1/32 trust
  - host all all 127.0.0.1/32 trust
  authentication:
    replication:
      username: replicator
      password: replicator
    superuser:
      username: postgres
      password: postgres
  parameters:
    unix_socket_directories: '{dir}'
",
        bootstrap = bootstrap.display(),
        data = data.display(),
        bin = bin_dir().display(),
        dir = dir.display(),
    )
}

/// HAProxy in TCP mode, sending each connection to the node whose REST API answers 200 to
/// `GET /primary`, checked every half second; a node marked down has its connections shut.
fn haproxy_config(port: u16, nodes: &[Node]) -> String {
    let mut config = format!(
        "global
  maxconn 400
defaults
  mode tcp
  timeout connect 1s
  timeout client 30m
  timeout server 30m
  timeout check 1s
listen primary
  bind 127.0.0.1:{port}
  option httpchk GET /primary
  http-check expect status 200
  default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
"
    );
    for node in nodes {
        config.push_str(&format!(
            "  server {} 127.0.0.1:{} check port {}\n",
            node.name, node.pg, node.rest
        ));
    }
    config
}

/// One refused call.
#[derive(Debug)]
#[allow(dead_code)]
struct Failure {
    op: &'static str,
    phase: u8,
    code: Code,
    reason: String,
    retry_info: bool,
    message: String,
}

/// What one worker was told.
#[derive(Debug, Default)]
struct Record {
    /// Keys answered CLAIMED.
    claimed: Vec<String>,
    /// Completions acknowledged: key and result.
    acked: Vec<(String, Vec<u8>)>,
    /// Answered calls, by phase.
    answered: [usize; 3],
    failures: Vec<Failure>,
}

struct Traffic {
    phase: AtomicU8,
    stop: AtomicBool,
}

impl Traffic {
    fn phase(&self) -> u8 {
        self.phase.load(Ordering::SeqCst)
    }

    fn failure(&self, op: &'static str, status: &tonic::Status) -> Failure {
        Failure {
            op,
            phase: self.phase(),
            code: status.code(),
            reason: reason(status),
            retry_info: status.get_details_retry_info().is_some(),
            message: status.message().to_string(),
        }
    }
}

/// A request that gives up after 10 s, so that a call stuck on a dead link shows as
/// DEADLINE_EXCEEDED instead of hanging the test.
fn bounded<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_secs(10));
    request
}

/// Claims fresh keys and completes each one it gets, with a Reconcile every fifth round,
/// until told to stop; a claim that failed is sent again with the same arguments (it may have
/// committed, and then must not be CLAIMED again), a completion until it is acknowledged.
async fn worker(
    w: usize,
    mut client: LedgerServiceClient<Channel>,
    traffic: Arc<Traffic>,
) -> Record {
    let mut record = Record::default();
    let mut n = 0u32;
    let mut retry: Option<String> = None;
    let pause = Duration::from_millis(20);
    while !traffic.stop.load(Ordering::SeqCst) {
        let args = retry.take().unwrap_or_else(|| {
            n += 1;
            format!(r#"{{"worker":{w},"n":{n}}}"#)
        });
        if n.is_multiple_of(5) {
            let answer = client
                .reconcile(bounded(pb::ReconcileRequest {
                    older_than: Some(prost_types::Duration {
                        seconds: 3600,
                        nanos: 0,
                    }),
                    limit: 10,
                    ..Default::default()
                }))
                .await;
            match answer {
                Ok(_) => record.answered[usize::from(traffic.phase())] += 1,
                Err(status) => record.failures.push(traffic.failure("reconcile", &status)),
            }
        }
        let claimed = match client.claim(bounded(claim_req(RUN, TOOL, &args))).await {
            Ok(answer) => answer.into_inner(),
            Err(status) => {
                record.failures.push(traffic.failure("claim", &status));
                retry = Some(args);
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        record.answered[usize::from(traffic.phase())] += 1;
        if claimed.outcome() != pb::Outcome::Claimed {
            // A retried claim whose first try committed: the attempt is in flight, and its
            // token was lost with the answer. Left for a reconciler.
            continue;
        }
        let key = claimed.entry.expect("a CLAIMED answer's entry").key;
        record.claimed.push(key.clone());
        let result = format!("shipped {args}").into_bytes();
        while !traffic.stop.load(Ordering::SeqCst) {
            match client
                .complete(bounded(success(&key, &claimed.claim_token, &result)))
                .await
            {
                Ok(_) => {
                    record.answered[usize::from(traffic.phase())] += 1;
                    record.acked.push((key.clone(), result.clone()));
                    break;
                }
                Err(status) => {
                    let failure = traffic.failure("complete", &status);
                    let again = failure.code == Code::Unavailable;
                    record.failures.push(failure);
                    if !again {
                        break;
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
    record
}

/// Health as one server reported it, sampled every 100 ms: (when, SERVING or not).
async fn watch_health(server: Arc<LedgerProcess>, stop: Arc<AtomicBool>) -> Vec<(Instant, bool)> {
    let mut samples = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let asked = Instant::now();
        let serving = server.health().await == Ok(ServingStatus::Serving);
        samples.push((asked, serving));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    samples
}

/// Waits until every server reports `want`.
async fn wait_for_all(servers: &[Arc<LedgerProcess>], want: ServingStatus, within: Duration) {
    for server in servers {
        server.wait_for_health(want, within).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patroni_failover_behind_haproxy_is_unavailable_with_retry_info_and_loses_nothing() {
    if let Some(missing) = missing_binary() {
        eprintln!(
            "SKIPPED a_patroni_failover_behind_haproxy_…: {missing} is not installed (.ci/run \
             installs patroni, etcd-server and haproxy)"
        );
        return;
    }
    let started = Instant::now();
    let mut topology = Topology::start().await;
    let leader = topology
        .wait_until_replicated(Duration::from_secs(60))
        .await;
    let replicated_after = started.elapsed();
    let database = "ledger";
    {
        use sqlx::{Connection as _, Executor as _};
        let mut admin = sqlx::PgConnection::connect(&topology.url("postgres"))
            .await
            .expect("connect through HAProxy");
        admin
            .execute("CREATE DATABASE ledger")
            .await
            .expect("create the database");
    }
    let url = topology.url(database);
    let servers: Vec<Arc<LedgerProcess>> = (0..2)
        .map(|_| Arc::new(LedgerProcess::spawn(&url, &["--db-acquire-timeout", "2s"])))
        .collect();
    wait_for_all(&servers, ServingStatus::Serving, Duration::from_secs(30)).await;

    let traffic = Arc::new(Traffic {
        phase: AtomicU8::new(BEFORE),
        stop: AtomicBool::new(false),
    });
    let stop_watching = Arc::new(AtomicBool::new(false));
    let watchers: Vec<_> = servers
        .iter()
        .map(|s| tokio::spawn(watch_health(s.clone(), stop_watching.clone())))
        .collect();
    let mut workers = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let client = server.client().await;
        for w in 0..2 {
            workers.push(tokio::spawn(worker(
                2 * i + w,
                client.clone(),
                traffic.clone(),
            )));
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The crash: the leader's Patroni first (so that it cannot restart PostgreSQL), then its
    // postmaster; its backends notice and exit.
    let postmaster = topology.nodes[leader]
        .postmaster()
        .expect("the leader's postmaster");
    let shared_memory = topology.nodes[leader].shared_memory_id();
    traffic.phase.store(SWITCH, Ordering::SeqCst);
    let killed_at = Instant::now();
    let old = &mut topology.nodes[leader].patroni;
    old.start_kill().expect("SIGKILL the leader's Patroni");
    old.wait().await.expect("the leader's Patroni ended");
    signal(postmaster, "-KILL");
    // A killed postmaster cannot remove its System V segment: marked here, the kernel removes
    // it once its last backend is gone, instead of it outliving the test.
    if let Some(id) = shared_memory {
        let _ = std::process::Command::new("ipcrm")
            .args(["-m", &id])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
    let new = &topology.nodes[1 - leader];
    let deadline = Instant::now() + Duration::from_secs(40);
    while new.rest_status("/primary").await != 200 {
        assert!(
            Instant::now() < deadline,
            "the standby was not promoted within 40 s of the kill:\n{}",
            topology.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let promoted_at = Instant::now();
    wait_for_all(&servers, ServingStatus::Serving, Duration::from_secs(30)).await;
    let serving_at = Instant::now();
    traffic.phase.store(AFTER, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    traffic.stop.store(true, Ordering::SeqCst);
    let mut records = Vec::new();
    for w in workers {
        records.push(w.await.expect("worker"));
    }
    stop_watching.store(true, Ordering::SeqCst);
    let mut health = Vec::new();
    for w in watchers {
        health.push(w.await.expect("health watcher"));
    }
    let logs = || {
        format!(
            "{}\n--- ledger servers ---\n{}\n{}",
            topology.logs(),
            servers[0].log(),
            servers[1].log()
        )
    };

    // Every refusal, in the switch or not, is UNAVAILABLE with RetryInfo; none INTERNAL.
    let failures: Vec<&Failure> = records.iter().flat_map(|r| &r.failures).collect();
    let not_unavailable: Vec<_> = failures
        .iter()
        .filter(|f| f.code != Code::Unavailable || !f.retry_info)
        .collect();
    assert!(
        not_unavailable.is_empty(),
        "refusals other than UNAVAILABLE with RetryInfo: {not_unavailable:#?}\n{}",
        logs()
    );
    let mut reasons: HashMap<&str, usize> = HashMap::new();
    for f in &failures {
        *reasons.entry(f.reason.as_str()).or_default() += 1;
    }

    // Health: NOT_SERVING from shortly after the kill until the new primary answered, then
    // SERVING. (The probe notices within its 200 ms interval; 3 s is slack for a loaded
    // machine.)
    for (i, samples) in health.iter().enumerate() {
        let in_switch: Vec<bool> = samples
            .iter()
            .filter(|(at, _)| *at >= killed_at + Duration::from_secs(3) && *at < promoted_at)
            .map(|(_, serving)| *serving)
            .collect();
        assert!(
            !in_switch.is_empty() && in_switch.iter().all(|serving| !serving),
            "server {i} reported SERVING while no primary answered: {in_switch:?}\n{}",
            logs()
        );
        assert!(
            samples
                .iter()
                .any(|(at, serving)| *at >= serving_at && *serving),
            "server {i} SERVING after the promotion"
        );
    }

    // No key was claimed twice, and every acknowledged completion is on the new primary.
    let mut claims: HashMap<&str, usize> = HashMap::new();
    for key in records.iter().flat_map(|r| &r.claimed) {
        *claims.entry(key.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = claims.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "keys CLAIMED more than once: {twice:?}");
    let acked: Vec<&(String, Vec<u8>)> = records.iter().flat_map(|r| &r.acked).collect();
    let mut lookups = servers[0].client().await;
    for (key, result) in &acked {
        let entry = lookups
            .lookup(bounded(key_req(key)))
            .await
            .unwrap_or_else(|s| panic!("lookup of acknowledged {key}: {s:?}"))
            .into_inner()
            .entry
            .expect("entry");
        assert_eq!(entry.status(), pb::Status::Succeeded, "{key}");
        assert_eq!(&entry.result, result, "{key}");
    }
    let answered: [usize; 3] = records.iter().fold([0; 3], |mut sum, r| {
        for (s, a) in sum.iter_mut().zip(r.answered) {
            *s += a;
        }
        sum
    });
    assert!(
        answered[usize::from(BEFORE)] > 0 && answered[usize::from(AFTER)] > 0,
        "calls were answered before and after the failover: {answered:?}"
    );
    eprintln!(
        "ha failover: replicated {replicated_after:?} after the start; standby promoted \
         {:?} after the kill, servers SERVING {:?} after it; {} calls answered (before, in \
         the switch, after: {answered:?}), {} completions acknowledged, {} refusals by reason \
         {reasons:?}; {:?} in all",
        promoted_at - killed_at,
        serving_at - killed_at,
        answered.iter().sum::<usize>(),
        acked.len(),
        failures.len(),
        started.elapsed(),
    );
}
