//! Instructions per RPC of the ledger server and of the gRPC floor, counted by valgrind's
//! callgrind (`profile`), so that a change to the claim path is measured by a figure that does
//! not move with the machine's load (the same binary and workload count the same instructions
//! within a few per cent; batch sizes, and so the count, still depend on timing at many
//! clients).
//!
//! For each client count, each side runs under callgrind with collection off; ledger-bench runs
//! a warm-up (not counted), then collection is switched on for exactly `--count` operations and
//! the totals are read. Sides: the floor (`ledger-floor`, the same RPC shapes) and ours
//! (`idempotency-ledger` on a throwaway PostgreSQL cluster, or on SQLite with `--store
//! sqlite`). Prints instructions per RPC for each, ours above the floor, where they go by
//! component ([`components`]) and the functions that count most (inclusive), and keeps the
//! callgrind files for `callgrind_annotate`.
//!
//! `--check` ([`check`]) counts ours alone and compares it with the committed record of the
//! same build profile, failing on a rise: CI's guard against the slow creep.

pub mod check;
pub mod components;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use testkit::postgres::{ClusterSetup, PgCluster};

use crate::compare::{Counts, release_binaries};
use crate::procs::Server;
use components::{OTHER, Profile};

/// Instructions per RPC of the server and the floor, under callgrind.
#[derive(Parser, Debug, Clone)]
#[command(name = "profile", version)]
pub struct Options {
    /// The workload profiled.
    #[arg(long, value_enum, default_value_t = Workload::ClaimComplete)]
    pub workload: Workload,
    /// Client counts ("C ...").
    #[arg(long, default_value = "1 32", value_parser = crate::compare::counts)]
    pub clients: Counts,
    /// Operations counted per cell.
    #[arg(long, default_value_t = 2000)]
    pub count: u64,
    /// The server's store.
    #[arg(long, value_enum, default_value_t = Store::Postgres)]
    pub store: Store,
    /// Where the callgrind files and logs go (relative to the repository).
    #[arg(long, default_value = "bench/results/profile")]
    pub out: PathBuf,
    /// Use the binaries already built.
    #[arg(long)]
    pub no_build: bool,
    /// Build and run the `smoke` profile's binaries (as `compare --smoke`), not `release`'s.
    #[arg(long)]
    pub smoke: bool,
    /// Use the binaries in DIR (idempotency-ledger, ledger-floor, ledger-bench), e.g. a copy of
    /// an earlier build, to compare two builds; implies --no-build.
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Functions listed per cell.
    #[arg(long, default_value_t = 25)]
    pub top: usize,
    /// Count ours alone with the record's settings (workload, clients, count, store; the other
    /// flags above are ignored) and fail if its instructions per RPC rose more than
    /// --tolerance per cent above the record (`bench/results/profile-record-<profile>.json`).
    #[arg(long)]
    pub check: bool,
    /// Count ours alone with --workload, the first of --clients and --count, and write the
    /// record --check compares with, for the build profile used.
    #[arg(long, conflicts_with = "check")]
    pub save_record: bool,
    /// The rise --check allows, in per cent.
    #[arg(long, default_value_t = 10.0)]
    pub tolerance: f64,
}

/// The workloads profiled.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// A Claim of a fresh key and its Complete: 2 RPCs.
    ClaimComplete,
    /// A Claim answered REPLAYED: 1 RPC.
    Replay,
}

impl Workload {
    /// Its name on ledger-bench's command line, and the RPCs one operation makes.
    #[must_use]
    pub fn name_and_rpcs(self) -> (&'static str, u64) {
        match self {
            Self::ClaimComplete => ("claim-complete", 2),
            Self::Replay => ("replay", 1),
        }
    }
}

/// The server's store.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Store {
    /// A throwaway PostgreSQL cluster.
    Postgres,
    /// A SQLite file.
    Sqlite,
}

fn log(line: &str) {
    eprintln!("profile: {line}");
}

/// The binaries a profile runs, and the profile they were built with.
struct Binaries {
    server: PathBuf,
    bench: PathBuf,
    floor: PathBuf,
}

