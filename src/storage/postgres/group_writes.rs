//! PostgreSQL's multi-row claims and completions, for the group commit: one statement per
//! batch, its rows bound as one array per column.

use super::PgStore;
use crate::domain::{Entry, Key, Tenant};
use crate::storage::sql_store::run_on;
use crate::storage::{Finish, Finished, FinishedRow, StoreResult};

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
    // Borrowed by each try of the statement.
    let c = &InsertColumns::of(&rows);
    let inserted: Vec<String> = run_on(store, &store.pool, move |mut conn| async move {
        let result: Result<_, sqlx::Error> = async {
            sqlx::query_scalar(PgStore::INSERT_MANY)
                .bind(&c.tenants)
                .bind(&c.keys)
                .bind(&c.run_ids)
                .bind(&c.tools)
                .bind(&c.fingerprints)
                .bind(&c.statuses)
                .bind(&c.attempts)
                .bind(&c.tokens)
                .bind(&c.results)
                .bind(&c.errors)
                .bind(&c.retryables)
                .bind(&c.principals)
                .bind(&c.started)
                .bind(&c.finished)
                .bind(&c.leases)
                .bind(&c.retentions)
                .bind(&c.expires)
                .bind(&c.replays)
                .bind(&c.arguments)
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
            sqlx::query_as(PgStore::FINISH_MANY)
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

/// The columns of a multi-row INSERT, one array per column in the order of
/// [`PgStore::INSERT_MANY`]'s `unnest`, from rows in (tenant, key) order.
struct InsertColumns<'a> {
    tenants: Vec<&'a str>,
    keys: Vec<String>,
    run_ids: Vec<String>,
    tools: Vec<String>,
    fingerprints: Vec<String>,
    statuses: Vec<String>,
    attempts: Vec<i64>,
    tokens: Vec<String>,
    results: Vec<Vec<u8>>,
    errors: Vec<String>,
    retryables: Vec<bool>,
    principals: Vec<String>,
    started: Vec<i64>,
    finished: Vec<Option<i64>>,
    leases: Vec<i64>,
    retentions: Vec<i64>,
    expires: Vec<Option<i64>>,
    replays: Vec<i64>,
    arguments: Vec<Option<String>>,
}

impl<'a> InsertColumns<'a> {
    fn of(rows: &[&'a (Tenant, Entry)]) -> InsertColumns<'a> {
        let col = |f: fn(&Entry) -> String| rows.iter().map(|(_, e)| f(e)).collect::<Vec<_>>();
        let int = |f: fn(&Entry) -> i64| rows.iter().map(|(_, e)| f(e)).collect::<Vec<_>>();
        let opt = |f: fn(&Entry) -> Option<i64>| rows.iter().map(|(_, e)| f(e)).collect::<Vec<_>>();
        InsertColumns {
            tenants: rows.iter().map(|(t, _)| t.as_str()).collect(),
            keys: col(|e| e.key.as_str().to_owned()),
            // An entry without a run stores the empty text, as the one-row INSERT does.
            run_ids: col(|e| e.run_id.as_ref().map_or("", |r| r.as_str()).to_owned()),
            tools: col(|e| e.tool.as_str().to_owned()),
            fingerprints: col(|e| e.fingerprint.clone()),
            statuses: col(|e| e.status.as_str().to_string()),
            attempts: int(|e| i64::from(e.attempt)),
            tokens: col(|e| e.claim_token.as_str().to_owned()),
            results: rows.iter().map(|(_, e)| e.result.clone()).collect(),
            errors: col(|e| e.error.clone()),
            retryables: rows.iter().map(|(_, e)| e.retryable).collect(),
            principals: col(|e| e.principal.as_str().to_owned()),
            started: int(|e| e.started_at.0),
            finished: opt(|e| e.finished_at.map(|m| m.0)),
            leases: int(|e| e.lease_expires_at.0),
            retentions: int(|e| e.retention.0),
            expires: opt(|e| e.expires_at.map(|m| m.0)),
            replays: int(|e| i64::try_from(e.replay_count).unwrap_or(i64::MAX)),
            arguments: rows.iter().map(|(_, e)| e.arguments.clone()).collect(),
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
