//! `ledger-bench`: drives a running `idempotency-ledger` server (or the gRPC floor,
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

use std::collections::BTreeMap;
use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use idempotency_ledger::defaults::parse_duration;
use idempotency_ledger::error::code_name;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use idempotency_ledger::grpc::pb::{
    ClaimRequest, ClaimResponse, CompleteRequest, CompleteResponse, Entry, LookupRequest, Outcome,
    Status as EntryStatus,
};
use prost::Message;
use prost::bytes::Bytes;
use serde::Serialize;
use sha2::Digest;
use tokio::time::Instant;
use tonic::Request;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

mod floor_pb {
    tonic::include_proto!("bench.v1");
}
use floor_pb::floor_service_client::FloorServiceClient;

const TOOL: &str = "issue_credit";
const ARGUMENTS: &str = r#"{"customer":"c-42","amount":200,"currency":"EUR"}"#;
/// The tool's result every Complete stores: 100 bytes of JSON (bench/compare.sh stores the
/// same in the baseline).
const RESULT: &[u8] =
    br#"{"credit_id":"cr-7f3a9c2e41","status":"issued","amount":200,"currency":"EUR","ref":"L-2026-0000042"}"#;
/// Longest latency the histograms hold (a minute, in microseconds); longer saturates.
const MAX_MICROS: u64 = 60_000_000;
/// The latencies recorded per operation: the operation's, and its parts'.
const PARTS: [&str; 4] = ["op", "claim", "complete", "waiting claim"];
const OP: usize = 0;
const CLAIM: usize = 1;
const COMPLETE: usize = 2;
const WAIT: usize = 3;
/// Clock ticks per second of /proc/PID/stat times (USER_HZ, 100 on every Linux ABI).
const USER_HZ: f64 = 100.0;

/// Drives a running idempotency-ledger server and reports throughput and latency.
#[derive(Parser, Debug, Clone)]
#[command(name = "ledger-bench", version)]
struct Args {
    /// The server's address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// What each operation does (see the binary's documentation); `floor` drives ledger-floor.
    #[arg(long, value_enum, default_value_t = Workload::ClaimComplete)]
    workload: Workload,
    /// `floor`: the workload whose RPCs (their number, order and sizes) one operation makes.
    #[arg(long, value_enum, default_value_t = FloorOf::ClaimComplete)]
    floor_of: FloorOf,
    /// Concurrent clients, each running one operation at a time.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Channels (HTTP/2 connections) the clients share, client i on channel i mod N, so each
    /// carries clients/N concurrent tasks; 0: one per client.
    #[arg(long, default_value_t = 0)]
    connections: usize,
    /// How long to measure (unless --count).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Measure this many operations in total instead of a duration.
    #[arg(long)]
    count: Option<u64>,
    /// Operations run for this long first and are not counted.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// Completed entries created first for `replay` and `lookup`.
    #[arg(long, default_value_t = 100)]
    hot_keys: usize,
    /// `lookup`: look up random keys of this many entries loaded beforehand (0: the hot keys).
    #[arg(long, default_value_t = 0)]
    preloaded: u64,
    /// `lookup` with --preloaded: entry i's key is hex(sha256(PREFIX || i)).
    #[arg(long, default_value = "bench-preload-")]
    preloaded_prefix: String,
    /// `mixed-wait`: percent of operations that wait for a key another client holds.
    #[arg(long, default_value_t = 10)]
    wait_percent: u32,
    /// `mixed-wait`: percent of operations that hold their claim for --hold-time.
    #[arg(long, default_value_t = 10)]
    hold_percent: u32,
    /// `mixed-wait`: how long a holder keeps its claim before completing it.
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    hold_time: Duration,
    /// `mixed-wait`: the `wait` a waiter's Claim carries.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    wait: Duration,
    /// Deadline of each call.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    timeout: Duration,
    /// How long to wait for the server to accept connections and report SERVING.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    connect_timeout: Duration,
    /// Bearer token sent as `authorization: Bearer TOKEN`.
    #[arg(long, env = "LEDGER_BENCH_TOKEN")]
    token: Option<String>,
    /// The server's process id: its peak (VmHWM) and current (VmRSS) memory and its CPU time
    /// are reported.
    #[arg(long)]
    server_pid: Option<u32>,
    /// The database's process id (a PostgreSQL postmaster): the CPU time of it and its
    /// children (the backends) is reported.
    #[arg(long)]
    db_pid: Option<u32>,
    /// A connection pooler's process id (PgBouncer, between the server and the database): its
    /// CPU time is reported.
    #[arg(long)]
    pooler_pid: Option<u32>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// A free-form label carried into the table and the JSON.
    #[arg(long, default_value = "")]
    label: String,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    ClaimComplete,
    Replay,
    MixedWait,
    Lookup,
    Floor,
}

