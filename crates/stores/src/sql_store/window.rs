//! The windows of intent of calls that name no run (the MCP gateway's): the generation of a
//! call's window counted, read, and counted with the call's entry inserted a statement at a
//! time, as a backend without a transaction of its own for it does (PostgreSQL: the window's
//! upsert serializes concurrent first calls, and the entry's primary key concurrent claimants,
//! as for any claim).

use super::super::sql::{self, Param};
use super::super::{EntryRow, IntentWindow, StoreError, StoreResult};
use super::{Dialect, On, at_most_one};
use crate::domain::{Entry, Key, Micros, Tenant};

/// A generation as stored, as a count (it is at least 1: the table's CHECK).
///
/// # Errors
/// `Internal` for a stored generation below 1 (a bug).
pub(crate) fn generation(stored: i64) -> StoreResult<u64> {
    u64::try_from(stored)
        .ok()
        .filter(|g| *g >= 1)
        .ok_or_else(|| StoreError::Internal(format!("a generation of {stored}")))
}

/// [`sql::INTENT_GENERATION`]'s parameters.
pub(crate) fn counting<'a>(
    tenant: &'a Tenant,
    fingerprint: &'a str,
    now: Micros,
    window: Micros,
    keep: bool,
) -> [Param<'a>; 5] {
    [
        Param::Text(tenant.as_str()),
        Param::Text(fingerprint),
        Param::Int(now.0),
        Param::Int(window.0),
        Param::Flag(keep),
    ]
}

/// [`Store::intent_generation`](super::super::Store::intent_generation).
pub(super) async fn intent_generation<D: Dialect>(
    store: &D,
    tenant: &Tenant,
    fingerprint: &str,
    now: Micros,
    window: Micros,
    keep: bool,
) -> StoreResult<u64> {
    let params = counting(tenant, fingerprint, now, window, keep);
    let rows: Vec<(i64,)> = store
        .fetch_all(sql::INTENT_GENERATION, &params, On::Pool)
        .await?;
    let (stored,) = at_most_one(rows, "INTENT_GENERATION")?
        .ok_or_else(|| StoreError::Internal("INTENT_GENERATION returned no row".into()))?;
    generation(stored)
}

/// [`Store::current_intent_generation`](super::super::Store::current_intent_generation).
pub(super) async fn current_generation<D: Dialect>(
    store: &D,
    tenant: &Tenant,
    fingerprint: &str,
) -> StoreResult<Option<u64>> {
    let params = [Param::Text(tenant.as_str()), Param::Text(fingerprint)];
    let rows: Vec<(i64,)> = store
        .fetch_all(sql::CURRENT_INTENT_GENERATION, &params, On::Pool)
        .await?;
    at_most_one(rows, "CURRENT_INTENT_GENERATION")?
        .map(|(stored,)| generation(stored))
        .transpose()
}

/// [`Store::insert_in_window`](super::super::Store::insert_in_window) a statement at a time:
/// the window read, the current intent's entry read where the window ended (only an
/// unresolved one keeps it), the window counted, the entry inserted.
pub(super) async fn in_steps<D: Dialect>(
    store: &D,
    tenant: &Tenant,
    window: &IntentWindow<'_>,
    entry_for: &(dyn Fn(u64) -> Entry + Send + Sync),
) -> StoreResult<(u64, bool)> {
    let params = [
        Param::Text(tenant.as_str()),
        Param::Text(window.fingerprint),
    ];
    let current: Vec<(i64, i64)> = store
        .fetch_all(sql::CURRENT_INTENT, &params, On::Pool)
        .await?;
    let keep = match at_most_one(current, "CURRENT_INTENT")? {
        Some((stored, last_seen)) if window.ended(Micros(last_seen)) => {
            let key = entry_for(generation(stored)?).key;
            window.held_open_by(get(store, tenant, &key).await?)
        }
        _ => false,
    };
    let generation = intent_generation(
        store,
        tenant,
        window.fingerprint,
        window.now,
        window.within,
        keep,
    )
    .await?;
    let entry = entry_for(generation);
    let params = sql::entry_params(tenant, &entry);
    let inserted = store.execute(sql::INSERT, &params, On::Pool).await? == 1;
    Ok((generation, inserted))
}

/// The entry of `key`, if any.
async fn get<D: Dialect>(store: &D, tenant: &Tenant, key: &Key) -> StoreResult<Option<Entry>> {
    let params = [Param::Text(tenant.as_str()), Param::Text(key.as_str())];
    let rows: Vec<EntryRow> = store.fetch_all(sql::GET, &params, On::Pool).await?;
    at_most_one(rows, "GET")?.map(Entry::try_from).transpose()
}
