//! PostgreSQL's multi-row claims and completions, for the group commit: one statement per
//! batch, its rows bound as one array per column.

use super::PgStore;
use crate::domain::{Entry, Key, Tenant};
use crate::storage::sql::{self, Param};
use crate::storage::sql_store::run_on;
use crate::storage::{Finish, Finished, FinishedRow, StoreError, StoreResult};

/// [`PgStore::INSERT_MANY`], named here so that the statement is visibly a constant.
const INSERT_MANY: &str = PgStore::INSERT_MANY;
/// [`PgStore::FINISH_MANY`], likewise.
const FINISH_MANY: &str = PgStore::FINISH_MANY;

/// [`Store::insert_many`](crate::storage::Store::insert_many): one statement, each column one
/// array.
pub(super) async fn insert_many(
    store: &PgStore,
    batch: &[(Tenant, Entry)],
) -> StoreResult<Vec<bool>> {
    // Rows go in (tenant, key) order, so that two batches sharing keys lock them in the
    // same order and cannot deadlock; the sort is stable, so the first entry of a key
    // still wins.
    let rows = in_key_order(batch, |e| &e.key);
    // One array per column of the claim's list, borrowed by each try of the statement.
    let columns = sql::CLAIM
        .iter()
        .map(|c| Array::of(c, &rows))
        .collect::<StoreResult<Vec<_>>>()?;
    let columns = &columns;
    let inserted: Vec<String> = run_on(store, &store.pool, move |mut conn| async move {
        let result: Result<_, sqlx::Error> = async {
            let mut args = sqlx::postgres::PgArguments::default();
            for column in columns {
                column.add_to(&mut args).map_err(sqlx::Error::Encode)?;
            }
            sqlx::query_scalar_with(self::INSERT_MANY, args)
                .persistent(store.persistent())
                .fetch_all(&mut *conn)
                .await
        }
        .await;
        (conn, result)
    })
    .await?;
    let inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
    Ok(batch
        .iter()
        .map(|(_, e)| inserted.contains(e.claim_token.as_str()))
        .collect())
}

/// [`Store::finish_many`](crate::storage::Store::finish_many): one statement, each column one
/// array.
pub(super) async fn finish_many(
    store: &PgStore,
    batch: &[(Tenant, Finish)],
) -> StoreResult<Vec<Option<Finished>>> {
    // In (tenant, key) order, as insert_many, so two batches cannot deadlock.
    let cmds = in_key_order(batch, |c| &c.key);
    let col = |f: fn(&Finish) -> String| cmds.iter().map(|(_, c)| f(c)).collect::<Vec<_>>();
    let tenants: Vec<&str> = cmds.iter().map(|(t, _)| t.as_str()).collect();
    let keys = col(|c| c.key.as_str().to_owned());
    let tokens = col(|c| c.claim_token.as_str().to_owned());
    let statuses = col(|c| c.completion.status().as_str().to_string());
    let results: Vec<Vec<u8>> = cmds
        .iter()
        .map(|(_, c)| c.completion.result().to_vec())
        .collect();
    let errors = col(|c| c.completion.error().to_owned());
    let retryables: Vec<bool> = cmds.iter().map(|(_, c)| c.completion.retryable()).collect();
    let nows: Vec<i64> = cmds.iter().map(|(_, c)| c.now.0).collect();
    let also_unknown: Vec<bool> = cmds.iter().map(|(_, c)| c.also_unknown).collect();
    // Borrowed by each try of the statement.
    let (tenants, keys, tokens, statuses, results, errors, retryables, nows, also_unknown) = (
        &tenants,
        &keys,
        &tokens,
        &statuses,
        &results,
        &errors,
        &retryables,
        &nows,
        &also_unknown,
    );
    let rows: Vec<FinishedRow> = run_on(store, &store.pool, move |mut conn| async move {
        let result: Result<_, sqlx::Error> = async {
            sqlx::query_as(self::FINISH_MANY)
                .bind(tenants)
                .bind(keys)
                .bind(tokens)
                .bind(statuses)
                .bind(results)
                .bind(errors)
                .bind(retryables)
                .bind(nows)
                .bind(also_unknown)
                .persistent(store.persistent())
                .fetch_all(&mut *conn)
                .await
        }
        .await;
        (conn, result)
    })
    .await?;
    // Tokens are unique, so they tell which command each written row answers.
    let mut written: std::collections::HashMap<crate::domain::ClaimToken, Finished> = rows
        .into_iter()
        .map(|r| Finished::try_from(r).map(|f| (f.entry.claim_token.clone(), f)))
        .collect::<StoreResult<_>>()?;
    Ok(batch
        .iter()
        .map(|(_, c)| written.remove(&c.claim_token))
        .collect())
}

