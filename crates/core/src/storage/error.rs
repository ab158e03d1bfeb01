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

impl StoreError {
    /// The cause a SQLite result code names, by its primary code (`code & 0xff`): sqlx reports
    /// the extended code, such as 773 SQLITE_BUSY_TIMEOUT or 531 SQLITE_CONSTRAINT_COMMITHOOK.
    pub fn sqlite_code(code: i32, detail: String) -> StoreError {
        match code & 0xff {
            // SQLITE_BUSY, SQLITE_LOCKED: another writer held the lock past the busy timeout
            // (which is the acquire timeout): the database is busy, not unreachable.
            5 | 6 => StoreError::Busy(detail),
            // SQLITE_NOMEM, SQLITE_INTERRUPT: the process is short of memory, or gave up.
            7 | 9 => StoreError::Unavailable(detail),
            // SQLITE_READONLY: the file (or its directory) cannot be written.
            8 => StoreError::ReadOnly(detail),
            // SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_PROTOCOL (WAL locking): the files failed us.
            10 | 14 | 15 => StoreError::Io(detail),
            // SQLITE_FULL: the disk (or the file-size limit) is full.
            13 => StoreError::Full(detail),
            // SQLITE_CORRUPT, SQLITE_NOTADB.
            11 | 26 => StoreError::Corrupt(detail),
            // SQLITE_CONSTRAINT and the rest: nothing the ledger's statements should meet.
            _ => StoreError::Internal(detail),
        }
    }

    /// The cause a PostgreSQL SQLSTATE names, the exact code first, then its class.
    pub fn sqlstate(state: &str, detail: String) -> StoreError {
        match state {
            // disk_full.
            "53100" => StoreError::Full(detail),
            // read_only_sql_transaction: a standby, or a primary demoted under us.
            "25006" => StoreError::ReadOnly(detail),
            // io_error, undefined_file.
            "58030" | "58P01" => StoreError::Io(detail),
            // data_corrupted, index_corrupted.
            "XX001" | "XX002" => StoreError::Corrupt(detail),
            // query_canceled (statement_timeout), lock_not_available (lock_timeout).
            "57014" | "55P03" => StoreError::Unavailable(detail),
            // invalid_catalog_name: the database does not exist (yet); insufficient_privilege:
            // the role lacks a grant. Both the operator's to mend, neither a bug.
            "3D000" | "42501" => StoreError::Unavailable(detail),
            // Class 08 connection exception, 28 invalid authorization (a wrong password, an
            // unknown role), 57P admin/crash shutdown or cannot connect now, 53 insufficient
            // resources (out of memory, too many connections).
            s if s.starts_with("08")
                || s.starts_with("28")
                || s.starts_with("57P")
                || s.starts_with("53") =>
            {
                StoreError::Unavailable(detail)
            }
            // Class 40, transaction rollback: deadlock_detected, serialization_failure.
            s if s.starts_with("40") => StoreError::Contention(detail),
            _ => StoreError::Internal(detail),
        }
    }
}

/// Result alias for store calls.
pub type StoreResult<T> = Result<T, StoreError>;

#[cfg(test)]
mod tests {
    use super::StoreError;

    #[test]
    fn sqlite_errors_are_classified_by_their_primary_code() {
        let kind = |code| StoreError::sqlite_code(code, String::new()).kind();
        // Extended codes of the same primary code classify alike.
        for busy in [
            5, 261, /* BUSY_RECOVERY */
            517, /* BUSY_SNAPSHOT */
            773, /* BUSY_TIMEOUT */
        ] {
            assert_eq!(kind(busy), "busy", "{busy}");
        }
        assert_eq!(kind(6), "busy", "LOCKED");
        assert_eq!(kind(7), "unavailable", "NOMEM");
        assert_eq!(kind(13), "full", "FULL");
        for io in [
            10, 266,  /* IOERR_READ */
            778,  /* IOERR_WRITE */
            1290, /* IOERR_FSYNC */
            14,
        ] {
            assert_eq!(kind(io), "io_error", "{io}");
        }
        assert_eq!(kind(8), "read_only", "READONLY");
        assert_eq!(kind(1032), "read_only", "READONLY_DBMOVED");
        assert_eq!(kind(11), "corrupt", "CORRUPT");
        assert_eq!(kind(26), "corrupt", "NOTADB");
        // A constraint the ledger did not expect is a bug, commit hook included: its code
        // 531 must not be read as PostgreSQL's class 53.
        for constraint in [
            19, 531, /* CONSTRAINT_COMMITHOOK */
            787, /* FOREIGNKEY */
            1555,
        ] {
            assert_eq!(kind(constraint), "internal", "{constraint}");
        }
        assert_eq!(kind(1), "internal", "SQLITE_ERROR");
    }

    #[test]
    fn postgres_errors_are_classified_by_their_sqlstate() {
        let kind = |state| StoreError::sqlstate(state, String::new()).kind();
        assert_eq!(kind("53100"), "full");
        assert_eq!(kind("53200"), "unavailable", "out_of_memory");
        assert_eq!(kind("53300"), "unavailable", "too_many_connections");
        assert_eq!(kind("40001"), "contention", "serialization_failure");
        assert_eq!(kind("40P01"), "contention", "deadlock_detected");
        assert_eq!(kind("25006"), "read_only");
        assert_eq!(kind("58030"), "io_error");
        assert_eq!(kind("XX001"), "corrupt");
        assert_eq!(kind("08006"), "unavailable", "connection_failure");
        assert_eq!(kind("57P01"), "unavailable", "admin_shutdown");
        assert_eq!(kind("57014"), "unavailable", "statement_timeout");
        assert_eq!(kind("23505"), "internal", "unique_violation");
        assert_eq!(kind("42P01"), "internal", "undefined_table");
        assert_eq!(kind("28P01"), "unavailable", "invalid_password");
        assert_eq!(kind("3D000"), "unavailable", "a missing database");
        assert_eq!(kind("42501"), "unavailable", "insufficient_privilege");
    }
}
