//! PgBouncer in front of the test cluster: the workspace's `testkit` crate
//! (testkit/src/pgbouncer.rs), which the benchmark (bench/) starts its poolers with too.

pub use testkit::pgbouncer::*;
