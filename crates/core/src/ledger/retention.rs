//! Retention: finished entries past their expiry are deleted in small batches.

use super::Ledger;
use crate::error::LedgerError;
#[cfg(doc)]
use crate::storage::Store;

impl Ledger {
    /// Deletes finished entries past their expiry, `batch` at a time, until none is left;
    /// returns how many. Each batch is one short statement, so claims never wait long. First
    /// it keeps every paused run's entries (see [`Store::keep_paused_runs`]), so that what a
    /// paused run finished is kept even where its write could not see the pause.
    ///
    /// # Errors
    /// `Unavailable`/`Internal` from the store; batches already deleted stay deleted.
    pub async fn prune(&self, batch: u32) -> Result<u64, LedgerError> {
        let kept = self.store.keep_paused_runs().await?;
        if kept > 0 {
            tracing::info!(
                kept,
                "kept paused runs' entries that finished as their run paused"
            );
        }
        let mut total = 0;
        loop {
            let deleted = self.store.prune(self.clock.now(), batch).await?;
            total += deleted;
            if deleted < u64::from(batch) {
                return Ok(total);
            }
            // Let claims waiting for the write lock (SQLite) or for I/O go first.
            tokio::task::yield_now().await;
        }
    }
}
