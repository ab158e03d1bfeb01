// The Ledger: the RPCs (rpc.ts) with runOnce, the claim → act → complete loop around one
// side-effecting tool call (renewing the lease while the action runs, settling an unknown
// outcome with the tool's paired read when it has one; running the action itself is action.ts),
// runTool (runOnce rendered for a model) and the tools registered with it (tools.ts and the
// adapters register theirs here, so that a Reconciler finds each tool's paired read).

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
import { confirmProblem, type Confirm, type Confirmation } from "./confirm.js";
import { DEFAULT_CONFIRM_DELAY_MS, DEFAULT_WAIT_MS } from "./defaults.js";
import {
  ActionTimeoutError,
  AlreadyResolvedError,
  AwaitingApprovalError,
  DeniedError,
  InProgressError,
  InvalidArgumentError,
  LedgerError,
  MissingRunIdError,
  NotExecutedError,
  NotFoundError,
  OutcomeUnknownError,
  PermanentFailureError,
  PreviouslyFailedError,
  ResultNotEncodableError,
  UNKNOWN_RETRY_AFTER_MS,
} from "./errors.js";
import { toArgumentsJson, type ArgumentsInput } from "./keys.js";
import { defaultPrincipal, stderrLogger, type LedgerLogger } from "./log.js";
import {
  missingRunIdResult,
  render,
  toolResultCodec,
  type AttemptOutcome,
  type ToolCallResult,
} from "./outcome.js";
import { LedgerRpc } from "./rpc.js";
import type { CallOptions, ClaimResult, CompleteParams, CompleteResult, LedgerRpcOptions } from "./rpc-types.js";
import { ask, attemptOf, logSettlement, resolutionOf, settle, type Settlement, type Via } from "./settle.js";
import type {
  ActionContext,
  NeedsApprovalOptions,
  RunOnceOptions,
  RunOnceResult,
  RunToolOptions,
} from "./run-options.js";
import type { LedgerEntry } from "./types.js";

/** How to reach the ledger, and how the client behaves. */
export interface LedgerOptions extends LedgerRpcOptions {
  /**
   * Strict mode: refuse to register a tool without a paired read (`confirm`), and refuse
   * runOnce and runTool without one. A tool that cannot be reconciled cannot be safely retried.
   */
  requireConfirm?: boolean;
  /** The default pause after an unknown outcome before asking confirm (default 1 s). */
  confirmDelayMs?: number;
  /** Where the client logs (default: stderr). */
  logger?: LedgerLogger;
}

/** A tool as registered with the ledger: its name and its paired read. */
export interface ToolRegistration<T = unknown> {
  name: string;
  confirm?: Confirm<T>;
  /** How its results are stored (what a found result is encoded with). */
  codec?: Codec<T>;
}

/** The client of one ledger: its RPCs, runOnce, runTool and the tools registered with it. */
export class Ledger extends LedgerRpc {
  /** Strict mode: every tool needs a paired read. */
  readonly requireConfirm: boolean;
  /** The default pause after an unknown outcome before asking confirm. */
  readonly confirmDelayMs: number;
  /** Where the client logs. */
  readonly logger: LedgerLogger;
  private readonly registrations = new Map<string, ToolRegistration>();
  private readonly runIdReported = new Set<string>();
  private readonly prechecked = new Map<string, { claimed: ClaimResult; timer: NodeJS.Timeout }>();

  constructor(options: LedgerOptions) {
    super(options);
    this.requireConfirm = options.requireConfirm ?? false;
    this.confirmDelayMs = options.confirmDelayMs ?? DEFAULT_CONFIRM_DELAY_MS;
    this.logger = options.logger ?? stderrLogger;
  }

  /**
   * Registers a tool (the wrappers and adapters do it): a Reconciler of this ledger settles the
   * unknown outcomes of the tools registered with a `confirm`, and of those only. In strict
   * mode a tool without one is refused, with why. A name registered again takes the new one.
   */
  register<T>(registration: ToolRegistration<T>, where = "registering"): void {
    this.checkConfirm(registration.name, registration.confirm, where);
    this.registrations.set(registration.name, registration as ToolRegistration);
  }

