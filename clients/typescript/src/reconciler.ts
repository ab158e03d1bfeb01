// The Reconciler: runs the Reconcile loop for the tools registered with a paired read
// (confirm), and for those only. Each round asks the ledger, tool by tool, for its unresolved
// entries (held for this reconciler for the reconcile lease), asks the tool's confirm about each
// by its external_ref and arguments, and sends what it found: found → SUCCEEDED with the
// result, not found → FAILED retryable, cannot tell → nothing (the entry is handed out again
// after the hold, or settled by a person with `idempotency-ledger resolve`). Confirms are paced
// (at most `maxConfirmsPerSecond`), failures back off (doubling, jittered, capped), and it stops
// cleanly on stop(), an AbortSignal or (if asked) SIGTERM/SIGINT. Every settlement is logged
// with its key, tool, external_ref, outcome and who settled it. Findings are fenced (the attempt
// and hold token of the entry handed out): one the ledger did not apply (STALE, ALREADY_RESOLVED)
// is logged with the attempt seen and the attempt and status now, and counted in `figures`,
// never as settled here.

import type { Ledger, ToolRegistration } from "./ledger.js";
import type { LedgerLogger } from "./log.js";
import { defaultPrincipal } from "./log.js";
import { toolResultCodec } from "./outcome.js";
import { answerOf, ask, attemptOf, logNotApplied, logSettlement, resolutionOf } from "./settle.js";
import { registrationOf } from "./tools.js";
import type { LedgerEntry, ResolutionOutcome } from "./types.js";
import { NotFoundError } from "./errors.js";
import { confirmProblem } from "./confirm.js";

/** One settlement the reconciler made (or tried). */
export interface SettlementRecord {
  key: string;
  tool: string;
  externalRef: string;
  /**
   * What the paired read said, or `elsewhere` when the ledger did not apply the finding (its
   * `result`): the entry moved on between the hand-out and the answer (a later attempt, another
   * hand-out, a late Complete, another reconciler, a person).
   */
  outcome: "found" | "not_found" | "cannot_tell" | "elsewhere";
  /** The attempt the paired read was asked about (the entry's, as handed out). */
  attemptSeen: number;
  /**
   * What the ledger answered to the finding sent (APPLIED, or why not: STALE, ALREADY_RESOLVED,
   * NOT_FOUND); undefined when none was sent (cannot tell).
   */
  result: ResolutionOutcome | undefined;
  /**
   * Who settled it, as the entry says (its resolvedBy): this reconciler's principal for found
   * and not_found, whoever did for `elsewhere`, "" while nobody has (cannot_tell).
   */
  resolvedBy: string;
  /** The entry as it stands after the answer. */
  entry: LedgerEntry;
}

/**
 * What a Reconciler has done since it was made: entries handed out to it, and what became of
 * them. `found` and `notFound` count findings the ledger applied (settled by this reconciler);
 * `stale` and `alreadyResolved` findings it did not apply (the entry had moved on: never counted
 * as settled here); `gone` entries that no longer existed.
 */
export interface ReconcilerFigures {
  handedOut: number;
  found: number;
  notFound: number;
  cannotTell: number;
  stale: number;
  alreadyResolved: number;
  gone: number;
}

/**
 * A Reconciler's defaults, the Python Reconciler's too (clients/parity.json, `reconciler`):
 * entries older than 10 s, 50 per tool per round, 5 s between idle rounds, 10 confirms a second,
 * failed rounds backing off from 1 s to 60 s.
 */
export const RECONCILER_DEFAULTS = Object.freeze({
  olderThanMs: 10_000,
  limit: 50,
  intervalMs: 5_000,
  maxConfirmsPerSecond: 10,
  backoffMs: 1_000,
  maxBackoffMs: 60_000,
  confirmTimeoutMs: 10_000,
});

/** The options of a Reconciler. */
export interface ReconcilerOptions {
  /**
   * Only entries whose attempt started at least this long ago (default 10 s), so that a call
   * settling its own unknown outcome right away (runOnce with confirm) is not raced for it.
   */
  olderThanMs?: number;
  /** How many entries to take per tool per round (default 50). */
  limit?: number;
  /** The pause between rounds when nothing was handed out (default 5 s). */
  intervalMs?: number;
  /** At most this many confirms per second, all tools together (default 10). */
  maxConfirmsPerSecond?: number;
  /** The first pause after a failed round, doubled after each failure (default 1 s). */
  backoffMs?: number;
  /** The longest pause after failed rounds (default 60 s). */
  maxBackoffMs?: number;
  /** Who reconciles, recorded as resolvedBy (default `reconciler@<host>:<pid>`). */
  principal?: string;
  /** How long one confirm may take before it counts as "cannot tell" (default 10 s). */
  confirmTimeoutMs?: number;
  /** Stops the reconciler when aborted. */
  signal?: AbortSignal;
  /** Stop on these process signals (for example ["SIGTERM", "SIGINT"]); default none. */
  stopOnSignals?: NodeJS.Signals[];
  /** Where to log (default the Ledger's logger). */
  logger?: LedgerLogger;
  /** Called with every settlement, after it is logged. */
  onSettlement?: (record: SettlementRecord) => void;
}

