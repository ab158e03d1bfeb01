//! A global allocator for unit tests: the system's, counting on each thread the allocations
//! made and the bytes live, so that a test can measure what a piece of code allocates (nextest
//! runs each test in a process of its own; the counts are per thread besides). A crate's tests
//! install it with `#[global_allocator] static A: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LIVE_BYTES: Cell<i64> = const { Cell::new(0) };
}

/// The system allocator, counting.
pub struct Counting;

// SAFETY: every call is passed on to the system allocator unchanged; the counts are plain
// thread-local cells, which need no allocation (`const` initialised), and are skipped while the
// thread's locals are torn down.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        let _ = LIVE_BYTES.try_with(|n| n.set(n.get() + layout.size() as i64));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE_BYTES.try_with(|n| n.set(n.get() - layout.size() as i64));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Heap allocations made on this thread so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Bytes allocated on this thread and not yet freed (on any thread), as requested.
pub fn live_bytes() -> i64 {
    LIVE_BYTES.with(Cell::get)
}
