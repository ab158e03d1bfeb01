//! The console's sessions: a table in the server's memory, keyed by a random id that the
//! browser holds in an HttpOnly, SameSite=Strict cookie. A session carries the CSRF token its
//! forms must send back, and once signed in, its tenant (and with credentials configured, the
//! digest of the token it signed in with, so that a credential removed from the tokens file no
//! longer opens the console).
//!
//! Bounded in time (an idle timeout and a lifetime) and in number ([`MAX_SESSIONS`]: when full,
//! the oldest session is dropped). Keyed by the sha256 of the cookie's value, so that the
//! table's memory holds no usable cookie. A restart signs everyone out.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use sha2::{Digest, Sha256};

use super::html::Flash;
use crate::credentials::Credential;
use crate::domain::{Micros, Tenant};
use crate::error::LedgerError;

/// Most sessions kept at once; the oldest goes first beyond it.
pub const MAX_SESSIONS: usize = 10_000;

/// Longest a session lasts, however busy.
pub const LIFETIME: Micros = Micros(12 * 3600 * 1_000_000);

/// Who a signed-in session acts for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedIn {
    /// The tenant whose entries it sees.
    pub tenant: Tenant,
    /// The digest of the token it signed in with; `None` without credentials configured.
    pub credential: Option<Credential>,
    /// The name the operator gave, for the audit trail (`resolved_by`); may be empty.
    pub operator: String,
}

/// One session, as a request sees it.
#[derive(Clone, Debug)]
pub struct Session {
    /// The value its forms must send back as `csrf`.
    pub csrf: String,
    /// Whom it acts for, once signed in.
    pub signed_in: Option<SignedIn>,
    /// A message for the next page it shows.
    pub flash: Option<Flash>,
    /// When it began.
    created: Micros,
    /// When it was last used.
    last_seen: Micros,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<[u8; 32], Session>,
    /// Ids by creation, oldest first (some may be gone already).
    order: VecDeque<[u8; 32]>,
}

/// The session table of one console.
pub struct Sessions {
    table: Mutex<Table>,
    /// A session unused this long is over.
    idle: Micros,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// 32 random bytes, hex.
///
/// # Errors
/// The system has no randomness to give.
pub fn random_hex() -> Result<String, LedgerError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| LedgerError::Internal(format!("no randomness for a console session: {e}")))?;
    Ok(hex::encode(bytes))
}

