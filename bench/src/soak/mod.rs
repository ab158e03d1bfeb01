//! The soak (`soak`): ten minutes of mixed load (claims, completes, waits, replays, lookups,
//! reconciles) on each store, the server's resident memory, open descriptors and database
//! connections sampled every few seconds; each reported flat or not after the warm-up
//! ([`trend()`](trend::trend)), written to `bench/results/soak.md` and `.json`.
//!
//! Not a speed test: the machine may be loaded. What it shows is whether anything the server
//! holds grows with the calls it has served (a leak), rather than with the calls in flight.

pub mod mix;
pub mod trend;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use serde::Serialize;
use testkit::postgres::{ClusterSetup, PgCluster};

use crate::compare::release_binaries;
use crate::host::{clock_now, commit, memory, uname, unix_now, utc};
use crate::procfs;
use crate::procs::Server;
use mix::{Counts, KINDS};
use trend::{Trend, WARMUP_FRACTION, trend};

/// Mixed load on each store for a while, sampling what the server holds.
#[derive(Parser, Debug, Clone)]
#[command(name = "soak", version)]
pub struct Options {
    /// The stores, one after the other ("sqlite postgres").
    #[arg(long, default_value = "sqlite postgres")]
    pub stores: String,
    /// How long each store is soaked.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// How often the server is sampled.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub every: Duration,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Each client opens a new connection after this many operations.
    #[arg(long, default_value_t = 500)]
    pub reconnect_every: u64,
    /// The server's `--replay-memory-bytes`: small enough that the replay memory (a cache
    /// bounded in bytes, which fills as entries finish) is full within the warm-up, so that
    /// what grows after it is a leak and not the cache filling up (at the default 32 MiB this
    /// load takes minutes to fill it).
    #[arg(long, default_value_t = 8 << 20)]
    pub replay_memory_bytes: u64,
    /// Write BASE.md and BASE.json, relative to the repository.
    #[arg(long, default_value = "bench/results/soak")]
    pub results: PathBuf,
    /// Use the binaries already built (in $CARGO_TARGET_DIR or target/, release).
    #[arg(long)]
    pub no_build: bool,
}

/// One sample of the server.
#[derive(Serialize, Debug, Clone)]
pub struct Sample {
    /// Seconds since the load started.
    pub t_s: f64,
    /// Resident memory (VmRSS), KiB.
    pub rss_kib: u64,
    /// Open descriptors (/proc/PID/fd).
    pub fds: usize,
    /// Database connections: PostgreSQL's client backends on the ledger's database
    /// (pg_stat_activity); SQLite's, the server's descriptors open on the database file.
    pub db_connections: Option<u64>,
    /// Successful operations so far.
    pub ops: u64,
}

/// One store's soak.
#[derive(Serialize, Debug)]
pub struct StoreRun {
    /// `sqlite` or `postgres`.
    pub store: String,
    /// Seconds of load.
    pub duration_s: f64,
    /// Successful operations by kind.
    pub ops: std::collections::BTreeMap<String, u64>,
    /// Failures by gRPC code.
    pub errors: std::collections::BTreeMap<String, u64>,
    /// The server's peak resident memory (VmHWM) at the end, KiB.
    pub peak_rss_kib: Option<u64>,
    /// Resident memory after the warm-up (MiB): tolerance 5 % of the mean, at least 2 MiB.
    pub rss_mib: Option<Trend>,
    /// Open descriptors after the warm-up: tolerance 5 % of the mean, at least 4.
    pub fds: Option<Trend>,
    /// Database connections after the warm-up: tolerance 5 % of the mean, at least 2.
    pub db_connections: Option<Trend>,
    /// Every sample.
    pub samples: Vec<Sample>,
}

fn log(line: &str) {
    eprintln!("[soak {}] {line}", clock_now());
}