/// The workloads the floor can stand in for.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum FloorOf {
    ClaimComplete,
    Replay,
}

/// One client's stubs, over one channel.
#[derive(Clone)]
struct Client {
    ledger: LedgerServiceClient<Channel>,
    floor: FloorServiceClient<Channel>,
}

impl Client {
    fn new(channel: Channel) -> Client {
        Client {
            ledger: LedgerServiceClient::new(channel.clone()),
            floor: FloorServiceClient::new(channel),
        }
    }
}

type Auth = Option<MetadataValue<Ascii>>;

/// What every client reads.
struct Shared {
    args: Args,
    auth: Auth,
    /// Unique per run, so that fresh keys never meet an earlier run's.
    run_tag: String,
    measure_from: Instant,
    /// Duration mode: no operation starts at or after this.
    stop_at: Option<Instant>,
    /// Count mode: operations still to measure.
    budget: AtomicU64,
    /// `replay` and `lookup`: (run_id, key) of the completed entries.
    hot: Vec<(String, String)>,
    /// `mixed-wait`: run_ids whose claim a holder keeps right now.
    held: Mutex<Vec<String>>,
    /// `floor`: the calls of one operation, as (request, response payload bytes).
    floor_calls: Vec<(Bytes, u32)>,
}

/// One successful operation: its latency and its parts' (indexed by [`PARTS`]).
struct Sample {
    times: [Option<Duration>; 4],
    outcome: &'static str,
}

impl Sample {
    fn single(op: Duration, outcome: &'static str) -> Sample {
        Sample {
            times: [Some(op), None, None, None],
            outcome,
        }
    }
}

/// One client's (then the run's) figures.
struct Tally {
    hists: [Histogram<u64>; 4],
    errors: BTreeMap<String, u64>,
    outcomes: BTreeMap<String, u64>,
    last_end: Option<Instant>,
}

impl Tally {
    fn new() -> Result<Tally, hdrhistogram::CreationError> {
        let h = || Histogram::new_with_bounds(1, MAX_MICROS, 3);
        Ok(Tally {
            hists: [h()?, h()?, h()?, h()?],
            errors: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            last_end: None,
        })
    }

    fn record(&mut self, result: Result<Sample, String>, end: Instant) {
        self.last_end = Some(self.last_end.map_or(end, |e| e.max(end)));
        match result {
            Ok(s) => {
                for (h, t) in self.hists.iter_mut().zip(s.times) {
                    if let Some(t) = t {
                        h.saturating_record(u64::try_from(t.as_micros()).unwrap_or(MAX_MICROS));
                    }
                }
                *self.outcomes.entry(s.outcome.to_string()).or_default() += 1;
            }
            Err(code) => *self.errors.entry(code).or_default() += 1,
        }
    }

