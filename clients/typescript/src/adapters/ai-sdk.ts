// The Vercel AI SDK adapter (`import { ledgerTool } from "idempotency-ledger/ai-sdk"`): wraps a
// `tool({ inputSchema, execute })` so that each call of it goes through the ledger. The run is
// read from the `experimental_context` given to generateText/streamText (`{ runId }`), or from
// the `runId` option. Only types are imported from "ai" (an optional peer dependency, 5 or 6):
// the wrapped tool is the same object, with its execute and toModelOutput replaced.

import type { Tool, ToolCallOptions } from "ai";
import type { Ledger } from "../ledger.js";
import { ToolCallResult, modelTextOf, type WrapToolOptions } from "../tools.js";

// ToolCallOptions is the name both majors export (6 also calls it ToolExecutionOptions).
type ToolExecutionOptions = ToolCallOptions;

/** The options of ledgerTool: wrapTool's, with the run id read from the AI SDK's call. */
export interface AiSdkToolOptions<INPUT>
  extends Omit<WrapToolOptions<[INPUT, ToolExecutionOptions]>, "name" | "runId" | "signal"> {
  /**
   * The run: a string, or a function of the call. Default: `experimental_context.runId`
   * (`generateText({ …, experimental_context: { runId } })`).
   */
  runId?: string | ((input: INPUT, options: ToolExecutionOptions) => string | undefined);
}

/** The AI SDK tool a wrapped one becomes: its output is the ToolCallResult. */
export type LedgerAiSdkTool<INPUT, OUTPUT> = Tool<INPUT, ToolCallResult<OUTPUT>>;

/** The default run id: `experimental_context.runId`, when the context is an object with one. */
export function runIdFromContext(_input: unknown, options: ToolExecutionOptions): string | undefined {
  const ctx = options?.experimental_context;
  if (ctx !== null && typeof ctx === "object" && typeof (ctx as { runId?: unknown }).runId === "string") {
    return (ctx as { runId: string }).runId;
  }
  return undefined;
}

/**
 * Wraps an AI SDK tool: `issue_credit: ledgerTool(ledger, "issue_credit", tool({ … }))`. Each
 * call claims the key of (run, `name`, input) before execute runs; a repeat of the same intent
 * in the run gets the stored result with the ledger's replay note, and nothing runs. The model
 * reads `toModelText()` of the ToolCallResult (the tool's own `toModelOutput` is replaced); the
 * step's tool result is the ToolCallResult itself. Inside execute, `currentAttempt()` gives the
 * attempt (its `externalRef` is the idempotency key to pass downstream). The call's
 * `abortSignal` aborted before execute starts leaves the intent retryable.
 */
export function ledgerTool<INPUT, OUTPUT>(
  ledger: Ledger,
  name: string,
  tool: Tool<INPUT, OUTPUT>,
  options: AiSdkToolOptions<INPUT> = {},
): LedgerAiSdkTool<INPUT, OUTPUT> {
  if (typeof tool?.execute !== "function") {
    throw new TypeError(`ledgerTool(${name}): the tool has no execute function to wrap`);
  }
  const { runId = runIdFromContext, ...rest } = options;
  const wrapped = ledger.wrapTool(
    tool as Tool<INPUT, OUTPUT> & { execute: (input: INPUT, options: ToolExecutionOptions) => unknown },
    {
      ...rest,
      name,
      runId: runId as WrapToolOptions<[INPUT, ToolExecutionOptions]>["runId"],
      signal: (_input: INPUT, callOptions: ToolExecutionOptions) => callOptions?.abortSignal,
      runIdHint:
        "the developer passes experimental_context: { runId } to generateText or streamText, or the runId option of ledgerTool",
    },
  );
  return Object.assign(wrapped, { toModelOutput }) as unknown as LedgerAiSdkTool<INPUT, OUTPUT>;
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
