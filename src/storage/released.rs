//! Migrations as they were released. A migration is never edited once it has shipped: the
//! migrator keeps each applied migration's checksum (SHA-384 of its file) and refuses to start
//! on a database whose applied migration no longer matches this build's file
//! (`migrations/released.sha384` holds every released checksum, and a test holds the files to
//! it).
//!
//! One was edited after release: 0004 (`arguments_and_runs`) first created the run index as
//! `(tenant, run_id, started_at, key)`; the file now creates it as `(run_id, tenant,
//! started_at)`, so that no Lookup plan made on an empty table takes it. A database migrated
//! with the first form would refuse to start, so before migrating, [`EDITED`] brings such a
//! database to the current form: in one transaction it re-creates the index and records the
//! current checksum, only where the applied checksum is the first release's (two servers
//! starting together: the second finds nothing to do).

/// A migration whose file changed after it was released, and how a database that applied the
/// released file is brought to the current one.
pub(super) struct Edited {
    /// Its version.
    pub version: i64,
    /// The released file's checksum (SHA-384, hex).
    pub released: &'static str,
    /// What the current file does differently, for a database that ran the released one (the
    /// same on both stores).
    pub upgrade: &'static [&'static str],
}

/// Every migration edited after release.
pub(super) const EDITED: &[Edited] = &[Edited {
    version: 4,
    released: "11bf51fed77757dbc92531d585f7450fc1d0aa9372ea26426a5976f8e9e0e7c5\
               8094cab9920443455780b4654af44764",
    upgrade: &[
        "DROP INDEX IF EXISTS ledger_entries_by_run",
        "CREATE INDEX ledger_entries_by_run ON ledger_entries (run_id, tenant, started_at)",
    ],
}];

/// Records `current` as `edited`'s checksum where the released one is applied, then runs its
/// upgrade, on `conn` inside the caller's transaction. Whether it did (false: the database
/// never applied the released file, or was already brought up).
pub(super) async fn upgrade<'c, DB>(
    conn: &'c mut DB::Connection,
    edited: &Edited,
    current: &[u8],
    update: &'static str,
    rows_affected: fn(&DB::QueryResult) -> u64,
) -> Result<bool, sqlx::Error>
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
    for<'e> &'e mut DB::Connection: sqlx::Executor<'e, Database = DB>,
    Vec<u8>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let released = hex::decode(edited.released).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    let moved = sqlx::query::<DB>(update)
        .bind(current.to_vec())
        .bind(edited.version)
        .bind(released)
        .execute(&mut *conn)
        .await?;
    if rows_affected(&moved) == 0 {
        return Ok(false);
    }
    for statement in edited.upgrade {
        sqlx::query::<DB>(*statement).execute(&mut *conn).await?;
    }
    Ok(true)
}
