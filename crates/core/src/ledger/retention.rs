//! Retention: finished entries past their expiry are deleted in small batches.

use super::Ledger;
use crate::error::LedgerError;

impl Ledger {
    /// Deletes finished entries past their expiry, `batch` at a time, until none is left;
    /// returns how many. Each batch is one short statement, so claims never wait long.
    ///
    /// # Errors
    /// `Unavailable`/`Internal` from the store; batches already deleted stay deleted.
    pub async fn prune(&self, batch: u32) -> Result<u64, LedgerError> {
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
