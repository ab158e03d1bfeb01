//! Every reason the server sends in a `google.rpc.ErrorInfo`, in one enum: the wire names are
//! spelled here and nowhere else. `docs/errors.md` lists exactly these and both clients' typed
//! errors catch only these (`tests/api/docs.rs` holds both). The lowest layer, so that the
//! domain's refusals, the codec and the error mapping all name the same values.
//!
//! [`Reason::face`] is the one error table: how an error of each reason is answered on each of
//! the server's faces, its gRPC code, the console's HTTP status and the retry hint. The gRPC
//! status (the server's `grpc::error`) and the console's error page both read it; the message a
//! person is shown is the error's own (`Display`), and what is not sent (the database's words)
//! is logged once, by `LedgerError::log_detail`.

use std::fmt;
use std::time::Duration;

/// A reason of the ledger's `ErrorInfo` (domain `idempotency.v1`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum Reason {
    /// A field is malformed (the `BadRequest` detail names it).
    InvalidField,
    /// `arguments_json` is not JSON.
    InvalidJson,
    /// A JSON object names a member twice.
    DuplicateMember,
    /// A JSON string holds an unpaired UTF-16 surrogate escape.
    LoneSurrogate,
    /// A JSON number is an integer beyond ±(2^53 − 1).
    UnsafeInteger,
    /// JSON nested deeper than the limit.
    JsonTooDeep,
    /// `arguments_json` is larger than the limit.
    ArgumentsTooLarge,
    /// `arguments_json` is not a JSON object.
    ArgumentsNotObject,
    /// A Complete's result or error is larger than the limit.
    ResultTooLarge,
    /// A ListEntries page token this server did not issue, or for other filters.
    InvalidPageToken,
    /// A request message that does not decode as its proto type.
    MalformedMessage,
    /// A message larger than the server accepts (tonic's own refusal, rewritten).
    MessageTooLarge,
    /// An explicit key came back with another tool or other arguments.
    KeyReusedWithDifferentRequest,
    /// The claim token is not the entry's current attempt.
    StaleClaimToken,
    /// Another outcome is already recorded.
    AlreadyResolved,
    /// The attempt's lease ended: it cannot be renewed.
    LeaseEnded,
    /// A Reconcile resolution without the attempt and the hold token it was about.
    UnfencedResolution,
    /// An acknowledgement of a possible double effect on an entry that carries no such mark.
    NotMarked,
    /// A decision about other arguments than the entry's (its fingerprint).
    ApprovalMismatch,
    /// The other decision was taken already.
    AlreadyDecided,
    /// A decision about an entry that awaits none (or whose request lapsed).
    NotAwaitingApproval,
    /// A credential without the approver role tried to decide.
    ApproverRoleRequired,
    /// No entry with this key for this tenant.
    EntryNotFound,
    /// A missing or wrong credential.
    Unauthenticated,
    /// The store cannot be reached (or the server is not ready).
    StoreUnavailable,
    /// No connection to the store (or its write lock) came free in time.
    StoreBusy,
    /// The store reported an I/O error.
    StoreIoError,
    /// The store's disk is full.
    StoreFull,
    /// The write met concurrent writes and was not committed after the server's retries.
    StoreContention,
    /// The store is read-only (a standby, a read-only file).
    StoreReadOnly,
    /// The store's data is damaged.
    StoreCorrupt,
    /// The store refuses for want of a setting or permission an operator must fix.
    StoreMisconfigured,
    /// The server sheds load (calls or bytes in flight).
    Overloaded,
    /// A tenant's rate limit.
    RateLimited,
    /// The call's deadline passed before an answer.
    DeadlineExceeded,
    /// A bug.
    Internal,
}

/// The gRPC status codes the ledger answers with, by their numbers in the gRPC specification
/// (this layer does not depend on tonic; the gRPC layer converts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum GrpcCode {
    /// 3.
    InvalidArgument = 3,
    /// 4.
    DeadlineExceeded = 4,
    /// 5.
    NotFound = 5,
    /// 7.
    PermissionDenied = 7,
    /// 8.
    ResourceExhausted = 8,
    /// 9.
    FailedPrecondition = 9,
    /// 13.
    Internal = 13,
    /// 14.
    Unavailable = 14,
    /// 15.
    DataLoss = 15,
    /// 16.
    Unauthenticated = 16,
}

