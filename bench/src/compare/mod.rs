//! The comparison (`compare`): the ledger server against hand-written SQL on the same
//! PostgreSQL, and against the gRPC floor, in one run.
//!
//! Builds the release binaries, starts a throwaway PostgreSQL cluster (the tests' harness,
//! `testkit`, with durable commits), and for each workload and client count measures a
//! *cell*:
//! - the baseline: pgbench running exactly the SQL the server issues per operation
//!   (`bench/pgbench/*.sql`), as autocommit statements over C connections,
//! - the gRPC floor: `ledger-floor`, a server on the same tonic stack and settings that does
//!   no work, driven by `ledger-bench` with the same clients making the same RPCs (their number
//!   and sizes), and
//! - ours: `idempotency-ledger` on the same database, driven over gRPC by `ledger-bench`;
//!
//! then claim-complete with `--mux-clients` clients over `--mux-connections` HTTP/2
//! connections beside one connection per client, pgbench and the server both through
//! PgBouncer in transaction mode beside the direct cells, the SQLite store through the
//! server, and (with `--scale`) a 5M-row table. Prints the side-by-side tables and writes them
//! to `bench/results/latest.md` (+ `.json`, + `.png`: throughput and latency against clients);
//! `--smoke` writes `bench/results/smoke.*` instead, so CI never overwrites the committed
//! record. Exits non-zero if any cell had an error.
//!
//! Modules: `cells` runs one side of a cell, `pgbench` the baseline, `record` keeps the
//! figures and writes the tables and the JSON, `picture` draws, `scale` loads the big table.

mod cells;
mod pgbench;
mod picture;
mod record;
mod scale;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clap::Parser;
use idempotency_ledger::defaults::DB_MAX_CONNECTIONS;
use testkit::postgres::{ClusterSetup, PgCluster};

use cells::{Cell, Side};
use record::Record;

/// Operations per cell in `--smoke`.
const SMOKE_OPS: u64 = 300;
/// The replay workload's hot set.
const HOT_KEYS: u32 = 100;
/// `--scale`: the clients of its runs.
const SCALE_CLIENTS: u32 = 32;
/// `--scale`: entries the empty-table lookup reads.
const LOOKUP_KEYS: u32 = 1000;

/// The ledger server against pgbench running its SQL and against the gRPC floor.
#[derive(Parser, Debug, Clone)]
#[command(name = "compare", version)]
pub struct Options {
    /// A few hundred operations per cell, client counts 1 and 8 and the --mux-clients cell, the
    /// pooler cells at 8 (CI); writes bench/results/smoke.* unless --results says otherwise.
    #[arg(long)]
    pub smoke: bool,
    /// Also load --scale-rows finished entries and compare claim-complete and lookup on the
    /// empty and the loaded table (not in --smoke).
    #[arg(long)]
    pub scale: bool,
    /// Rows --scale loads.
    #[arg(long, default_value_t = 5_000_000)]
    pub scale_rows: u64,
    /// Measured seconds per cell.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Unmeasured seconds before each cell, on every side.
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    /// Run every cell N times, alternating the sides, and report each side's median round by
    /// throughput.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Client counts on PostgreSQL ("C ...").
    #[arg(long, default_value = "1 8 32 64", value_parser = counts)]
    pub clients: Counts,
    /// The multiplexed cell: claim-complete with N clients over --mux-connections connections,
    /// beside one connection per client (0: no such cell).
    #[arg(long, default_value_t = 256)]
    pub mux_clients: u32,
    /// HTTP/2 connections the --mux-clients clients share.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub mux_connections: u32,
    /// Client counts of the pooler cells, pgbench and the server through PgBouncer in
    /// transaction mode ("": none; --smoke: 8).
    #[arg(long, default_value = "32", value_parser = counts)]
    pub pooler_clients: Counts,
    /// Workloads of the pooler cells (claim-complete and/or replay).
    #[arg(long, default_value = "claim-complete replay")]
    pub pooler_workloads: String,
    /// No pooler cells (the same as --pooler-clients ""); then PgBouncer is not needed.
    #[arg(long)]
    pub no_pooler: bool,
    /// Client counts on SQLite ("C ...").
    #[arg(long, default_value = "1 32", value_parser = counts)]
    pub sqlite_clients: Counts,
    /// The server's PostgreSQL pool: default (the server's own), match (C + 1 in a cell of C
    /// clients), or a number.
    #[arg(long, default_value = "default", value_parser = pool_choice)]
    pub db_max_connections: Pool,
    /// Write BASE.md, BASE.json and BASE.png (default bench/results/latest; --smoke:
    /// bench/results/smoke), relative to the repository.
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// Use the binaries already built (in $CARGO_TARGET_DIR or target/, release).
    #[arg(long)]
    pub no_build: bool,
    /// Draw no picture (then gnuplot is not needed).
    #[arg(long)]
    pub no_plot: bool,
    /// Keep the work directory (the cluster, stopped; logs; raw outputs) and print its path.
    #[arg(long)]
    pub keep: bool,
}

