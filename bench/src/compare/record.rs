//! The record: every cell's figures as rows of the tables and as JSON, the header that says
//! how they were measured, written to `BASE.md` and `BASE.json` (and the picture, `BASE.png`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde::Serialize;
use serde_json::Value;

use super::cells::{Cell, CellResult};
use super::pgbench::PgbenchRun;
use super::picture::{PlotRow, draw};
use super::scale::ScaleResult;
use super::{Options, Pool, SMOKE_OPS, log};
use crate::host::{commit, memory, uname, unix_now, utc};
use crate::load::Report;

/// One cell as the JSON holds it.
#[derive(Serialize)]
struct CellJson {
    workload: String,
    clients: u32,
    connections: u32,
    rpcs_per_op: u32,
    rounds_ops_s: RoundsJson,
    pgbench: Option<PgbenchRun>,
    floor: Option<FloorJson>,
    ours: Value,
}

#[derive(Serialize)]
struct RoundsJson {
    pgbench: Option<Vec<f64>>,
    ours: Vec<f64>,
}

#[derive(Serialize)]
struct FloorJson {
    stands_in_for: String,
    rounds_ops_s: Vec<f64>,
    report: Value,
}

/// The whole record as JSON.
#[derive(Serialize)]
struct RecordJson<'a> {
    date: String,
    commit: String,
    mode: String,
    cores: usize,
    memory: String,
    postgres: String,
    pool: String,
    elapsed_s: u64,
    commit_probe_ms: [Option<f64>; 2],
    failed_cells: &'a [String],
    cells: &'a [CellJson],
    pooler: Option<PoolerJson>,
    scale: Option<&'a ScaleResult>,
}

#[derive(Serialize)]
struct PoolerJson {
    program: String,
    pool_mode: &'static str,
    default_pool_size: &'static str,
    pgbench_query_mode: &'static str,
    server: &'static str,
}

/// What the header says beyond the cells.
pub(crate) struct Header<'a> {
    pub(crate) options: &'a Options,
    pub(crate) elapsed_s: u64,
    pub(crate) max_connections: u32,
    pub(crate) probe: [Option<f64>; 2],
    pub(crate) failed: Vec<String>,
}

/// A direct cell's figures, for the pooler table's direct side.
#[derive(Clone, Copy, Default)]
struct Direct {
    pg_tps: Option<f64>,
    pg_p50: Option<f64>,
    pg_p99: Option<f64>,
    tps: Option<f64>,
    p50: Option<f64>,
    p99: Option<f64>,
}

/// The figures so far, as table rows and JSON cells.
pub(crate) struct Record {
    pool: Pool,
    rows: Vec<String>,
    cpu_rows: Vec<String>,
    floor_rows: Vec<String>,
    pooler_rows: Vec<String>,
    pooler_cpu_rows: Vec<String>,
    plot_rows: Vec<PlotRow>,
    cells: Vec<CellJson>,
    direct: BTreeMap<(String, u32), Direct>,
    /// `--scale`'s runs.
    pub(crate) scale: Option<ScaleResult>,
    markdown: String,
    json: String,
    title: String,
}

/// `v` to `places` decimals, or `-`.
pub(crate) fn fmt(v: Option<f64>, places: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.places$}"))
}

/// `a / b` to two places, or `-`.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".to_string(),
    }
}

/// `(ms_per_op − the others) × 1000 / rpcs`, in µs per RPC, or `-` if any is missing.
fn us_per_rpc(ms_per_op: Option<f64>, rpcs: u32, minus: &[Option<f64>]) -> String {
    let Some(mut v) = ms_per_op else {
        return "-".to_string();
    };
    for m in minus {
        match m {
            Some(m) => v -= m,
            None => return "-".to_string(),
        }
    }
    format!("{:.0}", v * 1000.0 / f64::from(rpcs))
}