  /** The tools registered with this ledger. */
  registeredTools(): ToolRegistration[] {
    return [...this.registrations.values()];
  }

  private checkConfirm(tool: string, confirm: unknown, where: string): void {
    const problem = confirmProblem(confirm);
    if (problem) throw new TypeError(`${where} ${tool}: ${problem}`);
    if (this.requireConfirm && confirm === undefined) {
      throw new TypeError(
        `${where} ${tool}: this Ledger requires a paired read (requireConfirm: true) and the tool has ` +
          `none. Without one an unknown outcome (a timeout, a crash after acting) cannot be settled, ` +
          `so the tool cannot be safely retried. Pass confirm: (attempt) => found(result) | notFound | ` +
          `cannotTell, looking the effect up by attempt.externalRef.`,
      );
    }
  }

  /**
   * A tool was called without a run id: logs it once per tool, naming the fix, and returns the
   * error to throw (where the framework lets one reach the developer) or to render.
   */
  missingRunId(tool: string, fix: string): MissingRunIdError {
    const error = new MissingRunIdError(tool, fix);
    if (!this.runIdReported.has(tool)) {
      this.runIdReported.add(tool);
      this.logger.error(
        `the tool ${tool} was called without a run id, so the idempotency ledger cannot tell a repeat from a ` +
          `new request; nothing ran. Fix: ${fix || "give the call a run id"}. (Logged once per tool.)`,
      );
    }
    return error;
  }

  /**
   * Asks the ledger whether a tool call must wait for a person (a framework's `needsApproval`:
   * the adapters call it). True when the call's entry awaits a decision, or when this call
   * creates one (the server's policy gates it, or `requireApproval`); the run then pauses for
   * the person, and its entries are kept meanwhile (ExtendRun). Otherwise false, and the
   * ledger's answer is kept for the tool's own call (runOnce/runTool with the same `callId`),
   * so that the call is claimed once. It never lets anything act: after an approval the tool's
   * runOnce claims, and only the ledger's CLAIMED runs the action. A ledger that cannot be
   * asked answers false (the tool's own claim then says why nothing was done).
   */
  async needsApproval(runId: string, tool: string, args: ArgumentsInput, options: NeedsApprovalOptions = {}): Promise<boolean> {
    const callOpts = options.deadlineMs === undefined ? undefined : { deadlineMs: options.deadlineMs };
    let entry: LedgerEntry | undefined;
    try {
      entry = await this.lookup(
        options.key ? { key: options.key } : { runId, tool, args, canonicalization: options.canonicalization },
        callOpts,
      );
    } catch (err) {
      if (!(err instanceof NotFoundError)) {
        this.logger.warn(`needsApproval ${tool}: the ledger could not be asked (${describe(err)}); the call's own claim will say`);
        return false;
      }
    }
    const state = entry?.approval?.state;
    if (entry && state !== "EXPIRED") {
      if (state === "REQUESTED") {
        await this.keepPausedRun(runId, tool, options);
        return true;
      }
      if (options.askedAgainOnResume && state !== undefined) return true;
      return false;
    }
    let claimed: ClaimResult;
    try {
      claimed = await this.claim(
        {
          runId,
          tool,
          args,
          key: options.key,
          canonicalization: options.canonicalization,
          leaseMs: options.leaseMs,
          retentionMs: options.retentionMs,
          principal: options.principal,
          requireApproval: options.requireApproval,
        },
        callOpts,
      );
    } catch (err) {
      this.logger.warn(`needsApproval ${tool}: the ledger could not be asked (${describe(err)}); the call's own claim will say`);
      return false;
    }
    if (claimed.outcome === "AWAITING_APPROVAL") {
      await this.keepPausedRun(runId, tool, options);
      return true;
    }
    if (options.callId !== undefined) {
      if (claimed.outcome !== "IN_PROGRESS") this.keepPrechecked(runId, tool, options.callId, claimed);
    } else if (claimed.outcome === "CLAIMED") {
      // No call id to hand the claim to its call: released at once, the call claims anew.
      await this.releaseUnstarted(claimed, "an approval check without a call id does not keep its claim", options.deadlineMs);
    }
    return false;
  }