/// Client counts, as `"1 8 32"`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts(pub Vec<u32>);

/// Parses client counts, as `"1 8 32"` (`""`: none).
///
/// # Errors
///
/// When a word is not a positive count.
pub fn counts(text: &str) -> Result<Counts, String> {
    text.split_whitespace()
        .map(|c| match c.parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("not a client count: {c}")),
        })
        .collect::<Result<_, _>>()
        .map(Counts)
}

/// The server's PostgreSQL pool in a cell (`--db-max-connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// The server's own default.
    Default,
    /// C + 1 in a cell of C clients: as many connections for requests as pgbench has, plus the
    /// one the server's LISTEN keeps.
    Match,
    /// This many.
    Fixed(u32),
}

fn pool_choice(text: &str) -> Result<Pool, String> {
    match text {
        "default" => Ok(Pool::Default),
        "match" => Ok(Pool::Match),
        n => n
            .parse()
            .map(Pool::Fixed)
            .map_err(|_| format!("default, match or a number, not {n}")),
    }
}

impl Pool {
    /// The pool in a cell of `c` clients, as a number.
    fn size(self, c: u32) -> u32 {
        match self {
            Pool::Default => DB_MAX_CONNECTIONS,
            Pool::Match => c + 1,
            Pool::Fixed(n) => n,
        }
    }

    /// As the record's header says it.
    fn describe(self) -> String {
        match self {
            Pool::Default => format!("the server's default ({DB_MAX_CONNECTIONS})"),
            Pool::Match => "clients + 1 (match)".to_string(),
            Pool::Fixed(n) => n.to_string(),
        }
    }
}

/// Logs a line of progress to stderr, as `[compare HH:MM:SS] …`.
pub(crate) fn log(line: &str) {
    eprintln!("[compare {}] {line}", crate::host::clock_now());
}

/// The options once --smoke and --no-pooler have had their say.
struct Plan {
    options: Options,
    pooler_clients: Vec<u32>,
    pooler_workloads: Vec<String>,
    wait_clients: Option<u32>,
    results: PathBuf,
}

fn plan(mut options: Options) -> Result<Plan, String> {
    let root = crate::repository_root();
    let mut pooler_clients = options.pooler_clients.0.clone();
    if options.no_pooler {
        pooler_clients.clear();
    }
    if options.smoke {
        options.clients = Counts(vec![1, 8]);
        options.sqlite_clients = Counts(vec![1, 8]);
        if !pooler_clients.is_empty() {
            pooler_clients = vec![8];
        }
        options.scale = false;
    }
    let pooler_workloads: Vec<String> = options
        .pooler_workloads
        .split_whitespace()
        .map(String::from)
        .collect();
    if let Some(w) = pooler_workloads
        .iter()
        .find(|w| *w != "claim-complete" && *w != "replay")
    {
        return Err(format!(
            "--pooler-workloads takes claim-complete and/or replay, not {w}"
        ));
    }
    if pooler_workloads.is_empty() {
        pooler_clients.clear();
    }
    if options.mux_clients != 0 && options.mux_connections >= options.mux_clients {
        return Err(format!(
            "--mux-connections ({}) must be fewer than --mux-clients ({})",
            options.mux_connections, options.mux_clients
        ));
    }
    if !options.no_plot && !on_path("gnuplot") {
        return Err(
            "gnuplot not found (Debian: apt-get install gnuplot-nox), or pass --no-plot".into(),
        );
    }
    // mixed-wait runs once, at the largest client count from 8 to 32 (with one client nobody
    // waits).
    let wait_clients = options
        .clients
        .0
        .iter()
        .copied()
        .rfind(|c| (8..=32).contains(c));
    let default = if options.smoke {
        "bench/results/smoke"
    } else {
        "bench/results/latest"
    };
    let results = root.join(options.results.clone().unwrap_or_else(|| default.into()));
    Ok(Plan {
        options,
        pooler_clients,
        pooler_workloads,
        wait_clients,
        results,
    })
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()))
}

/// The release binaries the comparison runs.
pub(crate) struct Binaries {
    pub(crate) server: PathBuf,
    pub(crate) bench: PathBuf,
    pub(crate) floor: PathBuf,
}

