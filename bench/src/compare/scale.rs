//! `--scale`: claim-complete and lookup on the empty table, then on one loaded with
//! `--scale-rows` finished entries.

use serde::Serialize;
use serde_json::Value;

use super::cells::{BenchRun, Cell, Side};
use super::record::fmt;
use super::{LOOKUP_KEYS, SCALE_CLIENTS, log};
use crate::host::unix_now;
use crate::load::Report;

/// Rows one `INSERT … SELECT` loads.
const CHUNK: u64 = 500_000;

/// The four runs, as the record's JSON holds them.
#[derive(Serialize)]
pub(crate) struct ScaleResult {
    pub(crate) rows: u64,
    pub(crate) clients: u32,
    empty_cc: Value,
    empty_lookup: Value,
    loaded_cc: Value,
    loaded_lookup: Value,
    #[serde(skip)]
    reports: [Option<Report>; 4],
}

impl ScaleResult {
    /// The scale table's rows: each measure empty, loaded, and loaded / empty.
    pub(crate) fn rows_md(&self) -> Vec<String> {
        type Pick = fn(&Report) -> Option<f64>;
        let measures: [(&str, usize, Pick); 6] = [
            ("claim-complete ops/s", 0, |r| Some(r.throughput_ops_s)),
            ("claim-complete p50 ms", 0, |r| {
                r.latency_ms.as_ref().map(|l| l.p50)
            }),
            ("claim-complete p99 ms", 0, |r| {
                r.latency_ms.as_ref().map(|l| l.p99)
            }),
            ("lookup ops/s", 1, |r| Some(r.throughput_ops_s)),
            ("lookup p50 ms", 1, |r| r.latency_ms.as_ref().map(|l| l.p50)),
            ("lookup p99 ms", 1, |r| r.latency_ms.as_ref().map(|l| l.p99)),
        ];
        measures
            .iter()
            .map(|(title, which, pick)| {
                let e = self.reports[*which].as_ref().and_then(pick);
                let l = self.reports[which + 2].as_ref().and_then(pick);
                let r = match (e, l) {
                    (Some(e), Some(l)) if e > 0.0 => format!("{:.2}", l / e),
                    _ => "-".to_string(),
                };
                format!("| {title} | {} | {} | {r} |", fmt(e, 3), fmt(l, 3))
            })
            .collect()
    }
}

/// Claim-complete and lookup at [`SCALE_CLIENTS`], one round each, on the table as it is.
fn phase(side: &mut Side<'_>, round: &str, lookup_args: &[String]) -> [BenchRun; 2] {
    let cc = Cell::new(
        "postgres",
        "claim-complete",
        SCALE_CLIENTS,
        0,
        false,
        None,
        &[],
    );
    let cc = side.ours(&cc, round, true);
    let lookup = Cell::new(
        "postgres",
        "lookup",
        SCALE_CLIENTS,
        0,
        false,
        None,
        lookup_args,
    );
    let lookup = side.ours(&lookup, round, true);
    [cc, lookup]
}

/// The empty table's runs, the load, the loaded table's runs.
///
/// # Errors
///
/// When the load fails.
pub(crate) fn run(side: &mut Side<'_>) -> Result<ScaleResult, String> {
    let rows = side.options.scale_rows;
    side.reset_table();
    let [empty_cc, empty_lookup] = phase(
        side,
        "empty",
        &["--hot-keys".into(), LOOKUP_KEYS.to_string()],
    );
    side.reset_table();
    log(&format!("loading {rows} finished entries"));
    let now_us = unix_now() * 1_000_000;
    // A file, not -c: psql interpolates its variables in what it reads, not in -c.
    let load = side.work.join("scale-load.sql");
    std::fs::write(&load, LOAD).map_err(|e| format!("cannot write {}: {e}", load.display()))?;
    let load = load.display().to_string();
    let mut lo = 0;
    while lo < rows {
        let hi = (lo + CHUNK - 1).min(rows - 1);
        let vars = [
            format!("lo={lo}"),
            format!("hi={hi}"),
            format!("rows={rows}"),
            format!("now_us={now_us}"),
            format!("result={}", String::from_utf8_lossy(crate::load::RESULT)),
        ];
        let mut args: Vec<&str> = Vec::new();
        for v in &vars {
            args.extend(["-v", v]);
        }
        args.extend(["-f", &load]);
        if !side.psql(&args) {
            return Err("loading the --scale rows failed".into());
        }
        log(&format!("  {} rows", hi + 1));
        lo += CHUNK;
    }
    side.psql(&["-c", "VACUUM ANALYZE ledger_entries", "-c", "CHECKPOINT"]);
    let preloaded = [
        "--preloaded".into(),
        rows.to_string(),
        "--preloaded-prefix".into(),
        "bench-preload-".into(),
    ];
    let [loaded_cc, loaded_lookup] = phase(side, "loaded", &preloaded);
    Ok(ScaleResult {
        rows,
        clients: SCALE_CLIENTS,
        reports: [&empty_cc, &empty_lookup, &loaded_cc, &loaded_lookup].map(|r| r.report.clone()),
        empty_cc: empty_cc.json,
        empty_lookup: empty_lookup.json,
        loaded_cc: loaded_cc.json,
        loaded_lookup: loaded_lookup.json,
    })
}

/// Rows `:lo` to `:hi`: keys as ledger-bench `--preloaded` derives them; started over the last
/// day, in key order of i; SUCCEEDED a quarter second later; kept 7 days, so none expires
/// meanwhile.
const LOAD: &str =
    "INSERT INTO ledger_entries (tenant, key, run_id, tool, fingerprint, status, attempt,
    claim_token, result, error, retryable, principal, started_at, finished_at,
    lease_expires_at, retention_us, expires_at, replay_count)
SELECT 'default', encode(sha256(convert_to('bench-preload-' || i, 'UTF8')), 'hex'),
    'run-' || (i / 4), (ARRAY['issue_credit', 'open_ticket', 'send_reply'])[1 + i % 3],
    encode(sha256(convert_to('fp-' || (i % 1000), 'UTF8')), 'hex'), 'SUCCEEDED', 1,
    md5('preload-token-' || i), convert_to(:'result', 'UTF8'), '', false, 'agent-' || (i % 50),
    s, s + 250000, s + 60000000, 604800000000, s + 250000 + 604800000000, i % 3
FROM generate_series(:lo::bigint, :hi::bigint) AS i,
    LATERAL (SELECT :now_us::bigint - 86400000000 + i * 86400000000 / :rows AS s) AS t;";
