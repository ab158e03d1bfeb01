//! # ledger-core
//!
//! The idempotency ledger's rules, without a transport or a database: what a key is, how an
//! entry moves between its states, and the use cases (claim, complete, renew, lookup, list,
//! reconcile, approvals, retention) over the one [`storage::Store`] trait. The stores
//! (`ledger-stores`: PostgreSQL, SQLite, group commit) implement that trait; the server
//! (`idempotency-ledger`: gRPC, the console, the command line) calls the use cases. This crate's
//! manifest has neither tonic, hyper nor sqlx, so neither layer above can be imported here: an
//! arrow up does not compile.
//!
//! # Layout
//!
//! A module uses only modules to its left (the test `tests/layout.rs` holds it within each
//! crate; cargo holds it between crates):
//!
//! `reason ← domain, defaults ← storage ← error ← ledger`
//!
//! - [`reason`]: every reason the server sends in an `ErrorInfo`, one enum, below everything
//!   that refuses a call.
//! - [`domain`]: keys (RFC 8785 canonical JSON, derivation, field validation), tenants, what
//!   of the arguments is kept for audit (redaction), and the entry state machine with the
//!   compare-and-set predicates the stores' statements implement.
//! - [`defaults`]: every default setting, for the command line and the `Default` impls alike.
//! - [`storage`]: the one `Store` trait, what its methods take and answer, and `StoreError`.
//! - [`error`]: the ledger's one error type, its reasons, messages and retry hints.
//! - [`ledger`]: the use cases, one file each, the notes, and the claims that wait for an
//!   attempt in flight.

/// The `tracing` target of the spans that are exported as traces and never logged (the
/// server's observe layer exports them; the use cases and the stores write them too).
pub const TRACE_TARGET: &str = "idempotency_ledger::otel";

pub mod defaults;
pub mod domain;
pub mod error;
pub mod ledger;
pub mod reason;
pub mod storage;

/// The unit tests' allocator, which counts what each thread allocates.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: testkit::counting_alloc::Counting = testkit::counting_alloc::Counting;

#[cfg(test)]
use testkit::counting_alloc;
