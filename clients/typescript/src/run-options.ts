// What runOnce and runTool take and give: their options, the attempt an action is given
// (ActionContext), what runOnce returns, the options of the approval check a framework makes
// before the call (Ledger.needsApproval), and the Claim either makes (claimOf). The Ledger
// (ledger.ts) and one attempt of runOnce (attempt.ts) both read them.

import type { Codec } from "./codec.js";
import type { Confirm } from "./confirm.js";
import { RUN_ONCE_WAIT_FOR } from "./defaults.js";
import type { ArgumentsInput, Canonicalization } from "./keys.js";
import type { ClaimParams } from "./rpc-types.js";
import type { LedgerEntry } from "./types.js";

/** What the action of runOnce is given: the attempt, to pass downstream. */
export interface ActionContext {
  runId: string;
  tool: string;
  key: string;
  /** Pass it to the external system as its idempotency key or memo, so a reconciler can ask. */
  externalRef: string;
  /** 1 for the first attempt, one more after each retryable failure. */
  attempt: number;
  /** Aborted when `timeoutMs` passes, or when the runOnce `signal` aborts. */
  signal: AbortSignal;
  /** The entry as the claim returned it. */
  entry: LedgerEntry;
}

/** An error class the action throws only before acting (a validation error). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type ErrorClass = abstract new (...args: any[]) => unknown;

/** The options of runOnce. */
export interface RunOnceOptions<T> {
  /** An explicit key instead of the derived one. */
  key?: string;
  canonicalization?: Canonicalization;
  /**
   * How long the attempt may go without a sign of life before it counts as unknown (the
   * server's default, 60 s, when unset). runOnce renews it while the action runs.
   */
  leaseMs?: number;
  retentionMs?: number;
  /**
   * The claim's principal; also who settles, with `confirm`, an unknown outcome a repeat meets
   * (recorded as resolvedBy). Unset or empty: the Ledger's, else `confirm@<host>:<pid>`.
   */
  principal?: string;
  /**
   * When another attempt of the same intent is in flight: wait up to this long for it (the
   * server's `wait`), then replay its result, or run if it failed retryably. Default
   * DEFAULT_WAIT_MS (10 s); 0 throws InProgressError at once. It never waits for a person's
   * decision: a call awaiting one is answered at once (AwaitingApprovalError), in one Claim.
   */
  waitMs?: number;
  /** The action's time limit: past it, the entry is completed UNKNOWN and ActionTimeoutError thrown. */
  timeoutMs?: number;
  /**
   * Renew the lease every RENEW_EVERY_FRACTION_OF_LEASE of it while the action runs (default
   * true), so that a duplicate sees the attempt in flight (IN_PROGRESS, ATTEMPTING), not UNKNOWN.
   */
  renewLease?: boolean;
  /** How results are stored: JSON by default. */
  codec?: Codec<T>;
  /** Deadline of each ledger call (not of the action). */
  deadlineMs?: number;
  /**
   * Cancels the call. Aborted before the action starts: nothing runs, an attempt already
   * claimed is completed FAILED retryable, and NotExecutedError is thrown. Aborted while the
   * action runs: `ctx.signal` is aborted and the action decides.
   */
  signal?: AbortSignal;
  /**
   * The tool's paired read ("did this happen?"). After an unknown outcome (the action threw,
   * or outlived `timeoutMs`) runOnce waits `confirmDelayMs`, asks it, and settles the entry:
   * found → SUCCEEDED with its result, returned as the call's; not found → FAILED retryable
   * (NotExecutedError); cannot tell → UNKNOWN. A repeat that meets an UNKNOWN entry settles it
   * the same way before answering.
   */
  confirm?: Confirm<T>;
  /** The pause before asking confirm (default: the Ledger's, 1 s). */
  confirmDelayMs?: number;
  /**
   * Error classes the action throws only before acting (a validation error): such a throw is
   * recorded FAILED retryable, like NotExecutedError. Every other throw is UNKNOWN.
   */
  notExecuted?: readonly ErrorClass[];
  /**
   * Ask a person first (the Claim's `require_approval`), whatever the server's approval policy
   * says: a new intent waits for a decision (AwaitingApprovalError; runTool's
   * `awaiting_approval`) instead of acting. The policy may gate a call without it.
   */
  requireApproval?: boolean;
  /**
   * The framework's id of this tool call: what the ledger already answered this call's
   * approval check (Ledger.needsApproval with the same callId, in this process) is used
   * instead of claiming again.
   */
  callId?: string;
}

/** The options of Ledger.needsApproval: the call's, as runOnce would claim it. */
export interface NeedsApprovalOptions {
  /** The framework's id of the tool call, passed again to runOnce/runTool as `callId`. */
  callId?: string;
  /** Ask a person whatever the server's policy says (the Claim's `require_approval`). */
  requireApproval?: boolean;
  key?: string;
  canonicalization?: Canonicalization;
  principal?: string;
  leaseMs?: number;
  retentionMs?: number;
  /**
   * Whether the framework asks again when the run resumes with an approval (the AI SDK does,
   * and turns a call that no longer "needs approval" into a denial): then a call whose approval
   * was decided (approved, used, denied) still needs one, so that the framework hands it to
   * the tool, which asks the ledger. Default false (OpenAI Agents: only an undecided request).
   */
  askedAgainOnResume?: boolean;
  /**
   * How long the run's finished entries are kept at least (ExtendRun) when the call pauses the
   * run for a person: unset, the server's default retention.
   */
  pauseRetentionMs?: number;
  deadlineMs?: number;
}

/** What runOnce returns: the action's result, or the stored one on a repeat. */
export interface RunOnceResult<T> {
  value: T;
  /** True when the stored result of an earlier call was returned and nothing was executed. */
  replayed: boolean;
  /** With a replay: the server's note for the model ("already performed … no new action"). */
  note: string;
  entry: LedgerEntry;
  /** True when the action's outcome was unknown and its paired read found the effect. */
  confirmed: boolean;
}

/** The options of runTool: runOnce's. The default codec is toolResultCodec. */
export type RunToolOptions<T> = RunOnceOptions<T>;

/**
 * The Claim of a call, from its options (runOnce's, or its approval check's, which does not
 * wait). Its wait is for an attempt in flight only (RUN_ONCE_WAIT_FOR): one Claim answers a
 * repeat whatever it meets, and a call awaiting a person is answered at once.
 */
export function claimOf(
  runId: string,
  tool: string,
  args: ArgumentsInput,
  options: Pick<NeedsApprovalOptions, "key" | "canonicalization" | "leaseMs" | "retentionMs" | "principal" | "requireApproval">,
  waitMs?: number,
): ClaimParams {
  const { key, canonicalization, leaseMs, retentionMs, principal, requireApproval } = options;
  return { runId, tool, args, key, canonicalization, leaseMs, retentionMs, waitMs, waitFor: RUN_ONCE_WAIT_FOR, principal, requireApproval };
}
