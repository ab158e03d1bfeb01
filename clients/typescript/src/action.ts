// Running a claimed action, apart from the ledger's answers: the attempt it can read
// (currentAttempt), its time limit (withTimeout), an abort that answers at once while a call is
// in flight (raceAbort), the lease renewed while it runs (LeaseRenewer), and how its throw is
// recorded (classify). attempt.ts puts these together into one attempt of runOnce.

import { AsyncLocalStorage } from "node:async_hooks";
import { RENEW_EVERY_FRACTION_OF_LEASE } from "./defaults.js";
import { FailedPreconditionError, NotExecutedError, PermanentFailureError } from "./errors.js";
import type { LedgerRpc } from "./rpc.js";
import type { ClaimResult } from "./rpc-types.js";
import type { ActionContext, ErrorClass } from "./run-options.js";
import type { LedgerEntry } from "./types.js";

const attempts = new AsyncLocalStorage<ActionContext>();

/**
 * The attempt being executed, inside an action of runOnce or a wrapped tool's execute: its
 * key, externalRef and attempt number, to pass downstream (an idempotency key header, a memo
 * field). Undefined outside one.
 */
export function currentAttempt(): ActionContext | undefined {
  return attempts.getStore();
}

/** Runs the action with `ctx` as its currentAttempt. */
export function runAction<T>(ctx: ActionContext, action: (ctx: ActionContext) => T | Promise<T>): T | Promise<T> {
  return attempts.run(ctx, () => action(ctx));
}

/**
 * How a throw of the action is recorded: FAILED retryable when it says nothing happened
 * (NotExecutedError, itself or as its `cause`, or a class the tool declares `notExecuted`),
 * FAILED for good for PermanentFailureError (itself or as its `cause`), and UNKNOWN for
 * everything else: a framework's own retry or tool-error exception says nothing about whether
 * the effect happened.
 */
export function classify(err: unknown, notExecuted: readonly ErrorClass[] = []): "not_executed" | "failed" | "unknown" {
  const cause = err instanceof Error ? err.cause : undefined;
  if (err instanceof NotExecutedError || cause instanceof NotExecutedError) return "not_executed";
  if (notExecuted.some((cls) => err instanceof cls)) return "not_executed";
  if (err instanceof PermanentFailureError || cause instanceof PermanentFailureError) return "failed";
  return "unknown";
}

/**
 * Renews a claim's lease every RENEW_EVERY_FRACTION_OF_LEASE of it while the action runs. A
 * renewal the ledger refuses for good (STALE_CLAIM_TOKEN, LEASE_ENDED: the attempt lost its
 * claim) stops it; a transient failure is tried again at the next tick.
 */
export class LeaseRenewer {
  private timer: NodeJS.Timeout | undefined;
  private inFlight: Promise<void> | undefined;
  private stopped = false;

  private constructor(
    private readonly ledger: LedgerRpc,
    private readonly claimed: ClaimResult,
    private readonly leaseMs: number | undefined,
    private readonly deadlineMs: number,
  ) {}

  static start(
    ledger: LedgerRpc,
    claimed: ClaimResult,
    leaseMs: number | undefined,
    deadlineMs: number,
  ): LeaseRenewer | undefined {
    // Unset, the lease is the server's default: what the claim's entry shows.
    const lease = leaseMs ?? leaseOf(claimed.entry);
    if (!(lease > 0)) return undefined;
    const every = lease * RENEW_EVERY_FRACTION_OF_LEASE;
    // A renewal stuck longer than the interval would hold up the next one: it gives up first.
    const renewer = new LeaseRenewer(ledger, claimed, leaseMs, Math.min(deadlineMs, every));
    renewer.timer = setInterval(() => renewer.tick(), every);
    // A renewal is no reason to keep the process alive: the action is.
    renewer.timer.unref();
    return renewer;
  }

  private tick(): void {
    if (this.stopped || this.inFlight) return;
    const { entry, claimToken } = this.claimed;
    this.inFlight = this.ledger
      // A renewal retried past the interval would hold up the next one.
      .renewLease(entry.key, claimToken, this.leaseMs, { deadlineMs: this.deadlineMs, retryBudgetMs: this.deadlineMs })
      .then(
        () => {},
        (err: unknown) => {
          if (err instanceof FailedPreconditionError) this.halt();
        },
      )
      .finally(() => {
        this.inFlight = undefined;
      });
  }

  private halt(): void {
    this.stopped = true;
    clearInterval(this.timer);
  }

  /** Stops renewing; resolves once no renewal is in flight. */
  async stop(): Promise<void> {
    this.halt();
    await this.inFlight;
  }
}

export const ABORTED = Symbol("aborted");

/** `p`, or ABORTED as soon as `signal` aborts (p keeps running). */
export function raceAbort<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T | typeof ABORTED> {
  if (!signal) return p;
  return new Promise<T | typeof ABORTED>((resolve, reject) => {
    const onAbort = () => resolve(ABORTED);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(e);
      },
    );
  });
}

/** The lease an entry was claimed with (0 when its times are unset). */
export function leaseOf(entry: LedgerEntry): number {
  const { startedAt, leaseExpiresAt } = entry;
  return startedAt && leaseExpiresAt ? Math.max(0, leaseExpiresAt.getTime() - startedAt.getTime()) : 0;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}

/** An error as a log line or a recorded reason: `Name: message`. */
export function describe(err: unknown): string {
  if (err instanceof Error) return `${err.name}: ${err.message}`;
  return String(err);
}

/** The internal rejection of withTimeout; runOnce turns it into ActionTimeoutError with the entry. */
export class ActionTimedOut extends Error {
  constructor(readonly timeoutMs: number) {
    super(`the action did not finish within ${timeoutMs} ms`);
  }
}

/** Runs `run`; past `timeoutMs`, aborts `controller` and rejects with ActionTimedOut. */
export async function withTimeout<T>(
  run: () => T | Promise<T>,
  timeoutMs: number | undefined,
  controller: AbortController,
): Promise<T> {
  if (timeoutMs === undefined) return await run();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const err = new ActionTimedOut(timeoutMs);
      controller.abort(new DOMException(err.message, "TimeoutError"));
      reject(err);
    }, timeoutMs);
  });
  try {
    return await Promise.race([Promise.resolve().then(run), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
