// The client's plain types, converted from the generated messages: enum values as strings
// without their prefix, durations in milliseconds, times as Dates, counts as numbers.

import {
  durationFromMs,
  durationMs,
  timestampDate,
  type Duration,
  type Timestamp,
} from "@bufbuild/protobuf/wkt";
import {
  ApprovalState as PbApprovalState,
  Canonicalization as PbCanonicalization,
  Outcome as PbOutcome,
  ResolutionOutcome as PbResolutionOutcome,
  Status as PbStatus,
  WaitFor as PbWaitFor,
  type Approval as PbApproval,
  type Entry,
  type ResolutionResult as PbResolutionResult,
} from "./gen/idempotency/v1/ledger_pb.js";
import type { Canonicalization } from "./keys.js";

/**
 * The state of an entry (the proto's STATUS_* without the prefix). AWAITING_APPROVAL: a person
 * has been asked and nothing was done; DENIED: a person declined it (terminal).
 */
export type EntryStatus =
  | "UNSPECIFIED"
  | "ATTEMPTING"
  | "SUCCEEDED"
  | "FAILED"
  | "UNKNOWN"
  | "AWAITING_APPROVAL"
  | "DENIED";

/**
 * What a Claim found (the proto's OUTCOME_* without the prefix). AWAITING_APPROVAL: the call
 * waits for a person's decision and nothing was done; DENIED: a person declined it.
 */
export type Outcome =
  | "UNSPECIFIED"
  | "CLAIMED"
  | "REPLAYED"
  | "IN_PROGRESS"
  | "PREVIOUSLY_FAILED"
  | "AWAITING_APPROVAL"
  | "DENIED";

/**
 * Where an entry's approval stands (the proto's APPROVAL_STATE_* without the prefix): REQUESTED
 * (undecided until decideBy), APPROVED (the next Claim acts, once, before executeBy), DENIED,
 * EXPIRED (not decided, or not used, in time: the next Claim asks again), USED (approved and
 * acted on).
 */
export type ApprovalState = "UNSPECIFIED" | "REQUESTED" | "APPROVED" | "DENIED" | "EXPIRED" | "USED";

/**
 * What a Claim's wait waits for (the proto's WAIT_FOR_* without the prefix): ATTEMPT_OR_DECISION
 * (the server's default) also holds a repeat of a call awaiting a person's decision until the
 * decision or the wait's end; ATTEMPT waits for an attempt in flight only, and answers a call
 * awaiting a decision at once.
 */
export type WaitFor = "ATTEMPT" | "ATTEMPT_OR_DECISION";

/** A person's decision (the proto's DECISION_* without the prefix). */
export type Decision = "APPROVE" | "DENY";

/** The approval of a call that needed a person's decision. */
export interface Approval {
  state: ApprovalState;
  /** When the person was asked. */
  requestedAt: Date | undefined;
  /** Until when a decision may be taken; undecided after it, the request expires. */
  decideBy: Date | undefined;
  /** When it was decided. */
  decidedAt: Date | undefined;
  /** Who decided: the approver credential's principal (never the request's). */
  decidedBy: string;
  /** Why, in the approver's words. */
  reason: string;
  /** Until when an approval may be used; unused after it, it expires. */
  executeBy: Date | undefined;
}

/** One ledger entry: one intent of one tool call. */
export interface LedgerEntry {
  key: string;
  runId: string;
  tool: string;
  fingerprint: string;
  status: EntryStatus;
  attempt: number;
  /** The stored result (SUCCEEDED), byte for byte. */
  result: Uint8Array;
  error: string;
  retryable: boolean;
  principal: string;
  startedAt: Date | undefined;
  finishedAt: Date | undefined;
  leaseExpiresAt: Date | undefined;
  expiresAt: Date | undefined;
  replayCount: number;
  /** Pass it to external systems as their idempotency key or memo; reconcilers ask by it. */
  externalRef: string;
  /**
   * The tool's arguments in canonical form, as the server keeps them for audit (secrets
   * redacted by its --store-arguments policy). Set by lookup and listEntries only; empty in the
   * answers of claim, complete and reconcile.
   */
  argumentsJson: string;
  /** Who resolved the entry by Reconcile (a reconciler's or an operator's principal); "" otherwise. */
  resolvedBy: string;
  /**
   * Set on the entries Reconcile hands out (`pending`): the token of this hand-out, sent back
   * with the finding about it (a Resolution's `holdToken`, with its `attempt`). A later hand-out
   * of the entry replaces it. "" in every other answer.
   */
  holdToken: string;
  /**
   * A finding said an earlier attempt's effect exists while a later attempt was started (or after
   * that attempt was recorded as not done): the intent may have acted twice. Set until a person
   * acknowledges it.
   */
  possibleDoubleEffect: boolean;
  /** The person's decision the call needed, if it needed one; undefined otherwise. */
  approval: Approval | undefined;
}

