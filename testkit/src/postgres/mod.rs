//! Throwaway PostgreSQL clusters, for the integration tests and the benchmark.
//!
//! This module owns everything about the throwaway servers: a template data directory made
//! by `initdb` once per machine (PostgreSQL version and user) and cached in the system
//! temp dir, a private copy of it for every cluster, the server processes running on
//! those copies, and their cleanup. Cleanup happens in `Drop`, and also — because
//! statics are never dropped, and tests panic, call `exit` or get killed by the runner —
//! in a watchdog process that outlives the owning process just long enough to stop the
//! server and delete its directory.
//!
//! `initdb` costs about a second while copying its result costs a tenth of that, which is
//! why clusters are copies of a template rather than fresh `initdb`s. All of it lives
//! under `std::env::temp_dir()`: pointing `TMPDIR` at a tmpfs such as /dev/shm makes
//! starting a cluster and creating a database several times faster when the disk is busy.
//!
//! PostgreSQL refuses to run as root, and CI runs tests as root: then every server-side
//! command runs as the `postgres` OS user through `setpriv` (util-linux, like `runuser`
//! but without a PAM session, so three times faster to spawn), and the directories the
//! server writes are handed to that user.
//!
//! The template's settings are the tests' (no fsync: tests never survive a power cut); a
//! benchmark states its own with [`ClusterSetup::conf`], which wins over them.

mod process;
mod setup;
mod template;
mod tools;
mod watchdog;

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

pub use setup::ClusterSetup;
pub use tools::{as_server_user, bin_dir, program, server_command, version};

use setup::apply_setup;
use template::{copy_tree, template_dir, unique_suffix};
use tools::{describe, run, tools};
use watchdog::Watchdog;

/// Bump whenever `TEMPLATE_CONF` or the `initdb` arguments change, so that templates
/// cached by older code are not reused.
const TEMPLATE_FORMAT: u32 = 2;

/// Per-cluster settings live in their own file, included by the template's
/// `postgresql.conf`, so a port retry can rewrite them without touching anything else.
const CLUSTER_CONF: &str = "pgharness-cluster.conf";

/// Appended to the template's `postgresql.conf`.
///
/// fsync and full-page writes only protect against OS or power failure, which tests never
/// survive anyway; synchronous_commit stays on because it decides whether a committed
/// transaction survives a *server* crash (`StopMode::Immediate`), which tests do exercise.
const TEMPLATE_CONF: &str = "
# ---- added by testkit (src/postgres/mod.rs) ----
listen_addresses = '127.0.0.1'
max_connections = 200
shared_buffers = 16MB
fsync = off
full_page_writes = off
synchronous_commit = on
include = 'pgharness-cluster.conf'
";

/// How many fresh ports `start()` tries before giving up, since a port picked by binding
/// and dropping a listener can be taken by someone else before the server binds it.
const PORT_ATTEMPTS: u32 = 5;

/// How many times `restart()` retries a port that something else grabbed while the
/// server was down (it cannot move: URLs handed out earlier name it).
const RESTART_ATTEMPTS: u32 = 5;

/// `pg_ctl -t`: generous because a loaded CI machine may start slowly; a timeout is a
/// failure anyway.
const PG_CTL_TIMEOUT_SECS: &str = "60";

/// How long `stop` waits for the server to go down (immediate mode takes milliseconds;
/// fast mode waits for a checkpoint).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest usable Unix socket path (`sun_path` is 108 bytes including the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// How `PgCluster::stop` shuts the server down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// `pg_ctl stop -m fast`: disconnects clients, checkpoints, exits cleanly.
    Fast,
    /// `pg_ctl stop -m immediate`: kills the server without a checkpoint, like a crash;
    /// the next start runs crash recovery.
    Immediate,
}

impl StopMode {
    fn as_pg_ctl_arg(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}
/// A throwaway PostgreSQL cluster owned by this test process.
///
/// Reachable over TCP at `127.0.0.1:port()` as the superuser `postgres` with trust
/// authentication (no password). Every method takes `&self` so that a `&'static` or
/// `Arc`'d cluster can be stopped and restarted from one thread while others use it.
#[derive(Debug)]
pub struct PgCluster {
    port: u16,
    /// Holds `data/`, `server.log` and the Unix socket; dropping it deletes them all,
    /// which is why it must be dropped only after the server is stopped (see `Drop`).
    dir: tempfile::TempDir,
    data_dir: PathBuf,
    log_path: PathBuf,
    /// Serializes `pg_ctl start`/`stop` on the data directory: two at once would race on
    /// `postmaster.pid`.
    lifecycle: Mutex<()>,
    /// Taken in `Drop`.
    watchdog: Option<Watchdog>,
}

impl PgCluster {
    /// Starts a fresh, empty cluster on a free loopback port and waits until it accepts
    /// connections.
    ///
    /// Blocks for a few hundred milliseconds (about a second more the first time on a
    /// machine, to build the cached template). Panics with the server log's tail if the
    /// server cannot start.
    pub fn start() -> PgCluster {
        PgCluster::start_with(ClusterSetup::default())
    }

