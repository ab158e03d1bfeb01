//! The judgement of a recorded history: key by key, against the world's effects and each
//! key's final entry, plus every answer's code. The run's own floors (did enough happen, did
//! the faults hit) are the caller's: they depend on its workload.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use tonic::Code;

use super::{Answer, Effect, EntryStatus, Op, Seen, short};

/// What the ledger holds for each key the run touched, and what a Claim of it answers now.
#[derive(Default)]
pub struct Finals {
    /// Each key's entry as a Lookup after the run found it (`None`: not found).
    pub entries: BTreeMap<String, Option<Seen>>,
    /// For each key that succeeded, what one more Claim answered.
    pub claims: BTreeMap<String, Answer>,
}

/// What the check found.
pub struct Verdict {
    /// Each thing wrong, one line each, the key first when it is about one.
    pub problems: Vec<String>,
    /// The keys with problems, for [`evidence`].
    pub suspects: BTreeSet<String>,
    /// Counts of what the history holds, for the run's summary and floors.
    pub figures: Figures,
}

/// Counts of what a history holds.
#[derive(Default)]
pub struct Figures {
    /// Calls per RPC.
    pub calls: BTreeMap<&'static str, u64>,
    /// Claims' outcomes (`CLAIMED`, `REPLAYED`, …) answered.
    pub outcomes: BTreeMap<String, u64>,
    /// Failed calls, by `code/reason`, and those with no answer.
    pub errors: BTreeMap<String, u64>,
    /// Keys judged.
    pub keys: usize,
    /// Effects in the world.
    pub effects: usize,
    /// Acknowledged completions checked against the final entries.
    pub acknowledged: u64,
    /// `REPLAYED` answers checked against the final entries.
    pub replays: u64,
}

/// Judges a history: no answer `INTERNAL` (nor an OK answer of the wrong kind, recorded as an
/// error with code `Ok`), and for each key of `finals`:
///
/// - at most one effect in the world for the intent, and no mark of a possible double effect;
/// - nothing in flight: the entry is `SUCCEEDED` or `FAILED` (retryable: nobody reports a
///   permanent failure);
/// - an effect, if any, as the entry's result, byte for byte, at the effect's attempt; and a
///   `SUCCEEDED` entry only with an effect;
/// - every acknowledged completion (a Complete answered OK, an entry a Reconcile resolved)
///   present: the success's result byte for byte, a failure at its attempt or followed by a
///   later one;
/// - every `REPLAYED` answer carrying that result, and the Claim after the run replaying it;
/// - one token per claimed attempt, and no `PREVIOUSLY_FAILED`.
pub fn check(ops: &[Op], effects: &[Effect], finals: &Finals) -> Verdict {
    let mut problems = Vec::new();
    let mut suspects = BTreeSet::new();
    let mut figures = Figures {
        keys: finals.entries.len(),
        effects: effects.len(),
        ..Figures::default()
    };

    // Every answer: no INTERNAL from any server.
    for op in ops {
        if op.call != "client" {
            *figures.calls.entry(op.call).or_default() += 1;
        }
        match &op.answer {
            Answer::Error {
                code,
                reason,
                message,
            } => {
                *figures
                    .errors
                    .entry(format!("{code:?}/{reason}"))
                    .or_default() += 1;
                if *code == Code::Internal || *code == Code::Ok {
                    problems.push(format!(
                        "{} {} on server {:?} of {} at {:.3}s answered {code:?} {reason} {message:?}",
                        op.actor,
                        op.call,
                        op.server,
                        op.key,
                        op.sent.as_secs_f64()
                    ));
                }
            }
            Answer::Unanswered => *figures.errors.entry("no answer".into()).or_default() += 1,
            Answer::Claimed { .. } => *figures.outcomes.entry("CLAIMED".into()).or_default() += 1,
            Answer::Replayed(_) => *figures.outcomes.entry("REPLAYED".into()).or_default() += 1,
            Answer::InProgress(_) => {
                *figures.outcomes.entry("IN_PROGRESS".into()).or_default() += 1;
            }
            Answer::PreviouslyFailed(_) => {
                *figures
                    .outcomes
                    .entry("PREVIOUSLY_FAILED".into())
                    .or_default() += 1;
            }
            _ => {}
        }
    }

    // Key by key.
    for (key, fin) in &finals.entries {
        let of_key: Vec<&Op> = ops.iter().filter(|op| op.names(key)).collect();
        let mine: Vec<&Effect> = effects.iter().filter(|e| e.key == *key).collect();
        let trouble = check_key(
            key,
            fin.as_ref(),
            &of_key,
            &mine,
            finals.claims.get(key),
            &mut figures,
        );
        if !trouble.is_empty() {
            suspects.insert(key.clone());
            problems.extend(trouble.into_iter().map(|t| format!("{key}: {t}")));
        }
    }
    Verdict {
        problems,
        suspects,
        figures,
    }
}

