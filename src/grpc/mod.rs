//! The gRPC face of the ledger: the generated `idempotency.v1` types ([`pb`]), the
//! `LedgerService` implementation (`service`, [`LedgerApi`]), the requests parsed into the use
//! cases' typed inputs (`inputs`), the other proto ↔ domain conversions (`convert`), deadlines
//! ([`deadline`]), the rewrite of tonic's own refusals into the ledger's answers
//! ([`TransportRefusals`]), authentication ([`auth`]) and admission ([`admission`]). Each RPC
//! parses its request, runs the use case on the call's own task, bounded by the call's
//! deadline, and converts the answer back. The use case runs to its end even when the call
//! does not: a call abandoned before its work ended (the deadline passed, or the caller went
//! away) hands the rest of the work to a task of its own, so a write is never dropped halfway
//! ([`deadline`]). The one mapping of errors to gRPC statuses is [`error`].

pub mod admission;
pub mod auth;
mod convert;
pub mod deadline;
pub mod error;
mod inputs;
mod service;
mod transport_refusals;

pub use pb::ledger_service_server::{LedgerService, LedgerServiceServer};
pub use service::LedgerApi;
pub use transport_refusals::TransportRefusals;

/// The generated protobuf types and service traits of `idempotency.v1` ([`crate::proto`]).
pub use crate::proto as pb;
