//! The one place that turns an error into a gRPC status: a code, a `google.rpc.ErrorInfo`
//! (domain `idempotency.v1`, the error's [`Reason`]), a `google.rpc.RetryInfo` when waiting
//! helps and, for a bad field, a `google.rpc.BadRequest` naming it. [`CallError`] adds to the
//! ledger's own errors ([`LedgerError`], independent of gRPC) the refusals of the transport:
//! a missing credential ([`super::auth`]), a limit ([`super::admission`]) and a deadline
//! ([`super::deadline`]). What is not sent is logged here, once, by [`LedgerError::log_detail`].

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::error::LedgerError;
use crate::proto::ERROR_DOMAIN;
use crate::reason::Reason;

/// Everything a call can be refused with: the ledger's errors and the transport's own.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The use case refused or failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// A missing or wrong credential.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// A limit was reached (load shedding, a tenant's rate); retry after `retry_after`.
    #[error("{message}")]
    ResourceExhausted {
        /// [`Reason::Overloaded`] or [`Reason::RateLimited`].
        reason: Reason,
        /// What was reached, for a person.
        message: String,
        /// When a retry is worthwhile.
        retry_after: Duration,
    },
    /// The call's deadline passed before an answer.
    #[error("the call's deadline passed before the ledger could answer")]
    DeadlineExceeded,
    /// The credential lacks the role the call needs (Decide needs the approver role).
    #[error("{0}")]
    PermissionDenied(&'static str),
}

impl CallError {
    /// The reason sent in `ErrorInfo`.
    pub fn reason(&self) -> Reason {
        match self {
            CallError::Ledger(e) => e.reason(),
            CallError::Unauthenticated(_) => Reason::Unauthenticated,
            CallError::ResourceExhausted { reason, .. } => *reason,
            CallError::DeadlineExceeded => Reason::DeadlineExceeded,
            CallError::PermissionDenied(_) => Reason::ApproverRoleRequired,
        }
    }

    /// The gRPC code this error is sent with: the error table's ([`Reason::face`]).
    pub fn code(&self) -> Code {
        Code::from(self.reason().face().grpc as i32)
    }

    /// How long the caller should wait before retrying, when waiting helps: what a limit
    /// computed, else the error table's.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::ResourceExhausted { retry_after, .. } => Some(*retry_after),
            other => other.reason().face().retry_after,
        }
    }
}

impl From<CallError> for Status {
    fn from(err: CallError) -> Status {
        let mut details = ErrorDetails::new();
        details.set_error_info(
            err.reason().as_str(),
            ERROR_DOMAIN,
            std::collections::HashMap::new(),
        );
        if let CallError::Ledger(e) = &err {
            e.log_detail();
            if let LedgerError::InvalidArgument { field, message, .. } = e {
                details.add_bad_request_violation(*field, message.clone());
            }
        }
        if let Some(delay) = err.retry_after() {
            details.set_retry_info(Some(delay));
        }
        Status::with_error_details(err.code(), err.to_string(), details)
    }
}

/// A ledger error as the gRPC status it is answered with (the table's row for its reason).
pub fn status(err: LedgerError) -> Status {
    Status::from(CallError::Ledger(err))
}

/// The errors the tests of both faces (gRPC and the console) send: not part of the API.
#[cfg(test)]
pub(crate) mod samples {
    use crate::error::LedgerError;
    use crate::reason::Reason;
    use crate::storage::StoreError;

