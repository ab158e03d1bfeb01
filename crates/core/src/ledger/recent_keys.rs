//! Keys this server recently saw succeed: a hint for the claim path, never a decision.

use crate::domain::{Key, Tenant};

/// How many recently finished keys the claim path remembers; the set starts over when full.
const RECENT_KEYS: usize = 65_536;

/// A bounded set of (tenant, key) hashes. A hit only makes the claim try the replay
/// statement first; the store still checks status, fingerprint and expiry, so a stale or
/// colliding entry costs one statement, never a wrong answer.
#[derive(Default)]
pub(super) struct RecentKeys(std::sync::Mutex<std::collections::HashSet<u64>>);

impl RecentKeys {
    fn hash(tenant: &Tenant, key: &Key) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (tenant.as_str(), key.as_str()).hash(&mut h);
        h.finish()
    }

    pub(super) fn insert(&self, tenant: &Tenant, key: &Key) {
        let mut set = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if set.len() >= RECENT_KEYS {
            set.clear();
        }
        set.insert(Self::hash(tenant, key));
    }

    pub(super) fn probably_contains(&self, tenant: &Tenant, key: &Key) -> bool {
        let set = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        set.contains(&Self::hash(tenant, key))
    }
}