impl GrpcCode {
    /// The code's name, as gRPC spells it (`FAILED_PRECONDITION`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            GrpcCode::InvalidArgument => "INVALID_ARGUMENT",
            GrpcCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            GrpcCode::NotFound => "NOT_FOUND",
            GrpcCode::PermissionDenied => "PERMISSION_DENIED",
            GrpcCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            GrpcCode::FailedPrecondition => "FAILED_PRECONDITION",
            GrpcCode::Internal => "INTERNAL",
            GrpcCode::Unavailable => "UNAVAILABLE",
            GrpcCode::DataLoss => "DATA_LOSS",
            GrpcCode::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

/// How an error of one reason is answered on each face of the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Face {
    /// The gRPC status code.
    pub grpc: GrpcCode,
    /// The console's HTTP status.
    pub http: u16,
    /// How long a caller should wait before retrying, when waiting helps (sent as
    /// `google.rpc.RetryInfo` and as `Retry-After`). A limit's refusal computes its own.
    pub retry_after: Option<Duration>,
}

/// A store that cannot answer now: retry after a second (a connection, a failover, a lock).
const STORE_RETRY: Option<Duration> = Some(Duration::from_secs(1));

impl Reason {
    /// The error table: how an error of this reason is answered on gRPC and in the console.
    #[must_use]
    pub const fn face(self) -> Face {
        use GrpcCode as G;
        use Reason as R;
        let (grpc, http, retry_after) = match self {
            R::InvalidField
            | R::InvalidJson
            | R::DuplicateMember
            | R::LoneSurrogate
            | R::UnsafeInteger
            | R::JsonTooDeep
            | R::ArgumentsTooLarge
            | R::ArgumentsNotObject
            | R::ResultTooLarge
            | R::InvalidPageToken
            | R::MalformedMessage
            | R::UnfencedResolution => (G::InvalidArgument, 400, None),
            R::MessageTooLarge => (G::ResourceExhausted, 413, None),
            R::KeyReusedWithDifferentRequest
            | R::StaleClaimToken
            | R::AlreadyResolved
            | R::LeaseEnded
            | R::NotMarked
            | R::ApprovalMismatch
            | R::AlreadyDecided
            | R::NotAwaitingApproval => (G::FailedPrecondition, 409, None),
            R::ApproverRoleRequired => (G::PermissionDenied, 403, None),
            R::EntryNotFound => (G::NotFound, 404, None),
            R::Unauthenticated => (G::Unauthenticated, 401, None),
            R::StoreUnavailable | R::StoreBusy | R::StoreIoError | R::StoreReadOnly => {
                (G::Unavailable, 503, STORE_RETRY)
            }
            // The conflicting writers are done within milliseconds.
            R::StoreContention => (G::Unavailable, 503, Some(Duration::from_millis(100))),
            R::StoreMisconfigured => (G::Unavailable, 503, None),
            // Space comes back when an operator acts; reads still answer meanwhile.
            R::StoreFull => (G::ResourceExhausted, 507, Some(Duration::from_secs(5))),
            R::StoreCorrupt => (G::DataLoss, 500, None),
            R::Overloaded | R::RateLimited => (G::ResourceExhausted, 429, None),
            R::DeadlineExceeded => (G::DeadlineExceeded, 504, None),
            R::Internal => (G::Internal, 500, None),
        };
        Face {
            grpc,
            http,
            retry_after,
        }
    }

    /// The name on the wire (`SCREAMING_SNAKE`, derived from the variant's name).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The reason named `text` on the wire, if the server sends it.
    #[must_use]
    pub fn from_wire(text: &str) -> Option<Reason> {
        text.parse().ok()
    }

    /// Every reason, in the order the enum declares them.
    pub fn all() -> impl Iterator<Item = Reason> {
        <Reason as strum::IntoEnumIterator>::iter()
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for Reason {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<Reason> for &str {
    fn eq(&self, other: &Reason) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<Reason> for String {
    fn eq(&self, other: &Reason) -> bool {
        self == other.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_listed_once_and_read_back_from_its_wire_name() {
        let mut seen = std::collections::BTreeSet::new();
        for reason in Reason::all() {
            let wire = reason.as_str();
            assert!(seen.insert(wire), "{wire} twice");
            assert!(
                wire.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
                "{wire}"
            );
            assert_eq!(Reason::from_wire(wire), Some(reason));
        }
        assert_eq!(Reason::from_wire("NOT_A_REASON"), None);
        assert_eq!(seen.len(), 36);
        assert_eq!(
            Reason::KeyReusedWithDifferentRequest.as_str(),
            "KEY_REUSED_WITH_DIFFERENT_REQUEST"
        );
        assert_eq!(Reason::StoreIoError.as_str(), "STORE_IO_ERROR");
    }
}
