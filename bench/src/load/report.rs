//! The load generator's results: the report it prints and writes with `--json`, which the
//! comparison's driver reads back.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::sizes::rpc_bytes;
use super::tally::{Latency, OP, PARTS, Tally};
use super::{FloorOf, Shared, Workload, connections};
use crate::procfs;

/// CPU time of a process over the measured window.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Cpu {
    /// User + system seconds.
    pub seconds: f64,
    /// Milliseconds per measured operation.
    pub ms_per_op: f64,
}

/// The results, as printed and as written with `--json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Report {
    /// `--label`.
    pub label: String,
    /// The workload's name (`claim-complete`, …).
    pub workload: String,
    /// The server's address.
    pub addr: String,
    /// Concurrent clients.
    pub clients: usize,
    /// HTTP/2 connections they shared.
    pub connections: usize,
    /// `mixed-wait` and `floor`: what an operation was made of.
    pub mix: Option<String>,
    /// Unmeasured seconds first.
    pub warmup_s: f64,
    /// Measured seconds, to the end of the last measured operation.
    pub duration_s: f64,
    /// Successful measured operations.
    pub ops: u64,
    /// Failed measured operations.
    pub failed_ops: u64,
    /// `ops` per measured second.
    pub throughput_ops_s: f64,
    /// An operation's latency.
    pub latency_ms: Option<Latency>,
    /// The Claim of a claim-complete.
    pub claim_latency_ms: Option<Latency>,
    /// The Complete of a claim-complete.
    pub complete_latency_ms: Option<Latency>,
    /// `mixed-wait`: the Claims that waited.
    pub wait_claim_latency_ms: Option<Latency>,
    /// Failures by gRPC code (or `UNEXPECTED_<OUTCOME>`).
    pub errors: BTreeMap<String, u64>,
    /// Successes by outcome.
    pub outcomes: BTreeMap<String, u64>,
    /// `--server-pid`.
    pub server_pid: Option<u32>,
    /// The server's peak resident set at the end (VmHWM).
    pub server_peak_rss_kib: Option<u64>,
    /// The server's resident set at the end (VmRSS).
    pub server_rss_kib: Option<u64>,
    /// The server's CPU over the measured window.
    pub server_cpu: Option<Cpu>,
    /// The database's (postmaster and backends).
    pub db_cpu: Option<Cpu>,
    /// The pooler's.
    pub pooler_cpu: Option<Cpu>,
    /// The load generator's own.
    pub bench_cpu: Option<Cpu>,
    /// Encoded bytes of the first request and response of each kind of RPC.
    pub rpc_bytes: BTreeMap<String, [usize; 2]>,
    /// When it ended.
    pub finished_at_unix_s: u64,
}

/// CPU seconds so far of [the server, the database with its children, the pooler, this
/// process].
pub(crate) fn cpu_times([server, db, pooler]: [Option<u32>; 3]) -> [Option<f64>; 4] {
    [
        server.and_then(|p| procfs::cpu_seconds(&p.to_string(), false)),
        db.and_then(|p| procfs::cpu_seconds(&p.to_string(), true)),
        pooler.and_then(|p| procfs::cpu_seconds(&p.to_string(), false)),
        procfs::cpu_seconds("self", false),
    ]
}

pub(crate) fn report(
    shared: &Shared,
    total: &Tally,
    cpu_before: [Option<f64>; 4],
    cpu_after: [Option<f64>; 4],
) -> Report {
    let args = &shared.args;
    let ops = total.hists[OP].len();
    let end = total.last_end.unwrap_or(shared.measure_from);
    let duration = end
        .saturating_duration_since(shared.measure_from)
        .as_secs_f64();
    let memory = args.server_pid.and_then(procfs::memory_of);
    let mix = match args.workload {
        Workload::MixedWait => Some(format!(
            "{}% wait ({:?}) for a held key, {}% hold ({:?}), the rest claim-complete",
            args.wait_percent, args.wait, args.hold_percent, args.hold_time
        )),
        Workload::Floor => Some(format!(
            "the RPCs of one {} operation: {} floor call(s) of its sizes",
            match args.floor_of {
                FloorOf::ClaimComplete => "claim-complete",
                FloorOf::Replay => "replay",
            },
            shared.floor_calls.len()
        )),
        _ => None,
    };
    let cpu = |i: usize| match (cpu_before[i], cpu_after[i]) {
        (Some(a), Some(b)) if ops > 0 => Some(Cpu {
            seconds: b - a,
            ms_per_op: (b - a) * 1000.0 / ops as f64,
        }),
        _ => None,
    };
    let [op, claim, complete, wait] = total.hists.each_ref().map(Latency::of);
    Report {
        label: args.label.clone(),
        workload: args
            .workload
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string()),
        addr: args.addr.clone(),
        clients: args.clients,
        connections: connections(args),
        mix,
        warmup_s: args.warmup.as_secs_f64(),
        duration_s: duration,
        ops,
        failed_ops: total.errors.values().sum(),
        throughput_ops_s: if duration > 0.0 {
            ops as f64 / duration
        } else {
            0.0
        },
        latency_ms: op,
        claim_latency_ms: claim,
        complete_latency_ms: complete,
        wait_claim_latency_ms: wait,
        errors: total.errors.clone(),
        outcomes: total.outcomes.clone(),
        server_pid: args.server_pid,
        server_peak_rss_kib: memory.map(|m| m.peak_kib),
        server_rss_kib: memory.map(|m| m.rss_kib),
        server_cpu: cpu(0),
        db_cpu: cpu(1),
        pooler_cpu: cpu(2),
        bench_cpu: cpu(3),
        rpc_bytes: rpc_bytes(),
        finished_at_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}