/// Runs the soak on each store and writes the record.
///
/// # Errors
///
/// When a server cannot start or the record cannot be written.
pub fn run(options: &Options) -> Result<Vec<StoreRun>, String> {
    let (binary, _, _) = release_binaries(options.no_build, "release")?;
    let work = tempfile::Builder::new()
        .prefix("ledger-soak.")
        .tempdir()
        .map_err(|e| format!("cannot create a work directory: {e}"))?;
    let mut runs = Vec::new();
    for store in options.stores.split_whitespace() {
        let mut cluster = None;
        let (url, probe): (String, Box<dyn Fn(u32) -> Option<u64> + Send>) = match store {
            "sqlite" => {
                let db = work.path().join("soak.db");
                let url = format!("sqlite://{}", db.display());
                (url, Box::new(move |pid| sqlite_connections(pid, &db)))
            }
            "postgres" => {
                let c = Arc::new(PgCluster::start_with(
                    ClusterSetup::default()
                        .conf("fsync = on")
                        .conf("synchronous_commit = on")
                        .conf("full_page_writes = on")
                        .conf("shared_buffers = 128MB"),
                ));
                let url = c.create_database();
                let database = url.rsplit('/').next().unwrap_or_default().to_string();
                let probe_cluster = c.clone();
                cluster = Some(c);
                (
                    url,
                    Box::new(move |_| pg_connections(&probe_cluster, &database)),
                )
            }
            other => return Err(format!("--stores takes sqlite and postgres, not {other}")),
        };
        let log_path = work.path().join(format!("{store}.log"));
        let replay_memory = options.replay_memory_bytes.to_string();
        let server = Server::start(
            &binary,
            [
                "--database-url",
                &url,
                "--replay-memory-bytes",
                &replay_memory,
            ],
            &log_path,
        )?;
        log(&format!(
            "{store}: {} clients for {:?}",
            options.clients, options.duration
        ));
        let run = soak(options, store, &server, probe)?;
        server.stop();
        drop(cluster);
        runs.push(run);
    }
    write(options, &runs)?;
    Ok(runs)
}

/// The load on one running server, sampled until `--duration` has passed.
fn soak(
    options: &Options,
    store: &str,
    server: &Server,
    probe: Box<dyn Fn(u32) -> Option<u64> + Send>,
) -> Result<StoreRun, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))?;
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let endpoint = runtime
        .block_on(crate::load::serving(
            &server.addr(),
            "idempotency.v1.LedgerService",
            Duration::from_secs(60),
        ))
        .map_err(|e| e.to_string())?;
    let load = runtime.spawn(mix::run(
        endpoint,
        options.clients,
        options.reconnect_every,
        counts.clone(),
        stop.clone(),
    ));
    let pid = server.pid();
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut next = started;
    while started.elapsed() < options.duration {
        next += options.every;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let (Some(memory), Some(fds)) = (procfs::memory_of(pid), procfs::open_descriptors(pid))
        else {
            return Err(format!("the server exited; see {}", server.log().display()));
        };
        let sample = Sample {
            t_s: started.elapsed().as_secs_f64(),
            rss_kib: memory.rss_kib,
            fds,
            db_connections: probe(pid),
            ops: counts.total(),
        };
        if samples.len() % 12 == 0 {
            log(&format!(
                "{store} {:>4.0}s: {} ops, RSS {:.1} MiB, {} descriptors, {} database connections",
                sample.t_s,
                sample.ops,
                sample.rss_kib as f64 / 1024.0,
                sample.fds,
                sample
                    .db_connections
                    .map_or_else(|| "?".into(), |c| c.to_string())
            ));
        }
        samples.push(sample);
    }
    let duration_s = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    runtime
        .block_on(load)
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the load failed: {e}"))?;
    let points = |f: &dyn Fn(&Sample) -> Option<f64>| -> Vec<(f64, f64)> {
        samples
            .iter()
            .filter_map(|s| Some((s.t_s, f(s)?)))
            .collect()
    };
    let ops = KINDS
        .iter()
        .zip(&counts.ops)
        .map(|(k, n)| (k.to_string(), n.load(Ordering::Relaxed)))
        .collect();
    let errors = counts.errors.lock().map(|e| e.clone()).unwrap_or_default();
    Ok(StoreRun {
        store: store.to_string(),
        duration_s,
        ops,
        errors,
        peak_rss_kib: procfs::memory_of(pid).map(|m| m.peak_kib),
        rss_mib: trend(&points(&|s| Some(s.rss_kib as f64 / 1024.0)), 0.05, 2.0),
        fds: trend(&points(&|s| Some(s.fds as f64)), 0.05, 4.0),
        db_connections: trend(&points(&|s| s.db_connections.map(|c| c as f64)), 0.05, 2.0),
        samples,
    })
}

/// PostgreSQL's client backends connected to `database`.
fn pg_connections(cluster: &PgCluster, database: &str) -> Option<u64> {
    let query = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = '{database}' AND backend_type = 'client backend'"
    );
    let out = cluster
        .psql("postgres")
        .args(["-A", "-t", "-c", &query])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// The server's descriptors open on the SQLite database file: one per connection.
fn sqlite_connections(pid: u32, db: &std::path::Path) -> Option<u64> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(
        fds.flatten()
            .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == db))
            .count() as u64,
    )
}

