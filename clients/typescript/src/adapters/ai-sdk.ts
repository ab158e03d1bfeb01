// The Vercel AI SDK adapter (`import { ledgerTool } from "idempotency-ledger/ai-sdk"`): the ledger
// wraps the SDK's own tool, `ledgerTool(ledger, tool({ inputSchema, execute }), { name, confirm })`,
// so that each call of it goes through the ledger. The run is read from the
// `experimental_context` given to generateText/streamText (`{ runId }`), or from the `runId`
// option. Only types are imported from "ai" (an optional peer dependency, 5 or 6): the wrapped
// tool is the same object, with its execute, onInputAvailable and toModelOutput replaced.

import type { Tool, ToolCallOptions } from "ai";
import type { Confirm } from "../confirm.js";
import type { Ledger } from "../ledger.js";
import { ToolCallResult, modelTextOf } from "../outcome.js";
import { wrapTool, type WrapToolOptions } from "../tools.js";

// ToolCallOptions is the name both majors export (6 also calls it ToolExecutionOptions).
type ToolExecutionOptions = ToolCallOptions;

/** Where the developer sets the run id, said in the log line and the exception. */
const RUN_ID_FIX =
  "pass experimental_context: { runId } to generateText or streamText, or the runId option of ledgerTool";

/** The options of ledgerTool: wrapTool's, with the tool's name and its paired read. */
export interface AiSdkToolOptions<INPUT, OUTPUT = unknown>
  extends Omit<
    WrapToolOptions<[INPUT, ToolExecutionOptions]>,
    "name" | "runId" | "signal" | "throwOnMissingRunId" | "confirm"
  > {
  /**
   * The tool's name in the ledger: its key in the tools object you give generateText (AI SDK
   * tools have no name of their own). Required.
   */
  name: string;
  /**
   * The run: a string, or a function of the call. Default: `experimental_context.runId`
   * (`generateText({ …, experimental_context: { runId } })`).
   */
  runId?: string | ((input: INPUT, options: ToolExecutionOptions) => string | undefined);
  /**
   * The paired read: given the attempt (key, externalRef, arguments, attempt number), answers
   * found(result) with what execute would have returned, notFound, or cannotTell.
   */
  confirm?: Confirm<OUTPUT, INPUT>;
}

/** The AI SDK tool a wrapped one becomes: its output is the ToolCallResult. */
export type LedgerAiSdkTool<INPUT, OUTPUT> = Tool<INPUT, ToolCallResult<OUTPUT>>;

/** The default run id: `experimental_context.runId`, when the context is an object with one. */
export function runIdFromContext(_input: unknown, options: Pick<ToolExecutionOptions, "experimental_context">): string | undefined {
  const ctx = options?.experimental_context;
  if (ctx !== null && typeof ctx === "object" && typeof (ctx as { runId?: unknown }).runId === "string") {
    return (ctx as { runId: string }).runId;
  }
  return undefined;
}

/**
 * Wraps an AI SDK tool: `issue_credit: ledgerTool(ledger, tool({ … }), { name: "issue_credit",
 * confirm })`. Each call claims the key of (run, `name`, input) before execute runs; a repeat of
 * the same intent in the run gets the stored result with the ledger's replay note, and nothing
 * runs. The model reads `toModelText()` of the ToolCallResult (the tool's own `toModelOutput`
 * is replaced); the step's tool result is the ToolCallResult itself. An exception thrown by
 * execute after it started is an unknown outcome (settled with `confirm` if given), unless it is
 * NotExecutedError (itself or as its `cause`) or of a `notExecuted` class. A call without a run
 * id makes generateText/streamText throw MissingRunIdError before the tool runs (logged once).
 * Inside execute, `currentAttempt()` gives the attempt (its `externalRef` is the idempotency key
 * to pass downstream). The call's `abortSignal` aborted before execute starts leaves the intent
 * retryable.
 */
export function ledgerTool<INPUT, OUTPUT>(
  ledger: Ledger,
  tool: Tool<INPUT, OUTPUT>,
  options: AiSdkToolOptions<INPUT, OUTPUT>,
): LedgerAiSdkTool<INPUT, OUTPUT> {
  if (typeof tool === "string") {
    throw new TypeError(
      `ledgerTool(ledger, "${String(tool)}", tool): the name is an option now: ledgerTool(ledger, tool({ … }), { name: "${String(tool)}" })`,
    );
  }
  const name = options?.name;
  if (typeof name !== "string" || name === "") {
    throw new TypeError(
      "ledgerTool: options.name is required (the tool's key in the tools object): AI SDK tools have no name of " +
        "their own, and the ledger keys each call by it",
    );
  }
  if (typeof tool?.execute !== "function") {
    throw new TypeError(`ledgerTool(${name}): the tool has no execute function to wrap`);
  }
  const { runId = runIdFromContext, confirm, ...rest } = options;
  const runIdOf = (input: INPUT, callOptions: ToolExecutionOptions) =>
    typeof runId === "function" ? runId(input, callOptions) : runId;
  const wrapped = wrapTool(
    ledger,
    tool as Tool<INPUT, OUTPUT> & { execute: (input: INPUT, options: ToolExecutionOptions) => unknown },
    {
      ...rest,
      confirm: confirm as Confirm<unknown> | undefined,
      name,
      runId: runIdOf as WrapToolOptions<[INPUT, ToolExecutionOptions]>["runId"],
      signal: (_input: INPUT, callOptions: ToolExecutionOptions) => callOptions?.abortSignal,
      runIdHint: RUN_ID_FIX,
    },
  );
  // The SDK calls onInputAvailable before execute, and lets what it throws reach the caller of
  // generateText/streamText: the one place a missing run id can reach the developer.
  const own = tool.onInputAvailable;
  const onInputAvailable = async (event: Parameters<NonNullable<Tool<INPUT, OUTPUT>["onInputAvailable"]>>[0]) => {
    const run = runIdOf(event.input as INPUT, event as unknown as ToolExecutionOptions);
    if (typeof run !== "string" || run === "") throw ledger.missingRunId(name, RUN_ID_FIX);
    await own?.call(tool, event);
  };
  return Object.assign(wrapped, { toModelOutput, onInputAvailable }) as unknown as LedgerAiSdkTool<INPUT, OUTPUT>;
}

/**
 * What the model reads of a wrapped tool's output. AI SDK 6 passes `{ toolCallId, input, output }`,
 * 5 passes the output itself; either may be a ToolCallResult or its JSON form (a chat UI that
 * stored the messages and sends them back).
 */
function toModelOutput(arg: unknown): { type: "text"; value: string } {
  const output =
    arg instanceof ToolCallResult || arg === null || typeof arg !== "object" || !("output" in arg)
      ? arg
      : (arg as { output: unknown }).output;
  return { type: "text", value: modelTextOf(output) };
}
