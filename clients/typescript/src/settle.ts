// Settling an unknown outcome with the tool's paired read (confirm): take the entry with a
// Reconcile of its key alone (so that one settlement wins across callers, reconcilers and
// servers: the ledger hands a key to one caller at a time), ask confirm, send what it found.
// runOnce settles this way when a repeat meets an unknown outcome (right after its own, the call
// completes with its claim token instead); the Reconciler asks and answers the same way for the
// entries the ledger hands out in rounds. Every finding is fenced: it names the attempt and the
// hold token of the entry as it was handed out, and the ledger applies it only while that hold
// is the newest and the attempt the current one; its answer (`results`) says what became of it,
// and a finding it did not apply is logged and never counted as settled by its sender.

import type { Codec } from "./codec.js";
import {
  checkConfirmation,
  type Confirm,
  type ConfirmAttempt,
  type Confirmation,
} from "./confirm.js";
import { SETTLING_POLL_MS } from "./defaults.js";
import type { LedgerLogger } from "./log.js";
import type { LedgerRpc } from "./rpc.js";
import type { ReconcileResult, Resolution } from "./rpc-types.js";
import type { LedgerEntry, ResolutionResult } from "./types.js";

/** How one entry was settled (or not). */
export type Settlement<T> =
  /** The paired read found the effect: the entry is SUCCEEDED with `value`. */
  | { kind: "found"; value: T; entry: LedgerEntry }
  /** The paired read found none: the entry is FAILED, retryable. */
  | { kind: "not_found"; entry: LedgerEntry }
  /** The paired read could not tell (or could not be asked): the entry stays UNKNOWN. */
  | { kind: "cannot_tell"; entry: LedgerEntry }
  /**
   * Someone else holds the entry or settled it first (a reconciler, another caller, the
   * claimant's late Complete, a person): `entry` is as it stands now.
   */
  | { kind: "elsewhere"; entry: LedgerEntry; result?: ResolutionResult };

/** What a settlement needs besides the entry. */
export interface SettleContext<T> {
  confirm: Confirm<T>;
  /** How the tool's results are stored (a found result is stored as a Complete would). */
  codec: Codec<T>;
  /** The call's arguments as JSON values (what confirm is given). */
  args: unknown;
  /** Recorded as the entry's resolvedBy. */
  principal: string;
  logger: LedgerLogger;
  /** How long confirm may take before it counts as "cannot tell". */
  confirmTimeoutMs: number;
  /** Said in the log line: who asked. */
  via: Via;
  /**
   * How long to wait for a settlement someone else is making (the entry is not handed out:
   * another caller or a reconciler holds it): the call's `waitMs`.
   */
  waitMs: number;
}

/** The attempt confirm is asked about. */
export function attemptOf<A>(entry: LedgerEntry, args: A): ConfirmAttempt<A> {
  return {
    key: entry.key,
    externalRef: entry.externalRef,
    arguments: args,
    attempt: entry.attempt,
    runId: entry.runId,
    tool: entry.tool,
    entry,
  };
}

/**
 * Asks confirm, bounded by `timeoutMs`. A throw, a timeout or an answer that is not a
 * Confirmation is "cannot tell", logged with why.
 */
export async function ask<T>(
  confirm: Confirm<T>,
  attempt: ConfirmAttempt,
  logger: LedgerLogger,
  timeoutMs: number,
): Promise<Confirmation<T>> {
  let timer: NodeJS.Timeout | undefined;
  try {
    const answer = await Promise.race([
      Promise.resolve().then(() => confirm(attempt)),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`confirm did not answer within ${timeoutMs} ms`)), timeoutMs);
      }),
    ]);
    const { confirmation, problem } = checkConfirmation<T>(answer);
    if (problem) logger.warn(`${where(attempt)}: ${problem}; counted as cannot tell`);
    return confirmation;
  } catch (err) {
    logger.warn(`${where(attempt)}: confirm failed (${describe(err)}); counted as cannot tell`);
    return { kind: "cannot_tell" };
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The resolution that records a confirmation, or undefined for "cannot tell" (and for a
 * found result the codec cannot store, logged: the entry is left for a person). It is fenced
 * by the entry it was asked about: that entry's attempt and hold token (the pending entry's,
 * as Reconcile handed it out).
 */