/// A store's three rows of the soak's table: memory, descriptors and connections.
fn store_rows(run: &StoreRun) -> String {
    let mut rows = String::new();
    let ops: u64 = run.ops.values().sum();
    let errors: u64 = run.errors.values().sum();
    let rate = ops as f64 / run.duration_s.max(1.0);
    // The first sample, before the warm-up: what the server held once the load began.
    let start = run.samples.first();
    for (measure, t, places, at_start) in [
        (
            "RSS MiB",
            &run.rss_mib,
            1,
            start.map(|s| s.rss_kib as f64 / 1024.0),
        ),
        ("open descriptors", &run.fds, 0, start.map(|s| s.fds as f64)),
        (
            "database connections",
            &run.db_connections,
            0,
            start.and_then(|s| s.db_connections.map(|c| c as f64)),
        ),
    ] {
        let at_start = at_start.map_or_else(|| "-".to_string(), |v| format!("{v:.places$}"));
        let row = match t {
            Some(t) => format!(
                "{at_start} | {:.p$} | {:.p$} | {:.p$} | {:.p$} | {:.p$} | {:+.2} | {:+.1} | {}",
                t.first,
                t.last,
                t.min,
                t.max,
                t.max - t.min,
                t.slope_per_min,
                t.drift,
                if t.flat { "yes" } else { "**no**" },
                p = places
            ),
            None => format!("{at_start} | - | - | - | - | - | - | - | -"),
        };
        rows.push_str(&format!(
            "| {} | {ops} | {rate:.0} | {errors} | {measure} | {row} |\n",
            run.store
        ));
    }
    rows
}

/// Writes BASE.md and BASE.json and prints the Markdown.
fn write(options: &Options, runs: &[StoreRun]) -> Result<(), String> {
    let base = crate::repository_root().join(&options.results);
    if let Some(dir) = base.parent() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    let now = unix_now();
    let commit = commit();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mut md = String::from("# Soak: mixed load on each store, what the server holds\n\n");
    md.push_str(&format!(
        "- date: {}; commit {commit}; {:?} per store, {} clients (a new connection every {} operations each), sampled every {:?}\n",
        utc(now, false), options.duration, options.clients, options.reconnect_every, options.every
    ));
    md.push_str(&format!(
        "- machine: {cores} cores, {}, {}; the server, the database and the load share it with whatever else runs: flatness is the measure, not speed\n",
        memory(), uname()
    ));
    md.push_str(&format!(
        "- the server with `--replay-memory-bytes {}` (a bounded cache that fills as entries finish: full within the warm-up at this size)\n",
        options.replay_memory_bytes
    ));
    md.push_str("- mix: 45% claim-complete, 20% replays of 100 completed keys, 10% claims held 20 ms, 10% claims that wait (5 s) for a held key, 10% lookups, 5% completed UNKNOWN; one reconciler resolves the UNKNOWN ones every second\n");
    md.push_str(&format!(
        "- flat: after the warm-up (the first {:.0}% of samples, left out), the least-squares line's rise over the rest (drift) is within 5% of the mean, and at least 2 MiB of memory, 4 descriptors, 2 connections\n\n",
        WARMUP_FRACTION * 100.0
    ));
    md.push_str("| store | ops | ops/s | errors | measure | start | after warm-up | end | min | max | max − min | slope per minute | drift | flat |\n");
    md.push_str("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    for run in runs {
        md.push_str(&store_rows(run));
    }
    for run in runs.iter().filter(|r| !r.errors.is_empty()) {
        md.push_str(&format!("\n{} errors: {:?}\n", run.store, run.errors));
    }
    #[derive(Serialize)]
    struct Record<'a> {
        date: String,
        commit: String,
        cores: usize,
        duration_per_store_s: f64,
        every_s: f64,
        clients: usize,
        reconnect_every: u64,
        warmup_fraction: f64,
        stores: &'a [StoreRun],
    }
    let json = serde_json::to_string_pretty(&Record {
        date: utc(now, true),
        commit,
        cores,
        duration_per_store_s: options.duration.as_secs_f64(),
        every_s: options.every.as_secs_f64(),
        clients: options.clients,
        reconnect_every: options.reconnect_every,
        warmup_fraction: WARMUP_FRACTION,
        stores: runs,
    })
    .map_err(|e| e.to_string())?;
    let path = |ext: &str| PathBuf::from(format!("{}.{ext}", base.display()));
    std::fs::write(path("md"), &md).map_err(|e| e.to_string())?;
    std::fs::write(path("json"), json + "\n").map_err(|e| e.to_string())?;
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), md.as_bytes());
    log(&format!(
        "wrote {} and {}",
        path("md").display(),
        path("json").display()
    ));
    Ok(())
}
