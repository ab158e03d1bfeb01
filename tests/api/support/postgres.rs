//! Throwaway PostgreSQL clusters for the integration tests: the workspace's `testkit` crate
//! (testkit/src/postgres/), which the benchmark (bench/) starts its clusters with too.

pub use testkit::postgres::*;
