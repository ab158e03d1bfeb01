//! PgBouncer in front of a throwaway cluster, as production often runs PostgreSQL: Debian's
//! `pgbouncer` (1.18, or `$PGBOUNCER`), started as the server's unprivileged user with its
//! default settings, except where it listens, that it trusts local connections (the cluster
//! does too), its pool mode, and whatever settings the caller adds.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::free_port;
use crate::postgres::{PgCluster, as_server_user};

/// A running PgBouncer; killed on drop.
pub struct PgBouncer {
    port: u16,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl PgBouncer {
    /// One PgBouncer in transaction mode in front of [`PgCluster::shared`], for every test of
    /// this process (it ends with the process).
    pub fn shared() -> &'static PgBouncer {
        static SHARED: OnceLock<PgBouncer> = OnceLock::new();
        SHARED.get_or_init(|| PgBouncer::start(PgCluster::shared(), "transaction"))
    }

    /// Starts PgBouncer in `pool_mode` in front of `cluster`, and waits until it accepts
    /// connections.
    pub fn start(cluster: &PgCluster, pool_mode: &str) -> PgBouncer {
        PgBouncer::start_with(cluster, pool_mode, "trust", "\"postgres\" \"\"\n")
    }

    /// As [`PgBouncer::start`], checking clients with `auth_type` against `users` (the lines
    /// of its `auth_file`, `"user" "password"`).
    pub fn start_with(
        cluster: &PgCluster,
        pool_mode: &str,
        auth_type: &str,
        users: &str,
    ) -> PgBouncer {
        PgBouncer::launch(cluster, pool_mode, auth_type, users, &[])
    }

    /// As [`PgBouncer::start`], with `settings` (`name = value` lines) added to its
    /// `[pgbouncer]` section: `default_pool_size = 16`, say.
    pub fn start_with_settings(
        cluster: &PgCluster,
        pool_mode: &str,
        settings: &[String],
    ) -> PgBouncer {
        PgBouncer::launch(cluster, pool_mode, "trust", "\"postgres\" \"\"\n", settings)
    }

    fn launch(
        cluster: &PgCluster,
        pool_mode: &str,
        auth_type: &str,
        users: &str,
        settings: &[String],
    ) -> PgBouncer {
        let program = program();
        let dir = tempfile::Builder::new()
            .prefix("pgbouncer-")
            .tempdir()
            .expect("temp dir");
        let port = free_port();
        let log = dir.path().join("pgbouncer.log");
        let users_file = dir.path().join("users.txt");
        std::fs::write(&users_file, users).expect("users");
        let ini = dir.path().join("pgbouncer.ini");
        let mut extra = String::new();
        for line in settings {
            extra.push_str(line);
            extra.push('\n');
        }
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={upstream}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = {auth_type}\nauth_file = {users}\npool_mode = {pool_mode}\n\
                 logfile = {log}\n{extra}",
                upstream = cluster.port(),
                users = users_file.display(),
                log = log.display(),
            ),
        )
        .expect("ini");
        let child = as_server_user(&program, dir.path())
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let mut bouncer = PgBouncer {
            port,
            child,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = bouncer.child.try_wait().ok().flatten();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "pgbouncer did not listen on {port} within 20 s ({}):\n{}",
                exited.map_or_else(|| "still running".to_string(), |s| s.to_string()),
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        bouncer
    }

    /// `url` (a database of the cluster behind it) through this PgBouncer.
    pub fn url_for(&self, url: &str) -> String {
        let (_, database) = url.rsplit_once('/').expect("a database URL");
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its process id (`setpriv` execs PgBouncer, so the child's id is PgBouncer's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What PgBouncer logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The PgBouncer program: `$PGBOUNCER`, else Debian's.
///
/// # Panics
///
/// When neither is there.
pub fn program() -> PathBuf {
    std::env::var_os("PGBOUNCER")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .chain(["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"].map(PathBuf::from))
        .find(|p| p.is_file())
        .expect("pgbouncer is not installed (Debian's `pgbouncer` package; .ci/run installs it)")
}
