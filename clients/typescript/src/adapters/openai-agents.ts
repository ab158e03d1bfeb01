// The OpenAI Agents JS SDK adapter (`import { ledgerTool } from "idempotency-ledger/openai-agents"`):
// the ledger wraps the tool's definition, the object you give the SDK's `tool()`:
// `tool(ledgerTool(ledger, { name, description, parameters, execute }, { confirm }))`. It cannot
// wrap what `tool()` returns: that FunctionTool hides execute, and turns what execute throws
// (and its own timeouts) into an ordinary text result before any wrapper could see it, so an
// error after acting would be recorded as a success. The run is read from the run context: the
// `context` given to `run(agent, input, { context: { runId } })` (it is kept in a RunState, so a
// run resumed after an interruption keeps its run id). Only types are imported from
// "@openai/agents" (an optional peer dependency). Approvals: the definition's needsApproval asks
// the ledger, so a gated call interrupts the run (result.interruptions); decideInterruption is the
// app's button (Decide with an approver's credential, then state.approve); the tool acts only on
// the ledger's CLAIMED, whatever the RunState says was approved.

import type { RunContext, RunState, RunToolApprovalItem } from "@openai/agents";
import type { Confirm } from "../confirm.js";
import { MissingRunIdError } from "../errors.js";
import { deriveKey, fingerprint, type ArgumentsInput, type Canonicalization } from "../keys.js";
import type { Ledger } from "../ledger.js";
import { notExecutedNote } from "../outcome.js";
import type { LedgerRpc } from "../rpc.js";
import { wrapTool, type WrapToolOptions } from "../tools.js";
import type { Decision, LedgerEntry } from "../types.js";

/** What the SDK passes as execute's third argument (its ToolCallDetails): the call's signal and item. */
interface CallDetails {
  signal?: AbortSignal;
  toolCall?: { callId?: string };
}

/** The SDK's needsApproval: a boolean, or a function of the run context, the input and the call id. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AgentsApprovalGate = boolean | ((runContext: RunContext<any>, input: any, callId?: string) => boolean | Promise<boolean>);

/** Where the developer sets the run id, said in the log line and the exception. */
const RUN_ID_FIX = "pass context: { runId } to run(agent, input, options), or the runId option of ledgerTool";

/** The tool definition ledgerTool takes: what the SDK's tool() takes, with a name and an execute. */
export interface AgentsToolOptions {
  name: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  execute: (input: any, context?: RunContext<any>, details?: any) => unknown;
  outputSchema?: unknown;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  errorFunction?: ((context: RunContext<any>, error: unknown, details?: any) => unknown) | null;
  /** The SDK's own per-call time limit: ledgerTool makes it the ledger's `timeoutMs` instead. */
  timeoutMs?: number;
  timeoutBehavior?: unknown;
  timeoutErrorFunction?: unknown;
  /**
   * The SDK's own approval gate: ledgerTool makes it the Claim's `requireApproval` and replaces
   * it with one that asks the ledger (the server's approval policy may gate the tool too).
   */
  needsApproval?: AgentsApprovalGate;
}

/** The same definition, whose execute returns the text the model reads. */
export type LedgerAgentsToolOptions<T extends AgentsToolOptions> = Omit<
  T,
  "execute" | "errorFunction" | "timeoutMs" | "timeoutBehavior" | "timeoutErrorFunction"
> & {
  execute: (...args: Parameters<T["execute"]>) => Promise<string>;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  errorFunction: (context: RunContext<any>, error: unknown, details?: any) => Promise<string>;
  /** Asks the ledger: true while the call awaits a person's decision (the run is interrupted). */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  needsApproval: (runContext: RunContext<any>, input: any, callId?: string) => Promise<boolean>;
};

/** The options of ledgerTool: wrapTool's, with the run id read from the run context. */
export interface AgentsLedgerOptions
  extends Omit<
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    WrapToolOptions<[any, RunContext<any> | undefined, CallDetails | undefined]>,
    "name" | "runId" | "signal" | "throwOnMissingRunId" | "confirm" | "requireApproval" | "callId"
  > {
  /**
   * The run: a string, or a function of the call (input, run context). Default: the run
   * context's `context.runId` (`run(agent, input, { context: { runId } })`).
   */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  runId?: string | ((input: any, context: RunContext<any> | undefined) => string | undefined);
  /**
   * The paired read: given the attempt (key, externalRef, arguments, attempt number), answers
   * found(result) with what execute would have returned, notFound, or cannotTell.
   */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  confirm?: Confirm<unknown, any>;
  /**
   * How long the run's finished entries are kept at least (ExtendRun) when a call interrupts
   * the run for a person's decision: unset, the server's default retention.
   */
  pauseRetentionMs?: number;
}

