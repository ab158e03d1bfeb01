//! Announcements between the servers that share a PostgreSQL database: `NOTIFY` when an entry
//! a claim waits for changed, and one `LISTEN` connection per server that relays them.

use super::PgStore;
use crate::domain::{Key, Tenant};
use crate::storage::StoreResult;
use crate::storage::sql::Param;
use crate::storage::sql_store::{Dialect as _, On};

/// The channel servers announce completions on; the payload is `tenant key` (tenants have no
/// whitespace, keys are printable ASCII).
const WAKE_CHANNEL: &str = "ledger_wake";

/// Tells the other servers that (tenant, key) changed: a `NOTIFY` on [`WAKE_CHANNEL`].
pub(super) async fn announce(store: &PgStore, tenant: &Tenant, key: &Key) -> StoreResult<()> {
    let payload = format!("{} {}", tenant.as_str(), key.as_str());
    let params = [Param::Text(WAKE_CHANNEL), Param::Text(&payload)];
    store
        .execute("SELECT pg_notify($1, $2)", &params, On::Pool)
        .await?;
    Ok(())
}

/// Starts the one `LISTEN` connection that relays the other servers' announcements.
pub(super) fn subscribe(store: &PgStore) -> Option<tokio::sync::mpsc::Receiver<(Tenant, Key)>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let pool = store.listen_pool.clone();
    tokio::spawn(async move {
        // One dedicated connection LISTENs; sqlx reconnects it after a failure, and the
        // waiters' own slow poll covers whatever was announced while it was down. It ends
        // when nobody holds the receiver any more (the server stopped its relay), also
        // while it waits for a notification or a reconnection.
        let closed = tx.clone();
        tokio::select! {
            () = relay_announcements(pool, tx) => {}
            () = closed.closed() => tracing::debug!("announcements unsubscribed; LISTEN ends"),
        }
    });
    Some(rx)
}

/// Forwards the notifications of [`WAKE_CHANNEL`] to `tx`, reconnecting as needed, until `tx`
/// has no receiver.
async fn relay_announcements(pool: sqlx::PgPool, tx: tokio::sync::mpsc::Sender<(Tenant, Key)>) {
    loop {
        let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "cannot LISTEN yet; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(WAKE_CHANNEL).await {
            tracing::debug!(error = %e, "LISTEN failed; retrying");
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            continue;
        }
        loop {
            match listener.recv().await {
                Ok(n) => {
                    tracing::debug!(payload = n.payload(), "announcement received");
                    let Some((tenant, key)) = n.payload().split_once(' ') else {
                        continue;
                    };
                    // Another server's announcement of a stored key: trusted as stored values.
                    let announced = (
                        Tenant::from_stored(tenant.to_string()),
                        Key::from_stored(key.to_string()),
                    );
                    if tx.send(announced).await.is_err() {
                        return; // nobody consumes announcements any more
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "LISTEN connection lost; reconnecting");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}
