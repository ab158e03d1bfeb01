//! One cell: pgbench, the floor and ours at one workload and client count, for `--rounds`
//! rounds, alternating the sides, each side's median round kept.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;
use testkit::pgbouncer::PgBouncer;
use testkit::postgres::PgCluster;

use super::pgbench::PgbenchRun;
use super::{Binaries, Options, Pool, SMOKE_OPS, log};
use crate::load::Report;
use crate::procs::{Server, tail};

/// What one cell measures.
pub(crate) struct Cell {
    /// `postgres`, `pgbouncer` (PostgreSQL through a fresh PgBouncer of the server's pool
    /// size, the server with `--postgres-pooler transaction`) or `sqlite`.
    pub(crate) store: &'static str,
    pub(crate) workload: &'static str,
    pub(crate) clients: u32,
    /// HTTP/2 connections the clients share; 0: one per client.
    pub(crate) connections: u32,
    /// Whether pgbench runs beside.
    pub(crate) with_pgbench: bool,
    /// The workload the floor stands in for, if it runs beside.
    pub(crate) floor_of: Option<&'static str>,
    /// More `ledger-bench` arguments for ours.
    pub(crate) extra: Vec<String>,
}

impl Cell {
    pub(crate) fn new(
        store: &'static str,
        workload: &'static str,
        clients: u32,
        connections: u32,
        with_pgbench: bool,
        floor_of: Option<&'static str>,
        extra: &[String],
    ) -> Cell {
        Cell {
            store,
            workload,
            clients,
            connections,
            with_pgbench,
            floor_of,
            extra: extra.to_vec(),
        }
    }

    /// The connections its clients use.
    pub(crate) fn connections_used(&self) -> u32 {
        if self.connections == 0 {
            self.clients
        } else {
            self.connections
        }
    }
}

/// A ledger-bench run: its report as written (an empty object when it wrote none), read.
#[derive(Clone)]
pub(crate) struct BenchRun {
    pub(crate) json: Value,
    pub(crate) report: Option<Report>,
}

impl BenchRun {
    fn throughput(&self) -> f64 {
        self.report.as_ref().map_or(0.0, |r| r.throughput_ops_s)
    }
}

/// Each side's median round of a cell, and every round's throughput.
pub(crate) struct CellResult {
    pub(crate) pgbench: Option<PgbenchRun>,
    pub(crate) pgbench_rounds: Vec<f64>,
    pub(crate) floor: Option<BenchRun>,
    pub(crate) floor_rounds: Vec<f64>,
    pub(crate) ours: BenchRun,
    pub(crate) ours_rounds: Vec<f64>,
}

/// The state the cells share: the cluster, the binaries, the runs already made.
pub(crate) struct Side<'a> {
    pub(crate) options: &'a Options,
    pub(crate) binaries: &'a Binaries,
    pub(crate) cluster: &'a PgCluster,
    pub(crate) work: &'a Path,
    pub(crate) db_url: String,
    pub(crate) postmaster: u32,
    /// Unique per run: pgbench's keys never meet another run's.
    pub(crate) run_tag: String,
    /// The cells that had errors, by name.
    pub(crate) failed: Vec<String>,
    /// pgbench has no connections to share: a cell that differs from an earlier one of the
    /// round only in its connections reuses its run.
    pub(crate) pgbench_rounds: BTreeMap<String, PgbenchRun>,
    /// The floor has no store: the SQLite cells reuse PostgreSQL's.
    pub(crate) floor_rounds: BTreeMap<String, BenchRun>,
}

/// The throughputs of (throughput, run) pairs.
fn throughputs<T>(rounds: &[(f64, T)]) -> Vec<f64> {
    rounds.iter().map(|(t, _)| *t).collect()
}

/// Of (throughput, run) pairs, the run of the median throughput (the lower of two middles).
pub(crate) fn median<T: Clone>(rounds: &[(f64, T)]) -> Option<T> {
    let mut sorted: Vec<&(f64, T)> = rounds.iter().collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    sorted
        .get(rounds.len().div_ceil(2).saturating_sub(1))
        .map(|(_, t)| t.clone())
}

