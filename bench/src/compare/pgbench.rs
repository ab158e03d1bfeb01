//! The baseline: pgbench running the server's statements for one operation
//! (`bench/pgbench/<workload>.sql`), its figures read from its report and its per-transaction
//! log, and the CPU of the database, PgBouncer and pgbench from /proc around its run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;

use super::cells::Side;
use super::{HOT_KEYS, SMOKE_OPS, log};
use crate::load::{RESULT, TOOL};
use crate::procfs;
use crate::procs::tail;

/// The tenant every entry belongs to.
const TENANT: &str = "default";
/// The fingerprint the server derives for ledger-bench's tool and arguments.
const FINGERPRINT: &str = "d839cebaba2b8c0d6298b424549d4127ede041d1d4d491f0fe62163d1f55f51e";
/// What the server keeps of ledger-bench's arguments for audit: their canonical form (nothing
/// in them is redacted). [`crate::load::ARGUMENTS`] canonicalized: keys sorted.
const CANONICAL_ARGUMENTS: &str = r#"{"amount":200,"currency":"EUR","customer":"c-42"}"#;
/// The server's default lease, 60 s.
const LEASE_US: u64 = 60_000_000;
/// The server's default retention, 24 h.
const RETENTION_US: u64 = 86_400_000_000;

/// One pgbench statement's average latency (`-r`), for "where the time goes".
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(crate) struct Statement {
    pub(crate) avg_ms: f64,
    /// Its first six words.
    pub(crate) statement: String,
}

/// A pgbench run's figures, as the record's JSON holds them.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub(crate) struct PgbenchRun {
    /// `postgres` (directly) or `pgbouncer`.
    pub(crate) via: String,
    /// `prepared` directly, `extended` through the pooler.
    pub(crate) query_mode: String,
    pub(crate) tps: Option<f64>,
    pub(crate) latency_avg_ms: Option<f64>,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) transactions: Option<u64>,
    pub(crate) failed: Option<u64>,
    pub(crate) exit: i32,
    pub(crate) db_cpu_ms_per_op: Option<f64>,
    pub(crate) pooler_cpu_ms_per_op: Option<f64>,
    pub(crate) pgbench_cpu_ms_per_op: Option<f64>,
    pub(crate) statements: Vec<Statement>,
}

/// `x` rounded to `places` decimals, as the record prints it.
pub(crate) fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

/// CPU seconds over a run as milliseconds per operation, to three places.
fn per_op(seconds: f64, ops: Option<u64>) -> Option<f64> {
    ops.filter(|&n| n > 0)
        .map(|n| round(seconds * 1000.0 / n as f64, 3))
}

