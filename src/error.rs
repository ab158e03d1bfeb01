//! The one error type of the ledger and the one place that turns it into a gRPC status: a code,
//! a `google.rpc.ErrorInfo` (domain `idempotency.v1`, a SCREAMING_SNAKE reason) and, for a bad
//! field, a `google.rpc.BadRequest` naming it. Internal details (SQL, paths) are logged here and
//! never sent.

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::domain::canonical::CanonicalError;
use crate::domain::key::InvalidField;
use crate::storage::StoreError;

/// The `ErrorInfo` domain of every error the ledger sends.
pub const ERROR_DOMAIN: &str = crate::proto::ERROR_DOMAIN;

/// The reason of every `UNAVAILABLE` for want of a reachable store (and before migrations
/// ran), spelled once.
pub const STORE_UNAVAILABLE: &str = "STORE_UNAVAILABLE";

/// The reason of an `UNAVAILABLE` because the store was busy: no connection (on SQLite: or
/// its write lock) came free within `--db-acquire-timeout`.
pub const STORE_BUSY: &str = "STORE_BUSY";

/// How long a client should wait before retrying when the store is unavailable.
const UNAVAILABLE_RETRY_DELAY: Duration = Duration::from_secs(1);

/// What the caller is told when the store cannot be reached (or the server is not ready).
const UNAVAILABLE_MESSAGE: &str = "the ledger's database is unavailable; retry later";

/// The retry hint after contention: the conflicting writers are done within milliseconds.
const CONTENTION_RETRY_DELAY: Duration = Duration::from_millis(100);

/// The retry hint while the disk is full: space comes back when an operator acts.
const FULL_RETRY_DELAY: Duration = Duration::from_secs(5);

/// At most one log line per kind of store failure this often.
const STORE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Everything that can go wrong in a ledger call.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Malformed input: the field it concerns, a stable reason and a message that names the
    /// problem.
    #[error("{field}: {message}")]
    InvalidArgument {
        /// The request field at fault, as named in the proto.
        field: &'static str,
        /// A SCREAMING_SNAKE reason, such as `DUPLICATE_MEMBER`.
        reason: &'static str,
        /// What is wrong, for a person.
        message: String,
    },
    /// An explicit key came back with a different tool or arguments.
    #[error(
        "key was already used for a different request (another tool or other arguments); \
         a reused key is refused, never replayed"
    )]
    KeyReused,
    /// The claim token is not the current attempt's.
    #[error(
        "claim_token is not the current claim of this entry (a newer attempt holds it, or the \
         token is wrong)"
    )]
    StaleClaimToken,
    /// A different outcome is already recorded.
    #[error("the entry is already resolved as {0} with a different outcome; nothing changed")]
    AlreadyResolved(&'static str),
    /// No such entry for this tenant (absent, expired, or another tenant's: indistinguishable).
    #[error("no entry with this key")]
    NotFound,
    /// A missing or wrong credential.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// The server cannot serve yet (migrations have not run); the detail is logged, not sent.
    /// The same reason and message as a store that cannot be reached.
    #[error("{}", UNAVAILABLE_MESSAGE)]
    Unavailable(String),
    /// The store failed for a cause it could name (see [`StoreError`]): each cause has its own
    /// code, reason and message; the database's words are logged, not sent.
    #[error("{}", store_message(.0))]
    Store(StoreError),
    /// The attempt's lease ended (or the entry is resolved): it cannot be renewed.
    #[error(
        "the attempt's lease has already ended (the entry is {0}); it cannot be renewed: a \
         reconciler may be asking the outside world about it"
    )]
    LeaseEnded(&'static str),
    /// A limit was reached (load shedding, a tenant's rate); retry after `retry_after`.
    #[error("{message}")]
    ResourceExhausted {
        /// `OVERLOADED` or `RATE_LIMITED`.
        reason: &'static str,
        /// What was reached, for a person.
        message: String,
        /// When a retry is worthwhile.
        retry_after: Duration,
    },
    /// The call's deadline passed before an answer.
    #[error("the call's deadline passed before the ledger could answer")]
    DeadlineExceeded,
    /// A bug or an operator problem; the detail is logged, not sent.
    #[error("internal error")]
    Internal(String),
}