/**
 * What a Reconciler is given as its tools: wrapped tools (what wrapTool, ledgerTool and
 * registerLedgerTool return), registrations `{ name, confirm, codec? }`, or tool names (or
 * objects with a `name`, such as an Agents SDK FunctionTool) registered with the ledger; an
 * array or a record of them (the AI SDK's tools object).
 */
export type ReconcilerTools = Iterable<unknown> | Record<string, unknown>;

/** Settles the unknown outcomes of the tools it is given, and of those only. */
export class Reconciler {
  /** The tools this reconciler settles, each with its paired read. */
  readonly tools: ReadonlyArray<Required<Pick<ToolRegistration, "name" | "confirm">> & ToolRegistration>;
  /** Who reconciles (recorded as resolvedBy). */
  readonly principal: string;
  /** What it has done so far (updated as it goes). */
  readonly figures: ReconcilerFigures = {
    handedOut: 0,
    found: 0,
    notFound: 0,
    cannotTell: 0,
    stale: 0,
    alreadyResolved: 0,
    gone: 0,
  };
  private readonly logger: LedgerLogger;
  private readonly stopper = new AbortController();
  private loop: Promise<void> | undefined;
  private nextConfirmAt = 0;
  private readonly cleanup: Array<() => void> = [];

  /**
   * `tools` unset: every tool registered with `ledger` with a confirm. A tool given without a
   * paired read is refused: the reconciler never settles an entry it cannot ask about.
   */
  constructor(
    private readonly ledger: Ledger,
    tools?: ReconcilerTools,
    private readonly options: ReconcilerOptions = {},
  ) {
    this.tools = resolveTools(ledger, tools);
    this.principal = options.principal || defaultPrincipal("reconciler");
    this.logger = options.logger ?? ledger.logger;
    if (options.signal) {
      const onAbort = () => this.stopper.abort();
      if (options.signal.aborted) onAbort();
      options.signal.addEventListener("abort", onAbort, { once: true });
      this.cleanup.push(() => options.signal?.removeEventListener("abort", onAbort));
    }
    for (const sig of options.stopOnSignals ?? []) {
      const onSignal = () => {
        this.logger.info(`reconciler ${this.principal}: ${sig}, stopping`);
        this.stopper.abort();
      };
      process.once(sig, onSignal);
      this.cleanup.push(() => process.removeListener(sig, onSignal));
    }
  }

  /** True once stop() was called or the signal fired. */
  get stopped(): boolean {
    return this.stopper.signal.aborted;
  }

  /** Starts the loop in the background (beside the agent); returns this. */
  start(): this {
    if (!this.loop) {
      this.logger.info(
        `reconciler ${this.principal}: reconciling ${this.tools.map((t) => t.name).join(", ")}`,
      );
      this.loop = this.run();
    }
    return this;
  }

  /** Stops the loop after the confirm in flight, if any; resolves once it has stopped. */
  async stop(): Promise<void> {
    this.stopper.abort();
    await this.loop;
  }

  /** Resolves when the loop has stopped (after stop(), the signal, or a process signal). */
  get done(): Promise<void> {
    return this.loop ?? Promise.resolve();
  }

  private async run(): Promise<void> {
    let failures = 0;
    try {
      while (!this.stopped) {
        let handedOut: number;
        try {
          handedOut = (await this.round()).handedOut;
          failures = 0;
        } catch (err) {
          failures++;
          const first = this.options.backoffMs ?? RECONCILER_DEFAULTS.backoffMs;
          const base = Math.min(this.options.maxBackoffMs ?? RECONCILER_DEFAULTS.maxBackoffMs, first * 2 ** (failures - 1));
          const pause = base * (0.5 + Math.random() / 2);
          this.logger.warn(
            `reconciler ${this.principal}: round failed (${describe(err)}); next in ${Math.round(pause)} ms`,
          );
          await this.sleep(pause);
          continue;
        }
        if (handedOut === 0) await this.sleep(this.options.intervalMs ?? RECONCILER_DEFAULTS.intervalMs);
      }
    } finally {
      for (const undo of this.cleanup.splice(0)) undo();
      this.logger.info(`reconciler ${this.principal}: stopped; ${describeFigures(this.figures)}`);
    }
  }

