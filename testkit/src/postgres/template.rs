//! The `initdb`'d template every cluster copies: made once per machine (PostgreSQL version
//! and user) and cached in the system temp dir.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use super::tools::{describe, run, tools};
use super::watchdog::Watchdog;
use super::{CLUSTER_CONF, TEMPLATE_CONF, TEMPLATE_FORMAT};

/// The initdb'd template every cluster copies, built on first use by any test process.
pub(crate) fn template_dir() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let tools = tools();
        // Keyed by version (a data dir only works with its major version, and binaries
        // can be upgraded under a cached template) and by uid (the files belong to it).
        let name = format!(
            "pgharness-template-v{TEMPLATE_FORMAT}-pg{}-uid{}",
            tools.version, tools.euid
        );
        let path = std::env::temp_dir().join(&name);
        // The template only ever appears by an atomic rename of a finished one, so its
        // existence proves it is complete.
        if is_template(&path) {
            return path;
        }
        // Concurrent test processes (nextest) would otherwise all run initdb at once,
        // each taking a CPU-second, only for all but one to throw the result away. The
        // lock only saves work: correctness rests on the atomic rename below, which also
        // lets the check above skip the lock.
        let lock_path = std::env::temp_dir().join(format!("{name}.lock"));
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .and_then(|file| file.lock().map(|()| file));
        if is_template(&path) {
            return path;
        }
        if path.exists() {
            // Left incomplete by a /tmp cleaner that ages files out (systemd-tmpfiles
            // does): every start would fail. Moved aside first because a directory can
            // only be renamed onto an empty one.
            let trash = std::env::temp_dir().join(format!(
                ".pgharness-broken-template-{}-{}",
                std::process::id(),
                unique_suffix()
            ));
            if !is_template(&path) && fs::rename(&path, &trash).is_ok() {
                let _ = fs::remove_dir_all(&trash);
            }
        }
        let staging = tempfile::Builder::new()
            .prefix(".pgharness-initdb-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temp dir for initdb: {e}"));
        tools.give_to_server_user(staging.path());
        // initdb writes ~40 MB that a test killed meanwhile would leave behind.
        let watchdog = Watchdog::arm(staging.path());
        let data = staging.path().join("data");
        let out = run(
            tools.server_command("initdb").arg("-D").arg(&data).args([
                "-U",
                "postgres",
                // trust for local sockets and 127.0.0.1/::1, so no passwords anywhere
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ]),
            "initdb",
        );
        if !out.status.success() {
            panic!("initdb into {} failed:\n{}", data.display(), describe(&out));
        }
        let conf_path = data.join("postgresql.conf");
        fs::OpenOptions::new()
            .append(true)
            .open(&conf_path)
            .and_then(|mut conf| conf.write_all(TEMPLATE_CONF.as_bytes()))
            .unwrap_or_else(|e| panic!("cannot append to {}: {e}", conf_path.display()));
        match fs::rename(&data, &path) {
            Ok(()) => {}
            // Another process finished first; its template is as good as ours, which
            // `staging` now deletes.
            Err(_) if is_template(&path) => {}
            Err(e) => panic!(
                "cannot move the new PostgreSQL template from {} to {}: {e}",
                data.display(),
                path.display()
            ),
        }
        drop(lock);
        watchdog.disarm();
        path
    })
}

fn is_template(path: &Path) -> bool {
    ["PG_VERSION", "global/pg_control", "base/1/PG_VERSION"]
        .iter()
        .all(|file| path.join(file).is_file())
        && fs::read_to_string(path.join("postgresql.conf"))
            .is_ok_and(|conf| conf.contains(CLUSTER_CONF))
}

/// Wall-clock nanoseconds, truncated to keep names short (well under PostgreSQL's
/// 63-byte identifier limit).
pub(crate) fn unique_suffix() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() % 1_000_000_000_000)
        .unwrap_or(0)
}

/// Copies a data directory: files, directories with their modes (the server insists on
/// 0700), symlinks, and, when we are root, ownership by the server user.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let tools = tools();
    fs::create_dir(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&src)?, &dst)?;
        } else {
            // Copies the mode too.
            fs::copy(&src, &dst)?;
        }
        if !kind.is_symlink() {
            tools.give_to_server_user(&dst);
        }
    }
    fs::set_permissions(to, fs::metadata(from)?.permissions())?;
    tools.give_to_server_user(to);
    Ok(())
}
