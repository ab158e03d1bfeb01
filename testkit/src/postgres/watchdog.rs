//! The cleanup that outlives a killed process: stops the server and deletes the directory.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::tools::{SERVER_OS_USER, tools};

/// The watchdog's program. Its parameters come in the environment, not in its
/// arguments, so that `pgrep -f <data dir>` finds the processes at work on the data
/// dir and not the watchdog itself.
///
/// Its stdin is a pipe whose only write end is in the test process (close-on-exec, so
/// no child inherits it): `read` returns at end-of-file exactly when that process is
/// gone, however it died, with no polling and no pid that could be recycled.
///
/// Children of the dead test process (an `initdb`, a `pg_ctl start`) may still be at
/// work on the directory, so it waits for them to finish, stopping any server they
/// start, before deleting: deleting under a running `initdb` makes its backend die
/// without freeing its shared memory segments in /dev/shm.
const WATCHDOG_SCRIPT: &str = r#"
trap '' HUP INT
read -r _
stop_server() {
    [ -f "$PGH_DATA/postmaster.pid" ] || return 0
    if [ -n "$PGH_USER" ]; then
        setpriv --reuid="$PGH_USER" --regid="$PGH_USER" --init-groups \
            "$PGH_PG_CTL" -D "$PGH_DATA" -m immediate -w -t 60 stop >/dev/null 2>&1
    else
        "$PGH_PG_CTL" -D "$PGH_DATA" -m immediate -w -t 60 stop >/dev/null 2>&1
    fi
    if [ -f "$PGH_DATA/postmaster.pid" ]; then
        pid=$(head -n 1 "$PGH_DATA/postmaster.pid")
        [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    fi
}
pass=0
while [ "$pass" -lt 120 ]; do
    stop_server
    command -v pgrep >/dev/null 2>&1 || break
    pgrep -f -- "$PGH_DATA" >/dev/null 2>&1 || break
    pass=$((pass + 1))
    sleep 0.5
done
stop_server
rm -rf -- "$PGH_DIR"
"#;

/// A process that, once this test process is gone, stops the server in
/// `<dir>/data` if one runs there and deletes `<dir>`.
///
/// Dropping it without `disarm` sets it off right away (its stdin closes), which is
/// what a half-built directory abandoned by a panic needs.
#[derive(Debug)]
pub(crate) struct Watchdog(Child);

impl Watchdog {
    pub(crate) fn arm(dir: &Path) -> Watchdog {
        let tools = tools();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .env("PGH_DIR", dir)
            .env("PGH_DATA", dir.join("data"))
            .env("PGH_PG_CTL", tools.bin_dir.join("pg_ctl"))
            .env(
                "PGH_USER",
                if tools.server_user.is_some() {
                    SERVER_OS_USER
                } else {
                    ""
                },
            )
            .stdin(Stdio::piped())
            // Never the test runner's pipes: a runner waits for those to close, and this
            // process outlives the test on purpose.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .current_dir("/")
            // Its own process group, so that a runner killing the test's group on
            // timeout (nextest does) or a Ctrl-C does not kill the cleanup with it.
            .process_group(0);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn the PostgreSQL cleanup watchdog (sh): {e}"));
        Watchdog(child)
    }

    /// For when this process has cleaned up (or is about to) itself: a released
    /// watchdog would race it.
    pub(crate) fn disarm(mut self) {
        let _ = self.0.kill();
        // Reaped so that a long `cargo test` process collects no zombies.
        let _ = self.0.wait();
    }

    /// Runs the cleanup now and waits for it.
    pub(crate) fn fire(mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}
