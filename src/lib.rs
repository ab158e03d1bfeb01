//! # idempotency-ledger
//!
//! A gRPC service that lets an AI agent's side-effecting tool call happen once: the runtime
//! **claims** a key before acting, **completes** it with the result, and a repeat of the same
//! intent gets the stored result back with an honest "already done" note. `docs/behaviour.md`
//! is the reference for that behaviour; the README is the user's guide.
//!
//! # Layout
//! - [`domain`]: keys (RFC 8785 canonical JSON, derivation, field validation), what of the
//!   arguments is kept for audit (redaction), and the entry state machine. No tonic, no sqlx:
//!   unit-tested on its own.
//! - [`storage`]: the [`storage::Store`] trait and its PostgreSQL and SQLite implementations;
//!   `sqlx::Error` never leaves it.
//! - [`ledger`]: the use cases (Claim, Complete, Lookup, Reconcile, ListEntries) driving the
//!   domain over a store.
//! - [`grpc`]: the generated `idempotency.v1` types and the service, converting proto ↔ domain.
//! - [`error`]: the one error type and the one mapping to gRPC codes and details.
//! - [`admission`]: load shedding and per-tenant rate limits.
//! - [`auth`]: bearer tokens to tenants, as an interceptor on the ledger service.
//! - [`server`]: health, reflection, the readiness probe, graceful shutdown.
//! - [`connections`]: the client connections, bounded: the descriptor limit raised, a cap,
//!   idle connections closed, an accept loop that backs off when descriptors run out.
//! - [`wait`]: waking claims that wait for an attempt in flight, in-process and across
//!   servers.
//! - [`observe`]: what the server tells about itself: the Prometheus families on
//!   `prometheus-client` (the gRPC layer, the ledger's counters, gauges read from the store),
//!   the replay-rate alarm, the optional `/metrics` endpoint, and the logs (text or JSON, one
//!   span and one access line per RPC, W3C trace context).
//! - [`config`]: the command line; every flag has an environment variable.
//! - [`inspect`]: the `entries` and `entry` subcommands, a gRPC client that prints what a
//!   running server holds.

pub mod cli;
pub mod connections;
pub mod defaults;
pub mod domain;
pub mod error;
pub mod grpc;
pub mod ledger;
pub mod observe;
pub mod proto;
pub mod server;
#[doc(hidden)]
pub mod splitmix;
pub mod storage;