    /// As [`PgCluster::start`], with the data directory first filled, configured and given
    /// files as `setup` says (see [`ClusterSetup`]), all before the server's first start.
    pub fn start_with(mut setup: ClusterSetup) -> PgCluster {
        let tools = tools();

        let dir = tempfile::Builder::new()
            .prefix("pgharness-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for a PostgreSQL cluster: {e}"));
        // The server writes its log and socket here.
        tools.give_to_server_user(dir.path());
        // Armed before anything goes into the directory: a test killed in the middle of
        // the copy would otherwise leave a half-copied data dir behind.
        let watchdog = Watchdog::arm(dir.path());
        let data_dir = dir.path().join("data");
        let log_path = dir.path().join("server.log");

        match setup.populate.take() {
            Some(populate) => populate(&data_dir).unwrap_or_else(|e| {
                panic!(
                    "cannot fill the data directory {} of a new cluster: {e}",
                    data_dir.display()
                )
            }),
            None => {
                let template = template_dir();
                // In-process rather than `cp -a`: a `cp` outlives a killed test and goes on
                // writing into the directory while the watchdog deletes it.
                copy_tree(template, &data_dir).unwrap_or_else(|e| {
                    panic!(
                        "cannot copy the PostgreSQL template {} to {}: {e}",
                        template.display(),
                        data_dir.display()
                    )
                });
            }
        }
        apply_setup(&setup, &data_dir);

        let mut cluster = PgCluster {
            port: 0,
            dir,
            data_dir,
            log_path,
            lifecycle: Mutex::new(()),
            watchdog: Some(watchdog),
        };
        // Any panic from here on drops `cluster`, whose `Drop` stops whatever did start.
        for attempt in 1..=PORT_ATTEMPTS {
            let port = free_loopback_port();
            cluster.write_cluster_conf(port);
            match cluster.pg_ctl_start() {
                Ok(()) => {
                    cluster.port = port;
                    return cluster;
                }
                Err(failure) if failure.port_in_use && attempt < PORT_ATTEMPTS => continue,
                Err(failure) => panic!(
                    "PostgreSQL cluster in {} did not start on port {port} (attempt {attempt} of {PORT_ATTEMPTS}):\n{}",
                    cluster.data_dir.display(),
                    failure.report
                ),
            }
        }
        unreachable!("the last attempt either returns or panics")
    }

