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

/// The `ErrorInfo` domain of every error the ledger sends: its proto package.
pub const ERROR_DOMAIN: &str = "idempotency.v1";

/// The canonical name of a gRPC code, as the gRPC documentation writes it (for logs, metrics
/// labels and the inspection commands).
pub fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The codec of the ledger's messages: prost's, except that a request that does not decode
/// (a string field that is not UTF-8, a field of the wrong wire type) is answered as bad input
/// is, `INVALID_ARGUMENT` with the reason `MALFORMED_MESSAGE`, where tonic answers `INTERNAL`
/// without a reason. The generated service and client use it (`build.rs`, `codec_path`), so
/// the decision is made where the bytes are decoded, not by reading tonic's error text later.
pub mod codec {
    use std::marker::PhantomData;

    use prost::Message;
    use tonic::Status;
    use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
    use tonic_prost::{ProstDecoder, ProstEncoder};

    /// [`tonic_prost::ProstCodec`] with [`LedgerDecoder`] as its decoder.
    #[derive(Debug, Clone, Copy)]
    pub struct LedgerCodec<T, U>(PhantomData<(T, U)>);

    impl<T, U> Default for LedgerCodec<T, U> {
        fn default() -> Self {
            LedgerCodec(PhantomData)
        }
    }

    impl<T, U> Codec for LedgerCodec<T, U>
    where
        T: Message + Send + 'static,
        U: Message + Default + Send + 'static,
    {
        type Encode = T;
        type Decode = U;
        type Encoder = ProstEncoder<T>;
        type Decoder = LedgerDecoder<U>;

        fn encoder(&mut self) -> Self::Encoder {
            ProstEncoder::new(BufferSettings::default())
        }

        fn decoder(&mut self) -> Self::Decoder {
            LedgerDecoder(ProstDecoder::new(BufferSettings::default()))
        }
    }

    /// Decodes as prost does, and refuses what does not decode as malformed input.
    #[derive(Debug)]
    pub struct LedgerDecoder<U>(ProstDecoder<U>);

    impl<U: Message + Default> Decoder for LedgerDecoder<U> {
        type Item = U;
        type Error = Status;

        fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
            U::decode(buf).map(Some).map_err(|_| malformed())
        }

        fn buffer_settings(&self) -> BufferSettings {
            self.0.buffer_settings()
        }
    }

    /// The answer to a message that does not decode. prost's own words (which field, which
    /// wire type) are left out: they describe bytes the caller sent, not a fix.
    pub fn malformed() -> Status {
        let mut details = tonic_types::ErrorDetails::new();
        details.set_error_info(
            crate::reason::Reason::MalformedMessage.as_str(),
            super::ERROR_DOMAIN,
            std::collections::HashMap::new(),
        );
        <Status as tonic_types::StatusExt>::with_error_details(
            tonic::Code::from(crate::reason::Reason::MalformedMessage.face().grpc as i32),
            "the request is not a valid protobuf message of this method (a string field that \
             is not UTF-8, or a field of the wrong type)",
            details,
        )
    }
}