  /**
   * One round: for each tool, takes its unresolved entries, asks confirm about each, answers.
   * Returns how many entries were handed out and what became of them. Throws when the ledger
   * cannot be reached (the loop backs off).
   */
  async round(): Promise<{ handedOut: number; settlements: SettlementRecord[] }> {
    let handedOut = 0;
    const settlements: SettlementRecord[] = [];
    for (const tool of this.tools) {
      if (this.stopped) break;
      const { pending } = await this.ledger.reconcile({
        tool: tool.name,
        limit: this.options.limit ?? RECONCILER_DEFAULTS.limit,
        olderThanMs: this.options.olderThanMs ?? RECONCILER_DEFAULTS.olderThanMs,
        principal: this.principal,
      });
      handedOut += pending.length;
      this.figures.handedOut += pending.length;
      for (const entry of pending) {
        // Stopped mid-round: the rest are handed out again once their hold ends.
        if (this.stopped) break;
        // Never another tool's entry, whatever the ledger hands out.
        if (entry.tool !== tool.name) continue;
        const record = await this.settleOne(tool, entry);
        if (record) settlements.push(record);
      }
    }
    return { handedOut, settlements };
  }

  private async settleOne(tool: ToolRegistration & { confirm: NonNullable<ToolRegistration["confirm"]> }, entry: LedgerEntry) {
    // Reconcile hands out entries without their arguments: Lookup has them (as the server keeps them).
    let args: unknown;
    try {
      const full = await this.ledger.lookup({ key: entry.key });
      args = full.argumentsJson ? (JSON.parse(full.argumentsJson) as unknown) : undefined;
    } catch (err) {
      if (err instanceof NotFoundError) {
        this.figures.gone++; // expired meanwhile
        return undefined;
      }
      throw err;
    }
    const timeout = this.options.confirmTimeoutMs ?? RECONCILER_DEFAULTS.confirmTimeoutMs;
    // Paced right before the confirm, so the Lookup's own time cannot bring two confirms closer.
    await this.pace();
    const confirmation = await ask(tool.confirm, attemptOf(entry, args), this.logger, timeout);
    const codec = tool.codec ?? toolResultCodec;
    // Fenced: the attempt and the hold token of the entry as it was handed out.
    const resolution = resolutionOf(entry, confirmation, codec, this.logger);
    if (!resolution) {
      this.figures.cannotTell++;
      return this.record(entry, entry, "cannot_tell", undefined);
    }
    const answer = answerOf(
      resolution,
      await this.ledger.reconcile({ resolutions: [resolution], resolveOnly: true, principal: this.principal }),
      this.principal,
    );
    const said = confirmation.kind === "found" ? "found" : "not_found";
    if (answer.result === "APPLIED" && answer.entry) {
      this.figures[said === "found" ? "found" : "notFound"]++;
      return this.record(entry, answer.entry, said, answer.result);
    }
    // Not applied: the entry moved on since it was handed out; logged, counted, never ours.
    logNotApplied(this.logger, entry, said, answer, "reconciler");
    if (answer.result === "STALE") this.figures.stale++;
    else if (answer.result === "ALREADY_RESOLVED") this.figures.alreadyResolved++;
    else this.figures.gone++;
    if (!answer.entry) return undefined;
    return this.record(entry, answer.entry, "elsewhere", answer.result);
  }

  private record(
    seen: LedgerEntry,
    entry: LedgerEntry,
    outcome: SettlementRecord["outcome"],
    result: ResolutionOutcome | undefined,
  ): SettlementRecord {
    logSettlement(this.logger, entry, outcome, "reconciler");
    const record: SettlementRecord = {
      key: entry.key,
      tool: entry.tool,
      externalRef: entry.externalRef,
      outcome,
      attemptSeen: seen.attempt,
      result,
      resolvedBy: entry.resolvedBy,
      entry,
    };
    this.options.onSettlement?.(record);
    return record;
  }

