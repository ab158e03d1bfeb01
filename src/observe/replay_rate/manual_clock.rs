//! A clock moved by hand, for the tests of both parts.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::domain::Micros;
use crate::domain::time::Clock;

/// A clock moved by hand.
pub(super) struct Manual(pub(super) AtomicI64);

impl Clock for Manual {
    fn now(&self) -> Micros {
        Micros(self.0.load(Ordering::SeqCst))
    }
}

impl Manual {
    /// Moves the clock `seconds` on.
    pub(super) fn advance(&self, seconds: i64) {
        self.0.fetch_add(seconds * 1_000_000, Ordering::SeqCst);
    }
}
