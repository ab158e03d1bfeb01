//! How the stores classify what sqlx reports into a [`StoreError`] (`sqlx::Error` never leaves
//! this crate): by the database's own code, or by the step that failed.

use crate::StoreError;
use crate::kept_connections;

/// The classifications of sqlx's errors, as constructors of [`StoreError`] (a type of the
/// core, which knows no sqlx).
pub(crate) trait Classify: Sized {
    /// Whether the connection that produced this error should not be used again.
    fn poisons_connection(&self) -> bool;
    /// A failure of sqlx itself, outside any database's answer.
    fn from_client(err: &sqlx::Error) -> Self;
    /// A failure to lend a connection.
    fn from_acquire(
        err: kept_connections::AcquireError,
        classify: impl FnOnce(sqlx::Error) -> StoreError,
    ) -> Self;
    /// A failure to open a connection.
    fn from_opening(err: sqlx::Error, classify: impl FnOnce(sqlx::Error) -> StoreError) -> Self;
    /// A SQLite error.
    fn from_sqlite(err: sqlx::Error) -> Self;
    /// A PostgreSQL error.
    fn from_postgres(err: sqlx::Error) -> Self;
}

impl Classify for StoreError {
    /// Whether the connection that produced this error should not be used again: after an
    /// I/O error, a full disk or a read-only server, the session may hold a half-rolled-back
    /// transaction (SQLite) or point at a demoted primary (PostgreSQL).
    fn poisons_connection(&self) -> bool {
        matches!(
            self,
            StoreError::Io(_) | StoreError::Full(_) | StoreError::ReadOnly(_)
        )
    }

    /// The errors sqlx reports outside any database's answer while a statement runs on a
    /// live connection, the same for both backends. The link failed (an I/O error of any
    /// kind: reset, closed mid-message, timed out; a broken TLS session; SQLite's worker
    /// thread gone): unavailable. What sqlx cannot encode or decode, or a message out of
    /// place in the protocol (`Protocol`: too many parameters, a message over the protocol's
    /// size, a reply the driver did not expect), is a bug of ours or of the driver: internal.
    fn from_client(err: &sqlx::Error) -> StoreError {
        use sqlx::Error as E;
        match err {
            E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::Tls(_) | E::WorkerCrashed => {
                StoreError::Unavailable(err.to_string())
            }
            _ => StoreError::Internal(err.to_string()),
        }
    }

    /// Classifies a failure to lend a connection ([`kept_connections::Connections::acquire`]): the pool
    /// was busy, or opening a connection failed.
    fn from_acquire(
        err: kept_connections::AcquireError,
        classify: impl FnOnce(sqlx::Error) -> StoreError,
    ) -> StoreError {
        match err {
            kept_connections::AcquireError::Busy { waited, max } => StoreError::Busy(format!(
                "no database connection freed in time: waited {waited:?} \
                 (--db-acquire-timeout), while all {max} connections of the pool \
                 (--db-max-connections) were in use by other calls"
            )),
            kept_connections::AcquireError::Open(e) => StoreError::from_opening(e, classify),
        }
    }

    /// Classifies a failure to open a connection: always a condition of the database or of
    /// the way to it, never a bug, whichever step it died in. The database's own refusal
    /// (a wrong password, a missing database, too many connections, a pooler's words) is
    /// classified by its code with `classify` (what would be internal there is unavailable
    /// here); anything else sqlx reports there is unavailable, whatever its variant: an I/O
    /// error at connect, during the startup packet or authentication (a link reset or closed
    /// at any byte), a failed TLS handshake (`Tls`, or rustls' I/O errors), an answer that is
    /// no PostgreSQL's (`Protocol`: a proxy that accepted the connection and closed it before
    /// answering the SSLRequest is read as the byte 0x00), or a certificate or key file that
    /// cannot be read (`Configuration`). sqlx's pool timing out while it had room to open a
    /// connection, or while the connections it had were being checked (the ping sqlx sends
    /// on a connection given back, or before it lends one idle a while), is
    /// [`StoreError::Unreachable`]: the database did not answer in time.
    fn from_opening(
        err: sqlx::Error,
        classify: impl FnOnce(sqlx::Error) -> StoreError,
    ) -> StoreError {
        match err {
            sqlx::Error::PoolTimedOut => StoreError::Unreachable(
                "no connection could be opened or checked within --db-acquire-timeout".to_string(),
            ),
            err @ sqlx::Error::Database(_) => match classify(err) {
                StoreError::Internal(detail) => StoreError::Unavailable(detail),
                other => other,
            },
            other => StoreError::Unavailable(format!("cannot open a connection: {other}")),
        }
    }

    /// Classifies a SQLite error by its primary result code (see [`sqlite_code`]).
    fn from_sqlite(err: sqlx::Error) -> StoreError {
        match database_code(&err).and_then(|c| c.parse::<i32>().ok()) {
            Some(code) => sqlite_code(code, err.to_string()),
            None => StoreError::from_client(&err),
        }
    }

