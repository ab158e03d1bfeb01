//! The one error type of the ledger's use cases, independent of gRPC: each case's reason (a
//! SCREAMING_SNAKE [`Reason`]), the message a person is shown, the retry hint, and the log
//! line of what is not sent (internal details: SQL, paths). The refusals of the transport
//! (a credential, a limit, a deadline) and the one mapping to a gRPC status are
//! the server's `grpc::error`; this crate has no tonic (its manifest names none).

use std::time::Duration;

use crate::domain::canonical::CanonicalError;
use crate::domain::fields::InvalidField;
use crate::reason::Reason;
use crate::storage::StoreError;

/// What the caller is told when the store cannot be reached (or the server is not ready).
pub const UNAVAILABLE_MESSAGE: &str = "the ledger's database is unavailable; retry later";

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
        /// Why, such as [`Reason::DuplicateMember`].
        reason: Reason,
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
    /// An acknowledgement of a possible double effect on an entry that carries no such mark
    /// (never marked, or acknowledged already).
    #[error(
        "the entry is not marked as a possible double effect (never marked, or acknowledged \
         already); nothing changed"
    )]
    NotMarked,
    /// A decision about other arguments than the entry's.
    #[error(
        "fingerprint is not this entry's: the decision must name the arguments the person was \
         shown (other arguments are another request); nothing changed"
    )]
    ApprovalMismatch,
    /// The other decision was taken already.
    #[error("the call was already decided ({0}); the other decision is refused; nothing changed")]
    AlreadyDecided(&'static str),
    /// A decision about an entry that awaits none.
    #[error("the entry awaits no decision: {0}; nothing changed")]
    NotAwaitingApproval(String),
    /// A bug or an operator problem; the detail is logged, not sent.
    #[error("internal error")]
    Internal(String),
}

impl LedgerError {
    /// A bad-field error with the generic reason `INVALID_FIELD`.
    pub fn invalid(field: &'static str, message: impl Into<String>) -> LedgerError {
        LedgerError::InvalidArgument {
            field,
            reason: Reason::InvalidField,
            message: message.into(),
        }
    }

    /// The reason sent in `ErrorInfo`.
    pub fn reason(&self) -> Reason {
        match self {
            LedgerError::InvalidArgument { reason, .. } => *reason,
            LedgerError::KeyReused => Reason::KeyReusedWithDifferentRequest,
            LedgerError::StaleClaimToken => Reason::StaleClaimToken,
            LedgerError::AlreadyResolved(_) => Reason::AlreadyResolved,
            LedgerError::NotFound => Reason::EntryNotFound,
            LedgerError::Unavailable(_) => Reason::StoreUnavailable,
            LedgerError::Store(e) => match e {
                StoreError::Unavailable(_) | StoreError::Unreachable(_) => Reason::StoreUnavailable,
                StoreError::Busy(_) => Reason::StoreBusy,
                StoreError::Io(_) => Reason::StoreIoError,
                StoreError::Full(_) => Reason::StoreFull,
                StoreError::Contention(_) => Reason::StoreContention,
                StoreError::ReadOnly(_) => Reason::StoreReadOnly,
                StoreError::Corrupt(_) => Reason::StoreCorrupt,
                StoreError::Misconfigured(_) => Reason::StoreMisconfigured,
                StoreError::Internal(_) => Reason::Internal,
            },
            LedgerError::LeaseEnded(_) => Reason::LeaseEnded,
            LedgerError::NotMarked => Reason::NotMarked,
            LedgerError::ApprovalMismatch => Reason::ApprovalMismatch,
            LedgerError::AlreadyDecided(_) => Reason::AlreadyDecided,
            LedgerError::NotAwaitingApproval(_) => Reason::NotAwaitingApproval,
            LedgerError::Internal(_) => Reason::Internal,
        }
    }

    /// How long the caller should wait before retrying, when waiting helps.
    pub fn retry_after(&self) -> Option<Duration> {
        self.reason().face().retry_after
    }

    /// Logs what the caller is not sent (the database's words, a bug's detail): called once
    /// per error, where it is turned into an answer.
    pub fn log_detail(&self) {
        match self {
            LedgerError::Unavailable(detail) => tracing::debug!(error = %detail, "not serving yet"),
            LedgerError::Store(e) => log_store_error(e),
            LedgerError::Internal(detail) => tracing::error!(error = %detail, "internal error"),
            _ => {}
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