impl Side<'_> {
    /// `--rounds` rounds of the cell, alternating the sides (pgbench, the floor, ours).
    pub(crate) fn cell(&mut self, cell: &Cell) -> CellResult {
        let (mut pg, mut floor, mut ours) = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=self.options.rounds {
            let round = round.to_string();
            if cell.with_pgbench {
                let key = format!(
                    "{}-{}-c{}-r{round}",
                    cell.store, cell.workload, cell.clients
                );
                let run = match self.pgbench_rounds.get(&key) {
                    Some(run) => run.clone(),
                    None => {
                        let run = self.pgbench(cell.workload, cell.clients, cell.store, &round);
                        self.pgbench_rounds.insert(key, run.clone());
                        run
                    }
                };
                pg.push((run.tps.unwrap_or(0.0), run));
            }
            if let Some(shape) = cell.floor_of {
                let run = self.floor(shape, cell.clients, cell.connections, &round);
                floor.push((run.throughput(), run));
            }
            let run = self.ours(cell, &round, false);
            ours.push((run.throughput(), run));
        }
        CellResult {
            pgbench_rounds: throughputs(&pg),
            floor_rounds: throughputs(&floor),
            ours_rounds: throughputs(&ours),
            pgbench: median(&pg),
            floor: median(&floor),
            ours: median(&ours).unwrap_or_else(|| BenchRun {
                json: Value::Object(Default::default()),
                report: None,
            }),
        }
    }

    /// The floor standing in for `shape` with `c` clients over `conns` connections; a cell
    /// already measured in this round is not measured again.
    fn floor(&mut self, shape: &str, c: u32, conns: u32, round: &str) -> BenchRun {
        let n = if conns == 0 { c } else { conns };
        let name = format!("floor-{shape}-c{c}-n{n}-r{round}");
        if let Some(run) = self.floor_rounds.get(&name) {
            return run.clone();
        }
        log(&format!(
            "ledger-bench floor ({shape}), {c} clients over {n} connections"
        ));
        let args: Vec<String> = [
            "--workload",
            "floor",
            "--floor-of",
            shape,
            "--clients",
            &c.to_string(),
            "--connections",
            &conns.to_string(),
            "--label",
            &format!("floor of {shape}"),
        ]
        .map(String::from)
        .to_vec();
        let run = self.bench(&name, &self.binaries.floor.clone(), &[], &args);
        self.floor_rounds.insert(name, run.clone());
        run
    }

    /// Ours: a fresh server on the cell's store (a truncated table unless `keep_table`), driven
    /// by ledger-bench.
    pub(crate) fn ours(&mut self, cell: &Cell, round: &str, keep_table: bool) -> BenchRun {
        let (c, n) = (cell.clients, cell.connections_used());
        let name = format!("ours-{}-{}-c{c}-n{n}-r{round}", cell.store, cell.workload);
        let mut server_args: Vec<String> = Vec::new();
        let mut bench_args: Vec<String> = Vec::new();
        let mut pooler = None;
        let pool = match cell.store {
            "sqlite" => {
                for suffix in ["", "-wal", "-shm", "-journal"] {
                    let _ = std::fs::remove_file(self.work.join(format!("sqlite.db{suffix}")));
                }
                let url = format!("sqlite://{}", self.work.join("sqlite.db").display());
                server_args.extend(["--database-url".into(), url]);
                // SQLite has one writer whatever the pool.
                "default".to_string()
            }
            store => {
                if !keep_table {
                    self.reset_table();
                }
                let mut url = self.db_url.clone();
                bench_args.extend(["--db-pid".into(), self.postmaster.to_string()]);
                if store == "pgbouncer" {
                    let bouncer = self.pooler(c);
                    url = bouncer.url_for(&self.db_url);
                    server_args.extend(
                        [
                            "--postgres-pooler",
                            "transaction",
                            "--migrations-database-url",
                        ]
                        .map(String::from),
                    );
                    server_args.push(self.db_url.clone());
                    bench_args.extend(["--pooler-pid".into(), bouncer.pid().to_string()]);
                    pooler = Some(bouncer);
                }
                server_args.extend(["--database-url".into(), url]);
                match self.options.db_max_connections {
                    Pool::Default => "default".to_string(),
                    other => {
                        let size = other.size(c).to_string();
                        server_args.extend(["--db-max-connections".into(), size.clone()]);
                        size
                    }
                }
            }
        };
        log(&format!(
            "ledger-bench {} {}, {c} clients over {n} connections (pool {pool})",
            cell.store, cell.workload
        ));
        bench_args.extend(
            [
                "--workload",
                cell.workload,
                "--clients",
                &c.to_string(),
                "--connections",
                &cell.connections.to_string(),
                "--label",
                &format!("{} pool={pool}", cell.store),
            ]
            .map(String::from),
        );
        bench_args.extend(cell.extra.iter().cloned());
        let server = self.binaries.server.clone();
        let run = self.bench(&name, &server, &server_args, &bench_args);
        drop(pooler);
        run
    }

    /// A fresh PgBouncer in transaction mode in front of the cluster, with the server's pool
    /// size for `c` clients (`default_pool_size`: the database sees no more) and room for
    /// C + 50 clients. `extra_float_digits` is ignored: a startup parameter PgBouncer refuses
    /// unless told to, which sqlx sends by default (the ledger's connections turn it off,
    /// crates/stores/src/postgres.rs; pgbench does not send it).
    pub(crate) fn pooler(&self, c: u32) -> PgBouncer {
        PgBouncer::start_with_settings(
            self.cluster,
            "transaction",
            &[
                format!(
                    "default_pool_size = {}",
                    self.options.db_max_connections.size(c)
                ),
                format!("max_client_conn = {}", c + 50),
                "ignore_startup_parameters = extra_float_digits".to_string(),
            ],
        )
    }

    /// Starts `program` (the server or the floor), runs ledger-bench against it with the
    /// run's measuring mode and `args`, stops it.
    fn bench(
        &mut self,
        name: &str,
        program: &Path,
        program_args: &[String],
        args: &[String],
    ) -> BenchRun {
        let log_path = self.work.join("logs").join(format!("{name}.log"));
        let json_path = self.work.join("json").join(format!("{name}.json"));
        let server = match Server::start(program, program_args, &log_path) {
            Ok(server) => server,
            Err(e) => {
                log(&format!("{name}: {e}"));
                self.failed.push(name.to_string());
                return BenchRun {
                    json: Value::Object(Default::default()),
                    report: None,
                };
            }
        };
        let mut command = Command::new(&self.binaries.bench);
        command.args(["--addr", &server.addr()]);
        if self.options.smoke {
            command.args(["--count", &SMOKE_OPS.to_string(), "--warmup", "0s"]);
        } else {
            let (d, w) = (self.options.duration, self.options.warmup);
            command.args(["--duration", &format!("{d}s"), "--warmup", &format!("{w}s")]);
        }
        command
            .args(["--server-pid", &server.pid().to_string()])
            .arg("--json")
            .arg(&json_path)
            .args(args);
        let out_path = self.work.join("logs").join(format!("{name}.out"));
        let status = std::fs::File::create(&out_path).and_then(|out| {
            command
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .status()
        });
        let server_tail = server.log_tail(5);
        server.stop();
        let json: Option<Value> = std::fs::read_to_string(&json_path)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok());
        let report: Option<Report> = json.clone().and_then(|j| serde_json::from_value(j).ok());
        let ok = status.as_ref().is_ok_and(|s| s.success())
            && report.as_ref().is_some_and(|r| r.failed_ops == 0);
        if !ok {
            self.failed.push(name.to_string());
            let exit = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            let out = std::fs::read_to_string(&out_path).unwrap_or_default();
            log(&format!("ledger-bench {name} failed ({exit}):"));
            eprintln!("{}\n{server_tail}", tail(&out, 15));
        }
        BenchRun {
            json: json.unwrap_or_else(|| Value::Object(Default::default())),
            report,
        }
    }

    /// A fresh table for every cell, and a checkpoint, so each starts from the same state.
    /// CASCADE: the tables that reference the entries (ledger_history, migration 0007) are
    /// emptied with them; without it PostgreSQL refuses the TRUNCATE.
    pub(crate) fn reset_table(&self) {
        self.psql(&["-c", "TRUNCATE ledger_entries CASCADE", "-c", "CHECKPOINT"]);
    }

    /// Runs psql on the `ledger` database with `args`; a failure is logged (the cell that
    /// follows will fail and say so).
    pub(crate) fn psql(&self, args: &[&str]) -> bool {
        let out = self.cluster.psql("ledger").args(args).output();
        match out {
            Ok(out) if out.status.success() => true,
            Ok(out) => {
                log(&format!(
                    "psql {args:?} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
                false
            }
            Err(e) => {
                log(&format!("cannot run psql: {e}"));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_round_is_the_middle_one_by_throughput_or_the_lower_middle() {
        let rounds = [(3.0, "c"), (1.0, "a"), (2.0, "b")];
        assert_eq!(median(&rounds), Some("b"));
        assert_eq!(median(&[(5.0, "x"), (4.0, "y")]), Some("y"));
        assert_eq!(median::<&str>(&[]), None);
    }
}
