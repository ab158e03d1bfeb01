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
//! sqlite`). Prints instructions per RPC for each, ours above the floor, and the functions that
//! count most (inclusive), and keeps the callgrind files for `callgrind_annotate`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use testkit::postgres::{ClusterSetup, PgCluster};

use crate::compare::{Counts, release_binaries};
use crate::procs::Server;

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
    /// Use the release binaries already built.
    #[arg(long)]
    pub no_build: bool,
    /// Use the binaries in DIR (idempotency-ledger, ledger-floor, ledger-bench), e.g. a copy of
    /// an earlier build, to compare two builds; implies --no-build.
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Functions listed per cell.
    #[arg(long, default_value_t = 25)]
    pub top: usize,
}

/// The workloads profiled.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// A Claim of a fresh key and its Complete: 2 RPCs.
    ClaimComplete,
    /// A Claim answered REPLAYED: 1 RPC.
    Replay,
}

/// The server's store.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// A throwaway PostgreSQL cluster.
    Postgres,
    /// A SQLite file.
    Sqlite,
}

fn log(line: &str) {
    eprintln!("profile: {line}");
}

/// Runs the profile and prints its table; returns instructions per RPC by client count, the
/// floor's and ours.
///
/// # Errors
///
/// When valgrind is missing, a program does not start, or callgrind wrote no totals.
pub fn run(options: &Options) -> Result<BTreeMap<u32, (u64, u64)>, String> {
    let (workload, rpcs) = match options.workload {
        Workload::ClaimComplete => ("claim-complete", 2),
        Workload::Replay => ("replay", 1),
    };
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
        None => release_binaries(options.no_build, "release")?,
    };
    let out = crate::repository_root().join(&options.out);
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let cluster = (options.store == Store::Postgres).then(|| {
        // The comparison's settings: durable commits, the default shared_buffers.
        PgCluster::start_with(
            ClusterSetup::default()
                .conf("fsync = on")
                .conf("shared_buffers = 128MB"),
        )
    });
    let store_url = match &cluster {
        Some(cluster) => {
            let url = cluster.create_database();
            let status = Command::new(&server)
                .args(["migrate", "--database-url", &url])
                .output();
            if !status.is_ok_and(|o| o.status.success()) {
                return Err("the server's migrations failed".into());
            }
            Some(url)
        }
        None => None,
    };
    let mut figures = BTreeMap::new();
    for &c in &options.clients.0 {
        log(&format!("floor, {c} clients"));
        let name = format!("floor-{workload}-{c}");
        let floor_args = ["--workload", "floor", "--floor-of", workload];
        let floor_ir = measure(options, &out, &name, &floor, &[], &bench, c, &floor_args)?
            / (options.count * rpcs);
        log(&format!("ours ({:?}), {c} clients", options.store));
        let server_args: Vec<String> = match (&cluster, &store_url) {
            (Some(cluster), Some(url)) => {
                let _ = cluster
                    .psql(url.rsplit('/').next().unwrap_or("postgres"))
                    .args(["-c", "TRUNCATE ledger_entries", "-c", "CHECKPOINT"])
                    .status();
                vec!["--database-url".into(), url.clone()]
            }
            _ => {
                let db = work.path().join(format!("ledger-{c}.db"));
                vec![
                    "--database-url".into(),
                    format!("sqlite://{}", db.display()),
                ]
            }
        };
        let name = format!("ours-{workload}-{c}");
        let ours_ir = measure(
            options,
            &out,
            &name,
            &server,
            &server_args,
            &bench,
            c,
            &["--workload", workload],
        )? / (options.count * rpcs);
        figures.insert(c, (floor_ir, ours_ir));
    }
    let mut text = format!(
        "\nInstructions per RPC (callgrind, {} operations of {workload}, {rpcs} RPC each; store {:?})\n\n",
        options.count, options.store
    );
    text.push_str(
        "| clients | floor | ours | ours above the floor |\n| ---: | ---: | ---: | ---: |\n",
    );
    for (c, (floor_ir, ours_ir)) in &figures {
        let above = i128::from(*ours_ir) - i128::from(*floor_ir);
        text.push_str(&format!("| {c} | {floor_ir} | {ours_ir} | {above} |\n"));
    }
    for c in figures.keys() {
        text.push_str(&format!(
            "\nOurs at {c} clients, the functions that count most (inclusive instructions):\n"
        ));
        let file = out.join(format!("ours-{workload}-{c}.callgrind"));
        let annotated = annotate(&file, true);
        let lines: Vec<&str> = annotated
            .lines()
            .filter(|l| counted_function(l))
            .skip(1)
            .take(options.top)
            .collect();
        text.push_str(&lines.join("\n"));
        text.push('\n');
    }
    text.push_str(&format!(
        "\ncallgrind files: {} (callgrind_annotate --inclusive=yes FILE)\n",
        out.display()
    ));
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(figures)
}

/// Starts `program` under callgrind with collection off, runs a warm-up, switches collection
/// on for `--count` operations, stops the program and returns the instructions counted.
#[allow(clippy::too_many_arguments)]
fn measure(
    options: &Options,
    out: &Path,
    name: &str,
    program: &Path,
    program_args: &[String],
    bench: &Path,
    clients: u32,
    bench_args: &[&str],
) -> Result<u64, String> {
    let callgrind = out.join(format!("{name}.callgrind"));
    let mut args: Vec<String> = vec![
        "--tool=callgrind".into(),
        "--instr-atstart=no".into(),
        format!(
            "--log-file={}",
            out.join(format!("{name}.valgrind.log")).display()
        ),
        format!("--callgrind-out-file={}", callgrind.display()),
        program.display().to_string(),
    ];
    args.extend(program_args.iter().cloned());
    let server = Server::start(
        Path::new("valgrind"),
        &args,
        &out.join(format!("{name}.log")),
    )?;
    let run_bench = |count: u64, file: &str, json: bool| {
        let mut command = Command::new(bench);
        command
            .args([
                "--addr",
                &server.addr(),
                "--clients",
                &clients.to_string(),
                "--connect-timeout",
                "120s",
            ])
            .args(bench_args)
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
    let status = run_bench(options.count, &format!("{name}.bench.txt"), true)?;
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
