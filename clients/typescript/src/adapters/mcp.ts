// The MCP TypeScript SDK adapter (`import { registerLedgerTool } from "idempotency-ledger/mcp"`):
// `registerLedgerTool(server, ledger, name, config, callback)` registers a tool exactly as
// `server.registerTool(name, config, callback)` does, with each call going through the ledger.
// The run is read from the request's `_meta` (RUN_ID_META_KEY, "idempotency-ledger/run_id"):
// an MCP client calls `callTool({ name, arguments, _meta: { "idempotency-ledger/run_id": runId } })`.
// A call without one gets a tool error (isError), nothing runs, and the server logs it (once per
// tool): the SDK lets no exception from a tool reach the host. MCP has no approval step: a gated
// call answers the ledger's awaiting note, a denied one its denial note. Only types are imported
// from "@modelcontextprotocol/sdk" (an optional peer dependency).

import type { McpServer, RegisteredTool, ToolCallback } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { AnySchema, ZodRawShapeCompat } from "@modelcontextprotocol/sdk/server/zod-compat.js";
import type { CallToolResult, ToolAnnotations } from "@modelcontextprotocol/sdk/types.js";
import type { Confirm } from "../confirm.js";
import type { ArgumentsInput } from "../keys.js";
import type { Ledger, ToolRegistration } from "../ledger.js";
import type { RunToolOptions } from "../run-options.js";
import { missingRunIdResult, toolResultCodec, type ToolCallResult } from "../outcome.js";
import { markRegistered } from "../tools.js";

/** The `_meta` member of a tools/call request that carries the run id. */
export const RUN_ID_META_KEY = "idempotency-ledger/run_id";

/** What the SDK gives a tool callback besides its arguments (the parts this adapter reads). */
export interface McpCallExtra {
  _meta?: Record<string, unknown>;
  signal?: AbortSignal;
}

/** The options of registerLedgerTool: runTool's, and where the run id comes from. */
export interface McpLedgerOptions extends Omit<RunToolOptions<unknown>, "signal" | "codec" | "confirm"> {
  /** The `_meta` member that holds the run id; default RUN_ID_META_KEY. */
  metaKey?: string;
  /** The run id from the call, instead of `_meta[metaKey]`. */
  runId?: (args: unknown, extra: McpCallExtra) => string | undefined;
  /**
   * The paired read: given the attempt (key, externalRef, arguments, attempt number), answers
   * found(result) with the CallToolResult the callback would have returned (any other value is
   * sent as one text block), notFound, or cannotTell.
   */
  confirm?: Confirm<CallToolResult | unknown>;
}

/** The tool's config, as McpServer.registerTool takes it. */
export interface McpToolConfig<InputArgs, OutputArgs> {
  title?: string;
  description?: string;
  inputSchema?: InputArgs;
  outputSchema?: OutputArgs;
  annotations?: ToolAnnotations;
  _meta?: Record<string, unknown>;
}

/**
 * The callback returned a result with `isError: true`: the tool reported a failure in-band,
 * which says nothing about whether the effect happened. It is recorded UNKNOWN like any other
 * failure (its text is the entry's error); a tool that knows nothing happened throws
 * NotExecutedError instead.
 */
class ToolReportedError extends Error {
  constructor(readonly result: CallToolResult) {
    super(
      result.content
        .filter((c): c is { type: "text"; text: string } => c.type === "text")
        .map((c) => c.text)
        .join(" ") || "the tool reported an error",
    );
    this.name = "ToolReportedError";
  }
}

/** The run id in a call's `_meta`, if it is a non-empty string. */
export function runIdFromMeta(extra: McpCallExtra | undefined, metaKey = RUN_ID_META_KEY): string | undefined {
  const value = extra?._meta?.[metaKey];
  return typeof value === "string" && value !== "" ? value : undefined;
}

/**
 * Registers `name` on `server` as `server.registerTool(name, config, callback)` would, each call
 * going through the ledger: the key of (run, name, arguments) is claimed before the callback
 * runs; a repeat of the same intent in the run gets the stored result, with the ledger's replay
 * note as its first text block, and nothing runs. Every other outcome (in progress, unknown,
 * previously failed, not performed) is one text block the model reads (ToolCallResult's
 * toModelText()); `isError` is set when nothing happened or will happen (not performed,
 * failed), never for an attempt in flight or an unknown outcome, which must not be retried
 * (with an `outputSchema` those are isError too: the SDK allows no result without its
 * structured content). An exception thrown by the callback after it started, and a result it
 * marks `isError`, are unknown outcomes (settled with `confirm` if given), unless it is
 * NotExecutedError (itself or as its `cause`) or of a `notExecuted` class. Inside the callback
 * `currentAttempt()` gives the attempt.
 */
