//! What a new cluster's data directory gets before the server's first start.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::tools::tools;

/// What [`PgCluster::start_with`](super::PgCluster::start_with) does to a new cluster's data directory before the server's
/// first start, in this order: fill it, append to `postgresql.conf`, replace `pg_hba.conf`,
/// write the files.
#[derive(Default)]
pub struct ClusterSetup {
    pub(super) populate: Option<Populate>,
    conf: Vec<String>,
    hba: Option<String>,
    files: Vec<SetupFile>,
}

type Populate = Box<dyn FnOnce(&Path) -> Result<(), String>>;

/// A file [`ClusterSetup::file`] writes into the data directory.
struct SetupFile {
    /// Relative to the data directory.
    name: PathBuf,
    contents: Vec<u8>,
    mode: u32,
}

impl ClusterSetup {
    /// Fills the data directory (given its path, which does not exist yet; its parent belongs
    /// to the server user) instead of copying the template into it: with `pg_basebackup`
    /// through [`server_command`](super::server_command), say. Its `postgresql.conf` must include the harness's
    /// per-cluster file, as one copied from another harness cluster does.
    pub fn populate(mut self, fill: impl FnOnce(&Path) -> Result<(), String> + 'static) -> Self {
        self.populate = Some(Box::new(fill));
        self
    }

    /// Appends `line` to `postgresql.conf`, after the harness's settings, so that it wins
    /// over them (and over the server's defaults, but not over `postgresql.auto.conf`). The
    /// port is the harness's: do not set it.
    pub fn conf(mut self, line: impl Into<String>) -> Self {
        self.conf.push(line.into());
        self
    }

    /// Replaces `pg_hba.conf` with `contents`. The harness's own commands (`create_database`)
    /// connect over TCP from 127.0.0.1 as `postgres` to the database `postgres`, without a
    /// password or a client certificate: some line must still let them in.
    pub fn hba(mut self, contents: impl Into<String>) -> Self {
        self.hba = Some(contents.into());
        self
    }

    /// Writes `contents` to `name` (relative to the data directory) with `mode`, owned by the
    /// server user: PostgreSQL demands that of its private key (`0o600`).
    pub fn file(
        mut self,
        name: impl Into<PathBuf>,
        contents: impl Into<Vec<u8>>,
        mode: u32,
    ) -> Self {
        self.files.push(SetupFile {
            name: name.into(),
            contents: contents.into(),
            mode,
        });
        self
    }
}

/// What a [`ClusterSetup`] writes into a filled data directory.
pub(crate) fn apply_setup(setup: &ClusterSetup, data_dir: &Path) {
    let tools = tools();
    let ClusterSetup {
        conf, hba, files, ..
    } = setup;
    if !conf.is_empty() {
        let path = data_dir.join("postgresql.conf");
        let mut lines = String::from("\n# ---- added by ClusterSetup::conf ----\n");
        for line in conf {
            lines.push_str(line);
            lines.push('\n');
        }
        fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(lines.as_bytes()))
            .unwrap_or_else(|e| panic!("cannot append to {}: {e}", path.display()));
    }
    if let Some(hba) = hba {
        let path = data_dir.join("pg_hba.conf");
        fs::write(&path, hba).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        tools.give_to_server_user(&path);
    }
    for file in files {
        use std::os::unix::fs::PermissionsExt;
        let path = data_dir.join(&file.name);
        fs::write(&path, &file.contents)
            .and_then(|()| fs::set_permissions(&path, fs::Permissions::from_mode(file.mode)))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        tools.give_to_server_user(&path);
    }
}