    /// Classifies a PostgreSQL error by its SQLSTATE (see [`sqlstate`]).
    fn from_postgres(err: sqlx::Error) -> StoreError {
        match database_code(&err) {
            Some(state) => sqlstate(&state, without_source_line(err.to_string())),
            None => StoreError::from_client(&err),
        }
    }
}

/// The cause a SQLite result code names, by its primary code (`code & 0xff`): sqlx reports
/// the extended code, such as 773 SQLITE_BUSY_TIMEOUT or 531 SQLITE_CONSTRAINT_COMMITHOOK.
fn sqlite_code(code: i32, detail: String) -> StoreError {
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
fn sqlstate(state: &str, detail: String) -> StoreError {
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

/// sqlx ends a PostgreSQL error with ` at line N`, the line of PostgreSQL's own C source that
/// raised it, which reads as a line of the operator's file (`pg_hba.conf rejects connection …
/// at line 476`): it is left out of what the log shows.
pub(super) fn without_source_line(mut detail: String) -> String {
    if let Some(at) = detail.rfind(" at line ")
        && detail[at + " at line ".len()..]
            .bytes()
            .all(|b| b.is_ascii_digit())
    {
        detail.truncate(at);
    }
    detail
}

/// The database's own error code (SQLSTATE, or SQLite's extended result code), if the error
/// is the database's answer.
fn database_code(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::Classify as _;
    use super::{sqlite_code, sqlstate};
    use crate::StoreError;

    #[test]
    fn the_source_line_sqlx_appends_is_left_out() {
        assert_eq!(
            super::without_source_line("pg_hba.conf rejects connection at line 476".into()),
            "pg_hba.conf rejects connection"
        );
        assert_eq!(
            super::without_source_line("a value at line five".into()),
            "a value at line five"
        );
    }

    /// Whatever sqlx reports while a connection is being opened is the store being
    /// unavailable, by the variant and never its text: the answer 0x00 a proxy's closed
    /// connection makes of `SSLRequest` (a `Protocol` error) included.
    #[test]
    fn every_failure_to_open_a_connection_is_unavailable() {
        use std::io::{Error as IoError, ErrorKind};
        let opening = |e: sqlx::Error| StoreError::from_opening(e, StoreError::from_postgres);
        let failures = [
            sqlx::Error::Io(IoError::from(ErrorKind::ConnectionRefused)),
            sqlx::Error::Io(IoError::from(ErrorKind::ConnectionReset)),
            sqlx::Error::Io(IoError::new(ErrorKind::UnexpectedEof, "at EOF")),
            sqlx::Error::Io(IoError::from(ErrorKind::TimedOut)),
            // rustls' alerts and bad records come as InvalidData.
            sqlx::Error::Io(IoError::from(ErrorKind::InvalidData)),
            sqlx::Error::Protocol("unexpected response from SSLRequest: 0x00".into()),
            sqlx::Error::Protocol("anything else".into()),
            sqlx::Error::Tls("server does not support TLS".into()),
            sqlx::Error::Configuration("no keys found pem file".into()),
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
        ];
        for failure in failures {
            let what = format!("{failure:?}");
            let error = opening(failure);
            assert!(
                matches!(error, StoreError::Unavailable(_)),
                "{what} -> {error:?}"
            );
        }
        assert!(matches!(
            opening(sqlx::Error::PoolTimedOut),
            StoreError::Unreachable(_)
        ));
    }

    /// On a live connection the same variants split: the link failing is unavailable, what
    /// the driver could not encode or decode (a message over the protocol's size, too many
    /// parameters, a row of the wrong shape) is a bug.
    #[test]
    fn on_a_live_connection_only_the_link_failing_is_unavailable() {
        use std::io::{Error as IoError, ErrorKind};
        for link in [
            sqlx::Error::Io(IoError::from(ErrorKind::ConnectionReset)),
            sqlx::Error::Io(IoError::new(ErrorKind::UnexpectedEof, "at EOF")),
            sqlx::Error::Io(IoError::from(ErrorKind::BrokenPipe)),
            sqlx::Error::Tls("bad record mac".into()),
            sqlx::Error::WorkerCrashed,
        ] {
            let what = format!("{link:?}");
            assert_eq!(
                StoreError::from_postgres(link).kind(),
                "unavailable",
                "{what}"
            );
        }
        for bug in [
            sqlx::Error::Protocol("message size out of range for protocol".into()),
            sqlx::Error::RowNotFound,
            sqlx::Error::ColumnNotFound("status".into()),
        ] {
            let what = format!("{bug:?}");
            assert_eq!(StoreError::from_postgres(bug).kind(), "internal", "{what}");
        }
    }

    #[test]
    fn sqlite_errors_are_classified_by_their_primary_code() {
        let kind = |code| sqlite_code(code, String::new()).kind();
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
        let kind = |state| sqlstate(state, String::new()).kind();
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
