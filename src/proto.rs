//! The generated protobuf types and service traits of `idempotency.v1`, and the encoded
//! descriptors reflection serves. Generated at build time from `proto/` (by `protox`, no
//! `protoc` needed); the bottom of the crate's layers, beside [`crate::domain`]: the gRPC
//! service converts them, the metrics name the service's methods from them, and the inspection
//! commands call the service with them.

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("idempotency.v1");

/// The encoded descriptors of `ledger.proto` and its imports, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ledger_descriptor.bin"));

/// The descriptors of the `google.rpc` error details the ledger sends, so that reflective
/// clients (grpcurl) decode them.
pub const ERROR_DETAILS_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/error_details_descriptor.bin"));
