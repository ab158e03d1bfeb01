//! What /proc says of a process: its CPU time (alone, or with its children as a PostgreSQL
//! postmaster's backends), its memory, its open descriptors, its children.

use std::fs;
use std::ops::Range;

/// Clock ticks per second of /proc/PID/stat times (USER_HZ, 100 on every Linux ABI).
pub const USER_HZ: f64 = 100.0;

/// The fields of /proc/PID/stat after the command name (which may hold spaces), from field 3
/// (state) on.
fn fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect())
}

/// The sum of fields `range` (numbered as proc(5) numbers them, from 1).
fn ticks(f: &[&str], range: Range<usize>) -> Option<u64> {
    range.map(|i| f.get(i - 3)?.parse::<u64>().ok()).sum()
}

/// User + system CPU seconds of a process (`pid`, or `self`), all its threads, from
/// /proc/PID/stat; with `children`, plus those of its live children and of the children it
/// has reaped (a postmaster and its backends, a shell and its pgbench). `None` when the
/// process is gone.
pub fn cpu_seconds(pid: &str, children: bool) -> Option<f64> {
    // Fields 14 and 15 are utime and stime, 16 and 17 cutime and cstime.
    let own = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut total = ticks(&fields(&own), if children { 14..18 } else { 14..16 })?;
    if children {
        for (_, f) in all_stats() {
            if f.get(1).map(String::as_str) == Some(pid) {
                let f: Vec<&str> = f.iter().map(String::as_str).collect();
                total += ticks(&f, 14..16).unwrap_or(0);
            }
        }
    }
    Some(total as f64 / USER_HZ)
}

/// CPU seconds the reaped children of this process have used (cutime + cstime): a child
/// run to its end (pgbench) counts here once waited for.
pub fn reaped_children_cpu_seconds() -> f64 {
    fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| ticks(&fields(&stat), 16..18))
        .map_or(0.0, |t| t as f64 / USER_HZ)
}

/// Every process's pid and stat fields (from field 3 on), skipping those gone meanwhile.
fn all_stats() -> Vec<(u32, Vec<String>)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            Some((pid, fields(&stat).into_iter().map(String::from).collect()))
        })
        .collect()
}

/// The live children of `parent`.
pub fn children_of(parent: u32) -> Vec<u32> {
    let parent = parent.to_string();
    all_stats()
        .into_iter()
        .filter(|(_, f)| f.get(1) == Some(&parent))
        .map(|(pid, _)| pid)
        .collect()
}

/// A process's memory, in KiB, from /proc/PID/status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// The peak resident set (VmHWM).
    pub peak_kib: u64,
    /// The resident set now (VmRSS).
    pub rss_kib: u64,
}

/// `pid`'s memory, or `None` when it is gone.
pub fn memory_of(pid: u32) -> Option<Memory> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some(Memory {
        peak_kib: field("VmHWM:")?,
        rss_kib: field("VmRSS:")?,
    })
}

/// How many descriptors `pid` has open (entries of /proc/PID/fd), or `None` when it is gone.
pub fn open_descriptors(pid: u32) -> Option<usize> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|d| d.flatten().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 10 0 0 0 7 3 2 1 20 0 1 0";
        let f = fields(stat);
        assert_eq!(f[0], "S");
        assert_eq!(ticks(&f, 14..16), Some(10));
        assert_eq!(ticks(&f, 14..18), Some(13));
    }

    #[test]
    fn this_process_has_cpu_time_memory_and_descriptors() {
        let me = std::process::id();
        assert!(cpu_seconds("self", false).is_some());
        let memory = memory_of(me).expect("our own status");
        assert!(memory.rss_kib > 0 && memory.peak_kib >= memory.rss_kib);
        assert!(open_descriptors(me).expect("our own fds") >= 3);
    }
}
