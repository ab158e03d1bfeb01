//! Migrations as they were released. A migration is never edited once it has shipped: the
//! migrator keeps each applied migration's checksum (SHA-384 of its file) and refuses to start
//! on a database whose applied migration no longer matches this build's file
//! (`migrations/released.sha384` holds every released checksum, and a test holds the files to
//! it).
//!
//! One was edited after release: 0004 (`arguments_and_runs`) first created the run index as
//! `(tenant, run_id, started_at, key)`; the file now creates it as `(run_id, tenant,
//! started_at)`, so that no Lookup plan made on an empty table takes it. A database migrated
//! with the first form would refuse to start, so before migrating, [`upgrade`] brings such a
//! database to the current form: in one transaction it re-creates the index and records the
//! current checksum, only where the applied checksum is the first release's (two servers
//! starting together: the second finds nothing to do).

/// The version of the one migration edited after release.
const EDITED_VERSION: i64 = 4;

/// The checksum (SHA-384) of 0004 as first released.
const RELEASED_0004: &str = "11bf51fed77757dbc92531d585f7450fc1d0aa9372ea26426a5976f8e9e0e7c5\
                             8094cab9920443455780b4654af44764";

/// Records the current checksum `$1` of migration `$3` where the first release's `$2` is applied
/// (the same text on both stores).
const RECORD_CURRENT: &str =
    "UPDATE _sqlx_migrations SET checksum = $1 WHERE version = $3 AND checksum = $2";

/// What the current 0004 does differently: the run index led by the run.
const DROP_FIRST_RUN_INDEX: &str = "DROP INDEX IF EXISTS ledger_entries_by_run";
const CREATE_RUN_INDEX: &str =
    "CREATE INDEX ledger_entries_by_run ON ledger_entries (run_id, tenant, started_at)";

/// Where `migrator`'s 0004 is not the first release's but the database applied the first
/// release, records this build's checksum and re-creates the run index, on `conn` inside the
/// caller's transaction (so that of two servers starting together the second finds nothing to
/// do), and logs that it did.
pub(super) async fn upgrade<DB>(
    conn: &mut DB::Connection,
    migrator: &sqlx::migrate::Migrator,
    rows_affected: fn(&DB::QueryResult) -> u64,
) -> Result<(), sqlx::Error>
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
    for<'e> &'e mut DB::Connection: sqlx::Executor<'e, Database = DB>,
    Vec<u8>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let Some(current) = migrator.iter().find(|m| m.version == EDITED_VERSION) else {
        return Ok(());
    };
    let released = hex::decode(RELEASED_0004).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    let moved = sqlx::query(self::RECORD_CURRENT)
        .bind(current.checksum.to_vec())
        .bind(released)
        .bind(EDITED_VERSION)
        .execute(&mut *conn)
        .await?;
    if rows_affected(&moved) == 0 {
        return Ok(());
    }
    sqlx::query(self::DROP_FIRST_RUN_INDEX)
        .execute(&mut *conn)
        .await?;
    sqlx::query(self::CREATE_RUN_INDEX)
        .execute(&mut *conn)
        .await?;
    tracing::info!(
        version = EDITED_VERSION,
        "migration {EDITED_VERSION} was applied as first released: brought to its current form"
    );
    Ok(())
}