/// Where a profile's servers keep their entries: a throwaway cluster's database, or SQLite
/// files in a temporary directory.
struct Stores {
    cluster: Option<(PgCluster, String)>,
    work: tempfile::TempDir,
}

impl Stores {
    /// Starts the cluster (with `--store postgres`) and migrates it.
    fn start(store: Store, server: &Path) -> Result<Self, String> {
        let work = tempfile::tempdir().map_err(|e| e.to_string())?;
        if store == Store::Sqlite {
            return Ok(Self {
                cluster: None,
                work,
            });
        }
        // The comparison's settings: durable commits, the default shared_buffers.
        let cluster = PgCluster::start_with(
            ClusterSetup::default()
                .conf("fsync = on")
                .conf("shared_buffers = 128MB"),
        );
        let url = cluster.create_database();
        let status = Command::new(server)
            .args(["migrate", "--database-url", &url])
            .output();
        if !status.is_ok_and(|o| o.status.success()) {
            return Err("the server's migrations failed".into());
        }
        Ok(Self {
            cluster: Some((cluster, url)),
            work,
        })
    }

    /// The server's arguments for a cell of `clients`: an emptied table, or a fresh file.
    fn server_args(&self, clients: u32) -> Vec<String> {
        let url = match &self.cluster {
            Some((cluster, url)) => {
                let status = cluster
                    .psql(url.rsplit('/').next().unwrap_or("postgres"))
                    .args([
                        "-q",
                        "-c",
                        "TRUNCATE ledger_entries CASCADE",
                        "-c",
                        "CHECKPOINT",
                    ])
                    .status();
                if !status.is_ok_and(|s| s.success()) {
                    log("could not empty the table; the cell starts with the last one's entries");
                }
                url.clone()
            }
            None => {
                let db = self.work.path().join(format!("ledger-{clients}.db"));
                format!("sqlite://{}", db.display())
            }
        };
        vec!["--database-url".into(), url]
    }
}

/// Checks that valgrind's tools are installed and finds (or builds) the binaries.
fn prepare(options: &Options) -> Result<Binaries, String> {
    for tool in ["valgrind", "callgrind_control", "callgrind_annotate"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if found.is_err() {
            return Err(format!("{tool} not found (Debian: valgrind)"));
        }
    }
    let (server, bench, floor) = match &options.bin_dir {
        Some(dir) => ["idempotency-ledger", "ledger-bench", "ledger-floor"]
            .map(|b| dir.join(b))
            .into(),
        None => release_binaries(options.no_build, build_profile(options))?,
    };
    Ok(Binaries {
        server,
        bench,
        floor,
    })
}

/// The cargo profile the binaries are built with.
#[must_use]
pub fn build_profile(options: &Options) -> &'static str {
    if options.smoke { "smoke" } else { "release" }
}

/// The directory for callgrind files and logs, created.
fn out_dir(options: &Options) -> Result<PathBuf, String> {
    let out = crate::repository_root().join(&options.out);
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    Ok(out)
}

/// Runs the profile and prints its table; returns instructions per RPC by client count, the
/// floor's and ours.
///
/// # Errors
///
/// When valgrind is missing, a program does not start, or callgrind wrote no totals.
pub fn run(options: &Options) -> Result<BTreeMap<u32, (u64, u64)>, String> {
    let (workload, rpcs) = options.workload.name_and_rpcs();
    let binaries = prepare(options)?;
    let out = out_dir(options)?;
    let stores = Stores::start(options.store, &binaries.server)?;
    let mut figures = BTreeMap::new();
    for &c in &options.clients.0 {
        log(&format!("floor, {c} clients"));
        let floor = Side {
            name: format!("floor-{workload}-{c}"),
            program: &binaries.floor,
            args: Vec::new(),
            bench_args: vec!["--workload", "floor", "--floor-of", workload],
        };
        let floor_ir =
            floor.measure(&binaries.bench, &out, c, options.count)? / (options.count * rpcs);
        log(&format!("ours ({:?}), {c} clients", options.store));
        let ours = Side {
            name: format!("ours-{workload}-{c}"),
            program: &binaries.server,
            args: stores.server_args(c),
            bench_args: vec!["--workload", workload],
        };
        let ours_ir =
            ours.measure(&binaries.bench, &out, c, options.count)? / (options.count * rpcs);
        figures.insert(c, (floor_ir, ours_ir));
    }
    let text = report(options, &out, &figures)?;
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(figures)
}

