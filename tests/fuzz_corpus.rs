//! The `canonicalize` fuzz target's seed corpus as an ordinary test on stable: every file of
//! `fuzz/corpus/canonicalize/` goes through the same checks as the fuzzer (`fuzz/check.rs`),
//! and every violation is reported, not just the first.

#[path = "../fuzz/check.rs"]
mod check;

use std::path::Path;

#[test]
fn every_seed_of_the_canonicalize_corpus_passes_the_fuzz_checks() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/canonicalize");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    entries.sort();
    assert!(
        entries.len() >= 100,
        "only {} seeds in {}",
        entries.len(),
        dir.display()
    );
    let mut failures = Vec::new();
    for path in &entries {
        let data =
            std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        if let Err(violation) = check::check_bytes(&data) {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            failures.push(format!("{name}: {violation}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} seeds violate a property:\n{}",
        failures.len(),
        entries.len(),
        failures.join("\n")
    );
}

/// The checks themselves catch what they should: a sanity test of the oracle.
#[test]
fn the_checks_accept_the_documented_exception_and_the_model_agrees_on_known_cases() {
    use idempotency_ledger::domain::canonical::{Canonicalization, JsonLimits, canonicalize};

    // 2^60 written exactly is accepted; its canonical text is refused on re-parse, which is
    // the documented exception, not a violation.
    let canonical = canonicalize(
        r#"{"n":1152921504606846976}"#,
        Canonicalization::Jcs,
        &JsonLimits::default(),
    )
    .expect("2^60 written exactly is accepted");
    assert_eq!(canonical, r#"{"n":1152921504606847000}"#);
    let err = canonicalize(&canonical, Canonicalization::Jcs, &JsonLimits::default())
        .expect_err("its shortest form is an inexact integer");
    assert_eq!(err.reason(), "UNSAFE_INTEGER");
    check::check_unsafe_integer_exception(&canonical, &err).expect("the documented exception");
    // A refusal of canonical text for any other reason is not excused.
    let other = canonicalize(
        r#"{"n":1e400}"#,
        Canonicalization::Jcs,
        &JsonLimits::default(),
    )
    .expect_err("beyond the double range");
    assert!(check::check_unsafe_integer_exception(r#"{"n":1e400}"#, &other).is_err());

    for (literal, inexact) in [
        ("9007199254740992", false),
        ("9007199254740993", true),
        ("1152921504606846976", false),
        ("1152921504606847000", true),
        ("1e22", false),
        // An exponent makes a double, whatever its value.
        ("1e23", false),
        ("9007199254740993.0", false),
        ("90071992547409930e-1", false),
        ("100e-2", false),
        ("0.5", false),
        ("9007199254740993.5", false),
        ("-0", false),
        ("1180591620717411303424", false),
    ] {
        assert_eq!(check::model::inexact_integer(literal), inexact, "{literal}");
    }
}
