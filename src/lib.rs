//! # idempotency-ledger
//!
//! A gRPC service that lets an AI agent's side-effecting tool call happen once: the runtime
//! **claims** a key before acting, **completes** it with the result, and a repeat of the same
//! intent gets the stored result back with an honest "already done" note. `docs/behaviour.md`
//! is the reference for that behaviour; the README and the guides under `docs/` (indexed by
//! `docs/README.md`) are the user's.
//!
//! # Layout
//!
//! The service is three crates along its floors; cargo holds the arrows between them, since a
//! crate imports only what its manifest names:
//!
//! - `ledger-core` (`crates/core`): the domain (keys, canonical JSON, tenants, redaction, the
//!   entry state machine), every error reason, the default settings, the one `Store` trait and
//!   the use cases (claim, complete, renew, lookup, list, reconcile, approvals, retention), with
//!   neither tonic, hyper nor sqlx in its manifest. Re-exported here as [`reason`], [`domain`],
//!   [`defaults`], [`error`] and [`ledger`].
//! - `ledger-stores` (`crates/stores`): PostgreSQL and SQLite over sqlx, written once over a SQL
//!   dialect, and the group commit, a store around a store; re-exported here with the core's
//!   store trait as [`storage`]. `sqlx::Error` never leaves it.
//! - this crate, the server: its modules, each using only those to its left (the test
//!   `tests/layout.rs` holds it):
//!
//! `proto, connections ← observe, credentials ← grpc ← console ← server ← mcp ← cli`
//!
//! - [`proto`]: the generated `idempotency.v1` types and descriptors.
//! - [`connections`]: the client connections, bounded: the descriptor limit raised, a cap,
//!   idle connections closed, an accept loop that backs off when descriptors run out.
//! - [`observe`]: what the server tells about itself: the Prometheus families on
//!   `prometheus-client`, the replay-rate alarm, the `/metrics` endpoint on axum, the
//!   logs (one span and one access line per RPC, W3C trace context), and the traces exported
//!   over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Below [`grpc`], which records into
//!   it; it knows the ledger's answers (to count them), not the service.
//! - [`credentials`]: the tokens file, its tenants and roles, and the check of a bearer
//!   token, which the gRPC face, the console's sign-in and the gateway's edge all use.
//! - [`grpc`]: the service, the proto ↔ domain conversions, deadlines, the one rewrite of
//!   tonic's own refusals, authentication and admission (load shedding, tenant rate limits),
//!   and the mapping of the core's error table to gRPC codes, reasons and details.
//! - [`console`]: the operator's console, server-rendered HTML over HTTP/1.1 (axum, its pages
//!   maud templates): what needs a person (unknown outcomes, resolvable there as Reconcile
//!   would), calls awaiting approval, the entries by filter or search, one entry whole, and
//!   the replay rate drawn per tool; sessions signed in with a tenant's token, CSRF tokens,
//!   escaping. It uses the ledger's use cases and the observe figures directly, and the
//!   [`credentials`] the gRPC face checks too.
//! - [`server`]: the settings, health and its store probe, reflection, graceful shutdown;
//!   every task it starts ends with it. One public way to run it: [`server::run`].
//! - [`mcp`]: the MCP gateway (`idempotency-ledger mcp`): the ledger between an MCP client and
//!   an MCP server, so that each side-effecting tool call acts once per intent with neither
//!   changed; it runs the ledger's use cases in process (its own store, or a database it
//!   shares with servers).
//! - [`cli`]: the command line: `serve`, `migrate`, and the operator's commands, gRPC clients
//!   of a running server.
//! - `main.rs` uses any of them (the benchmark's client and its gRPC floor are the `bench`
//!   crate's, outside the service).

pub mod cli;
pub mod connections;
pub mod console;
pub mod credentials;
pub mod grpc;
pub mod mcp;
pub mod observe;
pub mod proto;
pub mod server;

pub use ledger_core::{defaults, domain, error, ledger, reason};

/// The stores: the core's `Store` trait and what it takes and answers, and the
/// `ledger-stores` crate's backends and group commit, under one name.
#[doc(hidden)]
pub mod storage {
    pub use ledger_stores::*;
}

/// The unit tests' allocator, which counts what each thread allocates.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: testkit::counting_alloc::Counting = testkit::counting_alloc::Counting;

#[cfg(test)]
use testkit::counting_alloc;