/// The profile's text: instructions per RPC, by component, and the top functions.
fn report(
    options: &Options,
    out: &Path,
    figures: &BTreeMap<u32, (u64, u64)>,
) -> Result<String, String> {
    let (workload, rpcs) = options.workload.name_and_rpcs();
    let mut text = format!(
        "\nInstructions per RPC (callgrind, {} operations of {workload}, {rpcs} RPC each; store {:?}; build profile {})\n\n",
        options.count,
        options.store,
        build_profile(options)
    );
    text.push_str(
        "| clients | floor | ours | ours above the floor |\n| ---: | ---: | ---: | ---: |\n",
    );
    for (c, (floor_ir, ours_ir)) in figures {
        let above = i128::from(*ours_ir) - i128::from(*floor_ir);
        text.push_str(&format!("| {c} | {floor_ir} | {ours_ir} | {above} |\n"));
    }
    for c in figures.keys() {
        let file = |side: &str| out.join(format!("{side}-{workload}-{c}.callgrind"));
        let rpcs_counted = (options.count * rpcs) as f64;
        text.push_str(&component_table(
            *c,
            &Profile::read(&file("ours"))?,
            &Profile::read(&file("floor"))?,
            rpcs_counted,
        ));
        text.push_str(&top_functions(*c, &file("ours"), options.top));
    }
    text.push_str(&format!(
        "\ncallgrind files: {} (callgrind_annotate --inclusive=yes FILE)\n",
        out.display()
    ));
    Ok(text)
}

/// Instructions per RPC by component, ours, the floor's and the difference, and who calls the
/// allocator and the copies.
#[must_use]
pub fn component_table(clients: u32, ours: &Profile, floor: &Profile, rpcs: f64) -> String {
    let (ours_rows, floor_rows) = (ours.by_component(), floor.by_component());
    let mut text = format!(
        "\nWhere ours go at {clients} clients, by component (self instructions per RPC; \
         components/std glue to their callers):\n\n\
         | component | ours | floor | ours − floor |\n| --- | ---: | ---: | ---: |\n"
    );
    let labels = components::COMPONENTS
        .iter()
        .map(|(label, _)| *label)
        .chain([OTHER]);
    for label in labels {
        let o = ours_rows.get(label).copied().unwrap_or(0.0) / rpcs;
        let f = floor_rows.get(label).copied().unwrap_or(0.0) / rpcs;
        text.push_str(&format!("| {label} | {o:.0} | {f:.0} | {:.0} |\n", o - f));
    }
    let (o, f) = (ours.total as f64 / rpcs, floor.total as f64 / rpcs);
    text.push_str(&format!("| **total** | {o:.0} | {f:.0} | {:.0} |\n", o - f));
    for row in [components::COMPONENTS[0].0, components::COMPONENTS[1].0] {
        let mut callers: Vec<_> = ours.callers_of(row).into_iter().collect();
        callers.sort_by(|a, b| b.1.total_cmp(&a.1));
        let list: Vec<String> = callers
            .iter()
            .take(6)
            .map(|(r, n)| format!("{r} {:.0}", n / rpcs))
            .collect();
        text.push_str(&format!("\nours, {row} by caller: {}\n", list.join("; ")));
    }
    text
}

/// The functions of ours that count most (inclusive), as `callgrind_annotate` lists them.
fn top_functions(clients: u32, file: &Path, top: usize) -> String {
    let annotated = annotate(file, true);
    let lines: Vec<&str> = annotated
        .lines()
        .filter(|l| counted_function(l))
        .skip(1)
        .take(top)
        .collect();
    format!(
        "\nOurs at {clients} clients, the functions that count most (inclusive instructions):\n{}\n",
        lines.join("\n")
    )
}