  /** The run pauses for a person: its finished entries are kept (ExtendRun); a failure is only logged. */
  private async keepPausedRun(runId: string, tool: string, options: NeedsApprovalOptions): Promise<void> {
    const callOpts = options.deadlineMs === undefined ? undefined : { deadlineMs: options.deadlineMs };
    await this.extendRun(runId, options.pauseRetentionMs, callOpts).then(
      () => {},
      (err: unknown) => this.logger.warn(`needsApproval ${tool}: could not extend run ${runId} while it waits (${describe(err)})`),
    );
  }

  private precheckKey(runId: string, tool: string, callId: string): string {
    return `${runId}\u0000${tool}\u0000${callId}`;
  }

  /**
   * Keeps the answer of a call's approval check for its own call. A claim nobody takes up in
   * time (the framework did not call the tool after all) is released: FAILED retryable, never
   * left to read UNKNOWN.
   */
  private keepPrechecked(runId: string, tool: string, callId: string, claimed: ClaimResult): void {
    const id = this.precheckKey(runId, tool, callId);
    const holdMs = Math.min(10_000, Math.max(1_000, leaseOf(claimed.entry) / 2));
    const timer = setTimeout(() => {
      if (this.prechecked.get(id)?.claimed !== claimed) return;
      this.prechecked.delete(id);
      void this.releaseUnstarted(claimed, "the framework did not run the tool after its approval check", undefined);
    }, holdMs);
    timer.unref();
    this.prechecked.set(id, { claimed, timer });
  }

  /** The answer an approval check kept for this call, taken (once). */
  private takePrechecked(runId: string, tool: string, callId: string | undefined): ClaimResult | undefined {
    if (callId === undefined) return undefined;
    const id = this.precheckKey(runId, tool, callId);
    const kept = this.prechecked.get(id);
    if (!kept) return undefined;
    this.prechecked.delete(id);
    clearTimeout(kept.timer);
    return kept.claimed;
  }

  /**
   * Runs `action` at most once per intent (run, tool, canonical arguments):
   *
   * - CLAIMED: runs the action (renewing the lease while it runs) and completes the entry with
   *   its result; returns `{ value, replayed: false }`. If the action throws NotExecutedError
   *   (itself, or as the `cause` of what it throws) or an error of a `notExecuted` class, the
   *   entry is completed FAILED retryable, PermanentFailureError FAILED for good (both get
   *   `entry` set and are re-thrown); on a timeout (`timeoutMs`, ActionTimeoutError) or any
   *   other error it is completed UNKNOWN and the error re-thrown, unless `confirm` settles it
   *   (found: the result is returned with `confirmed: true`; not found: NotExecutedError). A
   *   result that cannot be stored leaves it UNKNOWN too (ResultNotEncodableError).
   * - REPLAYED: returns the stored result, `{ value, replayed: true, note }`; nothing runs.
   * - IN_PROGRESS: the server holds the claim up to `waitMs` (default 10 s) for the other
   *   attempt, then replays its result (or runs, if it failed retryably); if it is still in
   *   flight, throws InProgressError; if its outcome is unknown, settles it with `confirm` and
   *   claims again, or (without one, or if it cannot tell) throws OutcomeUnknownError.
   * - PREVIOUSLY_FAILED: throws PreviouslyFailedError with the stored error.
   * - AWAITING_APPROVAL (a gated call, or `requireApproval`): throws AwaitingApprovalError;
   *   nothing runs until an approver's decide approves it, then the next call acts, once.
   * - DENIED: throws DeniedError with the person's reason; nothing runs, ever.
   */
  async runOnce<T = unknown>(
    runId: string,
    tool: string,
    args: ArgumentsInput,
    action: (ctx: ActionContext) => T | Promise<T>,
    options: RunOnceOptions<T> = {},
  ): Promise<RunOnceResult<T>> {
    const out = await this.attempt(runId, tool, args, action, options);
    switch (out.kind) {
      case "performed":
        return { value: out.value, replayed: false, note: "", entry: out.entry, confirmed: out.confirmed ?? false };
      case "replayed":
        return { value: out.value, replayed: true, note: out.note, entry: out.entry, confirmed: false };
      default:
        throw out.error;
    }
  }

