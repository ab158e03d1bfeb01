// The Ledger: the RPCs (rpc.ts) with runOnce (one attempt of which, claim → act → complete, is
// attempt.ts), runTool (runOnce rendered for a model), the approval check a framework makes
// before a call (needsApproval, whose claim the call then takes up), and the tools registered
// with it (tools.ts and the adapters register theirs here, so that a Reconciler finds each
// tool's paired read).

import { describe, leaseOf } from "./action.js";
import { Attempt, releaseUnstarted } from "./attempt.js";
import type { Codec } from "./codec.js";
import { confirmProblem, type Confirm } from "./confirm.js";
import { DEFAULT_CONFIRM_DELAY_MS } from "./defaults.js";
import { MissingRunIdError, NotFoundError } from "./errors.js";
import type { ArgumentsInput } from "./keys.js";
import { stderrLogger, type LedgerLogger } from "./log.js";
import { missingRunIdResult, render, toolResultCodec, type AttemptOutcome, type ToolCallResult } from "./outcome.js";
import { LedgerRpc } from "./rpc.js";
import type { ClaimResult, LedgerRpcOptions } from "./rpc-types.js";
import {
  claimOf,
  type ActionContext,
  type NeedsApprovalOptions,
  type RunOnceOptions,
  type RunOnceResult,
  type RunToolOptions,
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
      claimed = await this.claim(claimOf(runId, tool, args, options), callOpts);
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
      await releaseUnstarted(this, claimed, "an approval check without a call id does not keep its claim", options.deadlineMs);
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
      void releaseUnstarted(this, claimed, "the framework did not run the tool after its approval check", undefined);
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

  /** One attempt of runOnce, as an outcome rather than a throw (runTool renders it); see attempt.ts. */
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
    const host = { rpc: this, logger: this.logger, confirmDelayMs: this.confirmDelayMs, deadlineMs: this.deadlineMs };
    const takePrechecked = () => this.takePrechecked(runId, tool, options.callId);
    return new Attempt(host, { runId, tool, args, action, takePrechecked }, options).run();
  }
}