/// One program profiled: the floor or the server, and what ledger-bench runs against it.
struct Side<'a> {
    /// The callgrind file's and the logs' base name.
    name: String,
    program: &'a Path,
    args: Vec<String>,
    bench_args: Vec<&'a str>,
}

impl Side<'_> {
    /// Starts the program under callgrind with collection off, runs a warm-up, switches
    /// collection on for `count` operations, stops the program and returns the instructions
    /// counted.
    fn measure(&self, bench: &Path, out: &Path, clients: u32, count: u64) -> Result<u64, String> {
        let name = &self.name;
        let callgrind = out.join(format!("{name}.callgrind"));
        let mut args: Vec<String> = vec![
            "--tool=callgrind".into(),
            "--instr-atstart=no".into(),
            format!(
                "--log-file={}",
                out.join(format!("{name}.valgrind.log")).display()
            ),
            format!("--callgrind-out-file={}", callgrind.display()),
            self.program.display().to_string(),
        ];
        args.extend(self.args.iter().cloned());
        let server = Server::start(
            Path::new("valgrind"),
            &args,
            &out.join(format!("{name}.log")),
        )?;
        let run_bench = |count: u64, file: &str, json: bool| {
            let mut command = Command::new(bench);
            command
                .args(["--addr", &server.addr(), "--clients", &clients.to_string()])
                .args(["--connect-timeout", "120s"])
                .args(&self.bench_args)
                .args(["--warmup", "0s", "--count", &count.to_string()]);
            if json {
                command.arg("--json").arg(out.join(format!("{name}.json")));
            }
            let output = std::fs::File::create(out.join(file)).map_err(|e| e.to_string())?;
            command
                .stdout(output.try_clone().map_err(|e| e.to_string())?)
                .stderr(output)
                .status()
                .map_err(|e| format!("cannot run ledger-bench: {e}"))
        };
        run_bench(
            u64::from(clients * 20).max(200),
            &format!("{name}.warmup.txt"),
            false,
        )?;
        let control = |switch: &str| {
            Command::new("callgrind_control")
                .args(["-i", switch, &server.pid().to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
        };
        let _ = control("on");
        let status = run_bench(count, &format!("{name}.bench.txt"), true)?;
        let _ = control("off");
        server.stop_within(Duration::from_secs(600));
        if !status.success() {
            return Err(format!(
                "ledger-bench failed for {name}; see {}",
                out.join(format!("{name}.bench.txt")).display()
            ));
        }
        let totals = annotate(&callgrind, false);
        totals
            .lines()
            .find(|l| l.contains("PROGRAM TOTALS"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.replace(',', "").parse().ok())
            .ok_or_else(|| format!("no totals in {}", callgrind.display()))
    }
}

/// Counts ours alone: `count` operations of `workload` at `clients`, under callgrind;
/// instructions per RPC.
fn count_ours(
    options: &Options,
    workload: Workload,
    clients: u32,
    count: u64,
    store: Store,
) -> Result<u64, String> {
    let (name, rpcs) = workload.name_and_rpcs();
    let binaries = prepare(options)?;
    let out = out_dir(options)?;
    let stores = Stores::start(store, &binaries.server)?;
    let ours = Side {
        name: format!("ours-{name}-{clients}"),
        program: &binaries.server,
        args: stores.server_args(clients),
        bench_args: vec!["--workload", name],
    };
    Ok(ours.measure(&binaries.bench, &out, clients, count)? / (count * rpcs))
}

/// Whether a line of `callgrind_annotate` is a function's count: `  1,234 (12.3%)  name`.
fn counted_function(line: &str) -> bool {
    line.trim_start().split_once(' ').is_some_and(|(n, rest)| {
        !n.is_empty() && n.chars().all(|c| c.is_ascii_digit() || c == ',') && rest.starts_with('(')
    })
}

/// `callgrind_annotate [--inclusive=yes] FILE`'s output.
fn annotate(file: &Path, inclusive: bool) -> String {
    let mut command = Command::new("callgrind_annotate");
    if inclusive {
        command.arg("--inclusive=yes");
    }
    command.arg(file).output().map_or_else(
        |_| String::new(),
        |o| String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}
