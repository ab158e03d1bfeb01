// One attempt of runOnce, step by step (Attempt.run): claim the intent (waiting for another
// attempt in flight, settling once an unknown outcome a repeat meets), act under the claim
// (renewing its lease), then record what the action returned, or what it threw: an unknown
// outcome is first settled with the tool's paired read (confirm) while the claim still holds
// the entry. Each step returns the call's outcome (AttemptOutcome) where the attempt ends.

import {
  ABORTED,
  ActionTimedOut,
  LeaseRenewer,
  classify,
  describe,
  leaseOf,
  raceAbort,
  runAction,
  sleep,
  withTimeout,
} from "./action.js";
import { jsonCodec, type Codec } from "./codec.js";
import type { Confirmation } from "./confirm.js";
import { DEFAULT_WAIT_MS } from "./defaults.js";
import {
  ActionTimeoutError,
  AlreadyResolvedError,
  AwaitingApprovalError,
  DeniedError,
  InProgressError,
  InvalidArgumentError,
  LedgerError,
  NotExecutedError,
  OutcomeUnknownError,
  PermanentFailureError,
  PreviouslyFailedError,
  ResultNotEncodableError,
  UNKNOWN_RETRY_AFTER_MS,
} from "./errors.js";
import { toArgumentsJson, type ArgumentsInput } from "./keys.js";
import { defaultPrincipal, type LedgerLogger } from "./log.js";
import type { AttemptOutcome } from "./outcome.js";
import type { LedgerRpc } from "./rpc.js";
import type { ClaimResult, CompleteParams, CompleteResult } from "./rpc-types.js";
import { claimOf, type ActionContext, type RunOnceOptions } from "./run-options.js";
import { ask, attemptOf, logSettlement, resolutionOf, settle } from "./settle.js";
import type { LedgerEntry } from "./types.js";

/** What an attempt needs of its Ledger. */
export interface AttemptHost {
  /** The ledger's RPCs (the Ledger itself). */
  rpc: LedgerRpc;
  logger: LedgerLogger;
  /** The default pause after an unknown outcome before asking confirm. */
  confirmDelayMs: number;
  /** The default deadline of each ledger call. */
  deadlineMs: number;
}

/** The call an attempt is made for. */
export interface AttemptCall<T> {
  runId: string;
  tool: string;
  args: ArgumentsInput;
  action: (ctx: ActionContext) => T | Promise<T>;
  /** The claim the call's approval check kept for it (Ledger.needsApproval with its callId), taken once. */
  takePrechecked: () => ClaimResult | undefined;
}

/** The outcome a Complete records, without the key and token `Finish` adds. */
type Completion = Omit<CompleteParams, "key" | "claimToken">;

/** Completes the claimed entry. */
type Finish = (completion: Completion) => Promise<CompleteResult>;

/** One attempt of runOnce (Ledger.attempt makes one per call): see `run`. */
export class Attempt<T> {
  private readonly codec: Codec<T>;
  private readonly waitMs: number;
  private readonly signal: AbortSignal | undefined;

  constructor(
    private readonly host: AttemptHost,
    private readonly call: AttemptCall<T>,
    private readonly options: RunOnceOptions<T>,
  ) {
    this.codec = options.codec ?? (jsonCodec as Codec<T>);
    this.waitMs = options.waitMs ?? DEFAULT_WAIT_MS;
    this.signal = options.signal;
  }

  /**
   * Claim, act, record: the attempt's outcome, as an outcome rather than a throw. An abort
   * before the action starts runs nothing (a claim it holds is completed FAILED retryable).
   */
  async run(): Promise<AttemptOutcome<T>> {
    if (this.signal?.aborted) return notStarted(this.signal.reason);
    const claimed = await this.claim();
    // A replay, or why nothing runs.
    if ("kind" in claimed) return claimed;
    const finish = this.finisher(claimed);
    if (this.signal?.aborted) {
      return { kind: "thrown", error: await recordNotStarted(abortedBeforeStart(this.signal.reason), finish), actionRan: false };
    }
    return this.act(claimed, finish);
  }

