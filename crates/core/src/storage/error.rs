//! [`StoreError`]: what a store call failed of, classified by the stores from their
//! database's errors and own codes, so that no driver's error reaches the ledger.

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or did not answer in time: opening or using a
    /// connection failed, at whichever step (connect, the answer to TLS negotiation, the TLS
    /// handshake, the startup packet, authentication, a connection closed mid-statement).
    /// The caller may retry.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// No connection could be opened within the acquire timeout, and the pool kept no cause
    /// (it tries again after a refused connection, a database starting up or out of
    /// connection slots, until the timeout): what [`Store::unreachable_cause`](super::Store::unreachable_cause) finds
    /// out. Otherwise as [`StoreError::Unavailable`].
    #[error("store unavailable: {0}")]
    Unreachable(String),
    /// The database answers, but was busy: every connection the pool may open was in use by
    /// other calls until the acquire timeout (on SQLite: or another writer held its lock that
    /// long). Nothing was committed; the caller may retry.
    #[error("store busy: {0}")]
    Busy(String),
    /// The database reported an I/O error reading or writing its files; the write was not
    /// committed.
    #[error("store I/O error: {0}")]
    Io(String),
    /// The database's disk (or quota) is full; the write was not committed. Reads go on.
    #[error("store full: {0}")]
    Full(String),
    /// A deadlock or a serialization failure that the store's bounded retries did not get
    /// past; nothing was committed.
    #[error("store contention: {0}")]
    Contention(String),
    /// The connection reached a server that accepts no writes (a standby, or a file that
    /// cannot be written); the write was not committed.
    #[error("store read-only: {0}")]
    ReadOnly(String),
    /// The database reports its own files corrupt: an operator must restore them.
    #[error("store corrupt: {0}")]
    Corrupt(String),
    /// The server's settings do not fit the database it reached (a transaction pooler that
    /// `--postgres-pooler none` does not expect): the server refuses to start.
    #[error("store misconfigured: {0}")]
    Misconfigured(String),
    /// Anything else (a constraint we did not expect, a row we cannot read): a bug.
    #[error("store error: {0}")]
    Internal(String),
}

impl StoreError {
    /// Whether a write that failed this way may have committed all the same: a connection
    /// lost mid-statement (or at its commit) leaves its outcome unknown, and a bug says
    /// nothing. Every other cause was refused before anything was committed.
    pub fn may_have_committed(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Internal(_))
    }

    /// A short stable name of the cause, for metrics labels and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) | StoreError::Unreachable(_) => "unavailable",
            StoreError::Busy(_) => "busy",
            StoreError::Io(_) => "io_error",
            StoreError::Full(_) => "full",
            StoreError::Contention(_) => "contention",
            StoreError::ReadOnly(_) => "read_only",
            StoreError::Corrupt(_) => "corrupt",
            StoreError::Misconfigured(_) => "misconfigured",
            StoreError::Internal(_) => "internal",
        }
    }

    /// Every kind, in the order metrics report them; `internal` last.
    pub const KINDS: [&'static str; 9] = [
        "unavailable",
        "busy",
        "io_error",
        "full",
        "contention",
        "read_only",
        "corrupt",
        "misconfigured",
        "internal",
    ];

    /// The same error with `context` before its detail (where the store was, what it did).
    pub fn context(self, context: &str) -> StoreError {
        let with = |detail: String| format!("{context}: {detail}");
        match self {
            StoreError::Unavailable(d) => StoreError::Unavailable(with(d)),
            StoreError::Unreachable(d) => StoreError::Unreachable(with(d)),
            StoreError::Busy(d) => StoreError::Busy(with(d)),
            StoreError::Io(d) => StoreError::Io(with(d)),
            StoreError::Full(d) => StoreError::Full(with(d)),
            StoreError::Contention(d) => StoreError::Contention(with(d)),
            StoreError::ReadOnly(d) => StoreError::ReadOnly(with(d)),
            StoreError::Corrupt(d) => StoreError::Corrupt(with(d)),
            StoreError::Misconfigured(d) => StoreError::Misconfigured(with(d)),
            StoreError::Internal(d) => StoreError::Internal(with(d)),
        }
    }
}

/// Result alias for store calls.
pub type StoreResult<T> = Result<T, StoreError>;
