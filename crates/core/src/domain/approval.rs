//! Approvals: a call that must wait for a person's decision. The decision is bound to the
//! exact arguments (the entry's fingerprint), lets the approved call act once, and has two
//! deadlines: `decide_by` (an undecided request expires) and `execute_by` (an approval not
//! used in time expires). Which calls are gated is the server's [`Policy`] (or the claim's
//! own `require_approval`).

use std::collections::HashMap;

use super::fields::Principal;
use super::time::Micros;

/// Where an entry's approval stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ApprovalState {
    /// No approval is involved.
    #[default]
    None,
    /// A person has been asked; undecided until `decide_by`.
    Requested,
    /// Approved: the next claim before `execute_by` acts, once.
    Approved,
    /// Declined.
    Denied,
    /// Undecided by `decide_by`, or approved but unused by `execute_by`: nothing was done.
    Expired,
    /// Approved and used by the claim that acted.
    Used,
}

impl ApprovalState {
    /// The name stored in the database (empty for none) and shown to operators.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::None => "",
            ApprovalState::Requested => "REQUESTED",
            ApprovalState::Approved => "APPROVED",
            ApprovalState::Denied => "DENIED",
            ApprovalState::Expired => "EXPIRED",
            ApprovalState::Used => "USED",
        }
    }

    /// Parses a stored name; `None` for anything else.
    #[must_use]
    pub fn parse(s: &str) -> Option<ApprovalState> {
        Some(match s {
            "" => ApprovalState::None,
            "REQUESTED" => ApprovalState::Requested,
            "APPROVED" => ApprovalState::Approved,
            "DENIED" => ApprovalState::Denied,
            "EXPIRED" => ApprovalState::Expired,
            "USED" => ApprovalState::Used,
            _ => return None,
        })
    }
}

/// The approval of an entry's intent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Approval {
    /// Where it stands.
    pub state: ApprovalState,
    /// When the person was asked (the current request's).
    pub requested_at: Option<Micros>,
    /// Until when the request may be decided.
    pub decide_by: Option<Micros>,
    /// When it was decided.
    pub decided_at: Option<Micros>,
    /// Who decided: the approver credential's principal.
    pub decided_by: Principal,
    /// Why, in the approver's words.
    pub reason: String,
    /// Until when an approval may be used.
    pub execute_by: Option<Micros>,
}

impl Approval {
    /// A request made at `now`, to be decided by `decide_by`.
    #[must_use]
    pub fn requested(now: Micros, decide_by: Micros) -> Approval {
        Approval {
            state: ApprovalState::Requested,
            requested_at: Some(now),
            decide_by: Some(decide_by),
            ..Approval::default()
        }
    }

    /// Whether the request or the approval has run out at `now`: undecided past `decide_by`,
    /// or approved and unused past `execute_by`.
    #[must_use]
    pub fn lapsed(&self, now: Micros) -> bool {
        self.runs_until().is_some_and(|by| now >= by)
    }

    /// Until when an open request may be decided (`decide_by`), or an approval given may be
    /// used (`execute_by`); `None` once it was used, denied or lapsed. What the stores write
    /// as `COALESCE(approval_execute_by, approval_decide_by)` of an entry awaiting a decision.
    #[must_use]
    pub fn runs_until(&self) -> Option<Micros> {
        match self.state {
            ApprovalState::Requested => self.decide_by,
            ApprovalState::Approved => self.execute_by,
            _ => None,
        }
    }

    /// Whether an approval used by an attempt still covers a retry at `now`: it covers the
    /// attempts made before its `execute_by`; a retry after it must be approved again, so that
    /// nothing acts on a stale yes.
    #[must_use]
    pub fn covers_retry_at(&self, now: Micros) -> bool {
        self.state != ApprovalState::Used || self.execute_by.is_some_and(|by| now < by)
    }