  /**
   * Claims the intent: the claim to act on (CLAIMED), or the call's outcome (a replay, or why
   * nothing runs). The server holds the claim up to `waitMs` while another attempt is in
   * flight; a repeat that meets an unknown outcome settles it once, then claims again.
   */
  private async claim(): Promise<ClaimResult | AttemptOutcome<T>> {
    for (let settledOnce = false; ; settledOnce = true) {
      const claimed = await this.claimOnce(settledOnce);
      if ("kind" in claimed || claimed.outcome === "CLAIMED") return claimed;
      // Settled (here or elsewhere): the claim now replays the result, or runs again.
      if (claimed.outcome === "IN_PROGRESS" && !settledOnce && (await this.settledUnknown(claimed.entry))) continue;
      return this.answerOf(claimed);
    }
  }

  /** One Claim (or the one the call's approval check kept), or the outcome of an abort during it. */
  private async claimOnce(again: boolean): Promise<ClaimResult | AttemptOutcome<T>> {
    const { runId, tool, args } = this.call;
    const { options, waitMs, signal } = this;
    // The claim is not given the signal: aborting it in flight could leave a claim the server
    // made but whose token nobody received (UNKNOWN after its lease, for an action that never
    // ran). An abort during the claim answers at once and settles the claim when it arrives.
    const prechecked = again ? undefined : this.call.takePrechecked();
    const claiming = prechecked
      ? Promise.resolve(prechecked)
      : this.host.rpc.claim(
          claimOf(runId, tool, args, options, waitMs),
          options.deadlineMs === undefined ? undefined : { deadlineMs: options.deadlineMs + waitMs },
        );
    try {
      const raced = await raceAbort(claiming, signal);
      if (raced !== ABORTED) return raced;
    } catch (err) {
      return { kind: "thrown", error: err, actionRan: false };
    }
    claiming.then(
      (c) => releaseUnstarted(this.host.rpc, c, "the call was aborted before the action started", options.deadlineMs),
      () => {},
    );
    return notStarted(signal?.reason);
  }

  /**
   * A repeat met an unknown outcome: with confirm, waits out what is left of the pause since it
   * became unknown and settles it (settle.ts). True when it is settled, here or elsewhere.
   */
  private async settledUnknown(entry: LedgerEntry): Promise<boolean> {
    const { options, host } = this;
    if (entry.status !== "UNKNOWN" || !options.confirm) return false;
    await pauseSinceUnknown(entry, options.confirmDelayMs ?? host.confirmDelayMs);
    const settled = await settle(host.rpc, entry, {
      confirm: options.confirm,
      codec: this.codec,
      args: JSON.parse(toArgumentsJson(this.call.args)) as unknown,
      // Who settles (resolvedBy): the call's principal, else the Ledger's, else
      // `confirm@<host>:<pid>`; an empty one counts as none (the Python client's rule too).
      principal: options.principal || host.rpc.principal || defaultPrincipal("confirm"),
      logger: host.logger,
      confirmTimeoutMs: options.deadlineMs ?? host.deadlineMs,
      waitMs: this.waitMs,
      via: "a repeat",
    });
    return settled.kind !== "cannot_tell" && settled.entry.status !== "UNKNOWN";
  }

  /** The call's outcome for a claim that does not let the action run (all but CLAIMED). */
  private answerOf(claimed: ClaimResult): AttemptOutcome<T> {
    const { entry, note } = claimed;
    switch (claimed.outcome) {
      case "REPLAYED":
        try {
          return { kind: "replayed", value: this.codec.decode(entry.result), note, entry };
        } catch (err) {
          return { kind: "thrown", error: err, actionRan: false };
        }
      case "IN_PROGRESS": {
        const unknown = entry.status === "UNKNOWN";
        const Cls = unknown ? OutcomeUnknownError : InProgressError;
        const retryAfter = claimed.retryAfter ?? (unknown ? UNKNOWN_RETRY_AFTER_MS : 1000);
        return { kind: "thrown", error: new Cls(note, retryAfter, entry), actionRan: false };
      }
      case "PREVIOUSLY_FAILED":
        return { kind: "thrown", error: new PreviouslyFailedError(note, entry.error, entry), actionRan: false };
      case "AWAITING_APPROVAL":
        // Nothing acts on an approval the ledger has not given: only CLAIMED runs the action.
        return { kind: "thrown", error: new AwaitingApprovalError(note, entry), actionRan: false };
      case "DENIED":
        return { kind: "thrown", error: new DeniedError(note, entry), actionRan: false };
      default:
        return {
          kind: "thrown",
          error: new LedgerError(`the ledger answered an unexpected outcome ${claimed.outcome}`),
          actionRan: false,
        };
    }
  }

