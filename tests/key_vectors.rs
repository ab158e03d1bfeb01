//! Runs every case of `testdata/key-vectors.json` (written by the independent Python reference
//! generator `testdata/generate_key_vectors.py`) through the server's canonicalization and key
//! derivation, and reports every case that disagrees, not just the first.

use std::collections::{HashMap, HashSet};

use idempotency_ledger::domain::canonical::{Canonicalization, JsonLimits, canonicalize};
use idempotency_ledger::domain::fields::{RunId, ToolName};
use idempotency_ledger::domain::key::{derive_key, fingerprint};
use serde::Deserialize;

#[derive(Deserialize)]
struct Vectors {
    limits: Limits,
    cases: Vec<Case>,
}

#[derive(Clone, Copy, Deserialize)]
struct Limits {
    max_bytes: usize,
    max_depth: usize,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    run_id: String,
    tool: String,
    canonicalization: String,
    arguments_json: String,
    limits: Option<Limits>,
    canonical: Option<String>,
    key: Option<String>,
    fingerprint: Option<String>,
    error: Option<String>,
    same_key_as: Option<String>,
    different_key_from: Option<String>,
    same_fingerprint_as: Option<String>,
}

/// What the Rust code computed for a case: (key, fingerprint), or the refusal reason.
type Outcome = Result<(String, String), String>;

fn load() -> Vectors {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/key-vectors.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}

/// Runs one case; `Err` describes the disagreement.
fn run_case(case: &Case, defaults: Limits) -> Result<Outcome, String> {
    let mode = match case.canonicalization.as_str() {
        "JCS" => Canonicalization::Jcs,
        "JCS_LENIENT" => Canonicalization::JcsLenient,
        other => return Err(format!("unknown canonicalization {other:?}")),
    };
    let limits = case.limits.unwrap_or(defaults);
    let limits = JsonLimits {
        max_bytes: limits.max_bytes,
        max_depth: limits.max_depth,
    };
    let run_id = RunId::parse(&case.run_id).map_err(|e| format!("run_id refused: {e}"))?;
    let tool = ToolName::parse(&case.tool).map_err(|e| format!("tool refused: {e}"))?;
    match (
        canonicalize(&case.arguments_json, mode, &limits),
        &case.error,
    ) {
        (Err(e), Some(expected)) if e.reason().as_str() == expected => Ok(Err(expected.clone())),
        (Err(e), expected) => Err(format!(
            "expected {}, refused with {} ({e})",
            expected.as_deref().unwrap_or("acceptance"),
            e.reason()
        )),
        (Ok(canonical), Some(expected)) => {
            Err(format!("expected {expected}, accepted as {canonical:?}"))
        }
        (Ok(canonical), None) => {
            let key = derive_key(&run_id, &tool, &canonical, mode);
            let fp = fingerprint(&tool, &canonical, mode);
            let mut problems = Vec::new();
            for (what, got, want) in [
                ("canonical", &canonical, &case.canonical),
                ("key", &key, &case.key),
                ("fingerprint", &fp, &case.fingerprint),
            ] {
                match want {
                    Some(want) if want == got => {}
                    Some(want) => problems.push(format!("{what}: got {got:?}, want {want:?}")),
                    None => problems.push(format!("{what} missing from the file")),
                }
            }
            if problems.is_empty() {
                Ok(Ok((key, fp)))
            } else {
                Err(problems.join("; "))
            }
        }
    }
}

/// Checks the relations a case states with other cases, on what the Rust code computed.
/// A relation with a case that itself failed is skipped: that failure is reported already.
fn check_relations(
    case: &Case,
    outcomes: &HashMap<&str, Outcome>,
    failed: &HashSet<&str>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(Ok((key, fp))) = outcomes.get(case.name.as_str()) else {
        return problems;
    };
    let relations = [
        (&case.same_key_as, "same_key_as"),
        (&case.different_key_from, "different_key_from"),
        (&case.same_fingerprint_as, "same_fingerprint_as"),
    ];
    for (other, relation) in relations {
        let Some(other) = other.as_deref() else {
            continue;
        };
        if failed.contains(other) {
            continue;
        }
        let Some(Ok((other_key, other_fp))) = outcomes.get(other) else {
            problems.push(format!(
                "{relation} names {other:?}, which is not an accepted case"
            ));
            continue;
        };
        let holds = match relation {
            "same_key_as" => key == other_key,
            "different_key_from" => key != other_key,
            _ => fp == other_fp,
        };
        if !holds {
            problems.push(format!("{relation} {other:?} does not hold"));
        }
    }
    problems
}

#[test]
fn every_key_vector_matches_the_reference_implementation() {
    let vectors = load();
    assert!(
        vectors.cases.len() >= 50,
        "only {} cases in key-vectors.json",
        vectors.cases.len()
    );
    let mut failures = Vec::new();
    let mut failed = HashSet::new();
    let mut outcomes: HashMap<&str, Outcome> = HashMap::new();
    for case in &vectors.cases {
        match run_case(case, vectors.limits) {
            Ok(outcome) => {
                outcomes.insert(&case.name, outcome);
            }
            Err(problem) => {
                failed.insert(case.name.as_str());
                failures.push(format!("{}: {problem}", case.name));
            }
        }
    }
    for case in &vectors.cases {
        for problem in check_relations(case, &outcomes, &failed) {
            failures.push(format!("{}: {problem}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} key vectors failed:\n{}",
        failures.len(),
        vectors.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn key_vector_names_are_unique() {
    let vectors = load();
    let mut seen = HashSet::new();
    let duplicates: Vec<&str> = vectors
        .cases
        .iter()
        .filter(|c| !seen.insert(c.name.as_str()))
        .map(|c| c.name.as_str())
        .collect();
    assert!(
        duplicates.is_empty(),
        "duplicate case names: {duplicates:?}"
    );
}

#[test]
fn key_vectors_cover_every_refusal_reason() {
    let vectors = load();
    for reason in [
        "INVALID_JSON",
        "DUPLICATE_MEMBER",
        "LONE_SURROGATE",
        "UNSAFE_INTEGER",
        "JSON_TOO_DEEP",
        "ARGUMENTS_TOO_LARGE",
        "ARGUMENTS_NOT_OBJECT",
    ] {
        assert!(
            vectors
                .cases
                .iter()
                .any(|c| c.error.as_deref() == Some(reason)),
            "no case refused with {reason}"
        );
    }
}