  /**
   * Keeps confirms at least 1/maxConfirmsPerSecond apart: the next may start that long after
   * this one actually starts (not after when it was due: a timer that fired late must not bring
   * the next confirm closer), and a timer that fires early is waited out again.
   */
  private async pace(): Promise<void> {
    const every = 1_000 / (this.options.maxConfirmsPerSecond ?? RECONCILER_DEFAULTS.maxConfirmsPerSecond);
    for (let wait = this.nextConfirmAt - Date.now(); wait > 0 && !this.stopped; wait = this.nextConfirmAt - Date.now()) {
      await this.sleep(wait);
    }
    this.nextConfirmAt = Date.now() + every;
  }

  /** A pause that ends early when the reconciler stops. */
  private sleep(ms: number): Promise<void> {
    const signal = this.stopper.signal;
    if (signal.aborted) return Promise.resolve();
    return new Promise((done) => {
      const timer = setTimeout(finish, ms);
      function finish() {
        clearTimeout(timer);
        signal.removeEventListener("abort", finish);
        done();
      }
      signal.addEventListener("abort", finish, { once: true });
    });
  }
}

/** The registrations a Reconciler is given, each with its paired read. */
function resolveTools(
  ledger: Ledger,
  tools: ReconcilerTools | undefined,
): Array<ToolRegistration & { confirm: NonNullable<ToolRegistration["confirm"]> }> {
  const withConfirm = (r: ToolRegistration): r is ToolRegistration & { confirm: NonNullable<ToolRegistration["confirm"]> } =>
    typeof r.confirm === "function";
  if (tools === undefined) {
    const all = ledger.registeredTools().filter(withConfirm);
    if (all.length === 0) {
      throw new TypeError("Reconciler: no tool registered with this ledger has a paired read (confirm) to reconcile with");
    }
    return all;
  }
  const items: unknown[] =
    typeof (tools as Iterable<unknown>)[Symbol.iterator] === "function"
      ? [...(tools as Iterable<unknown>)]
      : Object.values(tools as Record<string, unknown>);
  const registered = new Map(ledger.registeredTools().map((r) => [r.name, r]));
  const out = new Map<string, ToolRegistration & { confirm: NonNullable<ToolRegistration["confirm"]> }>();
  for (const item of items) {
    const reg = registrationFor(item, registered);
    if (!reg) {
      throw new TypeError(
        `Reconciler: ${describeTool(item)} is not a tool registered with the ledger (wrap it with ledgerTool, ` +
          `registerLedgerTool or wrapTool, or give { name, confirm })`,
      );
    }
    const problem = confirmProblem(reg.confirm);
    if (problem) throw new TypeError(`Reconciler: the tool ${reg.name}: ${problem}`);
    if (!withConfirm(reg)) {
      throw new TypeError(
        `Reconciler: the tool ${reg.name} has no paired read (confirm), so this reconciler could never settle ` +
          `its entries. Register the tool with confirm: (attempt) => found(result) | notFound | cannotTell, ` +
          `looking the effect up by attempt.externalRef (the confirm option of ledgerTool, registerLedgerTool ` +
          `or wrapTool, or { name, confirm }), or leave it out of the reconciler's tools`,
      );
    }
    out.set(reg.name, reg);
  }
  if (out.size === 0) throw new TypeError("Reconciler: no tools to reconcile");
  return [...out.values()];
}

function registrationFor(item: unknown, registered: Map<string, ToolRegistration>): ToolRegistration | undefined {
  if (typeof item === "string") return registered.get(item);
  const carried = registrationOf(item);
  if (carried) return carried;
  if (item !== null && typeof item === "object" && typeof (item as { name?: unknown }).name === "string") {
    const { name, confirm } = item as { name: string; confirm?: unknown };
    // A registration given here (`{ name, confirm }`): its confirm is checked as the ledger's are.
    if (confirm !== undefined) return item as ToolRegistration;
    return registered.get(name);
  }
  return undefined;
}

function describeTool(item: unknown): string {
  if (typeof item === "string") return `the name ${JSON.stringify(item)}`;
  const name = (item as { name?: unknown } | null)?.name;
  return typeof name === "string" ? `the tool ${name}` : `a ${typeof item}`;
}

/** The figures in words, for the log. */
export function describeFigures(f: ReconcilerFigures): string {
  return (
    `handed out ${f.handedOut}, settled ${f.found + f.notFound} (found ${f.found}, not found ${f.notFound}), ` +
    `cannot tell ${f.cannotTell}, findings not applied ${f.stale + f.alreadyResolved} (stale ${f.stale}, ` +
    `already resolved ${f.alreadyResolved}), gone ${f.gone}`
  );
}

function describe(err: unknown): string {
  if (err instanceof Error) return `${err.name}: ${err.message}`;
  return String(err);
}