  /**
   * Completes the claimed entry, sent again on UNAVAILABLE and DEADLINE_EXCEEDED (the identical
   * Complete is idempotent) within the retry budget, and at least the claim's lease: an action
   * that ran must not turn into an unknown outcome because the ledger's database was failing over.
   */
  private finisher(claim: ClaimResult): Finish {
    const { entry, claimToken } = claim;
    const leaseMs = this.options.leaseMs ?? leaseOf(entry);
    const opts = { deadlineMs: this.options.deadlineMs };
    return (completion) => this.host.rpc.complete({ key: entry.key, claimToken, ...completion }, opts, leaseMs);
  }

  /**
   * Runs the action under the claim, with its own signal (aborted by the call's, or once
   * `timeoutMs` passes) and the lease renewed while it runs; then records what it returned, or
   * what it threw.
   */
  private async act(claim: ClaimResult, finish: Finish): Promise<AttemptOutcome<T>> {
    const { entry } = claim;
    const { options, signal } = this;
    const controller = new AbortController();
    const onAbort = () => controller.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    const ctx: ActionContext = {
      runId: this.call.runId,
      tool: this.call.tool,
      key: entry.key,
      externalRef: entry.externalRef,
      attempt: entry.attempt,
      signal: controller.signal,
      entry,
    };
    const renewer =
      options.renewLease === false
        ? undefined
        : LeaseRenewer.start(this.host.rpc, claim, options.leaseMs, options.deadlineMs ?? this.host.deadlineMs);
    let value: T;
    try {
      value = await withTimeout(() => runAction(ctx, this.call.action), options.timeoutMs, controller);
    } catch (err) {
      signal?.removeEventListener("abort", onAbort);
      // The lease is still renewed while confirm is asked; afterFailure stops the renewal
      // before the Complete, so that none lands after it.
      return this.afterFailure(err, entry, finish, renewer, controller.signal);
    }
    await renewer?.stop();
    signal?.removeEventListener("abort", onAbort);
    return this.recordResult(value, entry, finish);
  }

  /** Completes SUCCEEDED with the action's result; a result that cannot be stored is recorded UNKNOWN. */
  private async recordResult(value: T, entry: LedgerEntry, finish: Finish): Promise<AttemptOutcome<T>> {
    let result: Uint8Array;
    try {
      result = this.codec.encode(value);
    } catch (err) {
      return recordUnstorable(`the codec could not encode it: ${describe(err)}`, err, entry, finish);
    }
    try {
      const done = await finish({ status: "SUCCEEDED", result });
      return { kind: "performed", value, entry: done.entry };
    } catch (err) {
      if (err instanceof InvalidArgumentError) {
        // The ledger refused the result (RESULT_TOO_LARGE): the effect happened but cannot be
        // replayed, so record that the outcome is unknown rather than leave the claim hanging.
        return recordUnstorable(`the ledger refused it: ${err.reason || err.code}: ${err.message}`, err, entry, finish);
      }
      return { kind: "thrown", error: err, actionRan: true };
    }
  }

  /**
   * Records a failed action: FAILED retryable when it says it did not act, FAILED for good
   * when it says it never will, UNKNOWN otherwise. With confirm, an unknown outcome is settled
   * first (confirmUnknown), and the Complete records what it found.
   */
  private async afterFailure(
    err: unknown,
    claimedEntry: LedgerEntry,
    finish: Finish,
    renewer: LeaseRenewer | undefined,
    actionSignal: AbortSignal,
  ): Promise<AttemptOutcome<T>> {
    const timedOut = err instanceof ActionTimedOut;
    const kind = timedOut ? "unknown" : classify(err, this.options.notExecuted);
    const why = timedOut ? err.message : describe(err);
    let completion: Completion =
      kind === "not_executed"
        ? { status: "FAILED", retryable: true, error: why }
        : kind === "failed"
          ? { status: "FAILED", retryable: false, error: why }
          : { status: "UNKNOWN", error: why };
    let confirmation: Confirmation<T> | undefined;
    if (kind === "unknown" && this.options.confirm) {
      const cutOff = timedOut || actionSignal.aborted;
      ({ confirmation, completion } = await this.confirmUnknown(claimedEntry, why, cutOff, completion));
    }
    await renewer?.stop();
    let recorded: CompleteResult;
    try {
      recorded = await finish(completion);
    } catch (ledgerErr) {
      return this.failureNotRecorded(ledgerErr, err, why, claimedEntry, confirmation);
    }
    return this.failureRecorded(err, kind, recorded.entry, confirmation);
  }

