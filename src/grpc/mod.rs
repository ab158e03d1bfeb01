//! The gRPC face of the ledger: the generated `idempotency.v1` types ([`pb`]), the
//! `LedgerService` implementation ([`service`]), the proto ↔ domain conversions
//! ([`convert`]), deadlines ([`deadline`]), the rewrite of tonic's own refusals into the
//! ledger's answers ([`library_errors`]), authentication ([`auth`]) and admission
//! ([`admission`]). Each RPC converts its request, runs the use case to completion in its own
//! task (so a cancelled call never abandons a write halfway), bounded by the call's deadline,
//! and converts the answer back; the one mapping of errors to gRPC statuses is
//! [`crate::error`].

pub mod admission;
pub mod auth;
mod convert;
pub mod deadline;
mod library_errors;
mod service;

pub use library_errors::LibraryErrors;
pub use pb::ledger_service_server::{LedgerService, LedgerServiceServer};
pub use service::LedgerApi;

/// The generated protobuf types and service traits of `idempotency.v1` ([`crate::proto`]).
pub use crate::proto as pb;