/// The history of (up to four of) the `suspects`, one line per op about each, then its effects
/// in the world.
pub fn evidence(ops: &[Op], effects: &[Effect], suspects: &BTreeSet<String>) -> String {
    let mut evidence = String::new();
    for key in suspects.iter().take(4) {
        let _ = writeln!(evidence, "--- the history of {key} ---");
        for op in ops.iter().filter(|op| op.names(key)) {
            let _ = writeln!(
                evidence,
                "{:>8.3}s +{:>4}ms {:<6} {:<9} server {:?}: {}",
                op.sent.as_secs_f64(),
                op.took.as_millis(),
                op.actor,
                op.call,
                op.server,
                describe(&op.answer)
            );
        }
        for e in effects.iter().filter(|e| e.key == *key) {
            let _ = writeln!(
                evidence,
                "world: effect of attempt {} by {} at {:.3}s: {}",
                e.attempt,
                e.by,
                e.at.as_secs_f64(),
                short(&e.receipt)
            );
        }
    }
    evidence
}

/// What is wrong with one key: its effects in the world, its final entry `fin`, the ops about
/// it and the Claim sent after the check's Lookup.
fn check_key(
    key: &str,
    fin: Option<&Seen>,
    of_key: &[&Op],
    mine: &[&Effect],
    final_claim: Option<&Answer>,
    figures: &mut Figures,
) -> Vec<String> {
    let mut trouble = Vec::new();
    if mine.len() > 1 {
        trouble.push(format!(
            "{} effects for one intent: {}",
            mine.len(),
            mine.iter()
                .map(|e| format!(
                    "attempt {} by {} at {:.3}s",
                    e.attempt,
                    e.by,
                    e.at.as_secs_f64()
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    // No finding in this workload can say an earlier attempt acted while a later one was
    // started (an attempt is only retried after a failure before acting, or a read that found
    // nothing after its lease ended): a mark means the ledger applied or judged a finding
    // about what it did not see.
    if fin.is_some_and(|f| f.possible_double_effect) {
        trouble.push("marked as a possible double effect".into());
    }
    match fin {
        None => {
            if !mine.is_empty()
                || of_key
                    .iter()
                    .any(|op| matches!(op.answer, Answer::Claimed { .. }))
            {
                trouble.push("claimed (and maybe acted on) but Lookup finds nothing".into());
            }
        }
        Some(fin) => {
            match fin.status {
                EntryStatus::Succeeded => {}
                EntryStatus::Failed if fin.retryable => {}
                other => trouble.push(format!(
                    "left {other:?} (retryable {}) at attempt {} once reconciled",
                    fin.retryable, fin.attempt
                )),
            }
            match mine.first() {
                Some(effect)
                    if fin.status != EntryStatus::Succeeded
                        || fin.result != effect.receipt
                        || fin.attempt != effect.attempt =>
                {
                    trouble.push(format!(
                        "the world has attempt {}'s effect {} but the ledger holds {:?} at \
                         attempt {} with {}",
                        effect.attempt,
                        short(&effect.receipt),
                        fin.status,
                        fin.attempt,
                        short(&fin.result)
                    ));
                }
                Some(_) => {}
                None if fin.status == EntryStatus::Succeeded => trouble.push(format!(
                    "SUCCEEDED with {} at attempt {} but nothing happened in the world",
                    short(&fin.result),
                    fin.attempt
                )),
                None => {}
            }
            check_answers(key, fin, of_key, figures, &mut trouble);
            if fin.status == EntryStatus::Succeeded {
                match final_claim {
                    Some(Answer::Replayed(seen)) if seen.result == fin.result => {}
                    other => trouble.push(format!(
                        "a Claim now does not replay the stored result: {other:?}"
                    )),
                }
            }
        }
    }
    trouble
}

/// What the answers about one key said against its final entry `fin`: every acknowledged
/// outcome kept, every replay the stored result, no attempt claimed by two tokens, nobody told
/// of a permanent failure.
fn check_answers(
    key: &str,
    fin: &Seen,
    of_key: &[&Op],
    figures: &mut Figures,
    trouble: &mut Vec<String>,
) {
    let mut tokens: BTreeMap<u32, BTreeSet<&str>> = BTreeMap::new();
    for op in of_key {
        let acknowledged = match &op.answer {
            Answer::Completed { entry, .. } => vec![entry],
            Answer::Reconciled { resolved, .. } => {
                resolved.iter().filter(|s| s.key == *key).collect()
            }
            _ => Vec::new(),
        };
        for ack in acknowledged {
            figures.acknowledged += 1;
            let kept = match ack.status {
                EntryStatus::Succeeded => {
                    fin.status == EntryStatus::Succeeded
                        && fin.result == ack.result
                        && fin.attempt == ack.attempt
                }
                EntryStatus::Failed => {
                    fin.attempt > ack.attempt
                        || (fin.attempt == ack.attempt && fin.status == EntryStatus::Failed)
                }
                // A resolution of an attempt still in flight returns it as it is.
                _ => op.call == "Reconcile",
            };
            if !kept {
                trouble.push(format!(
                    "{} {} acknowledged {:?} at attempt {} with {}, but the ledger \
                     holds {:?} at attempt {} with {}",
                    op.actor,
                    op.call,
                    ack.status,
                    ack.attempt,
                    short(&ack.result),
                    fin.status,
                    fin.attempt,
                    short(&fin.result)
                ));
            }
        }
        match &op.answer {
            Answer::Replayed(seen) => {
                figures.replays += 1;
                if fin.status != EntryStatus::Succeeded || seen.result != fin.result {
                    trouble.push(format!(
                        "{} was replayed {} at {:.3}s, but the ledger holds {:?} \
                         with {}",
                        op.actor,
                        short(&seen.result),
                        op.sent.as_secs_f64(),
                        fin.status,
                        short(&fin.result)
                    ));
                }
            }
            Answer::Claimed { attempt, token } => {
                tokens.entry(*attempt).or_default().insert(token);
            }
            Answer::PreviouslyFailed(seen) => trouble.push(format!(
                "{} got PREVIOUSLY_FAILED at attempt {}: nobody reports a permanent \
                 failure",
                op.actor, seen.attempt
            )),
            _ => {}
        }
    }
    for (attempt, tokens) in tokens {
        if tokens.len() > 1 {
            trouble.push(format!(
                "attempt {attempt} was claimed by {} tokens",
                tokens.len()
            ));
        }
    }
}

/// An answer, one line, for a report.
pub fn describe(answer: &Answer) -> String {
    let seen = |s: &Seen| {
        format!(
            "{:?} attempt {} {}{}",
            s.status,
            s.attempt,
            short(&s.result),
            if s.retryable { " retryable" } else { "" }
        )
    };
    match answer {
        Answer::Claimed { attempt, token } => format!("CLAIMED attempt {attempt} token {token}"),
        Answer::Replayed(s) => format!("REPLAYED {}", seen(s)),
        Answer::InProgress(s) => format!("IN_PROGRESS {}", seen(s)),
        Answer::PreviouslyFailed(s) => format!("PREVIOUSLY_FAILED {}", seen(s)),
        Answer::Completed { entry, already } => {
            format!("completed: {} (already_completed {already})", seen(entry))
        }
        Answer::Reconciled { pending, resolved } => format!(
            "pending {pending:?}, resolved [{}]",
            resolved
                .iter()
                .map(|s| format!("{} {}", s.key, seen(s)))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        Answer::Looked(s) => format!("lookup: {}", s.as_ref().map_or("NOT_FOUND".into(), seen)),
        Answer::Error {
            code,
            reason,
            message,
        } => format!("{code:?} {reason} {message:?}"),
        Answer::Unanswered => "no answer".into(),
        Answer::Did(what) => what.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::history::History;

    fn effect(attempt: u32, receipt: &[u8]) -> Effect {
        Effect {
            key: "k".into(),
            external_ref: format!("k#{attempt}"),
            attempt,
            receipt: receipt.to_vec(),
            by: "w1".into(),
            at: Duration::ZERO,
        }
    }

    fn entry(status: EntryStatus, attempt: u32, result: &[u8]) -> Seen {
        Seen {
            key: "k".into(),
            status,
            attempt,
            result: result.to_vec(),
            retryable: status == EntryStatus::Failed,
            possible_double_effect: false,
        }
    }

    /// Finals for key `k` holding `fin`, whose Claim after the run replayed it.
    fn settled_at(fin: Seen) -> Finals {
        let mut finals = Finals::default();
        finals
            .claims
            .insert("k".into(), Answer::Replayed(fin.clone()));
        finals.entries.insert("k".into(), Some(fin));
        finals
    }

    fn claimed(history: &History, attempt: u32) {
        let answer = Answer::Claimed {
            attempt,
            token: format!("t{attempt}"),
        };
        history.record("w1", Some(0), "Claim", "k", history.started, answer);
    }

    #[test]
    fn one_effect_kept_as_the_result_passes() {
        let history = History::new();
        claimed(&history, 1);
        let fin = entry(EntryStatus::Succeeded, 1, b"r1");
        let verdict = check(&history.ops(), &[effect(1, b"r1")], &settled_at(fin));
        assert!(verdict.problems.is_empty(), "{:?}", verdict.problems);
    }

    #[test]
    fn two_effects_for_one_intent_are_found() {
        let history = History::new();
        claimed(&history, 1);
        claimed(&history, 2);
        let fin = entry(EntryStatus::Succeeded, 2, b"r2");
        let effects = [effect(1, b"r1"), effect(2, b"r2")];
        let verdict = check(&history.ops(), &effects, &settled_at(fin));
        assert!(
            verdict
                .problems
                .iter()
                .any(|p| p.contains("2 effects for one intent")),
            "{:?}",
            verdict.problems
        );
        assert!(verdict.suspects.contains("k"));
    }

    #[test]
    fn an_acknowledged_success_the_ledger_lost_is_found() {
        let history = History::new();
        claimed(&history, 1);
        let acknowledged = Answer::Completed {
            entry: entry(EntryStatus::Succeeded, 1, b"r1"),
            already: false,
        };
        history.record(
            "w1",
            Some(0),
            "Complete",
            "k",
            history.started,
            acknowledged,
        );
        let fin = entry(EntryStatus::Failed, 1, b"");
        let verdict = check(&history.ops(), &[effect(1, b"r1")], &settled_at(fin));
        assert!(
            verdict
                .problems
                .iter()
                .any(|p| p.contains("acknowledged Succeeded")),
            "{:?}",
            verdict.problems
        );
    }

    #[test]
    fn an_internal_answer_is_found() {
        let history = History::new();
        let internal = Answer::Error {
            code: Code::Internal,
            reason: "INTERNAL".into(),
            message: "bug".into(),
        };
        history.record("w1", Some(0), "Claim", "k", history.started, internal);
        let verdict = check(&history.ops(), &[], &Finals::default());
        assert_eq!(verdict.problems.len(), 1, "{:?}", verdict.problems);
    }
}