fn latency(r: Option<&Report>) -> (Option<f64>, Option<f64>, Option<f64>) {
    let l = r.and_then(|r| r.latency_ms.as_ref());
    (l.map(|l| l.p50), l.map(|l| l.p99), l.map(|l| l.p999))
}

fn cpu(r: Option<&Report>, pick: fn(&Report) -> Option<&crate::load::Cpu>) -> Option<f64> {
    r.and_then(pick).map(|c| c.ms_per_op)
}

fn errors(r: Option<&Report>) -> String {
    r.map_or_else(|| "failed".to_string(), |r| r.failed_ops.to_string())
}

impl Record {
    pub(crate) fn new(pool: Pool) -> Record {
        Record {
            pool,
            rows: Vec::new(),
            cpu_rows: Vec::new(),
            floor_rows: Vec::new(),
            pooler_rows: Vec::new(),
            pooler_cpu_rows: Vec::new(),
            plot_rows: Vec::new(),
            cells: Vec::new(),
            direct: BTreeMap::new(),
            scale: None,
            markdown: String::new(),
            json: String::new(),
            title: String::new(),
        }
    }

    /// One row of each table and one JSON cell (`rpcs`: gRPC calls per operation).
    pub(crate) fn add_row(&mut self, label: &str, cell: &Cell, rpcs: u32, r: &CellResult) {
        let (c, n) = (cell.clients, cell.connections_used());
        let ours = r.ours.report.as_ref();
        let tps = ours.map(|r| r.throughput_ops_s);
        let (p50, p99, p999) = latency(ours);
        let pg = r.pgbench.as_ref();
        let pg_tps = pg.and_then(|p| p.tps);
        let (pg_p50, pg_p99) = (pg.and_then(|p| p.p50_ms), pg.and_then(|p| p.p99_ms));
        let floor = r.floor.as_ref().and_then(|f| f.report.as_ref());
        let fl_tps = floor.map(|f| f.throughput_ops_s);
        let (fl_p50, fl_p99, _) = latency(floor);
        let (pg_cols, pg_pct, pg_err) = match pg {
            Some(p) => (
                fmt(pg_tps, 0),
                format!("{} / {}", fmt(pg_p50, 3), fmt(pg_p99, 3)),
                p.failed.map_or_else(|| "?".to_string(), |f| f.to_string()),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let (fl_cols, fl_pct, fl_err) = match &r.floor {
            Some(f) => (
                fmt(fl_tps, 0),
                format!("{} / {}", fmt(fl_p50, 3), fmt(fl_p99, 3)),
                errors(f.report.as_ref()),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let peak = ours
            .and_then(|r| r.server_peak_rss_kib)
            .map(|k| format!("{:.1}", k as f64 / 1024.0))
            .unwrap_or_else(|| "-".into());
        self.rows.push(format!(
            "| {label} | {c} | {n} | {pg_cols} | {fl_cols} | {} | {} | {} | {pg_pct} | {fl_pct} | {} / {} | {} | {peak} | {pg_err} / {fl_err} / {} |",
            fmt(tps, 0),
            ratio(tps, pg_tps),
            ratio(tps, fl_tps),
            fmt(p50, 3),
            fmt(p99, 3),
            fmt(p999, 3),
            errors(ours),
        ));
        let cpu_pg = pg.map_or_else(
            || "- | -".to_string(),
            |p| {
                format!(
                    "{} | {}",
                    fmt(p.db_cpu_ms_per_op, 3),
                    fmt(p.pgbench_cpu_ms_per_op, 3)
                )
            },
        );
        let (fl_srv, fl_bench) = (
            cpu(floor, |r| r.server_cpu.as_ref()),
            cpu(floor, |r| r.bench_cpu.as_ref()),
        );
        let cpu_fl = match &r.floor {
            Some(_) => format!("{} | {}", fmt(fl_srv, 3), fmt(fl_bench, 3)),
            None => "- | -".into(),
        };
        let (srv, bench) = (
            cpu(ours, |r| r.server_cpu.as_ref()),
            cpu(ours, |r| r.bench_cpu.as_ref()),
        );
        self.cpu_rows.push(format!(
            "| {label} | {c} | {n} | {cpu_pg} | {cpu_fl} | {} | {} | {} |",
            fmt(cpu(ours, |r| r.db_cpu.as_ref()), 3),
            fmt(srv, 3),
            fmt(bench, 3)
        ));
        if let Some(shape) = cell.floor_of {
            // The server's own latency: only where nothing queues, so that the three add up.
            let own = if pg.is_some() && c == 1 {
                us_per_rpc(p50, rpcs, &[fl_p50, pg_p50])
            } else {
                "-".to_string()
            };
            self.floor_rows.push(format!(
                "| {label} | {c} | {n} | {rpcs} | {} | {} | {} | {} | {} | {} | {own} |",
                us_per_rpc(fl_srv, rpcs, &[]),
                us_per_rpc(srv, rpcs, &[]),
                us_per_rpc(srv, rpcs, &[fl_srv]),
                us_per_rpc(fl_bench, rpcs, &[]),
                us_per_rpc(bench, rpcs, &[]),
                us_per_rpc(p50, rpcs, &[fl_p50]),
            ));
            // The pooler cells are not drawn.
            if label.ends_with("(PostgreSQL)") {
                self.plot_rows.push(PlotRow {
                    workload: cell.workload.to_string(),
                    clients: c,
                    connections: n,
                    values: [
                        pg_tps, fl_tps, tps, pg_p50, pg_p99, fl_p50, fl_p99, p50, p99,
                    ],
                });
            }
            let _ = shape;
        }
        let floor_json = match (&r.floor, cell.floor_of) {
            (Some(f), Some(shape)) => Some(FloorJson {
                stands_in_for: shape.to_string(),
                rounds_ops_s: r.floor_rounds.clone(),
                report: f.json.clone(),
            }),
            _ => None,
        };
        self.cells.push(CellJson {
            workload: label.to_string(),
            clients: c,
            connections: n,
            rpcs_per_op: rpcs,
            rounds_ops_s: RoundsJson {
                pgbench: pg.map(|_| r.pgbench_rounds.clone()),
                ours: r.ours_rounds.clone(),
            },
            pgbench: r.pgbench.clone(),
            floor: floor_json,
            ours: r.ours.json.clone(),
        });
    }

    /// Keeps the direct cell's figures, for the pooler table's direct side.
    pub(crate) fn note_direct(&mut self, workload: &str, c: u32, r: &CellResult) {
        let ours = r.ours.report.as_ref();
        let (p50, p99, _) = latency(ours);
        let pg = r.pgbench.as_ref();
        self.direct.insert(
            (workload.to_string(), c),
            Direct {
                pg_tps: pg.and_then(|p| p.tps),
                pg_p50: pg.and_then(|p| p.p50_ms),
                pg_p99: pg.and_then(|p| p.p99_ms),
                tps: ours.map(|r| r.throughput_ops_s),
                p50,
                p99,
            },
        );
    }

    /// The pooler table's rows for a pooler cell, beside the direct cell of the same workload
    /// and clients (when `--clients` measured it).
    pub(crate) fn add_pooler_row(&mut self, w: &str, c: u32, pool: u32, r: &CellResult) {
        let d = self
            .direct
            .get(&(w.to_string(), c))
            .copied()
            .unwrap_or_default();
        let ours = r.ours.report.as_ref();
        let tps = ours.map(|r| r.throughput_ops_s);
        let (p50, p99, _) = latency(ours);
        let pg = r.pgbench.clone().unwrap_or_default();
        self.pooler_rows.push(format!(
            "| {w} | {c} | {pool} | {} → {} | {} | {} → {} | {} | {} → {} | {} / {} → {} / {} | {} / {} → {} / {} |",
            fmt(d.pg_tps, 0),
            fmt(pg.tps, 0),
            ratio(pg.tps, d.pg_tps),
            fmt(d.tps, 0),
            fmt(tps, 0),
            ratio(tps, d.tps),
            ratio(d.tps, d.pg_tps),
            ratio(tps, pg.tps),
            fmt(d.pg_p50, 3),
            fmt(d.pg_p99, 3),
            fmt(pg.p50_ms, 3),
            fmt(pg.p99_ms, 3),
            fmt(d.p50, 3),
            fmt(d.p99, 3),
            fmt(p50, 3),
            fmt(p99, 3),
        ));
        self.pooler_cpu_rows.push(format!(
            "| {w} | {c} | {} | {} | {} | {} | {} | {} | {} |",
            fmt(pg.db_cpu_ms_per_op, 3),
            fmt(pg.pooler_cpu_ms_per_op, 3),
            fmt(pg.pgbench_cpu_ms_per_op, 3),
            fmt(cpu(ours, |r| r.db_cpu.as_ref()), 3),
            fmt(cpu(ours, |r| r.pooler_cpu.as_ref()), 3),
            fmt(cpu(ours, |r| r.server_cpu.as_ref()), 3),
            fmt(cpu(ours, |r| r.bench_cpu.as_ref()), 3),
        ));
    }
}

impl Record {
    /// Composes the record's Markdown and JSON from the cells and `header`.
    pub(crate) fn finish(&mut self, header: Header<'_>) {
        let options = header.options;
        let now = unix_now();
        let commit = commit();
        let mode = mode(options);
        let cores = std::thread::available_parallelism().map_or(0, usize::from);
        let memory = memory();
        let postgres = testkit::postgres::version().to_string();
        let pooler = (!self.pooler_rows.is_empty()).then(pooler_version);
        let md = &mut self.markdown;
        let mut line = |l: &str| {
            md.push_str(l);
            md.push('\n');
        };
        line("# Ledger server vs hand-written SQL and the gRPC floor");
        line("");
        line(&format!(
            "- date: {}; commit {commit}; {mode}; total {}s",
            utc(now, false),
            header.elapsed_s
        ));
        line(&format!(
            "- machine: {cores} cores, {memory}, {}; server, database and load generators share it",
            uname()
        ));
        line(&format!(
            "- PostgreSQL {postgres}: fsync=on, synchronous_commit=on, shared_buffers=128MB, max_connections={}; a truncated table and a checkpoint before each cell",
            header.max_connections
        ));
        if !options.smoke {
            let probe = |p: Option<f64>| p.map_or_else(|| "?".to_string(), |p| p.to_string());
            line(&format!(
                "- a one-row INSERT committed alone (the disk's fsync) took {} ms before the cells and {} ms after",
                probe(header.probe[0]),
                probe(header.probe[1])
            ));
        }
        line(&format!(
            "- pgbench: `-n -M prepared -c C -j min(C,2)`, bench/pgbench/*.sql, one database connection per client; floor: ledger-floor (the server's tonic stack, runtime, listener and HTTP/2 settings; no database, no ledger) driven by ledger-bench making the RPCs of one operation with the ledger's message sizes; ours: ledger-bench against the server, pool (`--db-max-connections`) {} for PostgreSQL, the default for SQLite",
            self.pool.describe()
        ));
        if let Some(version) = &pooler {
            line(&format!(
                "- via PgBouncer: {version} in transaction mode (`pool_mode = transaction`), a fresh one for each side of a cell, `default_pool_size` = the server's pool (so pgbench's C clients and the server reach PostgreSQL over the same number of connections); pgbench `-M extended` (unnamed statements, each autocommit), ours `--postgres-pooler transaction` (each store call BEGIN … COMMIT, unnamed statements), migrations directly"
            ));
        }
        line(
            "- connections: ledger-bench's HTTP/2 connections, for the floor and ours alike; as many as clients: one per client; fewer: client i uses connection i mod N (a runtime's channel pool)",
        );
        line(&format!(
            "- one op: claim-complete = Claim of a new key + Complete (2 RPCs); replay = Claim of one of {} completed keys (1 RPC); for pgbench one transaction of bench/pgbench/<workload>.sql, the server's statements for that op, each autocommit; ratios of ops/s",
            super::HOT_KEYS
        ));
        if !options.no_plot {
            line("- picture: [PICTURE](PICTURE) (throughput and p50/p99 latency against clients)");
        }
        let table = |md: &mut String,
                     title: Option<&str>,
                     text: Option<&str>,
                     head: &str,
                     rows: &[String]| {
            md.push('\n');
            if let Some(title) = title {
                md.push_str(&format!("{title}\n\n"));
            }
            if let Some(text) = text {
                md.push_str(&format!("{text}\n\n"));
            }
            let columns = head.matches('|').count() - 1;
            let align: Vec<&str> = (0..columns)
                .map(|i| if i == 0 { "---" } else { "---:" })
                .collect();
            md.push_str(&format!("{head}\n| {} |\n", align.join(" | ")));
            for row in rows {
                md.push_str(row);
                md.push('\n');
            }
        };
        let md = &mut self.markdown;
        table(
            md,
            None,
            None,
            "| workload | clients | connections | pgbench ops/s | floor ops/s | ours ops/s | ours / pgbench | ours / floor | pgbench p50 / p99 ms | floor p50 / p99 ms | ours p50 / p99 ms | ours p99.9 ms | server peak RSS MiB | errors (pgbench / floor / ours) |",
            &self.rows,
        );
        table(
            md,
            Some("## CPU per operation (ms, user + system, over the measured run)"),
            None,
            "| workload | clients | connections | pgbench: database | pgbench: pgbench | floor: server | floor: ledger-bench | ours: database | ours: server | ours: ledger-bench |",
            &self.cpu_rows,
        );
        table(
            md,
            Some("## Above the floor, per RPC (µs)"),
            Some(
                "CPU: the server process's, per gRPC call, the floor's and ours; ours − floor is what the ledger adds to the transport (the database's CPU is apart, in the table above). Latency: ours' p50 less the floor's, per call (the database's time included), and, at one client, where nothing queues, less pgbench's p50 as well: what is left is the server's own time per call.",
            ),
            "| workload | clients | connections | RPCs per op | floor: server CPU | ours: server CPU | ours − floor: server CPU | floor: ledger-bench CPU | ours: ledger-bench CPU | p50: ours − floor | p50: ours − floor − pgbench |",
            &self.floor_rows,
        );
        if !self.pooler_rows.is_empty() {
            table(
                md,
                Some("## Through PgBouncer (transaction mode) vs direct"),
                Some(
                    "Each figure direct → via PgBouncer. Direct: pgbench `-M prepared` over C connections, ours over its pool; via PgBouncer: pgbench `-M extended` and ours `--postgres-pooler transaction`, both over PgBouncer's pool of the server's size (the PostgreSQL connections column).",
                ),
                "| workload | clients | PostgreSQL connections via PgBouncer | pgbench ops/s | pgbench: PgBouncer / direct | ours ops/s | ours: PgBouncer / direct | ours / pgbench | pgbench p50 / p99 ms | ours p50 / p99 ms |",
                &self.pooler_rows,
            );
            table(
                md,
                None,
                Some(
                    "CPU per operation via PgBouncer (ms, user + system, over the measured run; direct: the CPU table above):",
                ),
                "| workload | clients | pgbench: database | pgbench: PgBouncer | pgbench: pgbench | ours: database | ours: PgBouncer | ours: server | ours: ledger-bench |",
                &self.pooler_cpu_rows,
            );
        }
        if let Some(scale) = &self.scale {
            let title = format!(
                "## Scale: empty table vs {} finished entries ({} clients)",
                scale.rows, scale.clients
            );
            table(
                md,
                Some(&title),
                None,
                "| measure | empty | loaded | loaded / empty |",
                &scale.rows_md(),
            );
        }
        if !header.failed.is_empty() {
            md.push_str(&format!(
                "\n**Cells with errors:** {}\n",
                header.failed.join(" ")
            ));
        }
        let record = RecordJson {
            date: utc(now, true),
            commit: commit.clone(),
            mode: mode.clone(),
            cores,
            memory,
            postgres,
            pool: self.pool.describe(),
            elapsed_s: header.elapsed_s,
            commit_probe_ms: header.probe,
            failed_cells: &header.failed,
            cells: &self.cells,
            pooler: pooler.map(|program| PoolerJson {
                program,
                pool_mode: "transaction",
                default_pool_size: "the server's pool",
                pgbench_query_mode: "extended",
                server: "--postgres-pooler transaction",
            }),
            scale: self.scale.as_ref(),
        };
        self.json = serde_json::to_string_pretty(&record).unwrap_or_default() + "\n";
        self.title = format!(
            "commit {commit}, {}, {mode}, {cores} cores shared by all processes",
            &utc(now, false)[..10]
        );
    }

    /// Writes `BASE.md` and `BASE.json`, draws `BASE.png` (a failure to draw is added to
    /// `failed` as `picture`), and prints the Markdown.
    ///
    /// # Errors
    ///
    /// When the files cannot be written.
    pub(crate) fn write(
        &self,
        base: &Path,
        plot: bool,
        work: &Path,
        failed: &mut Vec<String>,
        elapsed_s: u64,
    ) -> Result<(), String> {
        if let Some(dir) = base.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let with = |ext: &str| {
            base.with_file_name(format!(
                "{}.{ext}",
                base.file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
            ))
        };
        let (md_path, json_path, png_path) = (with("md"), with("json"), with("png"));
        let picture = png_path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let markdown = self.markdown.replace("PICTURE", &picture);
        std::fs::write(&md_path, &markdown)
            .map_err(|e| format!("cannot write {}: {e}", md_path.display()))?;
        std::fs::write(&json_path, &self.json)
            .map_err(|e| format!("cannot write {}: {e}", json_path.display()))?;
        if plot {
            if self.plot_rows.is_empty() {
                log("no PostgreSQL cell to draw");
            } else {
                match draw(&self.plot_rows, &self.title, &png_path, work) {
                    Ok(()) => log(&format!("drew {}", png_path.display())),
                    Err(e) => {
                        eprintln!("{e}");
                        failed.push("picture".to_string());
                    }
                }
            }
        }
        let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), markdown.as_bytes());
        log(&format!(
            "wrote {} and {} in {elapsed_s}s",
            md_path.display(),
            json_path.display()
        ));
        Ok(())
    }
}

/// How the cells were measured, as the header and the JSON say it.
fn mode(options: &Options) -> String {
    let mut mode = if options.smoke {
        format!(
            "smoke: {SMOKE_OPS} operations per cell, no warm-up; every binary built with the \
             smoke profile (release without fat LTO)"
        )
    } else {
        format!(
            "{}s per cell after a {}s warm-up; every binary built with the release profile",
            options.duration, options.warmup
        )
    };
    if options.rounds > 1 {
        mode.push_str(&format!(
            "; {} rounds per cell, each side's median round shown",
            options.rounds
        ));
    }
    mode
}

/// The first line of `pgbouncer --version`.
fn pooler_version() -> String {
    Command::new(testkit::pgbouncer::program())
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(String::from)
        })
        .unwrap_or_else(|| "PgBouncer".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_print_as_the_record_always_printed_them() {
        assert_eq!(fmt(Some(2270.6), 0), "2271");
        assert_eq!(fmt(None, 3), "-");
        assert_eq!(ratio(Some(1.0), Some(3.0)), "0.33");
        assert_eq!(ratio(Some(1.0), Some(0.0)), "-");
        assert_eq!(us_per_rpc(Some(0.9), 2, &[Some(0.2)]), "350");
        assert_eq!(us_per_rpc(Some(0.9), 2, &[None]), "-");
    }
}