    /// One cluster shared by every test of this process, started on first use.
    ///
    /// Never stopped by `Drop` (statics are not dropped): the watchdog removes it once the
    /// process exits. Tests using it must not stop it, and should isolate themselves with
    /// `create_database`.
    pub fn shared() -> &'static PgCluster {
        static SHARED: OnceLock<PgCluster> = OnceLock::new();
        SHARED.get_or_init(PgCluster::start)
    }

    /// The loopback TCP port the server listens on; it stays the same across `restart`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:{port}/{db}`, for `sqlx::PgPool::connect` and friends.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The cluster's data directory, e.g. to read files the server wrote; removed on drop.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Creates a new empty database with a name unique across threads and processes and
    /// returns its URL. Panics if the server refuses (for instance because it is stopped).
    pub fn create_database(&self) -> String {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        // The pid separates processes; the clock guards against a recycled pid meeting
        // a leftover database; the counter separates threads.
        let name = format!(
            "test_{}_{}_{}",
            std::process::id(),
            unique_suffix(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let out = run(
            self.psql("postgres")
                .arg("-c")
                .arg(format!("CREATE DATABASE \"{name}\"")),
            "psql -c 'CREATE DATABASE ...'",
        );
        if !out.status.success() {
            panic!(
                "cannot create database {name} on the PostgreSQL cluster at port {}:\n{}",
                self.port,
                describe(&out)
            );
        }
        self.url(&name)
    }

    /// Creates a new empty database, as [`PgCluster::create_database`], whose new tables and
    /// indexes go to a new tablespace at `location` (an empty directory, given to the server
    /// user here; the system catalogs stay where they are): a small filesystem there makes the
    /// ledger's disk fill up while the WAL's does not.
    pub fn create_database_on(&self, location: &Path) -> String {
        tools().give_to_server_user(location);
        let url = self.create_database();
        let name = url.rsplit('/').next().expect("a database name").to_string();
        let out = run(
            self.psql("postgres")
                .arg("-c")
                .arg(format!(
                    "CREATE TABLESPACE \"ts_{name}\" LOCATION '{}'",
                    location.display()
                ))
                .arg("-c")
                .arg(format!(
                    "ALTER DATABASE \"{name}\" SET default_tablespace = \"ts_{name}\""
                )),
            "psql -c 'CREATE TABLESPACE ...'",
        );
        if !out.status.success() {
            panic!(
                "cannot move database {name} to a tablespace at {}:\n{}",
                location.display(),
                describe(&out)
            );
        }
        url
    }

    /// Stops the server and waits until it is down. Connections fail from then on until
    /// `restart`. Does nothing if it is already stopped.
    pub fn stop(&self, mode: StopMode) {
        let _lifecycle = self.lock_lifecycle();
        if !self.is_running() {
            return;
        }
        if let Err(why) = self.pg_ctl_stop(mode) {
            panic!(
                "pg_ctl stop -m {} failed for the cluster in {}:\n{why}\n{}",
                mode.as_pg_ctl_arg(),
                self.data_dir.display(),
                self.log_tail()
            );
        }
    }

    /// Starts the server again on the same data directory and port, and waits until it
    /// accepts connections; data committed before a `stop` of either mode is still there.
    /// If the server is running, it is first stopped with `StopMode::Fast`, so this is a
    /// real restart rather than a no-op.
    pub fn restart(&self) {
        let _lifecycle = self.lock_lifecycle();
        if self.is_running()
            && let Err(why) = self.pg_ctl_stop(StopMode::Fast)
        {
            panic!(
                "pg_ctl stop -m fast (for restart) failed for the cluster in {}:\n{why}\n{}",
                self.data_dir.display(),
                self.log_tail()
            );
        }
        for attempt in 1..=RESTART_ATTEMPTS {
            match self.pg_ctl_start() {
                Ok(()) => return,
                Err(failure) if failure.port_in_use && attempt < RESTART_ATTEMPTS => {
                    // Whoever took the port may be a short-lived client socket: wait it out.
                    std::thread::sleep(Duration::from_millis(200 * u64::from(attempt)));
                }
                Err(failure) => panic!(
                    "PostgreSQL cluster in {} did not restart on port {} (attempt {attempt} of {RESTART_ATTEMPTS}):\n{}",
                    self.data_dir.display(),
                    self.port,
                    failure.report
                ),
            }
        }
    }

    /// `pg_ctl promote`: ends a standby's recovery and waits until it accepts writes. Panics
    /// with the server log's tail if it does not.
    pub fn promote(&self) {
        let _lifecycle = self.lock_lifecycle();
        let out = run(
            tools()
                .server_command("pg_ctl")
                .arg("-D")
                .arg(&self.data_dir)
                .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "promote"]),
            "pg_ctl promote",
        );
        if !out.status.success() {
            panic!(
                "pg_ctl promote failed for the cluster in {}:\n{}\n{}",
                self.data_dir.display(),
                describe(&out),
                self.log_tail()
            );
        }
    }

    /// Stops the server cleanly and keeps its directory (`data/`, `server.log`) instead of
    /// deleting it, for a person to look into or start again with `pg_ctl -D`; returns its
    /// path.
    pub fn keep(mut self) -> PathBuf {
        self.stop(StopMode::Fast);
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.disarm();
        }
        self.dir.disable_cleanup(true);
        self.dir.path().to_path_buf()
    }

    /// The server's log so far (`pg_ctl -l`), for assertions and failure messages.
    pub fn server_log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn lock_lifecycle(&self) -> MutexGuard<'_, ()> {
        // A test that panicked mid-restart must not wedge the other tests sharing this
        // cluster; the guarded state is the data dir, which `is_running` re-reads anyway.
        self.lifecycle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_cluster_conf(&self, port: u16) {
        let socket_dir = self.dir.path();
        let socket_line =
            if socket_dir.as_os_str().len() + "/.s.PGSQL.65535".len() <= MAX_SOCKET_PATH {
                format!("unix_socket_directories = '{}'", conf_escape(socket_dir))
            } else {
                // An over-long socket path is fatal to the server, and nothing here needs
                // the socket: everything connects over TCP.
                "unix_socket_directories = ''".to_string()
            };
        let path = self.data_dir.join(CLUSTER_CONF);
        fs::write(&path, format!("port = {port}\n{socket_line}\n"))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        tools().give_to_server_user(&path);
    }

    fn pg_ctl_start(&self) -> Result<(), StartFailure> {
        let log_offset = fs::metadata(&self.log_path).map(|m| m.len()).unwrap_or(0);
        let out = run(
            tools()
                .server_command("pg_ctl")
                .arg("-D")
                .arg(&self.data_dir)
                .arg("-l")
                .arg(&self.log_path)
                .args(["-w", "-t", PG_CTL_TIMEOUT_SECS, "start"]),
            "pg_ctl start",
        );
        if out.status.success() {
            return Ok(());
        }
        let new_log = read_from(&self.log_path, log_offset);
        Err(StartFailure {
            port_in_use: new_log.contains("Address already in use"),
            report: format!("{}\n{}", describe(&out), self.log_tail()),
        })
    }

    /// Signals the server to stop and waits until it is down; `Err` explains why not.
    fn pg_ctl_stop(&self, mode: StopMode) -> Result<(), String> {
        // `-W` and our own wait because `pg_ctl -w` polls every 100 ms, which more than
        // doubles the time a stop takes.
        // Not `run`, which panics: this is also called from `Drop`.
        let out = tools()
            .server_command("pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", mode.as_pg_ctl_arg(), "-W", "stop"])
            .output()
            .map_err(|e| format!("cannot run pg_ctl stop: {e}"))?;
        if !out.status.success() {
            return Err(describe(&out));
        }
        if self.wait_until_down(STOP_TIMEOUT) {
            Ok(())
        } else {
            Err(format!(
                "the server was still running {STOP_TIMEOUT:?} after pg_ctl stop"
            ))
        }
    }

    fn wait_until_down(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.is_running() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A `psql` command connected to `database` of this cluster over TCP as `postgres`,
    /// stopping at the first error (`-v ON_ERROR_STOP=1`), quiet (`-q`), reading no `~/.psqlrc`
    /// (`-X`), its standard input closed: add `-c`, `-f` or `-v` arguments and run it.
    pub fn psql(&self, database: &str) -> Command {
        let mut cmd = Command::new(program("psql"));
        // Variables from the developer's shell must not redirect or reconfigure us.
        for var in [
            "PGOPTIONS",
            "PGSERVICE",
            "PGSERVICEFILE",
            "PGSSLMODE",
            "PGTARGETSESSIONATTRS",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("PGCONNECT_TIMEOUT", "10")
            .args([
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
            ])
            .arg(database)
            .arg("-p")
            .arg(self.port.to_string())
            .stdin(Stdio::null());
        cmd
    }

    fn log_tail(&self) -> String {
        const LINES: usize = 40;
        match fs::read_to_string(&self.log_path) {
            Ok(log) => {
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(LINES)..].join("\n");
                format!("--- last lines of {} ---\n{tail}", self.log_path.display())
            }
            Err(e) => format!("--- no server log at {}: {e} ---", self.log_path.display()),
        }
    }
}

