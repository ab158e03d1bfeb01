//! Throwaway servers for the integration tests (`tests/api/support` re-exports this crate) and
//! the benchmark (`bench/`): one harness, so a fix to how a cluster starts, what it trusts or how
//! it is cleaned up reaches both.
//!
//! - [`postgres`]: PostgreSQL clusters copied from an `initdb`'d template, started on a free
//!   loopback port as an unprivileged user when we are root, stopped and deleted on drop or by
//!   a watchdog when the owning process dies.
//! - [`pgbouncer`]: PgBouncer in front of such a cluster.
//! - [`counting_alloc`]: an allocator for unit tests that counts what each thread allocates.
//! - [`proxy`]: a TCP proxy between a server and PostgreSQL that injects faults on demand
//!   (latency, partitions, resets, cuts at a commit or mid-message).
//! - [`history`]: the history checker: a recorded history of claims, completions and
//!   reconciliations, and its judgement against the effects an outside world saw.
//! - [`hostile`]: proptest strategies for hostile inputs (odd strings, JSON, enums, durations,
//!   bytes), which the no-panic test builds requests from.
//!
//! Both panic with the server's log when a server cannot start: their callers are tests and a
//! benchmark, for which a failed start is the end of the run.

pub mod counting_alloc;
pub mod history;
pub mod hostile;
pub mod pgbouncer;
pub mod postgres;
pub mod proxy;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::TcpListener;

/// A port that is free now, for a listener the caller cannot bind itself (a server process).
/// Drawn below Linux's ephemeral range (32768 and up): a port the kernel hands out for `:0` is
/// also what it hands to outgoing connections, which could take it before the server binds it.
///
/// # Panics
///
/// When none of a thousand draws is free.
pub fn free_port() -> u16 {
    // RandomState is seeded per process and per instance: enough to spread concurrent
    // processes over the range.
    let state = RandomState::new();
    for draw in 0..1000u32 {
        let port = 20_000 + (state.hash_one(draw) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range");
}
