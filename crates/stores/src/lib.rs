//! # ledger-stores
//!
//! Durable entries behind the core's one [`Store`] trait, implemented by [`postgres::PgStore`]
//! (production; several servers may share one database) and [`sqlite::SqliteStore`] (the
//! embedded default), and wrapped by [`group_commit::GroupCommit`].
//!
//! A store makes no decisions: it applies the writes the domain chose, each one a single atomic
//! statement whose `WHERE` clause is the compare-and-set condition. The claim itself is an
//! `INSERT … ON CONFLICT DO NOTHING`: the primary key on (tenant, key) decides who wins, never a
//! read-then-write. Every write is a plain data command (an [`Entry`](ledger_core::domain::Entry), a [`Finish`]), so
//! [`group_commit::GroupCommit`], a store around a store, collects the claims and completions
//! that arrive while the store is busy into one multi-row statement and one commit; every other
//! call passes through it.
//!
//! The trait is implemented once for both SQL backends (`sql_store`): each backend states what
//! it does its own way as a `Dialect` (the statements it words differently, how it runs one
//! statement, its batches, announcements, migrations and clock), the statements they share are
//! constants in [`sql`] whose column lists and placeholders are built from one list of columns,
//! and every statement runs through `sql_store::run_on`. [`open`] returns a backend wrapped in
//! its group commit.
//!
//! `sqlx::Error` never leaves this crate: it becomes [`StoreError`]. The core's storage items
//! are re-exported here, so that a store's code names them as its own (`crate::Store`).

mod error;
pub mod group_commit;
pub(crate) mod kept_connections;
mod migrations;
mod opening;
pub mod postgres;
mod rows;
#[doc(hidden)]
pub mod sql;
mod sql_store;
pub mod sqlite;
mod store_marks;

/// This crate, under the name the core gives the storage layer (`crate::storage::…`).
pub(crate) use crate as storage;
/// The core's default settings (the pool's).
pub(crate) use ledger_core::defaults;
/// The core's domain, which the stores read and write (`crate::domain::…` in their code).
pub(crate) use ledger_core::domain;

pub(crate) use error::Classify;
pub use ledger_core::storage::*;
pub use opening::{PoolOptions, Pooler, open, open_backend, open_with_writers};
pub(crate) use rows::{EntryRow, HistoryRow};
pub(crate) use rows::{FinishedRow, UnresolvedCountRow};
pub(crate) use store_marks::CONNECTIONS_PROVEN_FOR;
pub use store_marks::StoreMarks;

/// 64 KiB of fresh random bytes for the write probe (random, so that no compression makes the
/// write smaller than what it stands for).
fn probe_filler() -> Vec<u8> {
    let mut filler = vec![0u8; 64 * 1024];
    rand::Rng::fill_bytes(&mut rand::rng(), &mut filler);
    filler
}

/// The URL with any password replaced by `***`, for logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{tail}")
            } else {
                format!("{scheme}://{user}@{host}{tail}")
            }
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_reach_the_log() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/ledger"),
            "postgres://app:***@db:5432/ledger"
        );
        assert_eq!(
            redact_url("postgres://app@db/ledger"),
            "postgres://app@db/ledger"
        );
        assert_eq!(redact_url("sqlite://ledger.db"), "sqlite://ledger.db");
        assert_eq!(redact_url("postgres://u:p@ss@h/d"), "postgres://u:***@h/d");
    }
}
