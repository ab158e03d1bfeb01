//! The record as a document: its Markdown (the header that says how the cells were measured,
//! then the tables) and its JSON composed from the cells, and the files written.

use std::path::Path;
use std::process::Command;

use serde::Serialize;

use super::{CellJson, Record};
use crate::compare::picture::draw;
use crate::compare::scale::ScaleResult;
use crate::compare::{HOT_KEYS, Options, SMOKE_OPS, log};
use crate::host::{commit, memory, uname, unix_now, utc};

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
            HOT_KEYS
        ));
        if !options.no_plot {
            line("- picture: [PICTURE](PICTURE) (throughput and p50/p99 latency against clients)");
        }
        self.tables();
        let md = &mut self.markdown;
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

    /// Adds the tables to the Markdown: the cells, their CPU, what the server adds above the
    /// floor, the pooler's (when measured) and the scale's (with `--scale`).
    fn tables(&mut self) {
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
