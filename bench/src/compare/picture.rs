//! The picture: throughput and p50/p99 latency against clients, for claim-complete and replay
//! on PostgreSQL (pgbench, the floor and ours with a connection per client as lines, the
//! multiplexed cell as separate points), drawn by gnuplot.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

/// One drawn cell: its workload, clients and connections, then pgbench's, the floor's and
/// ours' ops/s, and pgbench's, the floor's and ours' p50 and p99 (ms).
pub(crate) struct PlotRow {
    pub(crate) workload: String,
    pub(crate) clients: u32,
    pub(crate) connections: u32,
    /// pg_tps, floor_tps, ours_tps, pg_p50, pg_p99, floor_p50, floor_p99, ours_p50, ours_p99.
    pub(crate) values: [Option<f64>; 9],
}

impl PlotRow {
    /// The values as gnuplot data columns (`null` where missing).
    fn columns(&self) -> String {
        let v: Vec<String> = self
            .values
            .iter()
            .map(|v| v.map_or_else(|| "null".to_string(), |v| v.to_string()))
            .collect();
        v.join(" ")
    }
}

/// Draws `rows` into `png` with gnuplot, its data and script in `work/plot`.
///
/// # Errors
///
/// When gnuplot fails or draws nothing; the error holds what it said.
pub(crate) fn draw(rows: &[PlotRow], title: &str, png: &Path, work: &Path) -> Result<(), String> {
    let dir = work.join("plot");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut mux_label = String::new();
    for w in ["claim-complete", "replay"] {
        let mut lines: Vec<&PlotRow> = rows.iter().filter(|r| r.workload == w).collect();
        lines.sort_by_key(|r| r.clients);
        let (mut direct, mut mux) = (String::new(), String::new());
        for r in lines {
            if r.clients == r.connections {
                let _ = writeln!(direct, "{} {}", r.clients, r.columns());
            } else {
                let _ = writeln!(mux, "{} {} {}", r.clients, r.connections, r.columns());
                if w == "claim-complete" && mux_label.is_empty() {
                    mux_label = format!("{}/{}", r.clients, r.connections);
                }
            }
        }
        std::fs::write(dir.join(format!("{w}.dat")), direct).map_err(|e| e.to_string())?;
        std::fs::write(dir.join(format!("{w}-mux.dat")), mux).map_err(|e| e.to_string())?;
    }
    let mut clients: Vec<u32> = rows.iter().map(|r| r.clients).collect();
    clients.sort_unstable();
    clients.dedup();
    let xtics: Vec<String> = clients.iter().map(|c| format!("\"{c}\" {c}")).collect();
    let xmax = clients.last().copied().unwrap_or(1);
    let mut legend =
        "lines: a connection per client (pgbench: to the database; floor and ours: HTTP/2)"
            .to_string();
    if let Some((c, n)) = mux_label.split_once('/') {
        legend.push_str(&format!(
            "; large hollow marks ({mux_label}): {c} clients sharing {n} HTTP/2 connections"
        ));
    }
    let script = SCRIPT
        .replace("@PICTURE@", &png.display().to_string())
        .replace("@XMAX@", &xmax.to_string())
        .replace("@XTICS@", &xtics.join(", "))
        .replace("@TITLE@", title)
        .replace("@LEGEND@", &legend)
        .replace("@MUX@", &mux_label)
        .replace("@DIR@", &dir.display().to_string());
    let script_path = dir.join("picture.gp");
    std::fs::write(&script_path, script).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(png);
    let out = Command::new("gnuplot")
        .arg(&script_path)
        .output()
        .map_err(|e| format!("cannot run gnuplot: {e}"))?;
    let drawn = std::fs::metadata(png).is_ok_and(|m| m.len() > 0);
    if out.status.success() && drawn {
        Ok(())
    } else {
        Err(format!(
            "gnuplot failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The gnuplot script; `@NAME@` are filled in. Columns of `W.dat`: clients, then
/// [`PlotRow::values`]; of `W-mux.dat`: clients, connections, then the same.
const SCRIPT: &str = r##"set terminal pngcairo size 1500,1200 font "sans,11" noenhanced
set output "@PICTURE@"
set datafile missing "null"
set logscale x 2
set xrange [0.75:@XMAX@ * 1.35]
set xtics (@XTICS@)
set xlabel "clients"
set grid xtics ytics lc rgb "#dddddd"
set key below horizontal maxcols 4 width -1 samplen 2 font ",10"
set bmargin 8
set border 3
set tics nomirror
set style line 1 lc rgb "#1f77b4" lw 2 pt 7 ps 1.1
set style line 2 lc rgb "#7f7f7f" lw 2 pt 5 ps 1.1
set style line 3 lc rgb "#d62728" lw 2 pt 9 ps 1.3
set style line 4 lc rgb "#1f77b4" lw 1.5 dt 2 pt 6 ps 1.1
set style line 5 lc rgb "#7f7f7f" lw 1.5 dt 2 pt 4 ps 1.1
set style line 6 lc rgb "#d62728" lw 1.5 dt 2 pt 8 ps 1.3
set style line 7 lc rgb "#7f7f7f" lw 2 pt 4 ps 2.2
set style line 8 lc rgb "#d62728" lw 2 pt 8 ps 2.4
set multiplot layout 2,2 title "ours (the ledger server) vs pgbench running its SQL vs the gRPC floor (ledger-floor)\n@TITLE@\n@LEGEND@" font "sans,12"
mux_label = "@MUX@"
do for [w in "claim-complete replay"] {
    data = "@DIR@/".w.".dat"
    mux = "@DIR@/".w."-mux.dat"
    has_mux = (w eq "claim-complete" && mux_label ne "")
    set title w." on PostgreSQL: throughput"
    set ylabel "operations per second"
    unset logscale y
    set yrange [0:*]
    if (has_mux) {
        plot data u 1:2 w lp ls 1 t "pgbench", data u 1:3 w lp ls 2 t "floor", \
             data u 1:4 w lp ls 3 t "ours", mux u 1:4 w p ls 7 t "floor ".mux_label, \
             mux u 1:5 w p ls 8 t "ours ".mux_label
    } else {
        plot data u 1:2 w lp ls 1 t "pgbench", data u 1:3 w lp ls 2 t "floor", \
             data u 1:4 w lp ls 3 t "ours"
    }
    set title w." on PostgreSQL: latency of an operation, p50 (solid) and p99 (dashed)"
    set ylabel "milliseconds (log scale)"
    set logscale y 10
    set yrange [*:*]
    if (has_mux) {
        plot data u 1:5 w lp ls 1 t "pgbench p50", data u 1:6 w lp ls 4 t "pgbench p99", \
             data u 1:7 w lp ls 2 t "floor p50", data u 1:8 w lp ls 5 t "floor p99", \
             data u 1:9 w lp ls 3 t "ours p50", data u 1:10 w lp ls 6 t "ours p99", \
             mux u 1:8 w p ls 7 t "floor ".mux_label." p50, p99", mux u 1:9 w p ls 7 notitle, \
             mux u 1:10 w p ls 8 t "ours ".mux_label." p50, p99", mux u 1:11 w p ls 8 notitle
    } else {
        plot data u 1:5 w lp ls 1 t "pgbench p50", data u 1:6 w lp ls 4 t "pgbench p99", \
             data u 1:7 w lp ls 2 t "floor p50", data u 1:8 w lp ls 5 t "floor p99", \
             data u 1:9 w lp ls 3 t "ours p50", data u 1:10 w lp ls 6 t "ours p99"
    }
}
unset multiplot
"##;