/// Writes the report as a table: the operation's percentiles, then its parts'.
///
/// # Errors
///
/// When `out` cannot be written to.
pub fn print_table(r: &Report, out: &mut impl Write) -> io::Result<()> {
    let label = if r.label.is_empty() {
        String::new()
    } else {
        format!(" [{}]", r.label)
    };
    writeln!(
        out,
        "ledger-bench{label}: {} against {}, {} clients over {} connections",
        r.workload, r.addr, r.clients, r.connections
    )?;
    if let Some(mix) = &r.mix {
        writeln!(out, "mix: {mix}")?;
    }
    let join = |m: &BTreeMap<String, u64>| {
        let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.join(" ")
    };
    let percentiles = |l: &Option<Latency>| match l {
        Some(l) => [l.p50, l.p90, l.p99, l.p999, l.max].map(|v| format!("{v:.3}")),
        None => ["-"; 5].map(String::from),
    };
    const HEADER: &str = "workload|clients|ops|secs|ops/s|p50 ms|p90 ms|p99 ms|p99.9 ms|max ms|\
        errors|server RSS MiB peak/now";
    let mut rows = vec![HEADER.split('|').map(String::from).collect::<Vec<_>>()];
    let mut first = vec![
        r.workload.clone(),
        r.clients.to_string(),
        r.ops.to_string(),
        format!("{:.2}", r.duration_s),
        format!("{:.1}", r.throughput_ops_s),
    ];
    first.extend(percentiles(&r.latency_ms));
    first.push(if r.errors.is_empty() {
        "0".to_string()
    } else {
        join(&r.errors)
    });
    first.push(match (r.server_peak_rss_kib, r.server_rss_kib) {
        (Some(peak), Some(now)) => {
            format!("{:.1}/{:.1}", peak as f64 / 1024.0, now as f64 / 1024.0)
        }
        _ => "-".to_string(),
    });
    rows.push(first);
    let parts = [
        &r.claim_latency_ms,
        &r.complete_latency_ms,
        &r.wait_claim_latency_ms,
    ];
    for (name, latency) in PARTS[1..].iter().zip(parts) {
        if let Some(l) = latency {
            let mut row = vec![format!("  {name}"), String::new(), l.count.to_string()];
            row.extend([String::new(), String::new()]);
            row.extend(percentiles(latency));
            rows.push(row);
        }
    }
    let width = |c: usize| rows.iter().filter_map(|r| r.get(c)).map(String::len).max();
    let widths: Vec<usize> = (0..rows[0].len()).map(|c| width(c).unwrap_or(0)).collect();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (s, &w))| {
                if c == 0 || c >= 10 {
                    format!("{s:<w$}")
                } else {
                    format!("{s:>w$}")
                }
            })
            .collect();
        writeln!(out, "{}", cells.join("  ").trim_end())?;
    }
    if !r.outcomes.is_empty() {
        writeln!(out, "outcomes: {}", join(&r.outcomes))?;
    }
    let cpu = [
        ("server", &r.server_cpu),
        ("database", &r.db_cpu),
        ("pooler", &r.pooler_cpu),
        ("ledger-bench", &r.bench_cpu),
    ];
    let cpu: Vec<String> = cpu
        .iter()
        .filter_map(|(who, c)| Some(format!("{who} {:.3}", c.as_ref()?.ms_per_op)))
        .collect();
    if !cpu.is_empty() {
        writeln!(out, "CPU ms per op: {}", cpu.join(", "))?;
    }
    Ok(())
}
