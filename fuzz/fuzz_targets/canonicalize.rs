//! Fuzzes key canonicalization and derivation: arbitrary bytes, if UTF-8, are canonicalized in
//! both modes under the default and small limits, compared with an independent reference model,
//! re-canonicalized (idempotence, up to the documented UNSAFE_INTEGER exception), and hashed into
//! a key and fingerprint. Every property lives in `../check.rs`, which `tests/fuzz_corpus.rs`
//! also runs over the seed corpus on stable.
//!
//! Run on nightly: `cargo +nightly fuzz run canonicalize` (see `fuzz/README.md`).

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../check.rs"]
mod check;

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = check::check_bytes(data) {
        panic!("{violation}");
    }
});
