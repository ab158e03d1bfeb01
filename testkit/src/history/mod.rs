//! The history checker: what a run of the ledger under faults did, recorded call by call, and
//! the judgement of that record against what the outside world saw.
//!
//! It owns the model, not the run: the tests (`tests/api/history.rs`) start the servers, run
//! the clients and the nemesis, and translate each gRPC answer into an [`Answer`]; this module
//! knows nothing of the service's crate or its proto types, so it builds without the service
//! and judges any client's history the same way.
//!
//! - [`World`]: the outside world the clients act on, recording every [`Effect`] and never
//!   deduplicating (keeping an intent to one effect is the ledger's job), and answering "did
//!   this happen?" as a tool's own read would.
//! - [`History`]: the recorder; every call (or client action) becomes an [`Op`] with its
//!   actor, server, key, send time, duration and [`Answer`].
//! - [`check()`]: once the run is over and each key's final entry was looked up ([`Finals`]),
//!   the key-by-key judgement: at most one effect per intent, nothing left in flight, the
//!   effect as the entry's result, every acknowledged completion kept, every replay faithful,
//!   one token per attempt, no `INTERNAL` answer. [`evidence`] prints the history of the keys
//!   it found wrong.
//!
//! ```
//! use std::time::Duration;
//! use testkit::history::{check, Answer, Effect, EntryStatus, Finals, History, Seen, World};
//!
//! let world = World::default();
//! let history = History::new();
//! history.record("w1", Some(0), "Claim", "k", history.started, Answer::Claimed {
//!     attempt: 1,
//!     token: "t1".into(),
//! });
//! world.act(Effect {
//!     key: "k".into(),
//!     external_ref: "k#1".into(),
//!     attempt: 1,
//!     receipt: b"ok".to_vec(),
//!     by: "w1".into(),
//!     at: Duration::ZERO,
//! });
//! let mut finals = Finals::default();
//! let fin = Seen {
//!     key: "k".into(),
//!     status: EntryStatus::Succeeded,
//!     attempt: 1,
//!     result: b"ok".to_vec(),
//!     retryable: false,
//!     possible_double_effect: false,
//! };
//! finals.claims.insert("k".into(), Answer::Replayed(fin.clone()));
//! finals.entries.insert("k".into(), Some(fin));
//! let verdict = check(&history.ops(), &world.effects(), &finals);
//! assert!(verdict.problems.is_empty(), "{:?}", verdict.problems);
//! ```

mod check;

pub use check::{Figures, Finals, Verdict, check, describe, evidence};

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;

/// One effect of a tool call in the outside world.
#[derive(Clone, Debug)]
pub struct Effect {
    /// The ledger key of the intent that acted.
    pub key: String,
    /// The reference the tool was given, by which the world answers "did this happen?".
    pub external_ref: String,
    /// The ledger attempt that acted.
    pub attempt: u32,
    /// What the tool answered: the result the ledger must end up holding.
    pub receipt: Vec<u8>,
    /// The actor (worker) that acted.
    pub by: String,
    /// When, since the history started.
    pub at: Duration,
}

/// The outside world the workers act on: it records every effect and never deduplicates
/// (keeping intents to one effect is the ledger's job).
#[derive(Default)]
pub struct World {
    effects: Mutex<Vec<Effect>>,
}

impl World {
    /// Records an effect.
    pub fn act(&self, effect: Effect) {
        lock(&self.effects).push(effect);
    }

    /// Records the effect `make` gives only if `in_time()` still holds, both in one step that
    /// no [`World::did_it_happen`] can pass: an actor bound to act within a deadline checks it
    /// here, not before, so that a pause between its check and its act (a thread descheduled
    /// on a loaded machine) can never land the effect after a reader was told it did not
    /// happen. Whether it acted.
    pub fn act_if(&self, in_time: impl FnOnce() -> bool, make: impl FnOnce() -> Effect) -> bool {
        let mut effects = lock(&self.effects);
        if !in_time() {
            return false;
        }
        effects.push(make());
        true
    }

    /// "Did this happen?", by the reference the tool was given: the receipt if it did.
    pub fn did_it_happen(&self, external_ref: &str) -> Option<Vec<u8>> {
        lock(&self.effects)
            .iter()
            .find(|e| e.external_ref == external_ref)
            .map(|e| e.receipt.clone())
    }