/// One column of a multi-row INSERT: its values for every row, in (tenant, key) order, as one
/// array of the column's type.
enum Array<'a> {
    Text(Vec<&'a str>),
    MaybeText(Vec<Option<&'a str>>),
    Bytes(Vec<&'a [u8]>),
    Int(Vec<i64>),
    MaybeInt(Vec<Option<i64>>),
    Flag(Vec<bool>),
}

impl<'a> Array<'a> {
    /// The values of `column` for `rows`. A column gives one kind of [`Param`] for every
    /// entry (`sql`'s tests hold it), so the array takes its first row's kind.
    fn of(column: &sql::Column, rows: &[&'a (Tenant, Entry)]) -> StoreResult<Array<'a>> {
        let mut values = rows.iter().map(|(t, e)| (column.value)(t, e));
        let mut array = match values.next() {
            Some(Param::Text(_)) | None => Array::Text(Vec::with_capacity(rows.len())),
            Some(Param::MaybeText(_)) => Array::MaybeText(Vec::with_capacity(rows.len())),
            Some(Param::Bytes(_)) => Array::Bytes(Vec::with_capacity(rows.len())),
            Some(Param::Int(_)) => Array::Int(Vec::with_capacity(rows.len())),
            Some(Param::MaybeInt(_)) => Array::MaybeInt(Vec::with_capacity(rows.len())),
            Some(Param::Flag(_)) => Array::Flag(Vec::with_capacity(rows.len())),
        };
        for (t, e) in rows {
            match (&mut array, (column.value)(t, e)) {
                (Array::Text(a), Param::Text(v)) => a.push(v),
                (Array::MaybeText(a), Param::MaybeText(v)) => a.push(v),
                (Array::Bytes(a), Param::Bytes(v)) => a.push(v),
                (Array::Int(a), Param::Int(v)) => a.push(v),
                (Array::MaybeInt(a), Param::MaybeInt(v)) => a.push(v),
                (Array::Flag(a), Param::Flag(v)) => a.push(v),
                (_, other) => {
                    return Err(StoreError::Internal(format!(
                        "column {} gave {other:?} after another kind",
                        column.name
                    )));
                }
            }
        }
        Ok(array)
    }

    /// Binds the array as the statement's next parameter.
    fn add_to(
        &self,
        args: &mut sqlx::postgres::PgArguments,
    ) -> Result<(), sqlx::error::BoxDynError> {
        use sqlx::Arguments as _;
        match self {
            Array::Text(a) => args.add(a.as_slice()),
            Array::MaybeText(a) => args.add(a.as_slice()),
            Array::Bytes(a) => args.add(a.as_slice()),
            Array::Int(a) => args.add(a.as_slice()),
            Array::MaybeInt(a) => args.add(a.as_slice()),
            Array::Flag(a) => args.add(a.as_slice()),
        }
    }
}

/// The rows of `batch` sorted by (tenant, key), stably: the order in which a multi-row
/// statement takes their row locks, the same for every batch.
fn in_key_order<T>(batch: &[(Tenant, T)], key: fn(&T) -> &Key) -> Vec<&(Tenant, T)> {
    let mut rows: Vec<&(Tenant, T)> = batch.iter().collect();
    rows.sort_by(|a, b| (a.0.as_str(), key(&a.1)).cmp(&(b.0.as_str(), key(&b.1))));
    rows
}