/** The default run id: `runContext.context.runId`, when the run's context is an object with one. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function runIdFromRunContext(_input: unknown, context: RunContext<any> | undefined): string | undefined {
  const ctx: unknown = context?.context;
  if (ctx !== null && typeof ctx === "object" && typeof (ctx as { runId?: unknown }).runId === "string") {
    return (ctx as { runId: string }).runId;
  }
  return undefined;
}

/**
 * Wraps an Agents SDK tool definition: `tool(ledgerTool(ledger, { name, description, parameters,
 * execute }, { confirm }))`. Each call claims the key of (run, name, parsed input) before execute
 * runs; a repeat of the same intent in the run gets the stored result with the ledger's replay
 * note, and nothing runs. execute returns the text the model reads (ToolCallResult.toModelText()),
 * so no outcome reaches the SDK as an error (whose text would ask the model to try again). An
 * exception thrown by execute after it started is an unknown outcome (settled with `confirm` if
 * given), unless it is NotExecutedError (itself or as its `cause`) or of a `notExecuted` class.
 * The definition's `timeoutMs` becomes the ledger's (an unknown outcome, not the SDK's "timed
 * out" text). A run without a run id throws MissingRunIdError out of run() (logged once per
 * tool). Inside execute, `currentAttempt()` gives the attempt. A tool with an `outputSchema` is
 * refused: its result must be the schema's object, and a replay note or an unknown note is not.
 */
export function ledgerTool<T extends AgentsToolOptions>(
  ledger: Ledger,
  definition: T,
  options: AgentsLedgerOptions = {},
): LedgerAgentsToolOptions<T> {
  const candidate = definition as unknown as { type?: unknown; invoke?: unknown; name?: unknown };
  if (candidate !== null && typeof candidate === "object" && typeof candidate.invoke === "function") {
    throw new TypeError(
      `ledgerTool(${String(candidate.name)}): this is the FunctionTool tool() returns; wrap its definition instead: ` +
        `tool(ledgerTool(ledger, { name, description, parameters, execute }, { confirm })). A FunctionTool hides ` +
        `execute and turns its errors and timeouts into ordinary results, so a wrapper around it could not tell ` +
        `a failure after acting from a success`,
    );
  }
  if (definition === null || typeof definition !== "object" || typeof definition.execute !== "function") {
    throw new TypeError("ledgerTool: the tool definition needs an execute function");
  }
  if (definition.outputSchema !== undefined) {
    throw new TypeError(
      `ledgerTool(${definition.name}): a tool with an outputSchema cannot carry the ledger's notes; ` +
        `drop the outputSchema, or use ledger.runTool inside execute`,
    );
  }
  const { runId = runIdFromRunContext, confirm, timeoutMs, pauseRetentionMs, ...rest } = options;
  const {
    errorFunction: ownErrorFunction,
    timeoutMs: sdkTimeoutMs,
    timeoutBehavior: _behavior,
    timeoutErrorFunction: _timeoutText,
    needsApproval: ownGate,
    ...plain
  } = definition;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const gated = async (runContext: RunContext<any> | undefined, input: unknown, callId?: string) =>
    typeof ownGate === "function" ? await ownGate(runContext as RunContext, input, callId) : (ownGate ?? false);
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const runIdOf = (input: unknown, runContext: RunContext<any> | undefined) =>
    typeof runId === "function" ? runId(input, runContext) : runId;
  const wrapped = wrapTool(ledger, { ...plain, execute: definition.execute } as T, {
    ...rest,
    confirm: confirm as Confirm<unknown> | undefined,
    timeoutMs: timeoutMs ?? sdkTimeoutMs,
    runId: runId as WrapToolOptions<Parameters<T["execute"]>>["runId"],
    signal: (_input: unknown, _context?: unknown, details?: CallDetails) => details?.signal,
    // The tool's gate, asked again at the call itself: resumed with an approval the ledger never
    // gave (a forged or replayed RunState), the Claim still asks for one, and only CLAIMED acts.
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    requireApproval: (input: unknown, context?: RunContext<any>, details?: CallDetails) =>
      gated(context, input, details?.toolCall?.callId),
    callId: (_input: unknown, _context?: unknown, details?: CallDetails) => details?.toolCall?.callId,
    runIdHint: RUN_ID_FIX,
    throwOnMissingRunId: true,
  } as WrapToolOptions<Parameters<T["execute"]>>);
  const execute = wrapped.execute;
  return Object.assign(wrapped, {
    // The SDK's approval step, with the ledger as its authority: true while the call's entry
    // awaits a person (the server's policy gated it, or the tool's own needsApproval asked),
    // which interrupts the run (result.interruptions); the run's entries are kept meanwhile.
    // Anything else is false, and the call's own Claim says what to do.
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    needsApproval: async (runContext: RunContext<any>, input: unknown, callId?: string) => {
      const run = runIdOf(input, runContext);
      if (typeof run !== "string" || run === "") return false;
      const args = (rest.arguments ? rest.arguments(input, runContext, undefined) : input) as ArgumentsInput;
      return ledger.needsApproval(run, definition.name, args, {
        callId,
        requireApproval: await gated(runContext, input, callId),
        key: rest.key?.(input, runContext, undefined),
        canonicalization: rest.canonicalization,
        principal: rest.principal,
        leaseMs: rest.leaseMs,
        retentionMs: rest.retentionMs,
        pauseRetentionMs,
        deadlineMs: rest.deadlineMs,
      });
    },
    execute: async (...args: Parameters<T["execute"]>) => (await execute(...args)).toModelText(),
    // Only two things reach here: the input the SDK could not parse (nothing ran) and a missing
    // run id, which must reach the developer: the SDK lets what this throws out of run().
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    errorFunction: async (context: RunContext<any>, error: unknown, details?: unknown) => {
      if (error instanceof MissingRunIdError || ownErrorFunction === null) throw error;
      if (ownErrorFunction) return (await ownErrorFunction(context, error, details)) as string;
      return notExecutedNote(error);
    },
  }) as unknown as LedgerAgentsToolOptions<T>;
}

