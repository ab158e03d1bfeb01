//! The idempotency ledger's benchmark tooling: how fast the server is, what it costs over the
//! SQL it runs and over gRPC itself, and whether it stays flat under hours of load.
//!
//! # Layout
//!
//! - [`load`]: the load generator (`ledger-bench`): N gRPC clients running one workload against
//!   a server or the floor, latencies in HDR histograms, CPU and memory from /proc.
//! - [`floor_pb`]: the floor's one RPC (`proto/bench/v1/floor.proto`), served by `ledger-floor`
//!   (src/bin/ledger-floor.rs) on the ledger server's own transport.
//! - [`compare`]: the comparison (`compare`): pgbench running the server's SQL, the floor and the
//!   server, cell by cell, on one throwaway PostgreSQL cluster, written to
//!   `bench/results/<base>.md`, `.json` and `.png`.
//! - [`soak`]: the soak (`soak`): ten minutes of mixed load on one store, sampling the server's
//!   memory, descriptors and database connections, written to `bench/results/soak.md` and
//!   `.json`.
//! - [`profile`]: instructions per RPC under callgrind (`profile`), by component, and CI's
//!   guard against their slow rise (`profile --check`).
//! - [`procs`]: the servers the drivers start (the ledger server, the floor) and stop.
//! - [`procfs`]: what /proc says of a process; [`host`]: of the machine, the commit, the time.
//!
//! The throwaway PostgreSQL clusters and PgBouncers are the tests' own (the `testkit` crate).
//! One direction: the drivers use `load`'s types, `procs` and `procfs`; `load` uses `procfs`.

pub mod compare;
pub mod host;
pub mod load;
pub mod procfs;
pub mod procs;
pub mod profile;
pub mod soak;

/// The floor's service (`proto/bench/v1/floor.proto`), compiled by build.rs.
#[allow(missing_docs, clippy::all)]
pub mod floor_pb {
    tonic::include_proto!("bench.v1");
}

use std::path::{Path, PathBuf};

/// The repository's root (this crate's parent directory): where `bench/pgbench/` and
/// `bench/results/` are found, and where `cargo build` runs.
pub fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}
