//! What a record says of where and when it was measured: the commit, the machine, the time.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// The short commit, marked `+uncommitted` when the work tree differs from it.
pub fn commit() -> String {
    let root = crate::repository_root();
    let git = |args: &[&str]| Command::new("git").args(args).current_dir(&root).output();
    let mut commit = git(&["rev-parse", "--short", "HEAD"])
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown".to_string(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_string(),
        );
    if git(&["diff", "--quiet", "HEAD"]).is_ok_and(|o| !o.status.success()) {
        commit.push_str("+uncommitted");
    }
    commit
}

/// The machine's memory, as `24 GiB`.
pub fn memory() -> String {
    let kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    format!("{:.0} GiB", kib / 1_048_576.0)
}

/// `uname -sr`.
pub fn uname() -> String {
    Command::new("uname").arg("-sr").output().map_or_else(
        |_| "unknown".to_string(),
        |o| String::from_utf8_lossy(&o.stdout).trim().to_string(),
    )
}

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The UTC date and time of `secs` since the epoch: `2026-12-01T20:02Z`, or with
/// `seconds`, `2026-12-01T20:02:33Z`.
pub fn utc(secs: u64, seconds: bool) -> String {
    let full = humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_secs(secs))
        .to_string();
    if seconds {
        full
    } else {
        format!("{}Z", &full[..16])
    }
}

/// The time of day (UTC), for progress lines.
pub fn clock_now() -> String {
    utc(unix_now(), true)[11..19].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_civil_dates() {
        assert_eq!(utc(0, true), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_796_155_353, false), "2026-12-01T20:02Z");
        assert_eq!(utc(951_782_400, true), "2000-02-29T00:00:00Z");
    }
}
