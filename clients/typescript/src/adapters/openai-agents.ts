// The OpenAI Agents JS SDK adapter (`import { ledgerTool } from "idempotency-ledger/openai-agents"`):
// wraps the options of `tool({ name, parameters, execute })` so that each call goes through the
// ledger: `tool(ledgerTool(ledger, { name, description, parameters, execute }))`. The run is
// read from the run context: the `context` given to `run(agent, input, { context: { runId } })`
// (it is kept in a RunState, so a run resumed after an interruption keeps its run id). Only
// types are imported from "@openai/agents" (an optional peer dependency).

import type { RunContext } from "@openai/agents";
import type { Ledger } from "../ledger.js";
import type { WrapToolOptions } from "../tools.js";

/** What the SDK passes as execute's third argument (its ToolCallDetails): the call's signal. */
interface CallDetails {
  signal?: AbortSignal;
}

/** The tool options ledgerTool takes: those of the SDK's tool(), with a name and an execute. */
export interface AgentsToolOptions {
  name: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  execute: (input: any, context?: RunContext<any>, details?: any) => unknown;
  outputSchema?: unknown;
}

/** The same tool options, whose execute returns the text the model reads. */
export type LedgerAgentsToolOptions<T extends AgentsToolOptions> = Omit<T, "execute"> & {
  execute: (...args: Parameters<T["execute"]>) => Promise<string>;
};

/** The options of ledgerTool: wrapTool's, with the run id read from the run context. */
export interface AgentsLedgerOptions
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  extends Omit<WrapToolOptions<[any, RunContext<any> | undefined, CallDetails | undefined]>, "name" | "runId" | "signal"> {
  /**
   * The run: a string, or a function of the call (input, run context). Default: the run
   * context's `context.runId` (`run(agent, input, { context: { runId } })`).
   */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  runId?: string | ((input: any, context: RunContext<any> | undefined) => string | undefined);
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
 * Wraps the options of an Agents SDK function tool: `tool(ledgerTool(ledger, { name,
 * description, parameters, execute }))`. Each call claims the key of (run, name, parsed input)
 * before execute runs; a repeat of the same intent in the run gets the stored result with the
 * ledger's replay note, and nothing runs. execute returns the text the model reads
 * (ToolCallResult.toModelText()), so no outcome reaches the SDK as an error. Inside execute,
 * `currentAttempt()` gives the attempt (its `externalRef` is the idempotency key to pass
 * downstream). A tool with an `outputSchema` is refused: its result must be the schema's object,
 * and a replay note or an in-progress note is not.
 */
export function ledgerTool<T extends AgentsToolOptions>(
  ledger: Ledger,
  toolOptions: T,
  options: AgentsLedgerOptions = {},
): LedgerAgentsToolOptions<T> {
  if (toolOptions === null || typeof toolOptions !== "object" || typeof toolOptions.execute !== "function") {
    throw new TypeError("ledgerTool: the tool options need an execute function");
  }
  if (toolOptions.outputSchema !== undefined) {
    throw new TypeError(
      `ledgerTool(${toolOptions.name}): a tool with an outputSchema cannot carry the ledger's notes; ` +
        `drop the outputSchema, or use ledger.runTool inside execute`,
    );
  }
  const { runId = runIdFromRunContext, ...rest } = options;
  const wrapped = ledger.wrapTool(toolOptions, {
    ...rest,
    runId: runId as WrapToolOptions<Parameters<T["execute"]>>["runId"],
    signal: (_input: unknown, _context?: unknown, details?: CallDetails) => details?.signal,
    runIdHint: "the developer passes context: { runId } to run(agent, input, options), or the runId option of ledgerTool",
  } as WrapToolOptions<Parameters<T["execute"]>>);
  const execute = wrapped.execute;
  return Object.assign(wrapped, {
    execute: async (...args: Parameters<T["execute"]>) => (await execute(...args)).toModelText(),
  }) as unknown as LedgerAgentsToolOptions<T>;
}