export function registerLedgerTool<
  InputArgs extends undefined | ZodRawShapeCompat | AnySchema = undefined,
  OutputArgs extends ZodRawShapeCompat | AnySchema = ZodRawShapeCompat,
>(
  server: McpServer,
  ledger: Ledger,
  name: string,
  config: McpToolConfig<InputArgs, OutputArgs>,
  callback: ToolCallback<InputArgs>,
  options: McpLedgerOptions = {},
): RegisteredTool {
  if (typeof callback !== "function") {
    throw new TypeError(`registerLedgerTool(${name}): the callback must be a function`);
  }
  const { metaKey = RUN_ID_META_KEY, runId: runIdOf, confirm, ...runOptions } = options;
  const registration: ToolRegistration = { name, confirm: confirm as Confirm<unknown> | undefined, codec: toolResultCodec };
  ledger.register(registration, "registerLedgerTool:");
  const fix = runIdOf
    ? "the runId option of registerLedgerTool found none in the call"
    : `the MCP client sends it as _meta["${metaKey}"] of tools/call, or pass the runId option of registerLedgerTool`;
  const hasInput = config.inputSchema !== undefined;
  const hasOutput = config.outputSchema !== undefined;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const call = callback as (...args: any[]) => CallToolResult | Promise<CallToolResult>;

  const handle = async (args: unknown, extra: McpCallExtra): Promise<CallToolResult> => {
    const runId = runIdOf ? runIdOf(args, extra) : runIdFromMeta(extra, metaKey);
    if (!runId) {
      // The host is who can send the run id: it reads how, after the note every client gives.
      const missing = missingRunIdResult(ledger.missingRunId(name, fix));
      return { content: [{ type: "text", text: `${missing.toModelText()} To fix it: ${fix}.` }], isError: true };
    }
    const result = await ledger.runTool<CallToolResult>(
      runId,
      name,
      (args ?? {}) as ArgumentsInput,
      async () => {
        const out = await (hasInput ? call(args, extra) : call(extra));
        if (out?.isError) throw new ToolReportedError(out);
        return out;
      },
      {
        ...runOptions,
        confirm: confirm as Confirm<CallToolResult> | undefined,
        signal: extra?.signal,
        codec: toolResultCodec as never,
      },
    );
    return toCallToolResult(result, hasOutput);
  };

  const registered = hasInput ? handle : (extra: McpCallExtra) => handle(undefined, extra);
  return markRegistered(server.registerTool(name, config as never, registered as never), registration);
}

/** A result as the MCP client gets it: a CallToolResult as is, anything else as one text block. */
function asCallToolResult(value: unknown): CallToolResult {
  if (value !== null && typeof value === "object" && Array.isArray((value as CallToolResult).content)) {
    return value as CallToolResult;
  }
  if (value === undefined) return { content: [] };
  return { content: [{ type: "text", text: typeof value === "string" ? value : JSON.stringify(value) }] };
}

/** What the MCP client gets for a ToolCallResult. */
function toCallToolResult(result: ToolCallResult<CallToolResult>, hasOutput: boolean): CallToolResult {
  const text = (t: string) => ({ type: "text" as const, text: t });
  switch (result.outcome) {
    case "performed":
      return asCallToolResult(result.value);
    case "replayed": {
      const stored = asCallToolResult(result.value);
      return { ...stored, content: [text(result.note), ...(stored.content ?? [])] };
    }
    case "not_executed":
      // Settled by the paired read (nothing happened): a normal result, like the unknown
      // outcome it was. Anything else not performed is a tool error the model may retry.
      return { content: [text(result.toModelText())], isError: result.confirmed ? hasOutput : true };
    case "outcome_unknown":
    case "in_progress":
    case "awaiting_approval":
      // Not a failure to retry: a normal result the model reads (the SDK insists on isError
      // for a result without the structured content an outputSchema asks for). A gated call
      // reads the ledger's awaiting note: a person has been asked, nothing was done.
      return { content: [text(result.toModelText())], isError: hasOutput };
    default:
      // Not performed, failed for good, previously failed, and denied (the ledger's note with
      // the person's reason): a tool error.
      return { content: [text(result.toModelText())], isError: true };
  }
}