  /**
   * runOnce for a tool call whose answer goes to a model: never throws for an outcome. The
   * result says what happened (`outcome`), carries the value on a first run or a replay, and
   * `toModelText()` is what the model should read: the result; on a repeat the stored result
   * with the replay note; for in progress, previously failed, unknown and not executed, the
   * note. A call without a run id runs nothing, is logged (once per tool) and answers that
   * nothing was performed.
   */
  async runTool<T = unknown>(
    runId: string | undefined,
    tool: string,
    args: ArgumentsInput,
    action: (ctx: ActionContext) => T | Promise<T>,
    options: RunToolOptions<T> = {},
  ): Promise<ToolCallResult<T>> {
    // A developer's error, before anything else: thrown, not rendered for the model.
    this.checkConfirm(tool, options.confirm, "runOnce:");
    if (typeof runId !== "string" || runId === "") {
      return missingRunIdResult(this.missingRunId(tool, ""));
    }
    let out: AttemptOutcome<T>;
    try {
      out = await this.attempt(runId, tool, args, action, {
        ...options,
        codec: options.codec ?? (toolResultCodec as Codec<T>),
      });
    } catch (err) {
      out = { kind: "thrown", error: err, actionRan: false };
    }
    return render(out);
  }

  /** One attempt of runOnce, as an outcome rather than a throw (runTool renders it). */
  async attempt<T>(
    runId: string,
    tool: string,
    args: ArgumentsInput,
    action: (ctx: ActionContext) => T | Promise<T>,
    options: RunOnceOptions<T> = {},
  ): Promise<AttemptOutcome<T>> {
    if (typeof action !== "function") {
      // Refused before claiming: an entry for an action that cannot run would only need clearing.
      throw new TypeError(`runOnce: the action must be a function, got ${typeof action}`);
    }
    this.checkConfirm(tool, options.confirm, "runOnce:");
    const codec = options.codec ?? (jsonCodec as Codec<T>);
    const waitMs = options.waitMs ?? DEFAULT_WAIT_MS;
    const signal = options.signal;
    const notStarted = (why: string, cause?: unknown) =>
      new NotExecutedError(`${why}; the action was not started`, { cause });
    if (signal?.aborted) {
      return { kind: "thrown", error: notStarted("the call was aborted", signal.reason), actionRan: false };
    }

    let claimed: ClaimResult | undefined;
    // A repeat that meets an unknown outcome settles it once, then claims again.
    for (let settledOnce = false; ; settledOnce = true) {
      // The claim is not given the signal: aborting it in flight could leave a claim the server
      // made but whose token nobody received (UNKNOWN after its lease, for an action that never
      // ran). An abort during the claim answers at once and settles the claim when it arrives.
      const prechecked = settledOnce ? undefined : this.takePrechecked(runId, tool, options.callId);
      const claiming = prechecked
        ? Promise.resolve(prechecked)
        : this.claim(
            {
              runId,
              tool,
              args,
              key: options.key,
              canonicalization: options.canonicalization,
              leaseMs: options.leaseMs,
              retentionMs: options.retentionMs,
              waitMs,
              principal: options.principal,
              requireApproval: options.requireApproval,
            },
            options.deadlineMs === undefined ? undefined : { deadlineMs: options.deadlineMs + waitMs },
          );
      try {
        const raced = await raceAbort(claiming, signal);
        if (raced === ABORTED) {
          claiming.then(
            (c) => this.releaseUnstarted(c, "the call was aborted before the action started", options.deadlineMs),
            () => {},
          );
          return { kind: "thrown", error: notStarted("the call was aborted", signal?.reason), actionRan: false };
        }
        claimed = raced;
      } catch (err) {
        return { kind: "thrown", error: err, actionRan: false };
      }

      const { entry } = claimed;
      switch (claimed.outcome) {
        case "REPLAYED":
          try {
            return { kind: "replayed", value: codec.decode(entry.result), note: claimed.note, entry };
          } catch (err) {
            return { kind: "thrown", error: err, actionRan: false };
          }
        case "IN_PROGRESS": {
          const unknown = entry.status === "UNKNOWN";
          if (unknown && options.confirm && !settledOnce) {
            await this.pauseSinceUnknown(entry, options.confirmDelayMs ?? this.confirmDelayMs);
            const settled = await this.settle(entry, args, options, codec, waitMs, "a repeat");
            // Settled (here or elsewhere): the claim now replays the result, or runs again.
            if (settled.kind !== "cannot_tell" && settled.entry.status !== "UNKNOWN") continue;
          }
          const Cls = unknown ? OutcomeUnknownError : InProgressError;
          const retryAfter = claimed.retryAfter ?? (unknown ? UNKNOWN_RETRY_AFTER_MS : 1000);
          return { kind: "thrown", error: new Cls(claimed.note, retryAfter, entry), actionRan: false };
        }
        case "PREVIOUSLY_FAILED":
          return {
            kind: "thrown",
            error: new PreviouslyFailedError(claimed.note, entry.error, entry),
            actionRan: false,
          };
        case "AWAITING_APPROVAL":
          // Nothing acts on an approval the ledger has not given: only CLAIMED runs the action.
          return { kind: "thrown", error: new AwaitingApprovalError(claimed.note, entry), actionRan: false };
        case "DENIED":
          return { kind: "thrown", error: new DeniedError(claimed.note, entry), actionRan: false };
        case "CLAIMED":
          break;
        default:
          return {
            kind: "thrown",
            error: new LedgerError(`the ledger answered an unexpected outcome ${claimed.outcome}`),
            actionRan: false,
          };
      }
      break;
    }
    const claim = claimed;
    const { entry } = claim;

    const callOpts: CallOptions = { deadlineMs: options.deadlineMs };
    const leaseMs = options.leaseMs ?? leaseOf(entry);
    const finish = (p: Omit<CompleteParams, "key" | "claimToken">) =>
      this.completeWithRetry({ key: entry.key, claimToken: claim.claimToken, ...p }, callOpts, leaseMs);

    if (signal?.aborted) {
      return {
        kind: "thrown",
        error: await this.recordNotStarted(notStarted("the call was aborted", signal.reason), finish),
        actionRan: false,
      };
    }

    const controller = new AbortController();
    const onAbort = () => controller.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    const ctx: ActionContext = {
      runId,
      tool,
      key: entry.key,
      externalRef: entry.externalRef,
      attempt: entry.attempt,
      signal: controller.signal,
      entry,
    };
    const renewer =
      options.renewLease === false
        ? undefined
        : LeaseRenewer.start(this, claim, options.leaseMs, options.deadlineMs ?? this.deadlineMs);
    let value: T;
    try {
      value = await withTimeout(() => runAction(ctx, action), options.timeoutMs, controller);
    } catch (err) {
      signal?.removeEventListener("abort", onAbort);
      // The lease is still renewed while confirm is asked; afterFailure stops the renewal
      // before the Complete, so that none lands after it.
      return this.afterFailure(err, entry, args, options, codec, finish, renewer, controller.signal);
    }
    await renewer?.stop();
    signal?.removeEventListener("abort", onAbort);

    let result: Uint8Array;
    try {
      result = codec.encode(value);
    } catch (err) {
      const why = `the codec could not encode it: ${describe(err)}`;
      const recorded = await finish({ status: "UNKNOWN", error: `the result could not be stored: ${why}` }).then(
        (c) => c.entry,
        () => entry,
      );
      return {
        kind: "thrown",
        error: new ResultNotEncodableError(why, recorded, { cause: err }),
        actionRan: true,
        recorded: "unknown",
        entry: recorded,
      };
    }
    try {
      const done = await finish({ status: "SUCCEEDED", result });
      return { kind: "performed", value, entry: done.entry };
    } catch (err) {
      if (err instanceof InvalidArgumentError) {
        // The ledger refused the result (RESULT_TOO_LARGE): the effect happened but cannot be
        // replayed, so record that the outcome is unknown rather than leave the claim hanging.
        const why = `the ledger refused it: ${err.reason || err.code}: ${err.message}`;
        const recorded = await finish({ status: "UNKNOWN", error: `the result could not be stored: ${why}` }).then(
          (c) => c.entry,
          () => entry,
        );
        return {
          kind: "thrown",
          error: new ResultNotEncodableError(why, recorded, { cause: err }),
          actionRan: true,
          recorded: "unknown",
          entry: recorded,
        };
      }
      return { kind: "thrown", error: err, actionRan: true };
    }
  }

