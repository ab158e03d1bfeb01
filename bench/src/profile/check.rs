//! The guard against the slow creep (`profile --check`): a fresh count of ours, instructions
//! per RPC of the claim path, against the record committed for the same build profile
//! (`bench/results/profile-record-<profile>.json`; `smoke` and `release` builds count
//! differently). A rise of more than `--tolerance` per cent fails; a fall passes and says so,
//! so the record can be lowered (`--save-record`) and keep guarding the gain.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Options, Store, Workload, build_profile, count_ours, log};

/// The committed record --check compares with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// The cargo profile the binaries were built with.
    pub build_profile: String,
    /// What ledger-bench ran.
    pub workload: Workload,
    /// Its clients.
    pub clients: u32,
    /// The operations counted (after a warm-up of 200).
    pub count: u64,
    /// The server's store.
    pub store: Store,
    /// The server's instructions per RPC.
    pub instructions_per_rpc: u64,
    /// The commit it was counted at (`+uncommitted` when the tree was not clean).
    pub commit: String,
    /// When (UTC).
    pub date: String,
}

/// The record's file for the options' build profile.
#[must_use]
pub fn record_file(options: &Options) -> PathBuf {
    crate::repository_root().join(format!(
        "bench/results/profile-record-{}.json",
        build_profile(options)
    ))
}

/// `--save-record` or `--check`; returns whether the check passed (a save always does).
///
/// # Errors
///
/// When the record cannot be read or written, or the count fails.
pub fn run(options: &Options) -> Result<bool, String> {
    let file = record_file(options);
    if options.save_record {
        let clients = options.clients.0.first().copied().unwrap_or(1);
        let ir = count_ours(
            options,
            options.workload,
            clients,
            options.count,
            options.store,
        )?;
        let record = Record {
            build_profile: build_profile(options).into(),
            workload: options.workload,
            clients,
            count: options.count,
            store: options.store,
            instructions_per_rpc: ir,
            commit: crate::host::commit(),
            date: crate::host::utc(crate::host::unix_now(), false),
        };
        let json = serde_json::to_string_pretty(&record).map_err(|e| e.to_string())? + "\n";
        std::fs::write(&file, json).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
        println!(
            "profile: recorded {ir} instructions per RPC in {}",
            file.display()
        );
        return Ok(true);
    }
    let text = std::fs::read_to_string(&file).map_err(|e| {
        format!(
            "cannot read {} (make it with --save-record): {e}",
            file.display()
        )
    })?;
    let record: Record = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a record: {e}", file.display()))?;
    log(&format!(
        "counting ours: {} operations of {:?} at {} client(s), {} build",
        record.count, record.workload, record.clients, record.build_profile
    ));
    let now = count_ours(
        options,
        record.workload,
        record.clients,
        record.count,
        record.store,
    )?;
    let (passed, line) = verdict(record.instructions_per_rpc, now, options.tolerance);
    println!(
        "profile --check: {line} (record {}, {})",
        record.commit,
        file.display()
    );
    Ok(passed)
}

/// Whether `now` is within `tolerance` per cent above `record`, and the line that says so.
#[must_use]
pub fn verdict(record: u64, now: u64, tolerance: f64) -> (bool, String) {
    let change = (now as f64 / record as f64 - 1.0) * 100.0;
    let passed = change <= tolerance;
    let word = if passed { "passed" } else { "FAILED" };
    (
        passed,
        format!(
            "{word}: {now} instructions per RPC now, {record} in the record ({change:+.1} %, \
             at most {tolerance:+.0} % allowed)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::verdict;

    #[test]
    fn a_rise_over_the_tolerance_fails_and_prints_both_figures() {
        let (passed, line) = verdict(100_000, 111_000, 10.0);
        assert!(!passed);
        assert!(line.contains("111000") && line.contains("100000"), "{line}");
        assert!(verdict(100_000, 109_000, 10.0).0);
        assert!(verdict(100_000, 80_000, 10.0).0);
    }
}