impl Side<'_> {
    /// pgbench's `-D` definitions for a run named `name`.
    fn pgbench_defs(&self, name: &str) -> Vec<String> {
        let tag = format!("{}-{name}", self.run_tag);
        [
            format!("tenant={TENANT}"),
            format!("tool={TOOL}"),
            format!("fingerprint={FINGERPRINT}"),
            "attempting=ATTEMPTING".into(),
            "succeeded=SUCCEEDED".into(),
            "also_unknown=false".into(),
            format!("lease_us={LEASE_US}"),
            format!("retention_us={RETENTION_US}"),
            format!("result={}", String::from_utf8_lossy(RESULT)),
            format!("arguments={CANONICAL_ARGUMENTS}"),
            format!("run_tag={tag}"),
            format!("run_id=bench-pgbench-{tag}"),
            format!("hot_keys={HOT_KEYS}"),
        ]
        .into_iter()
        .flat_map(|d| ["-D".to_string(), d])
        .collect()
    }

    /// pgbench at `c` clients on `workload`; `via` pgbouncer: through a fresh PgBouncer of the
    /// server's pool size with `-M extended` (unnamed statements: a transaction pooler keeps no
    /// prepared statement for the next transaction), else straight to PostgreSQL with
    /// `-M prepared`.
    pub(crate) fn pgbench(&mut self, workload: &str, c: u32, via: &str, round: &str) -> PgbenchRun {
        let through_pooler = via == "pgbouncer";
        let name = if through_pooler {
            format!("pg-pgbouncer-{workload}-c{c}-r{round}")
        } else {
            format!("pg-{workload}-c{c}-r{round}")
        };
        self.reset_table();
        if workload == "replay" {
            self.load_hot_set(&name);
        }
        let pooler = through_pooler.then(|| self.pooler(c));
        let (port, mode) = match &pooler {
            Some(p) => (p.port(), "extended"),
            None => (self.cluster.port(), "prepared"),
        };
        let common = self.pgbench_args(workload, &name, port, mode, c);
        let pgbench = testkit::postgres::program("pgbench");
        let run = self.warm_up(&pgbench, &common, c);
        match &pooler {
            Some(_) => log(&format!(
                "pgbench {workload}, {c} clients through PgBouncer (pool {})",
                self.options.db_max_connections.size(c)
            )),
            None => log(&format!("pgbench {workload}, {c} clients")),
        }
        let prefix = self.work.join("pgbench").join(format!("log-{name}"));
        let pooler_pid = pooler.as_ref().map(|p| p.pid().to_string());
        let pooler_cpu = || {
            pooler_pid
                .as_deref()
                .and_then(|p| procfs::cpu_seconds(p, false))
        };
        let before = [
            pooler_cpu(),
            Some(self.db_cpu()),
            Some(procfs::reaped_children_cpu_seconds()),
        ];
        let out = Command::new(&pgbench)
            .args(&common)
            .args(&run)
            .args(["-r", "-l"])
            .arg(format!("--log-prefix={}", prefix.display()))
            .arg("ledger")
            .stdin(Stdio::null())
            .output();
        // The postmaster reaps the backends, adding their CPU time to its children's.
        std::thread::sleep(Duration::from_millis(200));
        let after = [
            pooler_cpu(),
            Some(self.db_cpu()),
            Some(procfs::reaped_children_cpu_seconds()),
        ];
        drop(pooler);
        let (text, exit) = match out {
            Ok(out) => (
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
                out.status.code().unwrap_or(-1),
            ),
            Err(e) => (format!("cannot run pgbench: {e}"), -1),
        };
        let mut result = self.read_run(&name, &text, exit, &prefix, [before, after]);
        result.via = via.to_string();
        result.query_mode = mode.to_string();
        result
    }

    /// Loads replay's hot set (`bench/pgbench/hot_set.sql`) for the run named `name`.
    fn load_hot_set(&self, name: &str) {
        let tag = format!("{}-{name}", self.run_tag);
        let hot_set = crate::repository_root().join("bench/pgbench/hot_set.sql");
        let vars = [
            format!("tenant={TENANT}"),
            format!("run_tag={tag}"),
            format!("hot_keys={HOT_KEYS}"),
            format!("tool={TOOL}"),
            format!("fingerprint={FINGERPRINT}"),
            format!("result={}", String::from_utf8_lossy(RESULT)),
            format!("retention_us={RETENTION_US}"),
        ];
        let mut args: Vec<String> = vars.iter().flat_map(|v| ["-v".into(), v.clone()]).collect();
        args.extend(["-f".into(), hot_set.display().to_string()]);
        self.psql(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }

    /// pgbench's arguments but the run's length: the connection, `-n -M mode -c C -j
    /// min(C,2)`, the workload's script and its definitions.
    fn pgbench_args(
        &self,
        workload: &str,
        name: &str,
        port: u16,
        mode: &str,
        c: u32,
    ) -> Vec<String> {
        let script = crate::repository_root()
            .join(format!("bench/pgbench/{}.sql", workload.replace('-', "_")));
        let port = port.to_string();
        let (clients, threads) = (c.to_string(), c.min(2).to_string());
        let mut common: Vec<String> = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"]
            .map(String::from)
            .to_vec();
        common.extend(["-n", "-M", mode, "-c", &clients, "-j", &threads].map(String::from));
        common.extend(["-f".to_string(), script.display().to_string()]);
        common.extend(self.pgbench_defs(name));
        common
    }

    /// Runs the warm-up (none in smoke mode); returns the measured run's length: `-t` in smoke
    /// mode, else `-T`.
    fn warm_up(&self, pgbench: &Path, common: &[String], c: u32) -> Vec<String> {
        if self.options.smoke {
            return vec!["-t".into(), SMOKE_OPS.div_ceil(u64::from(c)).to_string()];
        }
        let _ = Command::new(pgbench)
            .args(common)
            .args(["-T", &self.options.warmup.to_string(), "ledger"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        vec!["-T".into(), self.options.duration.to_string()]
    }

    /// A run's figures from its report, its log and the CPU seconds `[pooler, database,
    /// pgbench]` before and after it; a failed run is named in the comparison's failures.
    fn read_run(
        &mut self,
        name: &str,
        text: &str,
        exit: i32,
        prefix: &Path,
        [before, after]: [[Option<f64>; 3]; 2],
    ) -> PgbenchRun {
        let _ = std::fs::write(
            self.work.join("pgbench").join(format!("out-{name}.txt")),
            text,
        );
        let mut result = parse_report(text);
        result.exit = exit;
        let (p50, p99) = log_percentiles(prefix);
        result.p50_ms = p50;
        result.p99_ms = p99;
        let spent = |i: usize| match (before[i], after[i]) {
            (Some(a), Some(b)) => per_op(b - a, result.transactions),
            _ => None,
        };
        result.pooler_cpu_ms_per_op = spent(0);
        result.db_cpu_ms_per_op = spent(1);
        result.pgbench_cpu_ms_per_op = spent(2);
        let failed = exit != 0
            || result.tps.is_none()
            || result.failed.unwrap_or(0) != 0
            || result.transactions.unwrap_or(0) == 0;
        if failed {
            self.failed.push(name.to_string());
            log(&format!("pgbench {name} failed (exit {exit}):"));
            eprintln!("{}", tail(text, 15));
        }
        result
    }

    /// CPU seconds of the postmaster and its backends, live or reaped.
    fn db_cpu(&self) -> f64 {
        procfs::cpu_seconds(&self.postmaster.to_string(), true).unwrap_or(0.0)
    }

    /// The latency of a one-row INSERT committed alone (1 client, 3 s): the disk's fsync,
    /// which dominates the low-concurrency figures and varies on a shared machine. Not in
    /// `--smoke`.
    pub(crate) fn commit_probe(&self) -> Option<f64> {
        if self.options.smoke {
            return None;
        }
        let ok = self
            .cluster
            .psql("postgres")
            .args([
                "-c",
                "DROP TABLE IF EXISTS probe",
                "-c",
                "CREATE TABLE probe (x int)",
            ])
            .status()
            .is_ok_and(|s| s.success());
        let script = self.work.join("probe.sql");
        if !ok || std::fs::write(&script, "INSERT INTO probe VALUES (1);\n").is_err() {
            return None;
        }
        let out = Command::new(testkit::postgres::program("pgbench"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.cluster.port().to_string(),
                "-U",
                "postgres",
            ])
            .args([
                "-n", "-M", "prepared", "-c", "1", "-j", "1", "-T", "3", "-f",
            ])
            .arg(&script)
            .arg("postgres")
            .stdin(Stdio::null())
            .output()
            .ok()?;
        parse_report(&String::from_utf8_lossy(&out.stdout)).latency_avg_ms
    }
}

/// The figures of pgbench's report: tps, average latency, transactions, failures, and the
/// per-statement latencies (`-r`).
pub(crate) fn parse_report(text: &str) -> PgbenchRun {
    let after = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
    };
    let mut statements = Vec::new();
    let mut on = false;
    for line in text.lines() {
        if line.starts_with("statement latencies") {
            on = true;
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let numeric = |w: &&str| w.parse::<f64>().is_ok();
        if !on || words.first().is_none_or(|w| !numeric(w)) {
            continue;
        }
        // Failures (PostgreSQL 15 and later) come as more numbers; `\set` lines are skipped.
        let first = words.iter().take_while(|w| numeric(w)).count();
        if words.get(first).is_none_or(|w| w.starts_with('\\')) {
            continue;
        }
        let text: Vec<&str> = words[first..].iter().take(6).copied().collect();
        statements.push(Statement {
            avg_ms: words[0].parse().unwrap_or(0.0),
            statement: text.join(" "),
        });
    }
    PgbenchRun {
        tps: after("tps = ").and_then(|v| v.parse().ok()),
        latency_avg_ms: after("latency average = ").and_then(|v| v.parse().ok()),
        // "304/304": done of those asked for (with -t; with -T the count alone).
        transactions: after("number of transactions actually processed: ")
            .and_then(|v| v.split('/').next()?.parse().ok()),
        failed: after("number of failed transactions: ").and_then(|v| v.parse().ok()),
        statements,
        ..PgbenchRun::default()
    }
}

/// The p50 and p99 (ms, three places) of pgbench's per-transaction logs `PREFIX.*` (the third
/// field: latency in µs), nearest-rank below as the record has always taken them.
fn log_percentiles(prefix: &Path) -> (Option<f64>, Option<f64>) {
    let (Some(dir), Some(stem)) = (prefix.parent(), prefix.file_name()) else {
        return (None, None);
    };
    let stem = format!("{}.", stem.to_string_lossy());
    let mut latencies: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&stem))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|log| {
            log.lines()
                .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .collect();
    latencies.sort_unstable();
    (percentile(&latencies, 0.50), percentile(&latencies, 0.99))
}

/// The value at rank floor(n × q) (from 1, at least 1) of sorted µs, in ms to three places.
fn percentile(sorted: &[u64], q: f64) -> Option<f64> {
    let n = sorted.len();
    let rank = ((n as f64 * q) as usize).max(1);
    sorted.get(rank - 1).map(|&us| round(us as f64 / 1000.0, 3))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: bench/pgbench/claim_complete.sql
number of transactions actually processed: 304/304
number of failed transactions: 0 (0.000%)
latency average = 3.524 ms
initial connection time = 5.012 ms
tps = 2270.106823 (without initial connection time)
statement latencies in milliseconds and failures:
         0.002           0  \\set k :client_id * 100000000000000 + random(1, 99999999999999)
         1.701           0  INSERT INTO ledger_entries (tenant, key, run_id, tool, fingerprint, status, attempt,
         1.820           0  UPDATE ledger_entries SET status = :succeeded, result = :result::bytea, error = '',
";

    #[test]
    fn pgbench_s_report_is_read_for_its_figures_and_statements() {
        let r = parse_report(REPORT);
        assert_eq!(r.tps, Some(2270.106823));
        assert_eq!(r.latency_avg_ms, Some(3.524));
        assert_eq!(r.transactions, Some(304));
        assert_eq!(r.failed, Some(0));
        assert_eq!(
            r.statements,
            vec![
                Statement {
                    avg_ms: 1.701,
                    statement: "INSERT INTO ledger_entries (tenant, key, run_id,".into()
                },
                Statement {
                    avg_ms: 1.82,
                    statement: "UPDATE ledger_entries SET status = :succeeded,".into()
                },
            ]
        );
        assert_eq!(parse_report("pgbench: error: connection refused").tps, None);
    }

    #[test]
    fn percentiles_take_the_nearest_rank_below() {
        let us: Vec<u64> = (1..=200).map(|i| i * 1000).collect();
        assert_eq!(percentile(&us, 0.50), Some(100.0));
        assert_eq!(percentile(&us, 0.99), Some(198.0));
        assert_eq!(percentile(&[1500], 0.99), Some(1.5));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