impl Drop for PgCluster {
    /// Stops the server at once (nothing of it is worth a clean shutdown), disarms the
    /// watchdog, and lets the `TempDir` field delete the directory afterwards.
    fn drop(&mut self) {
        // Never panic here: a drop during a panic's unwinding would abort the test binary.
        let down = !self.is_running() || self.pg_ctl_stop(StopMode::Immediate).is_ok();
        if let Some(watchdog) = self.watchdog.take() {
            if down {
                watchdog.disarm();
            } else {
                // It retries the stop and falls back to SIGKILL, which we cannot send
                // without libc.
                watchdog.fire();
            }
        }
    }
}

/// The harness's `initdb`'d template data directory (built on first use; never to be written
/// to): a copy of it, with an empty `pgharness-cluster.conf` beside its `postgresql.conf`,
/// is a cluster's data directory in a tenth of `initdb`'s time (a bootstrap method for
/// Patroni, say).
pub fn template_data_dir() -> &'static Path {
    template_dir()
}

fn free_loopback_port() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .unwrap_or_else(|e| panic!("cannot bind a loopback port to find a free one: {e}"));
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("cannot read a loopback listener's address: {e}"))
        .port()
}

struct StartFailure {
    /// The server failed because the port was taken, so another port (or a later try on
    /// the same one) may succeed.
    port_in_use: bool,
    report: String,
}

fn read_from(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut file) = fs::File::open(path) {
        let _ = file.seek(SeekFrom::Start(offset));
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    text
}

/// Escapes a path for a single-quoted `postgresql.conf` value.
fn conf_escape(path: &Path) -> String {
    path.to_string_lossy()
        .replace('\\', "\\\\")
        .replace('\'', "''")
}

// `shared()` hands one cluster to every test thread.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PgCluster>();
};