    /// Every effect so far, in the order they happened.
    pub fn effects(&self) -> Vec<Effect> {
        lock(&self.effects).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An entry's status as an answer showed it, as far as the check tells statuses apart: the
/// two an entry may settle at, and any other by its name (the caller maps the ledger's proto
/// statuses, which this crate does not know).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryStatus {
    /// The effect happened; the result is stored.
    Succeeded,
    /// The effect did not happen.
    Failed,
    /// Any other status (in flight, unknown, awaiting a person, denied, none), by name.
    Other(&'static str),
}

/// An entry as an answer showed it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The entry's key.
    pub key: String,
    /// Its status.
    pub status: EntryStatus,
    /// Its attempt.
    pub attempt: u32,
    /// Its stored result (empty unless it succeeded).
    pub result: Vec<u8>,
    /// Whether a failure may be tried again.
    pub retryable: bool,
    /// Whether the ledger marked it as a possible double effect.
    pub possible_double_effect: bool,
}

impl Seen {
    /// What an answer without an entry shows for `key`.
    pub fn nothing(key: &str) -> Seen {
        Seen {
            key: key.to_string(),
            status: EntryStatus::Other("none"),
            attempt: 0,
            result: Vec::new(),
            retryable: false,
            possible_double_effect: false,
        }
    }
}

/// What a call got back, or what a client did.
#[derive(Clone, Debug)]
pub enum Answer {
    /// A Claim answered `CLAIMED`: the attempt is the caller's, with its token.
    Claimed {
        /// The attempt claimed.
        attempt: u32,
        /// The claim token it was given.
        token: String,
    },
    /// A Claim answered `REPLAYED` with this entry.
    Replayed(Seen),
    /// A Claim answered `IN_PROGRESS`.
    InProgress(Seen),
    /// A Claim answered `PREVIOUSLY_FAILED`.
    PreviouslyFailed(Seen),
    /// A Complete answered OK.
    Completed {
        /// The entry it returned.
        entry: Seen,
        /// Whether it said the entry was already completed.
        already: bool,
    },
    /// A Reconcile answered OK.
    Reconciled {
        /// The entries it handed out: key and attempt.
        pending: Vec<(String, u32)>,
        /// The entries a finding settled (only these count as acknowledged).
        resolved: Vec<Seen>,
    },
    /// A Lookup's answer (`None`: not found).
    Looked(Option<Seen>),
    /// A call failed with a status.
    Error {
        /// The status's code (`Ok` here means an answer of the wrong kind).
        code: Code,
        /// The reason in its error details.
        reason: String,
        /// Its message.
        message: String,
    },
    /// No answer within the call's deadline and a second more.
    Unanswered,
    /// Something the client did (acted, crashed, asked the world).
    Did(String),
}

/// One call (or client action) of the history.
#[derive(Clone, Debug)]
pub struct Op {
    /// Who made it (a worker, a reconciler, the check).
    pub actor: String,
    /// Which server it went to (`None` for a client's own action).
    pub server: Option<usize>,
    /// The RPC's name, or `"client"` for a client's own action.
    pub call: &'static str,
    /// The key it is about; for a Reconcile, the keys of its findings, comma-separated.
    pub key: String,
    /// When it was sent, since the history started.
    pub sent: Duration,
    /// How long its answer took.
    pub took: Duration,
    /// What came back.
    pub answer: Answer,
}

impl Op {
    /// Whether this op is about `key` (a Reconcile is about every key it resolved or handed
    /// out).
    pub fn names(&self, key: &str) -> bool {
        self.key == key
            || match &self.answer {
                Answer::Reconciled { pending, resolved } => {
                    pending.iter().any(|(k, _)| k == key) || resolved.iter().any(|s| s.key == key)
                }
                _ => self.call == "Reconcile" && self.key.split(',').any(|k| k == key),
            }
    }
}

/// The recorder every client of a run shares.
pub struct History {
    /// When the history started: ops' times count from here.
    pub started: Instant,
    ops: Mutex<Vec<Op>>,
}

impl Default for History {
    fn default() -> History {
        History::new()
    }
}

impl History {
    /// An empty history starting now.
    pub fn new() -> History {
        History {
            started: Instant::now(),
            ops: Mutex::new(Vec::new()),
        }
    }

    /// Records a call sent at `sent` and answered now.
    pub fn record(
        &self,
        actor: &str,
        server: Option<usize>,
        call: &'static str,
        key: &str,
        sent: Instant,
        answer: Answer,
    ) {
        let op = Op {
            actor: actor.to_string(),
            server,
            call,
            key: key.to_string(),
            sent: sent.saturating_duration_since(self.started),
            took: sent.elapsed(),
            answer,
        };
        lock(&self.ops).push(op);
    }

    /// Records something a client did now, outside the ledger.
    pub fn did(&self, actor: &str, key: &str, what: String) {
        self.record(
            actor,
            None,
            "client",
            key,
            Instant::now(),
            Answer::Did(what),
        );
    }

    /// Every op so far, in the order they were recorded.
    pub fn ops(&self) -> Vec<Op> {
        lock(&self.ops).clone()
    }
}

/// A result as a report shows it: its length and first bytes in hex.
pub fn short(bytes: &[u8]) -> String {
    let hex = hex::encode(&bytes[..bytes.len().min(6)]);
    format!("{}B:{hex}…", bytes.len())
}
