//! The windows of intent of calls that name no run (the MCP gateway's): a call's window
//! counted, and its entry inserted, a statement at a time, as a backend without a transaction
//! of its own for it does (PostgreSQL: the window's upsert serializes concurrent first calls,
//! and the entry's primary key concurrent claimants, as for any claim).

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

/// Counts the window with [`sql::INTENT_GENERATION`]: its generation.
async fn count<D: Dialect>(
    store: &D,
    tenant: &Tenant,
    window: &IntentWindow<'_>,
    keep: bool,
) -> StoreResult<u64> {
    let params = counting(tenant, window.fingerprint, window.now, window.within, keep);
    let rows: Vec<(i64,)> = store
        .fetch_all(sql::INTENT_GENERATION, &params, On::Pool)
        .await?;
    let (stored,) = at_most_one(rows, "INTENT_GENERATION")?
        .ok_or_else(|| StoreError::Internal("INTENT_GENERATION returned no row".into()))?;
    generation(stored)
}

/// [`Store::count_window`](super::super::Store::count_window) a statement at a time: the
/// window read, the current intent's entry read where the window ended (only an unresolved
/// one keeps it), the window counted, the entry inserted when one is given.
pub(super) async fn in_steps<D: Dialect>(
    store: &D,
    tenant: &Tenant,
    window: &IntentWindow<'_>,
    key_for: &(dyn Fn(u64) -> Key + Send + Sync),
    entry_for: Option<&(dyn Fn(u64) -> Entry + Send + Sync)>,
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
            window.held_open_by(get(store, tenant, &key_for(generation(stored)?)).await?)
        }
        _ => false,
    };
    let generation = count(store, tenant, window, keep).await?;
    let Some(entry_for) = entry_for else {
        return Ok((generation, false));
    };
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