export function resolutionOf<T>(
  entry: LedgerEntry,
  confirmation: Confirmation<T>,
  codec: Codec<T>,
  logger: LedgerLogger,
): Resolution | undefined {
  switch (confirmation.kind) {
    case "found": {
      let result: Uint8Array;
      try {
        result = codec.encode(confirmation.result);
      } catch (err) {
        logger.warn(
          `${where(entry)}: confirm found the effect but its result cannot be stored (${describe(err)}); ` +
            `left UNKNOWN for a person (idempotency-ledger resolve)`,
        );
        return undefined;
      }
      return { key: entry.key, attempt: entry.attempt, holdToken: entry.holdToken, status: "SUCCEEDED", result };
    }
    case "not_found":
      return {
        key: entry.key,
        attempt: entry.attempt,
        holdToken: entry.holdToken,
        status: "FAILED",
        // The effect did not happen: the intent may be tried again.
        retryable: true,
        error: `the tool's paired read found no effect with reference ${entry.externalRef}`,
      };
    default:
      return undefined;
  }
}

/**
 * One log line per settlement: key, tool, external_ref, outcome, and the entry as it stands
 * afterwards: its status and who settled it as the entry says (settledBy), never a principal the
 * entry does not carry.
 */
export function logSettlement(
  logger: LedgerLogger,
  entry: LedgerEntry,
  outcome: "found" | "not_found" | "cannot_tell" | "elsewhere",
  via: Via,
): void {
  logger.info(
    `settled key=${entry.key} tool=${entry.tool} external_ref=${entry.externalRef} outcome=${outcome} ` +
      `status=${entry.status} ${settledBy(entry)} via=${via}`,
  );
}

/**
 * Who settled an entry, as the entry itself says it (the Python client's words):
 * `resolved_by=<principal>` when it records one (a Reconcile's resolution); else
 * `settled_by=claimant` once it is resolved (its claimant's own Complete, which records no
 * resolved_by), `settled_by=nobody` while its outcome is still unknown.
 */
export function settledBy(entry: LedgerEntry): string {
  if (entry.resolvedBy) return `resolved_by=${entry.resolvedBy}`;
  if (entry.status === "UNKNOWN" || entry.status === "ATTEMPTING") return "settled_by=nobody";
  return "settled_by=claimant";
}

/**
 * What the ledger answered to a finding that it did not apply (STALE, ALREADY_RESOLVED,
 * NOT_FOUND): one WARN line with the key, the attempt the finding was about and the attempt,
 * status the entry has now, and who settled it as it says (settledBy), and the ledger's note; and an ERROR line when the
 * ledger marked the entry as a possible double effect (a stale "found": an earlier attempt's
 * effect exists while a later one was started). Never counted as settled by the sender.
 */
export function logNotApplied(
  logger: LedgerLogger,
  seen: LedgerEntry,
  said: "found" | "not_found",
  answer: ResolutionResult,
  via: Via,
): void {
  const now = answer.entry;
  logger.warn(
    `finding not applied key=${seen.key} tool=${seen.tool} external_ref=${seen.externalRef} finding=${said} ` +
      `result=${answer.result} attempt_seen=${seen.attempt} attempt_now=${now ? now.attempt : "-"} ` +
      `status_now=${now ? now.status : "-"} ${now ? settledBy(now) : "settled_by=nobody"} via=${via}` +
      (answer.note ? `: ${answer.note}` : ""),
  );
  if (now?.possibleDoubleEffect) {
    logger.error(
      `possible double effect key=${seen.key} tool=${seen.tool} external_ref=${seen.externalRef}: the entry is ` +
        `marked, the intent may have acted twice (attempt ${seen.attempt}'s effect was found while the entry is at ` +
        `attempt ${now.attempt}, ${now.status}); a person must check the outside world and acknowledge it`,
    );
  }
}

/**
 * Who asked, in the settlement's log line (the Python client's words): the call settling its
 * own unknown outcome (`run_once`), a repeat meeting one, a reconciler.
 */
export type Via = "run_once" | "a repeat" | "reconciler";

/**
 * Settles one UNKNOWN entry: takes it (Reconcile of its key alone), asks confirm, records what
 * it found. When the ledger does not hand it out, someone else holds or settled it: this waits
 * (up to `ctx.waitMs`, looking it up) for what they find. A Reconcile or Lookup that fails
 * leaves it UNKNOWN (cannot tell, logged).
 */