impl LedgerError {
    /// A bad-field error with the generic reason `INVALID_FIELD`.
    pub fn invalid(field: &'static str, message: impl Into<String>) -> LedgerError {
        LedgerError::InvalidArgument {
            field,
            reason: "INVALID_FIELD",
            message: message.into(),
        }
    }

    /// The reason sent in `ErrorInfo`.
    pub fn reason(&self) -> &'static str {
        match self {
            LedgerError::InvalidArgument { reason, .. } => reason,
            LedgerError::KeyReused => "KEY_REUSED_WITH_DIFFERENT_REQUEST",
            LedgerError::StaleClaimToken => "STALE_CLAIM_TOKEN",
            LedgerError::AlreadyResolved(_) => "ALREADY_RESOLVED",
            LedgerError::NotFound => "ENTRY_NOT_FOUND",
            LedgerError::Unauthenticated(_) => "UNAUTHENTICATED",
            LedgerError::Unavailable(_) => STORE_UNAVAILABLE,
            LedgerError::Store(e) => match e {
                StoreError::Unavailable(_) | StoreError::Unreachable(_) => STORE_UNAVAILABLE,
                StoreError::Busy(_) => STORE_BUSY,
                StoreError::Io(_) => "STORE_IO_ERROR",
                StoreError::Full(_) => "STORE_FULL",
                StoreError::Contention(_) => "STORE_CONTENTION",
                StoreError::ReadOnly(_) => "STORE_READ_ONLY",
                StoreError::Corrupt(_) => "STORE_CORRUPT",
                StoreError::Misconfigured(_) => "STORE_MISCONFIGURED",
                StoreError::Internal(_) => "INTERNAL",
            },
            LedgerError::LeaseEnded(_) => "LEASE_ENDED",
            LedgerError::ResourceExhausted { reason, .. } => reason,
            LedgerError::DeadlineExceeded => "DEADLINE_EXCEEDED",
            LedgerError::Internal(_) => "INTERNAL",
        }
    }

    /// The gRPC code this error is sent with.
    pub fn code(&self) -> Code {
        match self {
            LedgerError::InvalidArgument { .. } => Code::InvalidArgument,
            LedgerError::KeyReused
            | LedgerError::StaleClaimToken
            | LedgerError::AlreadyResolved(_)
            | LedgerError::LeaseEnded(_) => Code::FailedPrecondition,
            LedgerError::NotFound => Code::NotFound,
            LedgerError::Unauthenticated(_) => Code::Unauthenticated,
            LedgerError::Unavailable(_) => Code::Unavailable,
            LedgerError::Store(e) => match e {
                StoreError::Unavailable(_)
                | StoreError::Unreachable(_)
                | StoreError::Busy(_)
                | StoreError::Io(_)
                | StoreError::Contention(_)
                | StoreError::ReadOnly(_)
                | StoreError::Misconfigured(_) => Code::Unavailable,
                StoreError::Full(_) => Code::ResourceExhausted,
                StoreError::Corrupt(_) => Code::DataLoss,
                StoreError::Internal(_) => Code::Internal,
            },
            LedgerError::ResourceExhausted { .. } => Code::ResourceExhausted,
            LedgerError::DeadlineExceeded => Code::DeadlineExceeded,
            LedgerError::Internal(_) => Code::Internal,
        }
    }
}

impl From<StoreError> for LedgerError {
    fn from(e: StoreError) -> LedgerError {
        LedgerError::Store(e)
    }
}

/// What the caller is told of a store failure: what happened to its write and what to do.
fn store_message(e: &StoreError) -> &'static str {
    match e {
        StoreError::Unavailable(_) | StoreError::Unreachable(_) => UNAVAILABLE_MESSAGE,
        StoreError::Busy(_) => {
            "the ledger's database is busy: no connection to it (or its lock) came free in \
             time; nothing was committed; retry later"
        }
        StoreError::Io(_) => {
            "the ledger's database reported an I/O error; the write was not committed; retry \
             later"
        }
        StoreError::Full(_) => {
            "the ledger's database is out of disk space; the write was not committed; reads \
             still answer, and writes resume once its operator frees space"
        }
        StoreError::Contention(_) => {
            "the write met concurrent writes (a deadlock or a serialization failure) and was \
             not committed after the server's own retries; retry"
        }
        StoreError::ReadOnly(_) => {
            "the ledger's database accepts no writes right now (a standby during a failover, \
             or a read-only file); the write was not committed; retry later"
        }
        StoreError::Corrupt(_) => {
            "the ledger's database reports corrupt files; an operator must restore it"
        }
        StoreError::Misconfigured(_) => {
            "the ledger's server is misconfigured for its database; its log says how"
        }
        StoreError::Internal(_) => "internal error",
    }
}

