//! The machine's PostgreSQL installation and how to run its programs, as the server user
//! when we are root.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// OS account the server runs as when the tests run as root.
pub(crate) const SERVER_OS_USER: &str = "postgres";

/// The machine's PostgreSQL installation and how to run its server-side programs.
#[derive(Debug)]
pub(crate) struct Tools {
    pub(crate) bin_dir: PathBuf,
    /// As printed by `postgres --version`, e.g. `15.18`.
    pub(crate) version: String,
    pub(crate) euid: u32,
    /// The server user's (uid, gid) when we are root and must drop privileges.
    pub(crate) server_user: Option<(u32, u32)>,
}

pub(crate) fn tools() -> &'static Tools {
    static TOOLS: OnceLock<Tools> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let bin_dir = find_bin_dir();
        let out = run(
            Command::new(bin_dir.join("postgres")).arg("--version"),
            "postgres --version",
        );
        let version_line = String::from_utf8_lossy(&out.stdout).into_owned();
        // "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
        let version = version_line
            .split_whitespace()
            .nth(2)
            .filter(|v| out.status.success() && v.starts_with(|c: char| c.is_ascii_digit()))
            .unwrap_or_else(|| {
                panic!(
                    "cannot parse `postgres --version` output: {}",
                    describe(&out)
                )
            })
            .to_string();
        let euid = effective_uid();
        let server_user =
            (euid == 0).then(|| (id_of(SERVER_OS_USER, "-u"), id_of(SERVER_OS_USER, "-g")));
        Tools {
            bin_dir,
            version,
            euid,
            server_user,
        }
    })
}

impl Tools {
    /// A command running `tool` from the server's bin dir, as the server user if we are root.
    pub(crate) fn server_command(&self, tool: &str) -> Command {
        let exe = self.bin_dir.join(tool);
        let mut cmd = if self.server_user.is_some() {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={SERVER_OS_USER}"))
                .arg(format!("--regid={SERVER_OS_USER}"))
                .arg("--init-groups")
                .arg(exe);
            c
        } else {
            Command::new(exe)
        };
        // The test's working directory (under /root in CI) may be unreadable to the
        // server user, and initdb and pg_ctl complain about that.
        cmd.current_dir(std::env::temp_dir()).stdin(Stdio::null());
        cmd
    }

    pub(crate) fn give_to_server_user(&self, path: &Path) {
        if let Some((uid, gid)) = self.server_user {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap_or_else(|e| {
                panic!("cannot chown {} to {SERVER_OS_USER}: {e}", path.display())
            });
        }
    }
}

/// A command running the server-side program `tool` (`pg_basebackup`, `pg_ctl`, …) of the
/// harness's PostgreSQL installation, as the server user when the tests run as root, from a
/// directory that user can read.
pub fn server_command(tool: &str) -> Command {
    tools().server_command(tool)
}

/// The directory of the harness's PostgreSQL server programs (`pg_ctl`, `postgres`, …).
pub fn bin_dir() -> &'static Path {
    &tools().bin_dir
}

/// The installation's PostgreSQL version, as `postgres --version` prints it (`15.18`).
pub fn version() -> &'static str {
    &tools().version
}

/// The client program `name` (`psql`, `pgbench`) of the harness's installation when it has
/// one, else `name` as found on `PATH`: to run as the calling user (clients may run as root).
pub fn program(name: &str) -> PathBuf {
    let bundled = tools().bin_dir.join(name);
    if bundled.is_file() {
        bundled
    } else {
        PathBuf::from(name)
    }
}

/// Finds the directory holding `pg_ctl`, `initdb` and `postgres` of one installation: `$PG_BIN`
/// when set, else the one on `PATH`, else the newest under /usr/lib/postgresql.
fn find_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        assert!(
            dir.join("pg_ctl").is_file(),
            "PG_BIN={} holds no pg_ctl",
            dir.display()
        );
        return dir;
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("pg_ctl"))
            .find(|exe| exe.is_file())
    });
    if let Some(pg_ctl) = on_path {
        // Resolve symlinks (Debian links /usr/local/bin/pg_ctl into the versioned dir)
        // so the three programs surely come from one installation.
        let real = fs::canonicalize(&pg_ctl).unwrap_or(pg_ctl);
        if let Some(dir) = real.parent()
            && dir.join("initdb").is_file()
            && dir.join("postgres").is_file()
        {
            return dir.to_path_buf();
        }
    }
    // Debian/Ubuntu keep the server programs off PATH; prefer the newest major version.
    let mut candidates: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("pg_ctl").is_file().then_some((major, bin))
        })
        .collect();
    candidates.sort();
    candidates.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "PostgreSQL server programs not found: put pg_ctl, initdb and postgres on PATH \
             or install them under /usr/lib/postgresql/<major>/bin"
        )
    })
}

fn effective_uid() -> u32 {
    // /proc/self belongs to the process's effective uid; `id -u` covers a missing /proc.
    fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or_else(|_| id_of_self())
}

fn id_of_self() -> u32 {
    let out = run(Command::new("id").arg("-u"), "id -u");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("cannot parse `id -u` output: {}", describe(&out)))
}

fn id_of(user: &str, flag: &str) -> u32 {
    let out = run(Command::new("id").arg(flag).arg(user), "id");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| {
        panic!(
            "tests run as root, so PostgreSQL must run as the OS user `{user}`, but `id {flag} {user}` failed:\n{}",
            describe(&out)
        )
    })
}

pub(crate) fn run(cmd: &mut Command, what: &str) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {what} ({:?}): {e}", cmd.get_program()))
}

pub(crate) fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim_end(),
        String::from_utf8_lossy(&out.stderr).trim_end()
    )
}

/// A command running `program` as the user the PostgreSQL servers run as (the `postgres` OS
/// user when the tests run as root, which PgBouncer refuses as much as PostgreSQL does), and
/// `path` handed to that user: for other servers the tests start beside PostgreSQL.
pub fn as_server_user(program: &Path, path: &Path) -> Command {
    let tools = tools();
    tools.give_to_server_user(path);
    let mut cmd = if tools.server_user.is_some() {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={SERVER_OS_USER}"))
            .arg(format!("--regid={SERVER_OS_USER}"))
            .arg("--init-groups")
            // Ends with the test process, even when a static holds it and is never dropped.
            .arg("--pdeathsig=KILL")
            .arg(program);
        c
    } else {
        Command::new(program)
    };
    cmd.current_dir(std::env::temp_dir()).stdin(Stdio::null());
    cmd
}