/** The options of decideInterruption. */
export interface DecideInterruptionOptions {
  /** The run: default the run state's `context.runId`, as the tool reads it. */
  runId?: string;
  /** As the tool's ledgerTool was given it. */
  canonicalization?: Canonicalization;
}

/**
 * The app's approve (or deny) button for an interruption of a ledger tool: records the person's
 * decision in the ledger with the approver's credential (`approver`: a Ledger made with a token
 * of the approver role), bound to the arguments the interruption shows (their fingerprint), and
 * marks the interruption approved in the run state, so that resuming the run
 * (`run(agent, state)`) hands the call to the tool, which asks the ledger: after an approval it
 * acts, once (any number of resumes of the state act once); after a denial the model reads the
 * ledger's note with the person's reason, and nothing acts. The run state's approval alone lets
 * nothing act: without this decision the tool answers that a person has been asked.
 * Returns the entry, decided.
 */
export async function decideInterruption(
  approver: LedgerRpc,
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  state: RunState<any, any>,
  interruption: RunToolApprovalItem,
  decision: Decision | Lowercase<Decision>,
  reason: string,
  options: DecideInterruptionOptions = {},
): Promise<LedgerEntry> {
  const { key, fingerprint: shown } = interruptionKey(state, interruption, options);
  const entry = await approver.decide(key, shown, decision, reason);
  state.approve(interruption);
  return entry;
}

/**
 * The ledger's key of an interrupted call and the fingerprint of the arguments it shows (what a
 * person approves), derived as the tool's Claim derives them: from the run (the run state's
 * `context.runId`), the tool's name and the interruption's arguments.
 */
export function interruptionKey(
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  state: RunState<any, any>,
  interruption: RunToolApprovalItem,
  options: DecideInterruptionOptions = {},
): { runId: string; tool: string; key: string; fingerprint: string; arguments: string } {
  const runId = options.runId ?? runIdFromRunContext(undefined, state._context);
  if (!runId) throw new MissingRunIdError(interruption.name ?? "?", RUN_ID_FIX);
  const tool = interruption.name;
  const args = interruption.arguments;
  if (!tool || args === undefined) throw new TypeError("decideInterruption: the interruption is not a function tool's call");
  return {
    runId,
    tool,
    key: deriveKey(runId, tool, args, options.canonicalization),
    fingerprint: fingerprint(tool, args, options.canonicalization),
    arguments: args,
  };
}
