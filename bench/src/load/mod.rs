//! The load generator, `ledger-bench`: drives a running `idempotency-ledger` server (or the gRPC floor,
//! `ledger-floor`) over gRPC with N concurrent clients and reports throughput, latency
//! percentiles (an HDR histogram with microsecond resolution), errors by gRPC code, and the
//! server's memory and CPU time.
//!
//! ```text
//! ledger-bench --addr http://127.0.0.1:50051 --workload claim-complete --clients 32 \
//!     --duration 10s --warmup 1s --server-pid "$(pgrep -n idempotency-ledger)" --json out.json
//! ```
//!
//! Each client is one task with its own tonic channel (one HTTP/2 connection, as separate agent
//! processes would have); `--connections N` opens N channels instead and client i uses channel
//! i mod N, so each HTTP/2 connection carries the concurrent calls of clients/N tasks (as an
//! agent runtime's channel pool would: `--clients 256 --connections 8` is 32 tasks per
//! connection). The run
//! lasts `--duration`, or until `--count` operations were measured, after a `--warmup` whose
//! operations are not counted. A failed operation is counted by its gRPC code (or
//! `UNEXPECTED_<OUTCOME>` when the Claim answered otherwise than the workload expects) and left
//! out of the latency histogram. The exit status is 1 when no operation succeeded.
//!
//! Workloads (`--workload`):
//! - `claim-complete`: Claim of a fresh key (a unique run_id per operation, fixed arguments),
//!   then Complete with a 100-byte result. The operation's latency is the pair; the claim's and
//!   the complete's are also reported on their own.
//! - `replay`: first creates `--hot-keys` completed entries, then each operation is a Claim of a
//!   random one of them, which the server answers REPLAYED.
//! - `mixed-wait`: each operation is, with `--wait-percent` (10) probability, a Claim with
//!   `wait` (`--wait`, 5s) of a key another client holds at that moment, answered once the
//!   holder completes (REPLAYED); with `--hold-percent` (10), a claim-complete of a fresh key
//!   that holds the claim for `--hold-time` (10ms, the tool running) before completing; else a
//!   plain claim-complete of a fresh key. A waiter that finds no key held does a plain
//!   claim-complete instead (so with one client nobody waits). A holder's latency leaves out
//!   its hold; a waiter's latency is its waiting Claim.
//! - `lookup`: first creates `--hot-keys` completed entries, then each operation is a Lookup of a
//!   random one by key. With `--preloaded N` it looks up random keys of N entries loaded
//!   beforehand instead, whose keys are `hex(sha256(PREFIX || i))` for i in 0..N.
//! - `floor`: against `ledger-floor` (bench.v1.FloorService/Call, which does no work), the
//!   RPCs one operation of `--floor-of` makes, in the same order and with requests and
//!   responses of the same encoded sizes: for `claim-complete` a Claim-sized call then a
//!   Complete-sized one (reported as the claim and the complete parts), for `replay` one call
//!   the size of a replayed Claim. What the transport alone costs per operation.
//!
//! The encoded sizes of the first request and response of each kind of RPC are reported
//! (`rpc_bytes`), so that the floor's can be checked against the ledger's.
//!
//! CPU time (user + system, from /proc) is measured over the measured window for the server
//! (`--server-pid`), the database (`--db-pid`: a PostgreSQL postmaster, counted with its
//! backends), a connection pooler between them (`--pooler-pid`: PgBouncer) and ledger-bench
//! itself, and reported per operation.
//!
//! Modules: [`tally`] records, [`report`] reports, `sizes` sizes the floor's calls as the
//! ledger's, `ops` runs the operations.

use std::error::Error;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use prost::bytes::Bytes;
use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::floor_pb::floor_service_client::FloorServiceClient;
use ops::{create_hot_set, run_client};
pub use report::{Cpu, Report, print_table};
use report::{cpu_times, report};
use sizes::floor_calls;
pub use tally::Latency;
use tally::Tally;

mod ops;
pub mod report;
mod sizes;
pub mod tally;

/// The tool every Claim names.
pub const TOOL: &str = "issue_credit";
/// The arguments every Claim carries.
pub const ARGUMENTS: &str = r#"{"customer":"c-42","amount":200,"currency":"EUR"}"#;
/// The tool's result every Complete stores: 100 bytes of JSON (the comparison's pgbench
/// baseline stores the same).
pub const RESULT: &[u8] =
    br#"{"credit_id":"cr-7f3a9c2e41","status":"issued","amount":200,"currency":"EUR","ref":"L-2026-0000042"}"#;

