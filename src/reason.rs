//! Every reason the server sends in a `google.rpc.ErrorInfo`, in one enum: the wire names are
//! spelled here and nowhere else. `docs/errors.md` lists exactly these and both clients' typed
//! errors catch only these (`tests/api/docs.rs` holds both). The lowest layer, so that the
//! domain's refusals, the codec and the error mapping all name the same values.

use std::fmt;

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

impl Reason {
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
        assert_eq!(seen.len(), 32);
        assert_eq!(
            Reason::KeyReusedWithDifferentRequest.as_str(),
            "KEY_REUSED_WITH_DIFFERENT_REQUEST"
        );
        assert_eq!(Reason::StoreIoError.as_str(), "STORE_IO_ERROR");
    }
}