    fn merge(&mut self, other: Tally) {
        for (h, o) in self.hists.iter_mut().zip(&other.hists) {
            // Same bounds everywhere, so adding cannot fail.
            let _ = h.add(o);
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        for (k, v) in other.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
        self.last_end = self.last_end.max(other.last_end);
    }
}

/// Percentiles of one histogram, in milliseconds.
#[derive(Serialize)]
struct Latency {
    count: u64,
    mean: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Option<Latency> {
        let ms = |us: u64| us as f64 / 1000.0;
        (!h.is_empty()).then(|| Latency {
            count: h.len(),
            mean: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        })
    }
}

/// CPU time of a process over the measured window.
#[derive(Serialize)]
struct Cpu {
    seconds: f64,
    ms_per_op: f64,
}

/// The results, as printed and as written with --json.
#[derive(Serialize)]
struct Report {
    label: String,
    workload: String,
    addr: String,
    clients: usize,
    connections: usize,
    mix: Option<String>,
    warmup_s: f64,
    duration_s: f64,
    ops: u64,
    failed_ops: u64,
    throughput_ops_s: f64,
    latency_ms: Option<Latency>,
    claim_latency_ms: Option<Latency>,
    complete_latency_ms: Option<Latency>,
    wait_claim_latency_ms: Option<Latency>,
    errors: BTreeMap<String, u64>,
    outcomes: BTreeMap<String, u64>,
    server_pid: Option<u32>,
    server_peak_rss_kib: Option<u64>,
    server_rss_kib: Option<u64>,
    server_cpu: Option<Cpu>,
    db_cpu: Option<Cpu>,
    pooler_cpu: Option<Cpu>,
    bench_cpu: Option<Cpu>,
    /// Encoded bytes of the first request and response of each kind of RPC.
    rpc_bytes: BTreeMap<&'static str, [usize; 2]>,
    finished_at_unix_s: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ledger-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn Error>> {
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
        floor_calls: floor_calls(args.floor_of, &run_tag),
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
    let seed = random_seed()?;
    let mut tasks = Vec::with_capacity(clients.len());
    for (i, client) in clients.into_iter().enumerate() {
        let rng = Rng(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let task = run_client(i, client, shared.clone(), Tally::new()?, rng);
        tasks.push(tokio::spawn(task));
    }
    let mut total = Tally::new()?;
    for task in tasks {
        total.merge(task.await?);
    }
    let cpu_after = cpu_times(pids);
    let report = report(&shared, &total, cpu_before.await?, cpu_after);
    print_table(&report);
    if let Some(path) = &shared.args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if report.ops == 0 {
        return Err(format!("no operation succeeded; failures: {:?}", report.errors).into());
    }
    Ok(())
}

/// Opens the channels, first waiting (up to --connect-timeout) for the server to report the
/// ledger service (or, for `floor`, the floor service) SERVING.
async fn connect(args: &Args) -> Result<Vec<Channel>, Box<dyn Error>> {
    let endpoint = Endpoint::from_shared(args.addr.clone())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    let deadline = Instant::now() + args.connect_timeout;
    loop {
        let last_error = match endpoint.connect().await {
            Ok(channel) => {
                let service = match args.workload {
                    Workload::Floor => "bench.v1.FloorService",
                    _ => "idempotency.v1.LedgerService",
                }
                .to_string();
                let check = HealthClient::new(channel)
                    .check(HealthCheckRequest { service })
                    .await;
                match check {
                    Ok(r) if r.get_ref().status() == ServingStatus::Serving => break,
                    Ok(r) => format!("health is {:?}", r.get_ref().status()),
                    Err(e) => format!("health check failed: {e}"),
                }
            }
            Err(e) => format!("cannot connect: {e}"),
        };
        if Instant::now() >= deadline {
            return Err(format!("server at {} not ready: {last_error}", args.addr).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut channels = Vec::new();
    for _ in 0..connections(args) {
        channels.push(endpoint.connect().await?);
    }
    Ok(channels)
}

fn connections(args: &Args) -> usize {
    match args.connections {
        0 => args.clients,
        n => n.min(args.clients),
    }
}

/// Creates --hot-keys completed entries, with up to 8 clients at once.
async fn create_hot_set(
    shared: &Shared,
    clients: &[Client],
) -> Result<Vec<(String, String)>, Box<dyn Error>> {
    let n = shared.args.hot_keys.max(1);
    let workers = clients.len().min(8);
    let mut tasks = Vec::with_capacity(workers);
    for (w, client) in clients.iter().take(workers).enumerate() {
        let mut client = client.clone();
        let run_ids: Vec<String> = (w..n)
            .step_by(workers)
            .map(|i| format!("bench-{}-hot-{i}", shared.run_tag))
            .collect();
        let (auth, timeout) = (shared.auth.clone(), shared.args.timeout);
        tasks.push(tokio::spawn(async move {
            let mut hot = Vec::with_capacity(run_ids.len());
            for run_id in run_ids {
                let (claim, _) = claim(&mut client, &auth, timeout, &run_id, None).await?;
                expect(&claim, Outcome::Claimed).map_err(|e| format!("{run_id}: {e}"))?;
                let key = claim.entry.map(|e| e.key).unwrap_or_default();
                complete(&mut client, &auth, timeout, &key, claim.claim_token).await?;
                hot.push((run_id, key));
            }
            Ok::<_, String>(hot)
        }));
    }
    let mut hot = Vec::with_capacity(n);
    for task in tasks {
        hot.extend(
            task.await?
                .map_err(|e| format!("creating the hot set: {e}"))?,
        );
    }
    Ok(hot)
}

async fn run_client(
    id: usize,
    mut client: Client,
    shared: Arc<Shared>,
    mut tally: Tally,
    mut rng: Rng,
) -> Tally {
    let mut n = 0u64;
    loop {
        let start = Instant::now();
        let measured = start >= shared.measure_from;
        if measured {
            if shared.stop_at.is_some_and(|stop| start >= stop) {
                break;
            }
            if shared.args.count.is_some()
                && shared
                    .budget
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
                    .is_err()
            {
                break;
            }
        }
        n += 1;
        let result = operation(&mut client, &shared, id, n, &mut rng).await;
        if measured {
            tally.record(result, Instant::now());
        } else if result.is_err() {
            // Failing already in the warm-up: do not spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tally
}

async fn operation(
    client: &mut Client,
    shared: &Shared,
    id: usize,
    n: u64,
    rng: &mut Rng,
) -> Result<Sample, String> {
    let args = &shared.args;
    let fresh = || format!("bench-{}-c{id}-{n}", shared.run_tag);
    let hot = |rng: &mut Rng| &shared.hot[rng.below_u64(shared.hot.len() as u64) as usize];
    match args.workload {
        Workload::ClaimComplete => claim_complete(client, shared, &fresh(), None).await,
        Workload::Replay => {
            let (run_id, _) = hot(rng);
            let (r, took) = claim(client, &shared.auth, args.timeout, run_id, None).await?;
            expect(&r, Outcome::Replayed)?;
            Ok(Sample::single(took, "REPLAYED"))
        }
        Workload::Lookup => {
            let key = if args.preloaded > 0 {
                let i = rng.below_u64(args.preloaded);
                hex::encode(sha2::Sha256::digest(format!(
                    "{}{i}",
                    args.preloaded_prefix
                )))
            } else {
                hot(rng).1.clone()
            };
            let request = LookupRequest {
                key,
                ..LookupRequest::default()
            };
            let request_len = request.encoded_len();
            let start = Instant::now();
            let response = client
                .ledger
                .lookup(request_with(&shared.auth, args.timeout, request))
                .await
                .map_err(|s| code_name(s.code()).to_string())?;
            let took = start.elapsed();
            note_bytes(RpcKind::Lookup, request_len, response.get_ref());
            Ok(Sample::single(took, "FOUND"))
        }
        Workload::Floor => floor_op(client, shared).await,
        Workload::MixedWait => {
            let draw = rng.below_u64(100) as u32;
            if draw < args.wait_percent {
                let target = shared.held.lock().map_err(|_| "POISONED")?.pop();
                if let Some(run_id) = target {
                    let wait = Some(args.wait);
                    let (r, took) =
                        claim(client, &shared.auth, args.timeout, &run_id, wait).await?;
                    let outcome = match r.outcome() {
                        Outcome::Replayed => "WAITED_REPLAYED",
                        Outcome::InProgress => "WAITED_IN_PROGRESS",
                        other => return Err(format!("UNEXPECTED_{}", outcome_name(other))),
                    };
                    let mut sample = Sample::single(took, outcome);
                    sample.times[WAIT] = Some(took);
                    return Ok(sample);
                }
            } else if draw < args.wait_percent + args.hold_percent {
                return claim_complete(client, shared, &fresh(), Some(args.hold_time)).await;
            }
            claim_complete(client, shared, &fresh(), None).await
        }
    }
}

/// Claims a fresh key and completes it; with `hold`, publishes the run_id for waiters and keeps
/// the claim that long first (left out of the latency).
async fn claim_complete(
    client: &mut Client,
    shared: &Shared,
    run_id: &str,
    hold: Option<Duration>,
) -> Result<Sample, String> {
    let timeout = shared.args.timeout;
    let (r, claim_took) = claim(client, &shared.auth, timeout, run_id, None).await?;
    expect(&r, Outcome::Claimed)?;
    let key = r.entry.map(|e| e.key).unwrap_or_default();
    let mut outcome = "CLAIMED_COMPLETED";
    if let Some(hold) = hold {
        let held = || shared.held.lock().map_err(|_| "POISONED".to_string());
        held()?.push(run_id.to_string());
        tokio::time::sleep(hold).await;
        // Withdrawn before completing, so a waiter only takes a key that is still held.
        held()?.retain(|h| h != run_id);
        outcome = "HELD_COMPLETED";
    }
    let complete_took = complete(client, &shared.auth, timeout, &key, r.claim_token).await?;
    let mut times = [None; 4];
    times[OP] = Some(claim_took + complete_took);
    times[CLAIM] = Some(claim_took);
    times[COMPLETE] = Some(complete_took);
    Ok(Sample { times, outcome })
}

async fn claim(
    client: &mut Client,
    auth: &Auth,
    timeout: Duration,
    run_id: &str,
    wait: Option<Duration>,
) -> Result<(ClaimResponse, Duration), String> {
    let request = ClaimRequest {
        run_id: run_id.to_string(),
        tool: TOOL.to_string(),
        arguments_json: ARGUMENTS.to_string(),
        wait: wait.and_then(|w| prost_types::Duration::try_from(w).ok()),
        ..ClaimRequest::default()
    };
    let request_len = request.encoded_len();
    let start = Instant::now();
    let response = client
        .ledger
        .claim(request_with(auth, timeout, request))
        .await
        .map_err(|s| code_name(s.code()).to_string())?;
    let took = start.elapsed();
    let response = response.into_inner();
    let kind = match response.outcome() {
        Outcome::Replayed => RpcKind::ClaimReplayed,
        _ => RpcKind::ClaimClaimed,
    };
    note_bytes(kind, request_len, &response);
    Ok((response, took))
}

async fn complete(
    client: &mut Client,
    auth: &Auth,
    timeout: Duration,
    key: &str,
    claim_token: String,
) -> Result<Duration, String> {
    let request = CompleteRequest {
        key: key.to_string(),
        claim_token,
        status: EntryStatus::Succeeded as i32,
        result: Bytes::from_static(RESULT),
        ..CompleteRequest::default()
    };
    let request_len = request.encoded_len();
    let start = Instant::now();
    let response = client
        .ledger
        .complete(request_with(auth, timeout, request))
        .await
        .map_err(|s| code_name(s.code()).to_string())?;
    let took = start.elapsed();
    note_bytes(RpcKind::Complete, request_len, response.get_ref());
    Ok(took)
}

/// One operation against the floor: the calls of `--floor-of`'s operation, one after the other.
async fn floor_op(client: &mut Client, shared: &Shared) -> Result<Sample, String> {
    let mut times = [None; 4];
    let mut total = Duration::ZERO;
    for (i, (payload, response_bytes)) in shared.floor_calls.iter().enumerate() {
        let request = floor_pb::CallRequest {
            payload: payload.clone(),
            response_payload_bytes: *response_bytes,
        };
        let request_len = request.encoded_len();
        let start = Instant::now();
        let response = client
            .floor
            .call(request_with(&shared.auth, shared.args.timeout, request))
            .await
            .map_err(|s| code_name(s.code()).to_string())?;
        let took = start.elapsed();
        let kind = [RpcKind::FloorFirst, RpcKind::FloorSecond][i.min(1)];
        note_bytes(kind, request_len, response.get_ref());
        total += took;
        if shared.floor_calls.len() == 2 {
            times[[CLAIM, COMPLETE][i]] = Some(took);
        }
    }
    times[OP] = Some(total);
    Ok(Sample {
        times,
        outcome: "FLOOR",
    })
}

/// The floor's calls for one operation of `of`: for each RPC that operation makes, a filler
/// payload and a response size such that the floor's request and response encode to as many
/// bytes as the ledger's would. The ledger's are built here as the server fills them (the
/// server's own answers for ledger-bench's requests: the same key, token, fingerprint and
/// timestamp lengths, the same result and note), so `rpc_bytes` of a real run and of a floor
/// run agree to a few bytes.
fn floor_calls(of: FloorOf, run_tag: &str) -> Vec<(Bytes, u32)> {
    let hex = |n: usize| "0123456789abcdef".repeat(n.div_ceil(16))[..n].to_string();
    let now = prost_types::Timestamp::from(SystemTime::now());
    let later = |s: i64| prost_types::Timestamp {
        seconds: now.seconds + s,
        nanos: now.nanos,
    };
    let entry = |run_id: &str| Entry {
        key: hex(64),
        run_id: run_id.to_string(),
        tool: TOOL.to_string(),
        fingerprint: hex(64),
        status: EntryStatus::Attempting as i32,
        attempt: 1,
        started_at: Some(now),
        lease_expires_at: Some(later(60)),
        external_ref: format!("idem-{}", hex(16)),
        ..Entry::default()
    };
    let finished = |run_id: &str| Entry {
        status: EntryStatus::Succeeded as i32,
        result: Bytes::from_static(RESULT),
        finished_at: Some(later(0)),
        expires_at: Some(later(86_400)),
        ..entry(run_id)
    };
    let claim_request = |run_id: &str| ClaimRequest {
        run_id: run_id.to_string(),
        tool: TOOL.to_string(),
        arguments_json: ARGUMENTS.to_string(),
        ..ClaimRequest::default()
    };
    let sizes: Vec<(usize, usize)> = match of {
        FloorOf::ClaimComplete => {
            let run_id = format!("bench-{run_tag}-c0-1000");
            let claimed = ClaimResponse {
                outcome: Outcome::Claimed as i32,
                entry: Some(entry(&run_id)),
                claim_token: hex(32),
                ..ClaimResponse::default()
            };
            let complete = CompleteRequest {
                key: hex(64),
                claim_token: hex(32),
                status: EntryStatus::Succeeded as i32,
                result: Bytes::from_static(RESULT),
                ..CompleteRequest::default()
            };
            let completed = CompleteResponse {
                entry: Some(finished(&run_id)),
                already_completed: false,
            };
            vec![
                (claim_request(&run_id).encoded_len(), claimed.encoded_len()),
                (complete.encoded_len(), completed.encoded_len()),
            ]
        }
        FloorOf::Replay => {
            let run_id = format!("bench-{run_tag}-hot-10");
            let replayed = ClaimResponse {
                outcome: Outcome::Replayed as i32,
                entry: Some(Entry {
                    replay_count: 1000,
                    ..finished(&run_id)
                }),
                note: REPLAY_NOTE.to_string(),
                ..ClaimResponse::default()
            };
            vec![(claim_request(&run_id).encoded_len(), replayed.encoded_len())]
        }
    };
    sizes
        .into_iter()
        .map(|(request, response)| {
            let payload = filler(request, |n| {
                floor_pb::CallRequest {
                    payload: Bytes::from(vec![0; n]),
                    // Any value of the same varint length as the one sent.
                    response_payload_bytes: response as u32,
                }
                .encoded_len()
            });
            let response_payload = filler(response, |n| {
                floor_pb::CallResponse {
                    payload: Bytes::from(vec![0; n]),
                }
                .encoded_len()
            });
            (Bytes::from(vec![0; payload]), response_payload as u32)
        })
        .collect()
}

/// The longest filler `n` whose message, `len(n)`, encodes to at most `target` bytes.
fn filler(target: usize, len: impl Fn(usize) -> usize) -> usize {
    (0..=target).rev().find(|&n| len(n) <= target).unwrap_or(0)
}

/// The note the server attaches to a replay within a run (src/ledger/notes.rs `replay_note`).
const REPLAY_NOTE: &str = "This action was already performed in this run; returning the \
    earlier result. No new action was taken.";

/// The kinds of RPC whose encoded sizes are reported.
#[derive(Clone, Copy)]
enum RpcKind {
    ClaimClaimed,
    ClaimReplayed,
    Complete,
    Lookup,
    FloorFirst,
    FloorSecond,
}

const RPC_KINDS: [(RpcKind, &str); 6] = [
    (RpcKind::ClaimClaimed, "Claim (CLAIMED)"),
    (RpcKind::ClaimReplayed, "Claim (REPLAYED)"),
    (RpcKind::Complete, "Complete"),
    (RpcKind::Lookup, "Lookup"),
    (RpcKind::FloorFirst, "Floor call 1"),
    (RpcKind::FloorSecond, "Floor call 2"),
];

/// The first (request, response) encoded sizes seen of each kind, indexed by `RpcKind`.
static RPC_BYTES: [OnceLock<[usize; 2]>; 6] = [const { OnceLock::new() }; 6];

fn note_bytes(kind: RpcKind, request: usize, response: &impl Message) {
    let slot = &RPC_BYTES[kind as usize];
    if slot.get().is_none() {
        let _ = slot.set([request, response.encoded_len()]);
    }
}

fn request_with<T>(auth: &Auth, timeout: Duration, msg: T) -> Request<T> {
    let mut request = Request::new(msg);
    request.set_timeout(timeout);
    if let Some(auth) = auth {
        request.metadata_mut().insert("authorization", auth.clone());
    }
    request
}

fn expect(r: &ClaimResponse, wanted: Outcome) -> Result<(), String> {
    if r.outcome() == wanted {
        Ok(())
    } else {
        Err(format!("UNEXPECTED_{}", outcome_name(r.outcome())))
    }
}

fn outcome_name(o: Outcome) -> &'static str {
    o.as_str_name().trim_start_matches("OUTCOME_")
}

fn report(
    shared: &Shared,
    total: &Tally,
    cpu_before: [Option<f64>; 4],
    cpu_after: [Option<f64>; 4],
) -> Report {
    let args = &shared.args;
    let ops = total.hists[OP].len();
    let end = total.last_end.unwrap_or(shared.measure_from);
    let duration = end
        .saturating_duration_since(shared.measure_from)
        .as_secs_f64();
    let (peak, rss) = args.server_pid.map_or((None, None), memory_of);
    let mix = match args.workload {
        Workload::MixedWait => Some(format!(
            "{}% wait ({:?}) for a held key, {}% hold ({:?}), the rest claim-complete",
            args.wait_percent, args.wait, args.hold_percent, args.hold_time
        )),
        Workload::Floor => Some(format!(
            "the RPCs of one {} operation: {} floor call(s) of its sizes",
            match args.floor_of {
                FloorOf::ClaimComplete => "claim-complete",
                FloorOf::Replay => "replay",
            },
            shared.floor_calls.len()
        )),
        _ => None,
    };
    let cpu = |i: usize| match (cpu_before[i], cpu_after[i]) {
        (Some(a), Some(b)) if ops > 0 => Some(Cpu {
            seconds: b - a,
            ms_per_op: (b - a) * 1000.0 / ops as f64,
        }),
        _ => None,
    };
    let [op, claim, complete, wait] = total.hists.each_ref().map(Latency::of);
    Report {
        label: args.label.clone(),
        workload: args
            .workload
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string()),
        addr: args.addr.clone(),
        clients: args.clients,
        connections: connections(args),
        mix,
        warmup_s: args.warmup.as_secs_f64(),
        duration_s: duration,
        ops,
        failed_ops: total.errors.values().sum(),
        throughput_ops_s: if duration > 0.0 {
            ops as f64 / duration
        } else {
            0.0
        },
        latency_ms: op,
        claim_latency_ms: claim,
        complete_latency_ms: complete,
        wait_claim_latency_ms: wait,
        errors: total.errors.clone(),
        outcomes: total.outcomes.clone(),
        server_pid: args.server_pid,
        server_peak_rss_kib: peak,
        server_rss_kib: rss,
        server_cpu: cpu(0),
        db_cpu: cpu(1),
        pooler_cpu: cpu(2),
        bench_cpu: cpu(3),
        rpc_bytes: RPC_KINDS
            .iter()
            .filter_map(|&(kind, name)| Some((name, *RPC_BYTES[kind as usize].get()?)))
            .collect(),
        finished_at_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}

/// VmHWM and VmRSS of a process, in KiB, from /proc/PID/status.
fn memory_of(pid: u32) -> (Option<u64>, Option<u64>) {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return (None, None);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// CPU seconds so far of [the server, the database with its children, the pooler, this
/// process].
fn cpu_times([server, db, pooler]: [Option<u32>; 3]) -> [Option<f64>; 4] {
    [
        server.and_then(|p| cpu_of(&p.to_string(), false)),
        db.and_then(|p| cpu_of(&p.to_string(), true)),
        pooler.and_then(|p| cpu_of(&p.to_string(), false)),
        cpu_of("self", false),
    ]
}

/// User + system CPU seconds of a process (all its threads) from /proc/PID/stat; with
/// `children`, plus those of its live children and of the children it has reaped.
fn cpu_of(pid: &str, children: bool) -> Option<f64> {
    // The fields after the command name (which may hold spaces), from field 3 (state) on.
    fn fields(stat: &str) -> Vec<&str> {
        stat.rsplit_once(')')
            .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect())
    }
    // Fields 14 and 15 are utime and stime, 16 and 17 cutime and cstime.
    let ticks = |f: &[&str], range: std::ops::Range<usize>| -> Option<u64> {
        range.map(|i| f.get(i - 3)?.parse::<u64>().ok()).sum()
    };
    let own = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut total = ticks(&fields(&own), if children { 14..18 } else { 14..16 })?;
    if children {
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue; // not a process, or gone meanwhile
            };
            let f = fields(&stat);
            if f.get(1) == Some(&pid) {
                total += ticks(&f, 14..16).unwrap_or(0);
            }
        }
    }
    Some(total as f64 / USER_HZ)
}

fn print_table(r: &Report) {
    let label = if r.label.is_empty() {
        String::new()
    } else {
        format!(" [{}]", r.label)
    };
    println!(
        "ledger-bench{label}: {} against {}, {} clients over {} connections",
        r.workload, r.addr, r.clients, r.connections
    );
    if let Some(mix) = &r.mix {
        println!("mix: {mix}");
    }
    let join = |m: &BTreeMap<String, u64>| {
        let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.join(" ")
    };
    let percentiles = |l: &Option<Latency>| match l {
        Some(l) => [l.p50, l.p90, l.p99, l.p999, l.max].map(|v| format!("{v:.3}")),
        None => ["-"; 5].map(String::from),
    };
    const HEADER: &str = "workload|clients|ops|secs|ops/s|p50 ms|p90 ms|p99 ms|p99.9 ms|max ms|\
        errors|server RSS MiB peak/now";
    let mut rows = vec![HEADER.split('|').map(String::from).collect::<Vec<_>>()];
    let mut first = vec![
        r.workload.clone(),
        r.clients.to_string(),
        r.ops.to_string(),
        format!("{:.2}", r.duration_s),
        format!("{:.1}", r.throughput_ops_s),
    ];
    first.extend(percentiles(&r.latency_ms));
    first.push(if r.errors.is_empty() {
        "0".to_string()
    } else {
        join(&r.errors)
    });
    first.push(match (r.server_peak_rss_kib, r.server_rss_kib) {
        (Some(peak), Some(now)) => {
            format!("{:.1}/{:.1}", peak as f64 / 1024.0, now as f64 / 1024.0)
        }
        _ => "-".to_string(),
    });
    rows.push(first);
    let parts = [
        &r.claim_latency_ms,
        &r.complete_latency_ms,
        &r.wait_claim_latency_ms,
    ];
    for (name, latency) in PARTS[1..].iter().zip(parts) {
        if let Some(l) = latency {
            let mut row = vec![format!("  {name}"), String::new(), l.count.to_string()];
            row.extend([String::new(), String::new()]);
            row.extend(percentiles(latency));
            rows.push(row);
        }
    }
    let width = |c: usize| rows.iter().filter_map(|r| r.get(c)).map(String::len).max();
    let widths: Vec<usize> = (0..rows[0].len()).map(|c| width(c).unwrap_or(0)).collect();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (s, &w))| {
                if c == 0 || c >= 10 {
                    format!("{s:<w$}")
                } else {
                    format!("{s:>w$}")
                }
            })
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
    if !r.outcomes.is_empty() {
        println!("outcomes: {}", join(&r.outcomes));
    }
    let cpu = [
        ("server", &r.server_cpu),
        ("database", &r.db_cpu),
        ("pooler", &r.pooler_cpu),
        ("ledger-bench", &r.bench_cpu),
    ];
    let cpu: Vec<String> = cpu
        .iter()
        .filter_map(|(who, c)| Some(format!("{who} {:.3}", c.as_ref()?.ms_per_op)))
        .collect();
    if !cpu.is_empty() {
        println!("CPU ms per op: {}", cpu.join(", "));
    }
}

/// A seed from the OS, so concurrent runs draw different hot keys.
fn random_seed() -> Result<u64, Box<dyn Error>> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    Ok(u64::from_le_bytes(bytes))
}

/// splitmix64: enough to pick keys uniformly.
use idempotency_ledger::splitmix::SplitMix64 as Rng;
