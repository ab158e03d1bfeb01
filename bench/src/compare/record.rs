//! The record: every cell's figures as rows of the tables and as JSON, the header that says
//! how they were measured, written to `BASE.md` and `BASE.json` (and the picture, `BASE.png`);
//! the header, the tables and the files are composed and written in `document`.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::Pool;
use super::cells::{Cell, CellResult};
use super::pgbench::PgbenchRun;
use super::picture::PlotRow;
use super::scale::ScaleResult;
use crate::load::Report;

mod document;

pub(crate) use document::Header;

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
        if cell.floor_of.is_some() {
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
        }
        self.push_cell_json(label, cell, rpcs, r);
    }

    /// The cell's JSON: its rounds, pgbench's, the floor's and ours' reports.
    fn push_cell_json(&mut self, label: &str, cell: &Cell, rpcs: u32, r: &CellResult) {
        let (c, n) = (cell.clients, cell.connections_used());
        let pg = r.pgbench.as_ref();
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