  /**
   * Asks confirm about an unknown outcome, after the pause: the claim still holds the entry
   * (ATTEMPTING, its lease renewed), so nobody else can take it meanwhile. Returns what it
   * found, and the Complete that records it. An action that was cut off (it outlived timeoutMs,
   * or the call was aborted) may still be running or its request still landing, so a "not
   * found" proves nothing yet: the entry is recorded UNKNOWN, for a reconciler to ask again once
   * the ledger's grace has passed; a "found" is proof, and settles it SUCCEEDED at once.
   */
  private async confirmUnknown(
    claimedEntry: LedgerEntry,
    why: string,
    cutOff: boolean,
    unknown: Completion,
  ): Promise<{ confirmation: Confirmation<T> | undefined; completion: Completion }> {
    const { options, host } = this;
    await sleep(options.confirmDelayMs ?? host.confirmDelayMs);
    const attempt = attemptOf(claimedEntry, JSON.parse(toArgumentsJson(this.call.args)) as unknown);
    const confirmation = await ask(options.confirm!, attempt, host.logger, options.deadlineMs ?? host.deadlineMs);
    const resolution = resolutionOf(claimedEntry, confirmation, this.codec, host.logger);
    if (!resolution) return { confirmation: undefined, completion: unknown };
    if (resolution.status === "SUCCEEDED") {
      return { confirmation, completion: { status: "SUCCEEDED", result: resolution.result } };
    }
    if (cutOff) return { confirmation, completion: { status: "UNKNOWN", error: notFoundYetWhy(why, claimedEntry) } };
    return { confirmation, completion: { status: "FAILED", retryable: true, error: notFoundWhy(why, claimedEntry) } };
  }

  /** The call's outcome once a failed action's Complete is recorded. */
  private failureRecorded(
    err: unknown,
    kind: ReturnType<typeof classify>,
    entry: LedgerEntry,
    confirmation: Confirmation<T> | undefined,
  ): AttemptOutcome<T> {
    if (kind !== "unknown") {
      if (err instanceof NotExecutedError || err instanceof PermanentFailureError) err.entry = entry;
      return { kind: "thrown", error: err, actionRan: true, recorded: kind, entry };
    }
    const error = err instanceof ActionTimedOut ? new ActionTimeoutError(err.timeoutMs, entry) : err;
    if (confirmation?.kind === "found") {
      logSettlement(this.host.logger, entry, "found", "run_once");
      return { kind: "performed", value: confirmation.result, entry, confirmed: true };
    }
    if (confirmation?.kind === "not_found") {
      logSettlement(this.host.logger, entry, "not_found", "run_once");
      // Cut off: nothing found yet, but the action may still land; recorded UNKNOWN.
      if (entry.status === "UNKNOWN") return { kind: "thrown", error, actionRan: true, recorded: "unknown", entry };
      return notFoundOutcome(error, entry);
    }
    if (this.options.confirm) logSettlement(this.host.logger, entry, "cannot_tell", "run_once");
    return { kind: "thrown", error, actionRan: true, recorded: "unknown", entry };
  }

  /** The call's outcome when a failed action's Complete did not go through. */
  private async failureNotRecorded(
    ledgerErr: unknown,
    err: unknown,
    why: string,
    claimedEntry: LedgerEntry,
    confirmation: Confirmation<T> | undefined,
  ): Promise<AttemptOutcome<T>> {
    if (confirmation && ledgerErr instanceof AlreadyResolvedError) {
      // Settled by someone else first (a reconciler that took the entry once the lease had
      // ended): say what they found.
      const now = await this.host.rpc.lookup({ key: claimedEntry.key }).catch(() => undefined);
      if (now) return settledElsewhere(err, why, now, this.codec);
    }
    // The entry stays as claimed and reads UNKNOWN once its lease ends: reconciled later.
    // The ledger's error is thrown (the caller must learn the outcome was not recorded),
    // carrying the action's error.
    if (ledgerErr instanceof LedgerError) {
      ledgerErr.actionError = err instanceof ActionTimedOut ? new ActionTimeoutError(err.timeoutMs, claimedEntry) : err;
    }
    return { kind: "thrown", error: ledgerErr, actionRan: true };
  }
}