export async function settle<T>(rpc: LedgerRpc, entry: LedgerEntry, ctx: SettleContext<T>): Promise<Settlement<T>> {
  let taken: LedgerEntry | undefined;
  try {
    const { pending } = await rpc.reconcile({ keys: [entry.key], principal: ctx.principal });
    taken = pending.find((e) => e.key === entry.key);
    if (!taken) {
      const now = await awaitSettlement(rpc, entry.key, ctx.waitMs);
      logSettlement(ctx.logger, now, "elsewhere", ctx.via);
      return { kind: "elsewhere", entry: now };
    }
  } catch (err) {
    ctx.logger.warn(`${where(entry)}: could not take the entry to settle it (${describe(err)}); left UNKNOWN`);
    return { kind: "cannot_tell", entry };
  }
  const confirmation = await ask(ctx.confirm, attemptOf(taken, ctx.args), ctx.logger, ctx.confirmTimeoutMs);
  const resolution = resolutionOf(taken, confirmation, ctx.codec, ctx.logger);
  if (!resolution) {
    logSettlement(ctx.logger, taken, "cannot_tell", ctx.via);
    return { kind: "cannot_tell", entry: taken };
  }
  let answer: ResolutionResult;
  try {
    answer = answerOf(
      resolution,
      await rpc.reconcile({ resolutions: [resolution], resolveOnly: true, principal: ctx.principal }),
      ctx.principal,
    );
  } catch (err) {
    ctx.logger.warn(`${where(taken)}: could not record what confirm found (${describe(err)}); left UNKNOWN`);
    return { kind: "cannot_tell", entry: taken };
  }
  const resolved = answer.entry;
  if (answer.result !== "APPLIED" || !resolved) {
    // Not ours: the entry moved on (another hand-out, a later attempt, a late Complete) or is gone.
    logNotApplied(ctx.logger, taken, confirmation.kind === "found" ? "found" : "not_found", answer, ctx.via);
    if (!resolved) return { kind: "cannot_tell", entry: taken };
    logSettlement(ctx.logger, resolved, "elsewhere", ctx.via);
    return { kind: "elsewhere", entry: resolved, result: answer };
  }
  if (confirmation.kind === "found") {
    logSettlement(ctx.logger, resolved, "found", ctx.via);
    return { kind: "found", value: confirmation.result, entry: resolved };
  }
  logSettlement(ctx.logger, resolved, "not_found", ctx.via);
  return { kind: "not_found", entry: resolved };
}

/**
 * The ledger's answer to the one resolution a call sent. A server without the fence answers no
 * `results`: then the resolved entry tells, as before (applied when it records this principal
 * and the status sent).
 */
export function answerOf(resolution: Resolution, reply: ReconcileResult, principal: string): ResolutionResult {
  const [answer] = reply.results;
  if (answer) return answer;
  const [entry] = reply.resolved;
  if (!entry) return { key: resolution.key, result: "NOT_FOUND", entry: undefined, note: "" };
  const applied = entry.resolvedBy === principal && entry.status === resolution.status;
  return { key: resolution.key, result: applied ? "APPLIED" : "ALREADY_RESOLVED", entry, note: "" };
}

/**
 * Looks the entry up until it is no longer UNKNOWN or `waitMs` is over (the first pause 50 ms,
 * doubling up to 1 s: SETTLING_POLL_MS); returns it as it then stands.
 */
async function awaitSettlement(rpc: LedgerRpc, key: string, waitMs: number): Promise<LedgerEntry> {
  const started = Date.now();
  let pause: number = SETTLING_POLL_MS[0];
  const longest = SETTLING_POLL_MS[1];
  for (;;) {
    const now = await rpc.lookup({ key });
    const left = waitMs - (Date.now() - started);
    if (now.status !== "UNKNOWN" || left <= 0) return now;
    await new Promise((done) => setTimeout(done, Math.min(pause, left)));
    pause = Math.min(pause * 2, longest);
  }
}

function where(x: { key: string; tool: string; externalRef: string }): string {
  return `tool ${x.tool}, key ${x.key} (external_ref ${x.externalRef})`;
}

function describe(err: unknown): string {
  if (err instanceof Error) return `${err.name}: ${err.message}`;
  return String(err);
}
