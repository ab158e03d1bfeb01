//! The fault proxy between a test's servers and PostgreSQL: the workspace's `testkit` crate
//! (testkit/src/proxy/).

pub use testkit::proxy::*;