/// Compares two secrets in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Sessions {
    /// An empty table whose sessions end after `idle` without a request.
    pub fn new(idle: Micros) -> Sessions {
        Sessions {
            table: Mutex::default(),
            idle,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A poisoned lock only means a panic elsewhere mid-update; the map is still usable.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a session at `now`; its id (the cookie's value) and the session.
    ///
    /// # Errors
    /// No randomness for the id or the CSRF token.
    pub fn create(
        &self,
        now: Micros,
        signed_in: Option<SignedIn>,
    ) -> Result<(String, Session), LedgerError> {
        let id = random_hex()?;
        let session = Session {
            csrf: random_hex()?,
            signed_in,
            flash: None,
            created: now,
            last_seen: now,
        };
        let key = digest(&id);
        let mut table = self.lock();
        while table.by_id.len() >= MAX_SESSIONS {
            let Some(oldest) = table.order.pop_front() else {
                break;
            };
            table.by_id.remove(&oldest);
        }
        // Drop the ids of sessions that ended meanwhile from the front, so the queue stays
        // near the table's size.
        while let Some(front) = table.order.front() {
            if table.by_id.contains_key(front) {
                break;
            }
            table.order.pop_front();
        }
        table.by_id.insert(key, session.clone());
        table.order.push_back(key);
        Ok((id, session))
    }

    /// The live session with this id at `now` (its idle time restarts), taking its flash
    /// message; `None` when there is none or it ended (then it is removed).
    pub fn get(&self, id: &str, now: Micros) -> Option<Session> {
        let key = digest(id);
        let mut table = self.lock();
        let session = table.by_id.get_mut(&key)?;
        let over =
            now.minus(session.last_seen) >= self.idle || now.minus(session.created) >= LIFETIME;
        if over {
            table.by_id.remove(&key);
            return None;
        }
        session.last_seen = now;
        let seen = session.clone();
        session.flash = None;
        Some(seen)
    }

    /// Ends the session with this id.
    pub fn remove(&self, id: &str) {
        self.lock().by_id.remove(&digest(id));
    }

    /// Leaves `flash` for the next page of the session with this id.
    pub fn flash(&self, id: &str, flash: Flash) {
        if let Some(session) = self.lock().by_id.get_mut(&digest(id)) {
            session.flash = Some(flash);
        }
    }

    /// Remembers the operator's name in the session with this id.
    pub fn set_operator(&self, id: &str, operator: &str) {
        if let Some(SignedIn { operator: name, .. }) = self
            .lock()
            .by_id
            .get_mut(&digest(id))
            .and_then(|s| s.signed_in.as_mut())
        {
            operator.clone_into(name);
        }
    }

    /// How many sessions the table holds (ended ones included until they are next asked for).
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: i64 = 60_000_000;

    fn signed_in() -> Option<SignedIn> {
        Some(SignedIn {
            tenant: Tenant::default_tenant(),
            credential: None,
            operator: String::new(),
        })
    }

    #[test]
    fn a_session_is_found_by_its_id_only_and_has_its_own_csrf_token() {
        let sessions = Sessions::new(Micros(30 * MINUTE));
        let (id, session) = sessions.create(Micros(0), signed_in()).expect("create");
        let (other, _) = sessions.create(Micros(0), None).expect("create");
        assert_eq!(id.len(), 64);
        assert_ne!(id, other);
        assert_ne!(id, session.csrf);
        let found = sessions.get(&id, Micros(1)).expect("found");
        assert_eq!(found.csrf, session.csrf);
        assert!(found.signed_in.is_some());
        assert!(sessions.get(&session.csrf, Micros(1)).is_none());
        assert!(sessions.get("", Micros(1)).is_none());
    }

    #[test]
    fn a_session_ends_when_idle_and_after_its_lifetime() {
        let sessions = Sessions::new(Micros(30 * MINUTE));
        let (id, _) = sessions.create(Micros(0), signed_in()).expect("create");
        // Used every 20 minutes, it lives on, until its lifetime ends.
        let mut now = 0;
        while now + 20 * MINUTE < LIFETIME.0 {
            now += 20 * MINUTE;
            assert!(sessions.get(&id, Micros(now)).is_some(), "at {now}");
        }
        assert!(sessions.get(&id, LIFETIME).is_none());
        let (idle, _) = sessions.create(Micros(0), signed_in()).expect("create");
        assert!(sessions.get(&idle, Micros(30 * MINUTE)).is_none());
        // Gone for good.
        assert!(sessions.get(&idle, Micros(1)).is_none());
    }

    #[test]
    fn a_full_table_drops_its_oldest_session() {
        let sessions = Sessions::new(Micros(30 * MINUTE));
        let (first, _) = sessions.create(Micros(0), None).expect("create");
        let (second, _) = sessions.create(Micros(0), None).expect("create");
        for _ in 2..MAX_SESSIONS {
            sessions.create(Micros(0), None).expect("create");
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
        sessions.create(Micros(0), None).expect("create");
        assert_eq!(sessions.len(), MAX_SESSIONS);
        assert!(sessions.get(&first, Micros(1)).is_none());
        assert!(sessions.get(&second, Micros(1)).is_some());
    }

    #[test]
    fn a_flash_message_is_shown_once() {
        let sessions = Sessions::new(Micros(30 * MINUTE));
        let (id, _) = sessions.create(Micros(0), signed_in()).expect("create");
        let flash = Flash {
            text: "done".into(),
            good: true,
        };
        sessions.flash(&id, flash.clone());
        assert_eq!(
            sessions.get(&id, Micros(1)).and_then(|s| s.flash),
            Some(flash)
        );
        assert_eq!(sessions.get(&id, Micros(2)).and_then(|s| s.flash), None);
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert!(!same_secret("", "a"));
    }
}