    /// Why the request or approval lapsed, in words (the lapse's error and history detail).
    #[must_use]
    pub fn lapsed_words(&self) -> String {
        let at = |m: Option<Micros>| m.map(super::time::rfc3339).unwrap_or_default();
        if self.state == ApprovalState::Approved {
            format!(
                "approved by {} but not used by {}: nothing was done; the next claim asks again",
                self.decided_by,
                at(self.execute_by)
            )
        } else {
            format!(
                "not decided by {}: nothing was done; the next claim asks again",
                at(self.decide_by)
            )
        }
    }
}

/// A person's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The call may act, once.
    Approve,
    /// The call must not act.
    Deny,
}

impl Decision {
    /// The approval state this decision leads to.
    #[must_use]
    pub fn state(self) -> ApprovalState {
        match self {
            Decision::Approve => ApprovalState::Approved,
            Decision::Deny => ApprovalState::Denied,
        }
    }

    /// Its name in logs and metrics.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approved",
            Decision::Deny => "denied",
        }
    }
}

/// What a decision does to an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecideOutcome {
    /// The entry does not exist (any more).
    NotFound,
    /// The fingerprint the person was shown is not the entry's: other arguments.
    Mismatch,
    /// The entry awaits no decision: none was asked for, or the request or approval lapsed.
    NotAwaiting,
    /// The same decision was taken already: nothing to do.
    AlreadyThat,
    /// The other decision was taken already: refused.
    Conflicting,
    /// Record the decision (compare-and-set on the request still open).
    Apply,
}

/// Decides what `decision` about the entry (`approval`, `fingerprint`; `None` when absent or
/// expired) does at `now`, given the fingerprint the person was shown.
#[must_use]
pub fn decide_decision(
    entry: Option<(&Approval, &str)>,
    shown_fingerprint: &str,
    decision: Decision,
    now: Micros,
) -> DecideOutcome {
    let Some((approval, fingerprint)) = entry else {
        return DecideOutcome::NotFound;
    };
    if fingerprint != shown_fingerprint {
        return DecideOutcome::Mismatch;
    }
    let taken = match approval.state {
        ApprovalState::None | ApprovalState::Expired => return DecideOutcome::NotAwaiting,
        ApprovalState::Requested if approval.lapsed(now) => return DecideOutcome::NotAwaiting,
        ApprovalState::Requested => return DecideOutcome::Apply,
        ApprovalState::Approved | ApprovalState::Used => Decision::Approve,
        ApprovalState::Denied => Decision::Deny,
    };
    if taken == decision {
        DecideOutcome::AlreadyThat
    } else {
        DecideOutcome::Conflicting
    }
}

/// One rule of the approval policy: calls of `tool` (of `tenant`, or any tenant) need a
/// person's decision, always or only when a numeric argument passes a threshold.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// The tenant it applies to; `None` for every tenant (`*`).
    pub tenant: Option<String>,
    /// The tool it gates.
    pub tool: String,
    /// Only when the number at this JSON pointer (RFC 6901) of the arguments passes this
    /// bound; always when `None`.
    pub threshold: Option<Threshold>,
    /// The line of the policy file it was read from.
    pub line: usize,
}

/// A numeric condition on one argument.
#[derive(Clone, Debug, PartialEq)]
pub struct Threshold {
    /// Where the number is, as a JSON pointer (`/amount`, `/refund/total`).
    pub pointer: String,
    /// `>` or `>=`.
    pub inclusive: bool,
    /// The bound.
    pub bound: f64,
}

impl Threshold {
    /// A threshold as a policy line writes it: a JSON pointer, `>` or `>=`, and a finite
    /// number (the approval policy's and the MCP gateway's `gate` alike).
    ///
    /// # Errors
    /// What is wrong with which word, for the caller to put after its line number.
    pub fn parse(pointer: &str, op: &str, bound: &str) -> Result<Threshold, String> {
        let inclusive = match op {
            ">" => false,
            ">=" => true,
            other => return Err(format!("`{other}` is not a comparison: use > or >=")),
        };
        if !pointer.starts_with('/') {
            return Err(format!(
                "`{pointer}` is not a JSON pointer (it starts with /, as /amount)"
            ));
        }
        let bound: f64 = bound
            .parse()
            .ok()
            .filter(|b: &f64| b.is_finite())
            .ok_or_else(|| format!("`{bound}` is not a number"))?;
        Ok(Threshold {
            pointer: pointer.to_string(),
            inclusive,
            bound,
        })
    }

