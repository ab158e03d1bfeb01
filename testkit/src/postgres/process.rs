//! The server's processes as `/proc` shows them: whether the postmaster is alive, its pid,
//! and killing it with SIGKILL as a lost host would, waiting for its backends to go.

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::tools::{describe, run};
use super::{PgCluster, STOP_TIMEOUT};

impl PgCluster {
    /// Whether the server process is alive (it accepts connections whenever `start`,
    /// `restart` or `stop` is not in the middle of changing that).
    pub fn is_running(&self) -> bool {
        self.postmaster_pid().is_some()
    }

    /// The pid of the server's postmaster while it is alive.
    pub fn postmaster_pid(&self) -> Option<u32> {
        // Read directly rather than via `pg_ctl status`: no process to spawn, and a zombie postmaster, which `kill -0` reports as
        // alive, counts as dead here.
        let pid_file = fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        let pid = pid_file
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<u32>().ok())?;
        if !process_alive(pid) {
            return None;
        }
        // A stale pid file's pid may have been recycled by an unrelated process.
        fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| contains(&cmdline, self.data_dir.as_os_str().as_encoded_bytes()))
            .then_some(pid)
    }

    /// Kills the postmaster with SIGKILL, as the kernel's OOM killer or a lost host would, and
    /// waits until it and the backends it had are gone (they notice their postmaster's death
    /// and exit on their own). No shutdown checkpoint is written: a `restart` runs crash
    /// recovery. Does nothing if the server is not running.
    pub fn kill(&self) {
        let _lifecycle = self.lock_lifecycle();
        let Some(pid) = self.postmaster_pid() else {
            return;
        };
        let children = children_of(pid);
        // Line 7 of postmaster.pid: the shared memory key and id. A killed postmaster cannot
        // remove its System V segment; marked here, the kernel removes it once the last
        // backend detaches, instead of it outliving the test.
        let shmid = fs::read_to_string(self.data_dir.join("postmaster.pid"))
            .ok()
            .and_then(|f| {
                f.lines()
                    .nth(6)
                    .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
            });
        let out = run(
            Command::new("kill").arg("-KILL").arg(pid.to_string()),
            "kill -KILL <postmaster>",
        );
        if !out.status.success() && self.is_running() {
            panic!(
                "kill -KILL {pid} failed for the cluster in {}:\n{}",
                self.data_dir.display(),
                describe(&out)
            );
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while (self.is_running() || children.iter().any(|c| process_alive(*c)))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !self.is_running(),
            "the postmaster {pid} of {} still runs {STOP_TIMEOUT:?} after SIGKILL",
            self.data_dir.display()
        );
        if let Some(shmid) = shmid.filter(|id| id.parse::<u64>().is_ok()) {
            let _ = Command::new("ipcrm")
                .args(["-m", &shmid])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Whether process `pid` exists and is not a zombie.
fn process_alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(
        |stat| matches!(stat.rsplit_once(") "), Some((_, rest)) if !rest.starts_with(['Z', 'X'])),
    )
}

/// The pids of the live processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // After the command's closing parenthesis: state, then the parent's pid.
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