/**
 * What became of one finding sent to Reconcile (the proto's RESOLUTION_* without the prefix):
 * APPLIED, it settled the entry; STALE, nothing changed because a later attempt was started,
 * the entry was handed out again since, or it is not unknown; ALREADY_RESOLVED, the attempt it
 * was about had been resolved meanwhile; NOT_FOUND, there is no such entry.
 */
export type ResolutionOutcome = "UNSPECIFIED" | "APPLIED" | "STALE" | "ALREADY_RESOLVED" | "NOT_FOUND";

/** The ledger's answer to one finding (one per Resolution sent, in the same order). */
export interface ResolutionResult {
  key: string;
  result: ResolutionOutcome;
  /** The entry as it stands now (its current attempt and status); undefined with NOT_FOUND. */
  entry: LedgerEntry | undefined;
  /** Why the finding was not applied, in words ("attempt 2 was started since"). */
  note: string;
}

export function statusName(s: PbStatus): EntryStatus {
  return (PbStatus[s] as EntryStatus | undefined) ?? "UNSPECIFIED";
}

export function outcomeName(o: PbOutcome): Outcome {
  return (PbOutcome[o] as Outcome | undefined) ?? "UNSPECIFIED";
}

export function resolutionOutcomeName(o: PbResolutionOutcome): ResolutionOutcome {
  const name = PbResolutionOutcome[o] as string | undefined;
  const short = name?.replace(/^RESOLUTION_/, "");
  return short === "APPLIED" || short === "STALE" || short === "ALREADY_RESOLVED" || short === "NOT_FOUND" ? short : "UNSPECIFIED";
}

export function resolutionResultFrom(r: PbResolutionResult): ResolutionResult {
  return { key: r.key, result: resolutionOutcomeName(r.result), entry: r.entry ? entryFrom(r.entry) : undefined, note: r.note };
}

export function statusValue(s: Exclude<EntryStatus, "UNSPECIFIED">): PbStatus {
  const v = PbStatus[s];
  if (v === undefined) throw new TypeError(`unknown status ${String(s)}`);
  return v;
}

export function canonicalizationValue(c: Canonicalization | undefined): PbCanonicalization {
  if (c === undefined) return PbCanonicalization.UNSPECIFIED;
  const v = PbCanonicalization[c];
  if (v === undefined) throw new TypeError(`unknown canonicalization ${String(c)}`);
  return v;
}

export function waitForValue(w: WaitFor | undefined): PbWaitFor {
  if (w === undefined) return PbWaitFor.UNSPECIFIED;
  const v = PbWaitFor[w];
  if (v === undefined) throw new TypeError(`unknown waitFor ${String(w)}`);
  return v;
}

function date(ts: Timestamp | undefined): Date | undefined {
  return ts ? timestampDate(ts) : undefined;
}

export function entryFrom(e: Entry | undefined): LedgerEntry {
  if (!e) throw new Error("the ledger answered without an entry");
  return {
    key: e.key,
    runId: e.runId,
    tool: e.tool,
    fingerprint: e.fingerprint,
    status: statusName(e.status),
    attempt: e.attempt,
    result: e.result,
    error: e.error,
    retryable: e.retryable,
    principal: e.principal,
    startedAt: date(e.startedAt),
    finishedAt: date(e.finishedAt),
    leaseExpiresAt: date(e.leaseExpiresAt),
    expiresAt: date(e.expiresAt),
    replayCount: Number(e.replayCount),
    externalRef: e.externalRef,
    argumentsJson: e.argumentsJson,
    resolvedBy: e.resolvedBy,
    holdToken: e.holdToken,
    possibleDoubleEffect: e.possibleDoubleEffect,
    approval: e.approval && e.approval.state !== PbApprovalState.UNSPECIFIED ? approvalFrom(e.approval) : undefined,
  };
}

export function approvalStateName(s: PbApprovalState): ApprovalState {
  const name = (PbApprovalState[s] as string | undefined)?.replace(/^APPROVAL_STATE_/, "");
  return name === "REQUESTED" || name === "APPROVED" || name === "DENIED" || name === "EXPIRED" || name === "USED"
    ? name
    : "UNSPECIFIED";
}

export function approvalFrom(a: PbApproval): Approval {
  return {
    state: approvalStateName(a.state),
    requestedAt: date(a.requestedAt),
    decideBy: date(a.decideBy),
    decidedAt: date(a.decidedAt),
    decidedBy: a.decidedBy,
    reason: a.reason,
    executeBy: date(a.executeBy),
  };
}

export function msFromDuration(d: Duration | undefined): number | undefined {
  return d ? durationMs(d) : undefined;
}

export function durationOf(ms: number | undefined, field: string): Duration | undefined {
  if (ms === undefined) return undefined;
  if (!Number.isFinite(ms) || ms < 0) {
    throw new RangeError(`${field}: must be a non-negative number of milliseconds`);
  }
  return durationFromMs(ms);
}