/// How long a client should wait before retrying after a store failure, when waiting helps.
fn store_retry_delay(e: &StoreError) -> Option<Duration> {
    match e {
        StoreError::Unavailable(_)
        | StoreError::Unreachable(_)
        | StoreError::Busy(_)
        | StoreError::Io(_)
        | StoreError::ReadOnly(_) => Some(UNAVAILABLE_RETRY_DELAY),
        StoreError::Contention(_) => Some(CONTENTION_RETRY_DELAY),
        StoreError::Full(_) => Some(FULL_RETRY_DELAY),
        StoreError::Corrupt(_) | StoreError::Misconfigured(_) | StoreError::Internal(_) => None,
    }
}

/// Logs a store failure with the database's own words: the first of each kind at once, then at
/// most one line per kind every [`STORE_LOG_EVERY`] with the number left out meanwhile, so a
/// full disk under load does not flood the log.
fn log_store_error(e: &StoreError) {
    use std::sync::Mutex;
    use std::time::Instant;
    static LAST: Mutex<[(Option<Instant>, u64); StoreError::KINDS.len()]> =
        Mutex::new([(None, 0); StoreError::KINDS.len()]);
    let kind = e.kind();
    let i = StoreError::KINDS
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(0);
    let suppressed = {
        let mut last = LAST
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (at, skipped) = &mut last[i];
        if at.is_some_and(|t| t.elapsed() < STORE_LOG_EVERY) {
            *skipped += 1;
            return;
        }
        *at = Some(Instant::now());
        std::mem::take(skipped)
    };
    match e {
        StoreError::Internal(detail) => {
            tracing::error!(error = %detail, suppressed, "internal store error");
        }
        StoreError::Corrupt(detail) => {
            tracing::error!(error = %detail, suppressed, "the store reports corrupt files");
        }
        StoreError::Misconfigured(detail) => {
            tracing::error!(error = %detail, suppressed, "the server is misconfigured for its store");
        }
        StoreError::Full(detail) => {
            tracing::warn!(error = %detail, suppressed, "write refused: the store is out of disk space");
        }
        StoreError::Io(detail) => {
            tracing::warn!(error = %detail, suppressed, "write failed: the store reported an I/O error");
        }
        StoreError::Contention(detail) => {
            tracing::warn!(error = %detail, suppressed, "write failed: contention outlasted the retries");
        }
        StoreError::ReadOnly(detail) => {
            tracing::warn!(error = %detail, suppressed, "write refused: the store is read-only");
        }
        StoreError::Unavailable(detail) | StoreError::Unreachable(detail) => {
            tracing::warn!(error = %detail, suppressed, "store unavailable");
        }
        StoreError::Busy(detail) => {
            tracing::warn!(
                error = %detail,
                suppressed,
                "store busy, not unreachable: a call waited past --db-acquire-timeout for a \
                 connection (or SQLite's write lock)"
            );
        }
    }
}

impl From<InvalidField> for LedgerError {
    fn from(e: InvalidField) -> LedgerError {
        LedgerError::invalid(e.field, e.message)
    }
}

impl LedgerError {
    /// A canonicalization refusal of `field` (`arguments_json`).
    pub fn from_canonical(field: &'static str, e: CanonicalError) -> LedgerError {
        LedgerError::InvalidArgument {
            field,
            reason: e.reason(),
            message: e.to_string(),
        }
    }
}