    /// An error of each reason the ledger's use cases can refuse with, carrying words of the
    /// database's where a store error would (for the tests of both faces); `None` for the
    /// reasons only the transport sends (a credential, a role, a limit, a deadline, the codec).
    pub(crate) fn sample(reason: Reason) -> Option<LedgerError> {
        use Reason as R;
        let words =
            || "relation ledger_entries: could not write block 7 of /var/lib/pg".to_string();
        Some(match reason {
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
            | R::UnfencedResolution => LedgerError::InvalidArgument {
                field: "field",
                reason,
                message: "is wrong".into(),
            },
            R::KeyReusedWithDifferentRequest => LedgerError::KeyReused,
            R::StaleClaimToken => LedgerError::StaleClaimToken,
            R::AlreadyResolved => LedgerError::AlreadyResolved("SUCCEEDED"),
            R::LeaseEnded => LedgerError::LeaseEnded("UNKNOWN"),
            R::NotMarked => LedgerError::NotMarked,
            R::ApprovalMismatch => LedgerError::ApprovalMismatch,
            R::AlreadyDecided => LedgerError::AlreadyDecided("APPROVED"),
            R::NotAwaitingApproval => LedgerError::NotAwaitingApproval("it was never gated".into()),
            R::EntryNotFound => LedgerError::NotFound,
            R::StoreUnavailable => LedgerError::Store(StoreError::Unreachable(words())),
            R::StoreBusy => LedgerError::Store(StoreError::Busy(words())),
            R::StoreIoError => LedgerError::Store(StoreError::Io(words())),
            R::StoreFull => LedgerError::Store(StoreError::Full(words())),
            R::StoreContention => LedgerError::Store(StoreError::Contention(words())),
            R::StoreReadOnly => LedgerError::Store(StoreError::ReadOnly(words())),
            R::StoreCorrupt => LedgerError::Store(StoreError::Corrupt(words())),
            R::StoreMisconfigured => LedgerError::Store(StoreError::Misconfigured(words())),
            R::Internal => LedgerError::Internal(words()),
            R::MalformedMessage
            | R::MessageTooLarge
            | R::ApproverRoleRequired
            | R::Unauthenticated
            | R::Overloaded
            | R::RateLimited
            | R::DeadlineExceeded => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::UNAVAILABLE_MESSAGE;
    use crate::storage::StoreError;

    /// An error of every reason, as the gRPC face sends it.
    fn every_error() -> Vec<(Reason, Status)> {
        Reason::all()
            .filter_map(|reason| {
                let error = match samples::sample(reason) {
                    Some(e) => CallError::Ledger(e),
                    None => match reason {
                        Reason::Unauthenticated => CallError::Unauthenticated("no credential"),
                        Reason::ApproverRoleRequired => CallError::PermissionDenied("no role"),
                        Reason::DeadlineExceeded => CallError::DeadlineExceeded,
                        Reason::Overloaded | Reason::RateLimited => CallError::ResourceExhausted {
                            reason,
                            message: "too much".into(),
                            retry_after: Duration::from_millis(250),
                        },
                        Reason::MalformedMessage => {
                            return Some((reason, crate::proto::codec::malformed()));
                        }
                        // Rewritten from tonic's own answer (transport_refusals, tested there).
                        _ => return None,
                    },
                };
                Some((reason, Status::from(error)))
            })
            .collect()
    }

    #[test]
    fn every_reason_is_sent_with_the_tables_code_and_retry_hint_and_no_database_words() {
        let sent = every_error();
        assert_eq!(
            sent.len(),
            Reason::all().count() - 1,
            "all but MESSAGE_TOO_LARGE"
        );
        for (reason, status) in sent {
            let face = reason.face();
            assert_eq!(status.code(), Code::from(face.grpc as i32), "{reason}");
            let info = status.get_details_error_info().expect("ErrorInfo");
            assert_eq!(
                (info.reason.as_str(), info.domain.as_str()),
                (reason.as_str(), ERROR_DOMAIN)
            );
            let retry = status.get_details_retry_info().and_then(|r| r.retry_delay);
            match reason {
                Reason::Overloaded | Reason::RateLimited => {
                    assert_eq!(retry, Some(Duration::from_millis(250)), "{reason}");
                }
                _ => assert_eq!(retry, face.retry_after, "{reason}"),
            }
            assert!(
                !status.message().contains("/var/lib") && !status.message().contains("block 7"),
                "{reason}: {}",
                status.message()
            );
        }
    }

    #[test]
    fn internal_details_are_never_sent() {
        let status = super::status(LedgerError::Internal(
            "relation ledger_entries does not exist at /var/lib/x".into(),
        ));
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("ledger_entries"));
        assert!(!status.message().contains("/var/lib"));
        let unavailable = super::status(LedgerError::Unavailable(
            "connection refused 10.0.0.1".into(),
        ));
        assert!(!unavailable.message().contains("10.0.0.1"));
        assert!(unavailable.get_details_retry_info().is_some());
    }

    /// The server recognises tonic's own size refusal by its code (grpc::transport_refusals):
    /// no answer of the ledger's may share it.
    #[test]
    fn the_ledger_never_answers_out_of_range() {
        let store =
            |e: fn(String) -> StoreError| CallError::from(LedgerError::Store(e(String::new())));
        let every = [
            CallError::from(LedgerError::invalid("tool", "x")),
            CallError::from(LedgerError::KeyReused),
            CallError::from(LedgerError::StaleClaimToken),
            CallError::from(LedgerError::AlreadyResolved("SUCCEEDED")),
            CallError::from(LedgerError::NotFound),
            CallError::Unauthenticated("x"),
            CallError::from(LedgerError::Unavailable(String::new())),
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
            CallError::from(LedgerError::LeaseEnded("UNKNOWN")),
            CallError::ResourceExhausted {
                reason: Reason::Overloaded,
                message: String::new(),
                retry_after: Duration::ZERO,
            },
            CallError::DeadlineExceeded,
            CallError::from(LedgerError::Internal(String::new())),
        ];
        for e in every {
            assert_ne!(e.code(), Code::OutOfRange, "{e:?}");
        }
    }

    /// One spelling of each reason; busy and unreachable both carry a retry delay.
    #[test]
    fn a_busy_store_has_a_reason_of_its_own_and_an_unreachable_one_the_same_as_unavailable() {
        let busy = super::status(LedgerError::Store(StoreError::Busy("all 16 in use".into())));
        assert_eq!(busy.code(), Code::Unavailable);
        assert_eq!(
            busy.get_details_error_info().expect("info").reason,
            Reason::StoreBusy
        );
        assert!(busy.get_details_retry_info().is_some());
        assert!(!busy.message().contains("16"), "{}", busy.message());
        for unavailable in [
            LedgerError::Store(StoreError::Unreachable("refused".into())),
            LedgerError::Store(StoreError::Unavailable("reset".into())),
            LedgerError::Unavailable("migrations have not run yet".into()),
        ] {
            let status = super::status(unavailable);
            assert_eq!(status.code(), Code::Unavailable);
            let info = status.get_details_error_info().expect("info");
            assert_eq!(info.reason, Reason::StoreUnavailable);
            assert_eq!(status.message(), UNAVAILABLE_MESSAGE);
            assert!(status.get_details_retry_info().is_some());
        }
    }

    #[test]
    fn a_bad_field_carries_error_info_and_bad_request() {
        let status = super::status(LedgerError::invalid("tool", "must not be empty"));
        assert_eq!(status.code(), Code::InvalidArgument);
        let info = status.get_details_error_info().expect("error info");
        assert_eq!(info.reason, "INVALID_FIELD");
        assert_eq!(info.domain, ERROR_DOMAIN);
        let bad = status.get_details_bad_request().expect("bad request");
        assert_eq!(bad.field_violations[0].field, "tool");
    }
}
