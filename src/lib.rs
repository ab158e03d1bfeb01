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
//! The dependency rule, in one line (a module uses only modules to its left; the test
//! `tests/layout.rs` holds it):
//!
//! `reason ← domain, proto, defaults, connections ← storage ← error ← ledger ← observe ← grpc ← console ← server ← cli`
//!
//! - [`reason`]: every reason the server sends in an `ErrorInfo`, one enum (the wire names
//!   derived from the variants by `strum`), below everything that refuses a call.
//! - [`domain`]: keys (RFC 8785 canonical JSON, derivation, field validation), tenants, what
//!   of the arguments is kept for audit (redaction), and the entry state machine with the
//!   compare-and-set predicates the stores' statements implement. No tonic, no sqlx.
//! - [`proto`]: the generated `idempotency.v1` types and descriptors.
//! - [`defaults`]: every default setting, for the command line and the `Default` impls alike.
//! - [`connections`]: the client connections, bounded: the descriptor limit raised, a cap,
//!   idle connections closed, an accept loop that backs off when descriptors run out.
//! - [`storage`]: the one `Store` trait every consumer holds (`Arc<dyn Store>`), implemented
//!   once over a SQL dialect for the PostgreSQL and SQLite backends, and by the group commit,
//!   a store around a store that batches claims and completions; `sqlx::Error` never leaves
//!   it.
//! - [`error`]: the ledger's one error type, its reasons, messages and retry hints, without
//!   tonic (the transport's refusals and the mapping to gRPC statuses are [`grpc::error`]'s).
//! - [`ledger`]: the use cases, one file each (claim, complete, renew, lookup, list,
//!   reconcile, retention, and find: an entry by key, prefix or external reference), the
//!   notes, and the claims that wait for an attempt in flight.
//! - [`observe`]: what the server tells about itself: the Prometheus families on
//!   `prometheus-client`, the replay-rate alarm, the `/metrics` endpoint on axum, the
//!   logs (one span and one access line per RPC, W3C trace context), and the traces exported
//!   over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Below [`grpc`], which records into
//!   it; it knows the ledger's answers (to count them), not the service.
//! - [`grpc`]: the service, the proto ↔ domain conversions, deadlines, the one rewrite of
//!   tonic's own refusals, authentication and admission (load shedding, tenant rate limits),
//!   and the one mapping of errors to gRPC codes, reasons and details.
//! - [`console`]: the operator's console, server-rendered HTML over HTTP/1.1 (axum, its pages
//!   maud templates): what needs a person (unknown outcomes, resolvable there as Reconcile
//!   would), calls awaiting approval, the entries by filter or search, one entry whole, and the replay rate drawn per tool; sessions signed in
//!   with a tenant's token, CSRF tokens, escaping. It uses the ledger's use cases and the
//!   observe figures directly, and the credentials of [`grpc`]'s authentication.
//! - [`server`]: the settings, health and its store probe, reflection, graceful shutdown;
//!   every task it starts ends with it.
//! - [`cli`]: the command line: `serve`, `migrate`, and the operator's commands, gRPC clients
//!   of a running server (`entries`, `entry` by key, prefix or external reference, `resolve`,
//!   `renew`).
//! - `main.rs` uses any of them (the benchmark's client and its gRPC floor are the `bench`
//!   crate's, outside the service).

pub mod cli;
pub mod connections;
pub mod console;
pub mod defaults;
pub mod domain;
pub mod error;
pub mod grpc;
pub mod ledger;
pub mod observe;
pub mod proto;
pub mod reason;
pub mod server;
#[doc(hidden)]
pub mod storage;

/// The unit tests' allocator, which counts what each thread allocates.
#[cfg(test)]
mod counting_alloc;