/// Builds (unless `no_build`) and finds the binaries of the service and the bench, with the
/// cargo `profile` (`release`, or `smoke`: the same without fat LTO, for CI).
///
/// # Errors
///
/// When the build fails or a binary is missing.
pub fn release_binaries(
    no_build: bool,
    profile: &str,
) -> Result<(PathBuf, PathBuf, PathBuf), String> {
    let root = crate::repository_root();
    if !no_build {
        log(&format!("building the binaries (profile {profile})"));
        let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        // What `cargo run` set for this driver is not the build's: ring's build script reruns
        // when CARGO_MANIFEST_DIR, CARGO_PKG_* or OUT_DIR change, and with it rustls, tonic and
        // the server, so a build from here and one from a shell (or from another driver)
        // rebuilt each other's: minutes each time, in CI after compare's smoke build.
        const SET_BY_CARGO_RUN: [&str; 4] = [
            "CARGO_CRATE_NAME",
            "CARGO_BIN_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "OUT_DIR",
        ];
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("CARGO_PKG_")
                || name.starts_with("CARGO_MANIFEST_")
                || SET_BY_CARGO_RUN.contains(&name.as_ref())
            {
                cargo.env_remove(name.as_ref());
            }
        }
        let status = cargo
            // Just the three binaries every driver runs: each release binary is linked with
            // fat LTO, so the drivers not running (soak, profile) are not linked on the way.
            .args(["build", "--profile", profile, "--quiet"])
            .args(["-p", "idempotency-ledger", "-p", "ledger-bench"])
            .args(["--bin", "idempotency-ledger", "--bin", "ledger-bench"])
            .args(["--bin", "ledger-floor"])
            .current_dir(&root)
            .status()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !status.success() {
            return Err(format!("cargo build failed ({status})"));
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join(profile);
    let [server, bench, floor] =
        ["idempotency-ledger", "ledger-bench", "ledger-floor"].map(|b| target.join(b));
    for b in [&server, &bench, &floor] {
        if !b.is_file() {
            return Err(format!("no release binary {}", b.display()));
        }
    }
    Ok((server, bench, floor))
}

/// Runs the comparison; returns the names of the cells that had errors.
///
/// # Errors
///
/// When it cannot start: bad options, a failed build, no PostgreSQL, a failed migration.
pub fn run(options: Options) -> Result<Vec<String>, String> {
    let plan = plan(options)?;
    let options = &plan.options;
    let profile = if options.smoke { "smoke" } else { "release" };
    let (server, bench, floor) = release_binaries(options.no_build, profile)?;
    let binaries = Binaries {
        server,
        bench,
        floor,
    };
    let work = tempfile::Builder::new()
        .prefix("ledger-compare.")
        .tempdir()
        .map_err(|e| format!("cannot create a work directory: {e}"))?;
    for dir in ["logs", "json", "pgbench"] {
        std::fs::create_dir_all(work.path().join(dir)).map_err(|e| e.to_string())?;
    }
    // The most clients pgbench opens at once, for PostgreSQL's max_connections.
    let max_clients = options
        .clients
        .0
        .iter()
        .copied()
        .chain([options.mux_clients])
        .max()
        .unwrap_or(0);
    let max_connections = (max_clients + 40).max(200);
    log(&format!("PostgreSQL {}", testkit::postgres::version()));
    // Durable commits as in production (fsync and synchronous_commit on, the defaults), room
    // for the most pgbench connections of any cell plus the server's pool, and shared_buffers
    // 128MB (the default, stated so a changed default does not change the figures): over the
    // harness's test settings, which turn fsync off.
    let cluster = PgCluster::start_with(
        ClusterSetup::default()
            .conf(format!("max_connections = {max_connections}"))
            .conf("shared_buffers = 128MB")
            .conf("fsync = on")
            .conf("synchronous_commit = on")
            .conf("full_page_writes = on"),
    );
    let result = measure(&plan, &binaries, &cluster, work.path(), max_connections);
    if options.keep {
        let dir = cluster.keep();
        let work = work.keep();
        log(&format!(
            "kept {} and the cluster in {} (stopped)",
            work.display(),
            dir.display()
        ));
    }
    result
}

/// Everything after the cluster started.
fn measure(
    plan: &Plan,
    binaries: &Binaries,
    cluster: &PgCluster,
    work: &Path,
    max_connections: u32,
) -> Result<Vec<String>, String> {
    let options = &plan.options;
    let db_url = create_ledger_database(cluster, binaries)?;
    let postmaster = cluster
        .postmaster_pid()
        .ok_or("the cluster's postmaster is not running")?;
    let mut side = Side {
        options,
        binaries,
        cluster,
        work,
        db_url,
        postmaster,
        run_tag: format!("r{}", crate::host::unix_now()),
        failed: Vec::new(),
        pgbench_rounds: BTreeMap::new(),
        floor_rounds: BTreeMap::new(),
    };
    let started = Instant::now();
    let mut record = Record::new(options.db_max_connections);
    let probe_before = side.commit_probe();
    for workload in ["claim-complete", "replay"] {
        postgres_cells(plan, &mut side, &mut record, workload);
    }
    if let Some(c) = plan.wait_clients {
        let cell = Cell::new("postgres", "mixed-wait", c, 0, false, None, &[]);
        let result = side.cell(&cell);
        record.add_row("mixed-wait (PostgreSQL)", &cell, 2, &result);
    }
    // SQLite through the server; the floor is PostgreSQL's, reused when measured.
    for &c in &options.sqlite_clients.0 {
        let floor = Some("claim-complete");
        let cell = Cell::new("sqlite", "claim-complete", c, 0, false, floor, &[]);
        let result = side.cell(&cell);
        record.add_row("claim-complete (SQLite)", &cell, 2, &result);
    }
    if options.scale {
        record.scale = Some(scale::run(&mut side)?);
    }
    let probe_after = side.commit_probe();
    record.finish(record::Header {
        options,
        elapsed_s: started.elapsed().as_secs(),
        max_connections,
        probe: [probe_before, probe_after],
        failed: side.failed.clone(),
    });
    let mut failed = side.failed;
    let elapsed = started.elapsed().as_secs();
    record.write(&plan.results, !options.no_plot, work, &mut failed, elapsed)?;
    Ok(failed)
}

/// Creates the `ledger` database on the cluster and runs the server's migrations on it;
/// returns its URL.
fn create_ledger_database(cluster: &PgCluster, binaries: &Binaries) -> Result<String, String> {
    succeeds(
        cluster
            .psql("postgres")
            .args(["-c", "CREATE DATABASE ledger"]),
        "CREATE DATABASE",
    )?;
    let db_url = cluster.url("ledger");
    succeeds(
        Command::new(&binaries.server).args(["migrate", "--database-url", &db_url]),
        "the server's migrations",
    )?;
    log(&format!("PostgreSQL on port {}, migrated", cluster.port()));
    Ok(db_url)
}

/// Runs `command` to its end; an error names `what`, with its standard error.
fn succeeds(command: &mut Command, what: &str) -> Result<(), String> {
    let out = command
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// `workload`'s PostgreSQL cells: direct at each client count, multiplexed (claim-complete),
/// and through PgBouncer.
fn postgres_cells(plan: &Plan, side: &mut Side<'_>, record: &mut Record, workload: &'static str) {
    let options = &plan.options;
    let (extra, rpcs): (Vec<String>, u32) = if workload == "replay" {
        (vec!["--hot-keys".into(), HOT_KEYS.to_string()], 1)
    } else {
        (Vec::new(), 2)
    };
    for &c in &options.clients.0 {
        let cell = Cell::new("postgres", workload, c, 0, true, Some(workload), &extra);
        let result = side.cell(&cell);
        record.add_row(&format!("{workload} (PostgreSQL)"), &cell, rpcs, &result);
        record.note_direct(workload, c, &result);
    }
    // The way agents connect: many clients multiplexed over a few HTTP/2 connections,
    // beside the same clients with a connection each (unless --clients measured that).
    if workload == "claim-complete" && options.mux_clients > 0 {
        let mux = options.mux_clients;
        let mut conns = vec![options.mux_connections];
        if !options.clients.0.contains(&mux) {
            conns.insert(0, 0);
        }
        for n in conns {
            let cell = Cell::new("postgres", workload, mux, n, true, Some(workload), &[]);
            let result = side.cell(&cell);
            record.add_row("claim-complete (PostgreSQL)", &cell, 2, &result);
            if n == 0 {
                record.note_direct(workload, mux, &result);
            }
        }
    }
    // Through PgBouncer in transaction mode, pgbench and ours alike, beside the direct
    // cells.
    if plan.pooler_workloads.iter().any(|w| w == workload) {
        for &c in &plan.pooler_clients {
            let cell = Cell::new("pgbouncer", workload, c, 0, true, Some(workload), &extra);
            let result = side.cell(&cell);
            let label = format!("{workload} (PostgreSQL via PgBouncer)");
            record.add_row(&label, &cell, rpcs, &result);
            record.add_pooler_row(workload, c, options.db_max_connections.size(c), &result);
        }
    }
}
