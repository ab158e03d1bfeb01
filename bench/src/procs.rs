//! The servers the drivers start: the ledger server or the floor on a port the kernel picks,
//! found in its start-up log line, stopped with SIGTERM (a graceful stop, as deployed).

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to log its address: a loaded two-core machine is slow to start
/// a release binary that runs migrations first.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stop may take before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A server process started by a driver; stopped (SIGTERM, then SIGKILL) on drop.
pub struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    /// Starts `program` with `args` and `--listen 127.0.0.1:0`, its log (`RUST_LOG=info`, to
    /// stderr) in `log`, and waits until it logs the port it listens on (`listen=…:PORT`):
    /// port 0, because a port probed free beforehand can be taken by a client's ephemeral port
    /// before the server binds it.
    ///
    /// # Errors
    ///
    /// When it cannot be spawned, exits, or logs no address within a minute; the error
    /// names the log.
    pub fn start<I, S>(program: &Path, args: I, log: &Path) -> Result<Server, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let file =
            File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let child = Command::new(program)
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        let mut server = Server {
            child,
            port: 0,
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(port) = logged_port(&std::fs::read_to_string(log).unwrap_or_default()) {
                server.port = port;
                return Ok(server);
            }
            let exited = server.child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() >= deadline {
                let why = exited.map_or_else(|| "logged no address".to_string(), |s| s.to_string());
                return Err(format!(
                    "{} did not start ({why}); see {}",
                    program.display(),
                    log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its address, for gRPC clients.
    pub fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), n)
    }

    /// Stops it: SIGTERM, and SIGKILL if it is still running after 30 s.
    pub fn stop(self) {
        self.stop_within(STOP_TIMEOUT);
    }

    /// Stops it: SIGTERM, and SIGKILL if it is still running after `timeout` (a server under
    /// valgrind writes its profile as it exits, which takes a while).
    pub fn stop_within(mut self, timeout: Duration) {
        self.terminate(timeout);
    }

    fn terminate(&mut self, timeout: Duration) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        terminate(self.child.id());
        let deadline = Instant::now() + timeout;
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.terminate(STOP_TIMEOUT);
    }
}

/// Sends SIGTERM to `pid`.
pub fn terminate(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes any pid and signal number; a gone process is an ESRCH error,
        // which is ignored.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// The port of the first `listen=127.0.0.1:PORT` in a log.
fn logged_port(log: &str) -> Option<u16> {
    let (_, rest) = log.split_once("listen=127.0.0.1:")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|&p| p != 0)
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_read_from_the_start_up_line() {
        let log = "2026-12-01T00:00:00Z  INFO idempotency_ledger: idempotency-ledger starting \
                   listen=127.0.0.1:43117 store=sqlite\n";
        assert_eq!(logged_port(log), Some(43117));
        assert_eq!(logged_port("listen=127.0.0.1:0 "), None);
        assert_eq!(logged_port("nothing yet"), None);
    }
}