  /**
   * Records a failed action: FAILED retryable when it says it did not act, FAILED for good
   * when it says it never will, UNKNOWN otherwise. With confirm, an unknown outcome is settled
   * first: the claim still holds the entry (ATTEMPTING, its lease renewed), so nobody else can
   * take it while confirm is asked after the pause, and the Complete records what it found.
   * An action that was cut off (it outlived timeoutMs, or the call was aborted: `actionSignal`
   * aborted) may still be running or its request still landing, so a "not found" proves
   * nothing yet: the entry is recorded UNKNOWN, for a reconciler to ask again once the ledger's
   * grace has passed; a "found" is proof, and settles it SUCCEEDED at once.
   */
  private async afterFailure<T>(
    err: unknown,
    claimedEntry: LedgerEntry,
    args: ArgumentsInput,
    options: RunOnceOptions<T>,
    codec: Codec<T>,
    finish: (p: Omit<CompleteParams, "key" | "claimToken">) => Promise<CompleteResult>,
    renewer: LeaseRenewer | undefined,
    actionSignal: AbortSignal,
  ): Promise<AttemptOutcome<T>> {
    const kind = err instanceof ActionTimedOut ? "unknown" : classify(err, options.notExecuted);
    const why = err instanceof ActionTimedOut ? err.message : describe(err);
    let completion: Omit<CompleteParams, "key" | "claimToken"> =
      kind === "not_executed"
        ? { status: "FAILED", retryable: true, error: why }
        : kind === "failed"
          ? { status: "FAILED", retryable: false, error: why }
          : { status: "UNKNOWN", error: why };
    let confirmation: Confirmation<T> | undefined;
    const cutOff = err instanceof ActionTimedOut || actionSignal.aborted;
    if (kind === "unknown" && options.confirm) {
      await sleep(options.confirmDelayMs ?? this.confirmDelayMs);
      const attempt = attemptOf(claimedEntry, JSON.parse(toArgumentsJson(args)) as unknown);
      confirmation = await ask(options.confirm, attempt, this.logger, options.deadlineMs ?? this.deadlineMs);
      const resolution = resolutionOf(claimedEntry, confirmation, codec, this.logger);
      if (!resolution) {
        confirmation = undefined;
      } else if (resolution.status === "SUCCEEDED") {
        completion = { status: "SUCCEEDED", result: resolution.result };
      } else if (cutOff) {
        completion = { status: "UNKNOWN", error: notFoundYetWhy(why, claimedEntry) };
      } else {
        completion = { status: "FAILED", retryable: true, error: notFoundWhy(why, claimedEntry) };
      }
    }
    await renewer?.stop();
    let recorded: CompleteResult;
    try {
      recorded = await finish(completion);
    } catch (ledgerErr) {
      if (confirmation && ledgerErr instanceof AlreadyResolvedError) {
        // Settled by someone else first (a reconciler that took the entry once the lease had
        // ended): say what they found.
        const now = await this.lookup({ key: claimedEntry.key }).catch(() => undefined);
        if (now) return this.settledElsewhere(err, why, now, codec);
      }
      // The entry stays as claimed and reads UNKNOWN once its lease ends: reconciled later.
      // The ledger's error is thrown (the caller must learn the outcome was not recorded),
      // carrying the action's error.
      if (ledgerErr instanceof LedgerError) {
        ledgerErr.actionError = err instanceof ActionTimedOut ? new ActionTimeoutError(err.timeoutMs, claimedEntry) : err;
      }
      return { kind: "thrown", error: ledgerErr, actionRan: true };
    }
    const entry = recorded.entry;
    if (kind !== "unknown") {
      if (err instanceof NotExecutedError || err instanceof PermanentFailureError) err.entry = entry;
      return { kind: "thrown", error: err, actionRan: true, recorded: kind, entry };
    }
    const error = err instanceof ActionTimedOut ? new ActionTimeoutError(err.timeoutMs, entry) : err;
    if (confirmation?.kind === "found") {
      logSettlement(this.logger, entry, "found", "run_once");
      return { kind: "performed", value: confirmation.result, entry, confirmed: true };
    }
    if (confirmation?.kind === "not_found") {
      logSettlement(this.logger, entry, "not_found", "run_once");
      // Cut off: nothing found yet, but the action may still land; recorded UNKNOWN.
      if (entry.status === "UNKNOWN") return { kind: "thrown", error, actionRan: true, recorded: "unknown", entry };
      return notFoundOutcome(error, entry);
    }
    if (options.confirm) logSettlement(this.logger, entry, "cannot_tell", "run_once");
    return { kind: "thrown", error, actionRan: true, recorded: "unknown", entry };
  }