/// Drives a running idempotency-ledger server and reports throughput and latency.
#[derive(Parser, Debug, Clone)]
#[command(name = "ledger-bench", version)]
pub struct Args {
    /// The server's address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// What each operation does (see the binary's documentation); `floor` drives ledger-floor.
    #[arg(long, value_enum, default_value_t = Workload::ClaimComplete)]
    pub workload: Workload,
    /// `floor`: the workload whose RPCs (their number, order and sizes) one operation makes.
    #[arg(long, value_enum, default_value_t = FloorOf::ClaimComplete)]
    pub floor_of: FloorOf,
    /// Concurrent clients, each running one operation at a time.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Channels (HTTP/2 connections) the clients share, client i on channel i mod N, so each
    /// carries clients/N concurrent tasks; 0: one per client.
    #[arg(long, default_value_t = 0)]
    pub connections: usize,
    /// How long to measure (unless --count).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Measure this many operations in total instead of a duration.
    #[arg(long)]
    pub count: Option<u64>,
    /// Operations run for this long first and are not counted.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Completed entries created first for `replay` and `lookup`.
    #[arg(long, default_value_t = 100)]
    pub hot_keys: usize,
    /// `lookup`: look up random keys of this many entries loaded beforehand (0: the hot keys).
    #[arg(long, default_value_t = 0)]
    pub preloaded: u64,
    /// `lookup` with --preloaded: entry i's key is hex(sha256(PREFIX || i)).
    #[arg(long, default_value = "bench-preload-")]
    pub preloaded_prefix: String,
    /// `mixed-wait`: percent of operations that wait for a key another client holds.
    #[arg(long, default_value_t = 10)]
    pub wait_percent: u32,
    /// `mixed-wait`: percent of operations that hold their claim for --hold-time.
    #[arg(long, default_value_t = 10)]
    pub hold_percent: u32,
    /// `mixed-wait`: how long a holder keeps its claim before completing it.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    pub hold_time: Duration,
    /// `mixed-wait`: the `wait` a waiter's Claim carries.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
    /// Deadline of each call.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// How long to wait for the server to accept connections and report SERVING.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// Bearer token sent as `authorization: Bearer TOKEN`.
    #[arg(long, env = "LEDGER_BENCH_TOKEN")]
    pub token: Option<String>,
    /// The server's process id: its peak (VmHWM) and current (VmRSS) memory and its CPU time
    /// are reported.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// The database's process id (a PostgreSQL postmaster): the CPU time of it and its
    /// children (the backends) is reported.
    #[arg(long)]
    pub db_pid: Option<u32>,
    /// A connection pooler's process id (PgBouncer, between the server and the database): its
    /// CPU time is reported.
    #[arg(long)]
    pub pooler_pid: Option<u32>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// A free-form label carried into the table and the JSON.
    #[arg(long, default_value = "")]
    pub label: String,
    /// The view each Complete asks for: `basic`, as the clients ask, leaves out the result it
    /// sent; `full` is the answer of a caller that sets none (and the floor's calls are sized
    /// as the view's).
    #[arg(long, value_enum, default_value_t = View::Basic)]
    pub view: View,
}

/// How much of the entry a Complete answers with (its request's `view`).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// `ENTRY_VIEW_BASIC`: without the result the Complete sent.
    Basic,
    /// `ENTRY_VIEW_FULL`: the whole entry.
    Full,
}

impl View {
    /// The proto's value.
    pub fn entry_view(self) -> idempotency_ledger::grpc::pb::EntryView {
        match self {
            View::Basic => idempotency_ledger::grpc::pb::EntryView::Basic,
            View::Full => idempotency_ledger::grpc::pb::EntryView::Full,
        }
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// A Claim of a fresh key, then its Complete.
    ClaimComplete,
    /// A Claim of a completed hot key, answered REPLAYED.
    Replay,
    /// Claim-complete, with some claims held and some waiting for a held key.
    MixedWait,
    /// A Lookup by key.
    Lookup,
    /// The RPCs of `--floor-of`'s operation, against ledger-floor.
    Floor,
}

/// The workloads the floor can stand in for.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorOf {
    /// A Claim-sized call, then a Complete-sized one.
    ClaimComplete,
    /// One call the size of a replayed Claim.
    Replay,
}

/// One client's stubs, over one channel.
#[derive(Clone)]
pub(crate) struct Client {
    pub(crate) ledger: LedgerServiceClient<Channel>,
    pub(crate) floor: FloorServiceClient<Channel>,
}

impl Client {
    fn new(channel: Channel) -> Client {
        Client {
            ledger: LedgerServiceClient::new(channel.clone()),
            floor: FloorServiceClient::new(channel),
        }
    }
}

pub(crate) type Auth = Option<MetadataValue<Ascii>>;