    /// Whether `arguments` pass it. An argument that is missing or not a number gates the
    /// call: the person decides what the rule cannot judge.
    #[must_use]
    pub fn gates(&self, arguments: &serde_json::Value) -> bool {
        match arguments
            .pointer(&self.pointer)
            .and_then(serde_json::Value::as_f64)
        {
            Some(n) if self.inclusive => n >= self.bound,
            Some(n) => n > self.bound,
            None => true,
        }
    }
}

/// The server's approval policy (`--approval-policy FILE`): which calls need a person's
/// decision. One rule a line, `#` starts a comment:
///
/// ```text
/// # tenant  tool            [pointer  op  bound]
/// *         delete_account
/// acme      issue_refund    /amount   >   100
/// ```
///
/// A tenant's own rule for a tool replaces the `*` rule for it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {
    rules: HashMap<String, Vec<Rule>>,
}

impl Policy {
    /// No call is gated (no file).
    #[must_use]
    pub fn none() -> Policy {
        Policy::default()
    }

    /// Reads a policy file's text.
    ///
    /// # Errors
    /// The line that does not parse, and why.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let mut rules: HashMap<String, Vec<Rule>> = HashMap::new();
        for (n, raw) in text.lines().enumerate() {
            let line = n + 1;
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let words: Vec<&str> = content.split_whitespace().collect();
            let (tenant, tool, threshold) = match words.as_slice() {
                [tenant, tool] => (*tenant, *tool, None),
                [tenant, tool, pointer, op, bound] => (
                    *tenant,
                    *tool,
                    Some(
                        Threshold::parse(pointer, op, bound)
                            .map_err(|why| format!("line {line}: {why}"))?,
                    ),
                ),
                _ => {
                    return Err(format!(
                        "line {line}: expected `<tenant|*> <tool>` or `<tenant|*> <tool> \
                         <json-pointer> <>|>=> <number>`"
                    ));
                }
            };
            if tool.chars().any(char::is_control) || tenant.chars().any(char::is_control) {
                return Err(format!("line {line}: control characters"));
            }
            rules.entry(tool.to_string()).or_default().push(Rule {
                tenant: (tenant != "*").then(|| tenant.to_string()),
                tool: tool.to_string(),
                threshold,
                line,
            });
        }
        Ok(Policy { rules })
    }

    /// Whether any rule gates `tool` for some tenant: calls of other tools need no look at
    /// their arguments.
    #[must_use]
    pub fn mentions(&self, tool: &str) -> bool {
        self.rules.contains_key(tool)
    }

    /// The rule that gates a call of `tool` by `tenant` with `arguments` (canonical JSON
    /// text), if any. The tenant's own rules for the tool replace the `*` ones.
    #[must_use]
    pub fn gate(&self, tenant: &str, tool: &str, arguments: &str) -> Option<&Rule> {
        let rules = self.rules.get(tool)?;
        let own: Vec<&Rule> = rules
            .iter()
            .filter(|r| r.tenant.as_deref() == Some(tenant))
            .collect();
        let applicable: Vec<&Rule> = if own.is_empty() {
            rules.iter().filter(|r| r.tenant.is_none()).collect()
        } else {
            own
        };
        if applicable.is_empty() {
            return None;
        }
        let parsed: Option<serde_json::Value> = if applicable.iter().any(|r| r.threshold.is_some())
        {
            serde_json::from_str(arguments).ok()
        } else {
            None
        };
        applicable
            .into_iter()
            .find(|r| match (&r.threshold, &parsed) {
                (None, _) => true,
                (Some(t), Some(args)) => t.gates(args),
                // Arguments that do not parse cannot be judged: gated.
                (Some(_), None) => true,
            })
    }

    /// How many rules it holds (for the start-up and reload logs).
    #[must_use]
    pub fn len(&self) -> usize {
        self.rules.values().map(Vec::len).sum()
    }

    /// Whether it gates nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Micros = Micros(1_000_000_000);

    #[test]
    fn a_policy_gates_per_tenant_and_tool_and_by_threshold() {
        let policy = Policy::parse(
            "# who   tool           [pointer op bound]\n\
             *       delete_account\n\
             *       issue_refund   /amount >  100\n\
             acme    issue_refund   /amount >= 500   # acme's own limit\n\
             \n",
        )
        .expect("parses");
        assert_eq!(policy.len(), 3);
        assert!(policy.gate("globex", "delete_account", "{}").is_some());
        assert!(policy.gate("globex", "send_email", "{}").is_none());
        assert!(!policy.mentions("send_email"));
        // The `*` rule: over 100.
        assert!(
            policy
                .gate("globex", "issue_refund", r#"{"amount":100}"#)
                .is_none()
        );
        assert!(
            policy
                .gate("globex", "issue_refund", r#"{"amount":100.5}"#)
                .is_some()
        );
        // Acme's own rule replaces it: at or over 500.
        assert!(
            policy
                .gate("acme", "issue_refund", r#"{"amount":499}"#)
                .is_none()
        );
        let rule = policy.gate("acme", "issue_refund", r#"{"amount":500}"#);
        assert_eq!(rule.map(|r| r.line), Some(4));
        // What a threshold cannot judge is gated: a missing or non-numeric argument.
        assert!(
            policy
                .gate("globex", "issue_refund", r#"{"total":1}"#)
                .is_some()
        );
        assert!(
            policy
                .gate("globex", "issue_refund", r#"{"amount":"5"}"#)
                .is_some()
        );
    }

    #[test]
    fn a_bad_policy_line_is_named() {
        for (text, line) in [
            ("* a\nacme\n", "line 2"),
            ("* t amount > 1\n", "line 1"),
            ("\n\n* t /amount < 1\n", "line 3"),
            ("* t /amount > lots\n", "line 1"),
            ("* t /amount > inf\n", "line 1"),
        ] {
            let e = Policy::parse(text).expect_err(text);
            assert!(e.starts_with(line), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_decision_binds_to_the_fingerprint_and_is_taken_once() {
        let open = Approval::requested(NOW, NOW.plus(Micros(10)));
        let approve = Decision::Approve;
        assert_eq!(
            decide_decision(Some((&open, "fp")), "fp", approve, NOW),
            DecideOutcome::Apply
        );
        assert_eq!(
            decide_decision(Some((&open, "fp")), "other", approve, NOW),
            DecideOutcome::Mismatch
        );
        assert_eq!(
            decide_decision(None, "fp", approve, NOW),
            DecideOutcome::NotFound
        );
        // Past decide_by, the request lapsed: nothing to decide.
        assert_eq!(
            decide_decision(Some((&open, "fp")), "fp", approve, NOW.plus(Micros(10))),
            DecideOutcome::NotAwaiting
        );
        let approved = Approval {
            state: ApprovalState::Approved,
            ..open.clone()
        };
        for taken in [
            approved,
            Approval {
                state: ApprovalState::Used,
                ..open.clone()
            },
        ] {
            assert_eq!(
                decide_decision(Some((&taken, "fp")), "fp", approve, NOW),
                DecideOutcome::AlreadyThat
            );
            assert_eq!(
                decide_decision(Some((&taken, "fp")), "fp", Decision::Deny, NOW),
                DecideOutcome::Conflicting
            );
        }
        let none = Approval::default();
        assert_eq!(
            decide_decision(Some((&none, "fp")), "fp", approve, NOW),
            DecideOutcome::NotAwaiting
        );
    }

    #[test]
    fn states_read_back_as_stored() {
        for state in [
            ApprovalState::None,
            ApprovalState::Requested,
            ApprovalState::Approved,
            ApprovalState::Denied,
            ApprovalState::Expired,
            ApprovalState::Used,
        ] {
            assert_eq!(ApprovalState::parse(state.as_str()), Some(state));
        }
        assert_eq!(ApprovalState::parse("MAYBE"), None);
    }
}