  /** The outcome of an attempt someone else settled first, as they settled it. */
  private settledElsewhere<T>(err: unknown, why: string, now: LedgerEntry, codec: Codec<T>): AttemptOutcome<T> {
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

  /**
   * Who a call settles as (resolvedBy): the call's principal, else the Ledger's, else
   * `confirm@<host>:<pid>`; an empty one counts as none (the Python client's rule too).
   */
  private settler(options: { principal?: string }): string {
    return options.principal || this.principal || defaultPrincipal("confirm");
  }

  /** Settles an UNKNOWN entry a repeat met with the call's paired read (see settle.ts). */
  private settle<T>(
    entry: LedgerEntry,
    args: ArgumentsInput,
    options: RunOnceOptions<T>,
    codec: Codec<T>,
    waitMs: number,
    via: Via,
  ): Promise<Settlement<T>> {
    return settle(this, entry, {
      confirm: options.confirm!,
      codec,
      args: JSON.parse(toArgumentsJson(args)) as unknown,
      principal: this.settler(options),
      logger: this.logger,
      confirmTimeoutMs: options.deadlineMs ?? this.deadlineMs,
      waitMs,
      via,
    });
  }

  /**
   * Waits out what is left of the pause since the entry became unknown (its Complete, or the
   * end of its lease), so that a repeat arriving at once gives the outside world the same time
   * to show the effect as the call that met the unknown outcome.
   */
  private async pauseSinceUnknown(entry: LedgerEntry, delayMs: number): Promise<void> {
    const since = entry.finishedAt ?? entry.leaseExpiresAt;
    if (!since) return;
    const left = Math.min(delayMs, since.getTime() + delayMs - Date.now());
    if (left > 0) await sleep(left);
  }

  /** Completes FAILED retryable an attempt claimed but never started; returns `error` with its entry. */
  private async recordNotStarted(
    error: NotExecutedError,
    finish: (p: Omit<CompleteParams, "key" | "claimToken">) => Promise<CompleteResult>,
  ): Promise<unknown> {
    try {
      error.entry = (await finish({ status: "FAILED", retryable: true, error: describe(error) })).entry;
      return error;
    } catch (ledgerErr) {
      if (ledgerErr instanceof LedgerError) ledgerErr.actionError = error;
      return ledgerErr;
    }
  }

  /** Settles, in the background, a claim that arrived after its caller had given up. */
  private async releaseUnstarted(claimed: ClaimResult, why: string, deadlineMs: number | undefined) {
    if (claimed.outcome !== "CLAIMED") return;
    await this.completeWithRetry(
      {
        key: claimed.entry.key,
        claimToken: claimed.claimToken,
        status: "FAILED",
        retryable: true,
        error: `NotExecutedError: ${why}`,
      },
      { deadlineMs },
    ).catch(() => {});
  }

  /**
   * Complete, sent again on UNAVAILABLE and DEADLINE_EXCEEDED (the identical Complete is
   * idempotent) within the retry budget, and at least the claim's lease: an action that ran
   * must not turn into an unknown outcome because the ledger's database was failing over.
   */
  private completeWithRetry(params: CompleteParams, opts: CallOptions, leaseMs = 0): Promise<CompleteResult> {
    return this.complete(params, opts, leaseMs);
  }
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