/** Settles, in the background, a claim that arrived after its caller had given up. */
export async function releaseUnstarted(
  rpc: LedgerRpc,
  claimed: ClaimResult,
  why: string,
  deadlineMs: number | undefined,
): Promise<void> {
  if (claimed.outcome !== "CLAIMED") return;
  await rpc
    .complete(
      {
        key: claimed.entry.key,
        claimToken: claimed.claimToken,
        status: "FAILED",
        retryable: true,
        error: `NotExecutedError: ${why}`,
      },
      { deadlineMs },
    )
    .catch(() => {});
}

/** Why nothing ran: the call was aborted before the action started. */
function abortedBeforeStart(reason: unknown): NotExecutedError {
  return new NotExecutedError("the call was aborted; the action was not started", { cause: reason });
}

/** The outcome of a call aborted before it held a claim. */
function notStarted<T>(reason: unknown): AttemptOutcome<T> {
  return { kind: "thrown", error: abortedBeforeStart(reason), actionRan: false };
}

/** Completes FAILED retryable an attempt claimed but never started; returns `error` with its entry. */
async function recordNotStarted(error: NotExecutedError, finish: Finish): Promise<unknown> {
  try {
    error.entry = (await finish({ status: "FAILED", retryable: true, error: describe(error) })).entry;
    return error;
  } catch (ledgerErr) {
    if (ledgerErr instanceof LedgerError) ledgerErr.actionError = error;
    return ledgerErr;
  }
}

/** A result that cannot be stored: the effect happened but cannot be replayed, recorded UNKNOWN. */
async function recordUnstorable<T>(why: string, cause: unknown, entry: LedgerEntry, finish: Finish): Promise<AttemptOutcome<T>> {
  const recorded = await finish({ status: "UNKNOWN", error: `the result could not be stored: ${why}` }).then(
    (c) => c.entry,
    () => entry,
  );
  return {
    kind: "thrown",
    error: new ResultNotEncodableError(why, recorded, { cause }),
    actionRan: true,
    recorded: "unknown",
    entry: recorded,
  };
}

/**
 * Waits out what is left of the pause since the entry became unknown (its Complete, or the
 * end of its lease), so that a repeat arriving at once gives the outside world the same time
 * to show the effect as the call that met the unknown outcome.
 */
async function pauseSinceUnknown(entry: LedgerEntry, delayMs: number): Promise<void> {
  const since = entry.finishedAt ?? entry.leaseExpiresAt;
  if (!since) return;
  const left = Math.min(delayMs, since.getTime() + delayMs - Date.now());
  if (left > 0) await sleep(left);
}

/** The outcome of an attempt someone else settled first, as they settled it. */
function settledElsewhere<T>(err: unknown, why: string, now: LedgerEntry, codec: Codec<T>): AttemptOutcome<T> {
  const error = err instanceof ActionTimedOut ? new ActionTimeoutError(err.timeoutMs, now) : err;
  const unknown: AttemptOutcome<T> = { kind: "thrown", error, actionRan: true, recorded: "unknown", entry: now };
  if (now.status === "SUCCEEDED") {
    try {
      return { kind: "performed", value: codec.decode(now.result), entry: now, confirmed: true };
    } catch {
      return unknown;
    }
  }
  if (now.status === "FAILED" && now.retryable) return notFoundOutcome(error, now, why);
  if (now.status === "FAILED") {
    const permanent = new PermanentFailureError(now.error || "settled as failed for good", { cause: error });
    permanent.entry = now;
    return { kind: "thrown", error: permanent, actionRan: true, recorded: "failed", entry: now };
  }
  return unknown;
}

/** What is recorded, and said, when the paired read found no effect of a failed attempt. */
function notFoundWhy(why: string, entry: LedgerEntry): string {
  return `the attempt failed (${why}) and the tool's paired read found no effect (external_ref ${entry.externalRef})`;
}

/** What is recorded when the paired read found no effect of an action that was cut off and may still land. */
function notFoundYetWhy(why: string, entry: LedgerEntry): string {
  return (
    `the attempt was cut off (${why}); the tool's paired read found no effect yet (external_ref ${entry.externalRef}), ` +
    `but the action may still be running or landing: left unknown, for a reconciler to ask again after the ledger's grace`
  );
}

/** An unknown outcome whose paired read found no effect: the intent may be tried again. */
function notFoundOutcome<T>(error: unknown, entry: LedgerEntry, why?: string): AttemptOutcome<T> {
  const notExecuted = new NotExecutedError(why === undefined ? entry.error : notFoundWhy(why, entry), { cause: error });
  notExecuted.entry = entry;
  return { kind: "thrown", error: notExecuted, actionRan: true, recorded: "not_found", entry };
}