/// What every client reads.
pub(crate) struct Shared {
    pub(crate) args: Args,
    pub(crate) auth: Auth,
    /// Unique per run, so that fresh keys never meet an earlier run's.
    pub(crate) run_tag: String,
    pub(crate) measure_from: Instant,
    /// Duration mode: no operation starts at or after this.
    pub(crate) stop_at: Option<Instant>,
    /// Count mode: operations still to measure.
    pub(crate) budget: AtomicU64,
    /// `replay` and `lookup`: (run_id, key) of the completed entries.
    pub(crate) hot: Vec<(String, String)>,
    /// `mixed-wait`: run_ids whose claim a holder keeps right now.
    pub(crate) held: Mutex<Vec<String>>,
    /// `floor`: the calls of one operation, as (request, response payload bytes).
    pub(crate) floor_calls: Vec<(Bytes, u32)>,
}

/// Runs the load `args` describe against the server, prints the report and writes it with
/// `--json`.
///
/// # Errors
///
/// When the server never reports SERVING, the hot set cannot be created, the report cannot
/// be written, or no operation succeeded.
pub async fn run(args: Args) -> Result<Report, Box<dyn Error>> {
    if args.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    let auth = match &args.token {
        Some(t) => Some(MetadataValue::try_from(format!("Bearer {t}"))?),
        None => None,
    };
    let channels = connect(&args).await?;
    let clients: Vec<Client> = (0..args.clients)
        .map(|i| Client::new(channels[i % channels.len()].clone()))
        .collect();
    let now_unix = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let run_tag = format!("{}-{}", std::process::id(), now_unix.as_millis());
    let mut shared = Shared {
        floor_calls: floor_calls(args.floor_of, args.view, &run_tag),
        run_tag,
        auth,
        measure_from: Instant::now(),
        stop_at: None,
        budget: AtomicU64::new(args.count.unwrap_or(0)),
        hot: Vec::new(),
        held: Mutex::new(Vec::new()),
        args,
    };
    if matches!(shared.args.workload, Workload::Replay | Workload::Lookup)
        && shared.args.preloaded == 0
    {
        shared.hot = create_hot_set(&shared, &clients).await?;
    }
    shared.measure_from = Instant::now() + shared.args.warmup;
    if shared.args.count.is_none() {
        shared.stop_at = Some(shared.measure_from + shared.args.duration);
    }
    let shared = Arc::new(shared);
    let pids = [
        shared.args.server_pid,
        shared.args.db_pid,
        shared.args.pooler_pid,
    ];
    let measure_from = shared.measure_from;
    let cpu_before = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from).await;
        cpu_times(pids)
    });
    let mut tasks = Vec::with_capacity(clients.len());
    for (i, client) in clients.into_iter().enumerate() {
        // Seeded from the OS, so concurrent runs draw different hot keys.
        let task = run_client(
            i,
            client,
            shared.clone(),
            Tally::new()?,
            fastrand::Rng::new(),
        );
        tasks.push(tokio::spawn(task));
    }
    let mut total = Tally::new()?;
    for task in tasks {
        total.merge(task.await?);
    }
    let cpu_after = cpu_times(pids);
    let report = report(&shared, &total, cpu_before.await?, cpu_after);
    print_table(&report, &mut std::io::stdout().lock())?;
    if let Some(path) = &shared.args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if report.ops == 0 {
        return Err(format!("no operation succeeded; failures: {:?}", report.errors).into());
    }
    Ok(report)
}

/// Opens the channels, first waiting (up to --connect-timeout) for the server to report the
/// ledger service (or, for `floor`, the floor service) SERVING.
async fn connect(args: &Args) -> Result<Vec<Channel>, Box<dyn Error>> {
    let service = match args.workload {
        Workload::Floor => "bench.v1.FloorService",
        _ => "idempotency.v1.LedgerService",
    };
    let endpoint = serving(&args.addr, service, args.connect_timeout).await?;
    let mut channels = Vec::new();
    for _ in 0..connections(args) {
        channels.push(endpoint.connect().await?);
    }
    Ok(channels)
}

/// The endpoint of the server at `addr` once its health reports `service` SERVING, trying
/// every 100 ms for up to `timeout`.
///
/// # Errors
///
/// When it does not within `timeout`: the last reason why not.
pub async fn serving(
    addr: &str,
    service: &str,
    timeout: Duration,
) -> Result<Endpoint, Box<dyn Error>> {
    let endpoint = Endpoint::from_shared(addr.to_string())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    let deadline = Instant::now() + timeout;
    loop {
        let last_error = match endpoint.connect().await {
            Ok(channel) => {
                let check = HealthClient::new(channel)
                    .check(HealthCheckRequest {
                        service: service.to_string(),
                    })
                    .await;
                match check {
                    Ok(r) if r.get_ref().status() == ServingStatus::Serving => return Ok(endpoint),
                    Ok(r) => format!("health is {:?}", r.get_ref().status()),
                    Err(e) => format!("health check failed: {e}"),
                }
            }
            Err(e) => format!("cannot connect: {e}"),
        };
        if Instant::now() >= deadline {
            return Err(format!("server at {addr} not ready: {last_error}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn connections(args: &Args) -> usize {
    match args.connections {
        0 => args.clients,
        n => n.min(args.clients),
    }
}