impl From<LedgerError> for Status {
    fn from(err: LedgerError) -> Status {
        let mut details = ErrorDetails::new();
        details.set_error_info(err.reason(), ERROR_DOMAIN, std::collections::HashMap::new());
        match &err {
            LedgerError::InvalidArgument { field, message, .. } => {
                details.add_bad_request_violation(*field, message.clone());
            }
            LedgerError::Unavailable(detail) => {
                tracing::debug!(error = %detail, "not serving yet");
                details.set_retry_info(Some(UNAVAILABLE_RETRY_DELAY));
            }
            LedgerError::Store(e) => {
                log_store_error(e);
                if let Some(delay) = store_retry_delay(e) {
                    details.set_retry_info(Some(delay));
                }
            }
            LedgerError::ResourceExhausted { retry_after, .. } => {
                details.set_retry_info(Some(*retry_after));
            }
            LedgerError::Internal(detail) => {
                tracing::error!(error = %detail, "internal error");
            }
            _ => {}
        }
        Status::with_error_details(err.code(), err.to_string(), details)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_details_are_never_sent() {
        let status = Status::from(LedgerError::Internal(
            "relation ledger_entries does not exist at /var/lib/x".into(),
        ));
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("ledger_entries"));
        assert!(!status.message().contains("/var/lib"));
        let unavailable = Status::from(LedgerError::Unavailable(
            "connection refused 10.0.0.1".into(),
        ));
        assert!(!unavailable.message().contains("10.0.0.1"));
        assert!(unavailable.get_details_retry_info().is_some());
    }

    /// The server recognises tonic's own size refusal by its code (grpc::library_errors):
    /// no answer of the ledger's may share it.
    #[test]
    fn the_ledger_never_answers_out_of_range() {
        let store = |e: fn(String) -> StoreError| LedgerError::Store(e(String::new()));
        let every = [
            LedgerError::invalid("tool", "x"),
            LedgerError::KeyReused,
            LedgerError::StaleClaimToken,
            LedgerError::AlreadyResolved("SUCCEEDED"),
            LedgerError::NotFound,
            LedgerError::Unauthenticated("x"),
            LedgerError::Unavailable(String::new()),
            store(StoreError::Unavailable),
            store(StoreError::Unreachable),
            store(StoreError::Busy),
            store(StoreError::Io),
            store(StoreError::Full),
            store(StoreError::Contention),
            store(StoreError::ReadOnly),
            store(StoreError::Corrupt),
            store(StoreError::Misconfigured),
            store(StoreError::Internal),
            LedgerError::LeaseEnded("UNKNOWN"),
            LedgerError::ResourceExhausted {
                reason: "OVERLOADED",
                message: String::new(),
                retry_after: Duration::ZERO,
            },
            LedgerError::DeadlineExceeded,
            LedgerError::Internal(String::new()),
        ];
        for e in every {
            assert_ne!(e.code(), Code::OutOfRange, "{e:?}");
        }
    }

    /// One spelling of each reason; busy and unreachable both carry a retry delay.
    #[test]
    fn a_busy_store_has_a_reason_of_its_own_and_an_unreachable_one_the_same_as_unavailable() {
        let busy = Status::from(LedgerError::Store(StoreError::Busy("all 16 in use".into())));
        assert_eq!(busy.code(), Code::Unavailable);
        assert_eq!(
            busy.get_details_error_info().expect("info").reason,
            STORE_BUSY
        );
        assert!(busy.get_details_retry_info().is_some());
        assert!(!busy.message().contains("16"), "{}", busy.message());
        for unavailable in [
            LedgerError::Store(StoreError::Unreachable("refused".into())),
            LedgerError::Store(StoreError::Unavailable("reset".into())),
            LedgerError::Unavailable("migrations have not run yet".into()),
        ] {
            let status = Status::from(unavailable);
            assert_eq!(status.code(), Code::Unavailable);
            let info = status.get_details_error_info().expect("info");
            assert_eq!(info.reason, STORE_UNAVAILABLE);
            assert_eq!(status.message(), UNAVAILABLE_MESSAGE);
            assert!(status.get_details_retry_info().is_some());
        }
    }

    #[test]
    fn a_bad_field_carries_error_info_and_bad_request() {
        let status = Status::from(LedgerError::invalid("tool", "must not be empty"));
        assert_eq!(status.code(), Code::InvalidArgument);
        let info = status.get_details_error_info().expect("error info");
        assert_eq!(info.reason, "INVALID_FIELD");
        assert_eq!(info.domain, ERROR_DOMAIN);
        let bad = status.get_details_bad_request().expect("bad request");
        assert_eq!(bad.field_violations[0].field, "tool");
    }
}
