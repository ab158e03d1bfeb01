//! Migrations are never edited once released: every migration file's checksum (as sqlx
//! computes and records it) is held to the committed list `migrations/released.sha384`. And a
//! database that applied migration 0004 as first released (before it was edited) is brought
//! to its current form at start-up instead of refusing to start.

use std::collections::BTreeMap;
use std::path::Path;

use sqlx::Connection;

use crate::support::{Backend, TestDb};

on_every_backend!(a_database_migrated_with_the_first_0004_is_brought_up_and_starts);

/// The list: (store, file name) → checksum in hex.
fn released() -> BTreeMap<(String, String), String> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/released.sha384"),
    )
    .expect("migrations/released.sha384");
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(fields.len(), 3, "a line is `store file checksum`: {l}");
            (
                (fields[0].to_string(), fields[1].to_string()),
                fields[2].to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn every_migration_file_is_as_released() {
    let listed = released();
    let mut seen = BTreeMap::new();
    for store in ["postgres", "sqlite"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(store);
        let migrator = sqlx::migrate::Migrator::new(dir.as_path())
            .await
            .expect("read the migrations");
        for file in std::fs::read_dir(&dir).expect("dir") {
            let name = file
                .expect("entry")
                .file_name()
                .into_string()
                .expect("UTF-8");
            let version: i64 = name[..4].parse().expect("a numbered file");
            let migration = migrator
                .iter()
                .find(|m| m.version == version)
                .expect("the migrator reads each file");
            seen.insert(
                (store.to_string(), name),
                hex::encode(&migration.checksum[..]),
            );
        }
    }
    for (file, checksum) in &seen {
        match listed.get(file) {
            Some(released) => assert_eq!(
                released, checksum,
                "{file:?} was edited after release: a database that applied it would refuse to \
                 start. Put the change in a new migration (and restore the file)"
            ),
            None => panic!(
                "{file:?} is not in migrations/released.sha384: add its line (`{} {} {checksum}`) \
                 with the commit that adds it",
                file.0, file.1
            ),
        }
    }
    for file in listed.keys() {
        assert!(
            seen.contains_key(file),
            "{file:?} was released and is gone: a database that applied it would refuse to start"
        );
    }
}

/// The first release of 0004, as a database that applied it holds it: its checksum and its
/// run index.
const FIRST_0004: &str = "11bf51fed77757dbc92531d585f7450fc1d0aa9372ea26426a5976f8e9e0e7c5\
                          8094cab9920443455780b4654af44764";
const FIRST_RUN_INDEX: &str =
    "CREATE INDEX ledger_entries_by_run ON ledger_entries (tenant, run_id, started_at, key)";

/// Puts the first release of 0004 back into a migrated database on `conn`: its run index and
/// its checksum.
async fn rewind_to_the_first_0004<DB>(conn: &mut DB::Connection)
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
    for<'e> &'e mut DB::Connection: sqlx::Executor<'e, Database = DB>,
    Vec<u8>: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let first = hex::decode(FIRST_0004).expect("hex");
    sqlx::query("DROP INDEX ledger_entries_by_run")
        .execute(&mut *conn)
        .await
        .expect("drop");
    sqlx::query(FIRST_RUN_INDEX)
        .execute(&mut *conn)
        .await
        .expect("the first index");
    sqlx::query("UPDATE _sqlx_migrations SET checksum = $1 WHERE version = 4")
        .bind(first)
        .execute(&mut *conn)
        .await
        .expect("the first checksum");
}

/// The run index's definition (as `index_sql` reads it) and 0004's recorded checksum.
async fn index_and_checksum<DB>(
    conn: &mut DB::Connection,
    index_sql: &'static str,
) -> (String, Vec<u8>)
where
    DB: sqlx::Database,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
    for<'e> &'e mut DB::Connection: sqlx::Executor<'e, Database = DB>,
    (String,): for<'r> sqlx::FromRow<'r, DB::Row>,
    (Vec<u8>,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let (index,): (String,) = sqlx::query_as(index_sql)
        .fetch_one(&mut *conn)
        .await
        .expect("index");
    let (checksum,): (Vec<u8>,) =
        sqlx::query_as("SELECT checksum FROM _sqlx_migrations WHERE version = 4")
            .fetch_one(&mut *conn)
            .await
            .expect("checksum");
    (index, checksum)
}

async fn a_database_migrated_with_the_first_0004_is_brought_up_and_starts(backend: Backend) {
    let db = TestDb::new(backend);
    drop(db.store(1).await);
    let (index, checksum) = match backend {
        Backend::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(&db.direct_url)
                .await
                .expect("connect");
            rewind_to_the_first_0004::<sqlx::Sqlite>(&mut conn).await;
            drop(db.store(1).await);
            index_and_checksum::<sqlx::Sqlite>(
                &mut conn,
                "SELECT sql FROM sqlite_master WHERE name = 'ledger_entries_by_run'",
            )
            .await
        }
        _ => {
            let mut conn = sqlx::PgConnection::connect(&db.direct_url)
                .await
                .expect("connect");
            rewind_to_the_first_0004::<sqlx::Postgres>(&mut conn).await;
            drop(db.store(1).await);
            index_and_checksum::<sqlx::Postgres>(
                &mut conn,
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'ledger_entries_by_run'",
            )
            .await
        }
    };
    assert!(
        index.contains("(run_id, tenant, started_at)"),
        "the run index is the current one: {index}"
    );
    let current = &released()[&(
        if backend == Backend::Sqlite {
            "sqlite"
        } else {
            "postgres"
        }
        .to_string(),
        "0004_arguments_and_runs.sql".to_string(),
    )];
    assert_eq!(&hex::encode(checksum), current);
}
