// Tools, framework-free: wrapTool (any `{ execute }` tool, same shape, each call through
// Ledger.runTool) and the registration a wrapped tool carries (its name and its paired read),
// which the Reconciler reads. The framework adapters (adapters/) build on wrapTool.

import type { Codec } from "./codec.js";
import { NotExecutedError } from "./errors.js";
import type { ArgumentsInput } from "./keys.js";
import type { Ledger, ToolRegistration } from "./ledger.js";
import type { RunToolOptions } from "./run-options.js";
import { missingRunIdResult, render, type ToolCallResult } from "./outcome.js";

/**
 * The property under which a wrapped tool (wrapTool, the adapters' ledgerTool and
 * registerLedgerTool) carries its registration: what a Reconciler needs to settle its entries.
 */
export const LEDGER_TOOL: unique symbol = Symbol.for("idempotency-ledger.tool") as never;

/** The registration a tool object carries, if it is a wrapped tool. */
export function registrationOf(tool: unknown): ToolRegistration | undefined {
  if (tool === null || (typeof tool !== "object" && typeof tool !== "function")) return undefined;
  return (tool as { [LEDGER_TOOL]?: ToolRegistration })[LEDGER_TOOL];
}

/** Attaches a registration to a tool object (not enumerable: frameworks that copy tools skip it). */
export function markRegistered<O extends object>(tool: O, registration: ToolRegistration): O {
  Object.defineProperty(tool, LEDGER_TOOL, { value: registration, enumerable: false, configurable: true });
  return tool;
}

/** Anything with an `execute` function: the tool objects of most agent frameworks. */
export interface ToolLike {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  execute: (...args: any[]) => unknown;
  name?: string;
}

/** The wrapped tool: the same object, with an execute that returns a ToolCallResult. */
export type WrappedTool<Tool extends ToolLike> = Omit<Tool, "execute"> & {
  execute: (
    ...args: Parameters<Tool["execute"]>
  ) => Promise<ToolCallResult<Awaited<ToolValue<ReturnType<Tool["execute"]>>>>>;
};

/** The value an execute produces: its awaited result, or the last item of an async iterable. */
export type ToolValue<R> = R extends AsyncIterable<infer V> ? V : R;

/** How wrapTool reaches the ledger for each call; `A` is the tool's execute arguments. */
export interface WrapToolOptions<A extends unknown[]>
  extends Omit<RunToolOptions<unknown>, "key" | "signal" | "requireApproval" | "callId"> {
  /** The tool's name in the ledger; default the tool's own `name`. */
  name?: string;
  /**
   * The agent run each call belongs to: a string, or a function of execute's arguments (the
   * framework's context, where the run is kept). Required: without a run the ledger cannot
   * tell a repeat from a new request; a call without one is not performed.
   */
  runId: string | ((...args: A) => string | undefined);
  /** What is recorded as the call's arguments; default execute's first argument. */
  arguments?: (...args: A) => ArgumentsInput;
  /** An explicit key per call (such as `${workflowRunId}:${stepId}`) instead of the derived one. */
  key?: (...args: A) => string | undefined;
  /**
   * Ask a person before the call acts (the Claim's `require_approval`): a boolean, or a function
   * of execute's arguments (the framework's own `needsApproval`, say). The server's approval
   * policy may gate a call without it. A gated call answers the model `awaiting_approval` (a
   * person has been asked; nothing was done) and acts only once the ledger, asked again, says
   * CLAIMED: an approval held only in the framework's state never lets it act.
   */
  requireApproval?: boolean | ((...args: A) => boolean | Promise<boolean>);
  /** The framework's id of the call, to take up the answer of its approval check (Ledger.needsApproval). */
  callId?: (...args: A) => string | undefined;
  /** The framework's abort signal of the call, if it has one. */
  signal?: (...args: A) => AbortSignal | undefined;
  /** Where the developer sets the run id: said in the log line (the model reads only that nothing ran). */
  runIdHint?: string;
  /**
   * A call without a run id throws MissingRunIdError from execute instead of answering that
   * nothing was performed: for frameworks that let an exception reach the developer.
   */
  throwOnMissingRunId?: boolean;
}

/**
 * Wraps a tool (any object with an `execute` function) so that each call goes through
 * Ledger.runTool: the same object shape, with an `execute` that takes the same arguments and
 * returns a ToolCallResult. The tool name defaults to `tool.name`; the arguments recorded are
 * `execute`'s first argument (what the model sent, the framework's context left out); `runId`
 * is required (a string, or a function of execute's arguments). The tool is registered with
 * the ledger (with its `confirm`, if any: refused without one in strict mode). The tool's own
 * execute can read the attempt (key, externalRef, attempt) with currentAttempt(). The framework
 * adapters (idempotency-ledger/ai-sdk, /openai-agents, /mcp) build on it.
 */
export function wrapTool<Tool extends ToolLike>(
  ledger: Ledger,
  tool: Tool,
  options: WrapToolOptions<Parameters<Tool["execute"]>>,
): WrappedTool<Tool> {
  type A = Parameters<Tool["execute"]>;
  if (tool === null || typeof tool !== "object" || typeof tool.execute !== "function") {
    throw new TypeError("wrapTool: the tool must be an object with an execute function");
  }
  const name = options?.name ?? tool.name;
  if (typeof name !== "string" || name === "") {
    throw new TypeError("wrapTool: the tool has no name; pass options.name");
  }
  if (options.runId === undefined || (typeof options.runId !== "string" && typeof options.runId !== "function")) {
    throw new TypeError("wrapTool: options.runId is required (a string, or a function of execute's arguments)");
  }
  const {
    runId,
    arguments: argsOf,
    key,
    signal,
    requireApproval,
    callId,
    runIdHint = "",
    throwOnMissingRunId = false,
    name: _name,
    ...runOptions
  } = options;
  const registration: ToolRegistration = { name, confirm: runOptions.confirm, codec: runOptions.codec as Codec<unknown> | undefined };
  ledger.register(registration, "wrapTool:");
  const original = tool.execute;
  const execute = async (...callArgs: A) => {
    let run: string | undefined;
    let args: ArgumentsInput;
    let explicitKey: string | undefined;
    let callSignal: AbortSignal | undefined;
    let gated: boolean | undefined;
    let id: string | undefined;
    try {
      run = typeof runId === "function" ? runId(...callArgs) : runId;
      args = argsOf ? argsOf(...callArgs) : ((callArgs[0] ?? {}) as ArgumentsInput);
      explicitKey = key?.(...callArgs);
      callSignal = signal?.(...callArgs);
      // Asked again at every call, whatever the framework's state says was approved: a call
      // that reaches the ledger without an entry yet (a forged history) is still gated.
      gated = typeof requireApproval === "function" ? await requireApproval(...callArgs) : requireApproval;
      id = callId?.(...callArgs);
    } catch (err) {
      // Nothing was claimed yet: the call is simply not performed, and the model says why.
      return render<never>({
        kind: "thrown",
        error: new NotExecutedError(`the tool wrapper could not prepare the call: ${describe(err)}`, { cause: err }),
        actionRan: false,
      });
    }
    if (typeof run !== "string" || run === "") {
      const missing = ledger.missingRunId(name, runIdHint);
      if (throwOnMissingRunId) throw missing;
      return missingRunIdResult(missing);
    }
    return ledger.runTool(run, name, args, () => lastValue(original.apply(tool, callArgs)), {
      ...runOptions,
      key: explicitKey,
      signal: callSignal,
      requireApproval: gated,
      callId: id,
    });
  };
  const wrapped = Object.create(Object.getPrototypeOf(tool) as object) as WrappedTool<Tool>;
  Object.assign(wrapped, tool, { execute });
  return markRegistered(wrapped, registration);
}

/** The value of an execute's result: awaited, or the last item of an async iterable (streamed). */
async function lastValue(result: unknown): Promise<unknown> {
  if (result !== null && typeof result === "object" && !("then" in result) && Symbol.asyncIterator in result) {
    let last: unknown;
    for await (const item of result as AsyncIterable<unknown>) last = item;
    return last;
  }
  return await result;
}

function describe(err: unknown): string {
  if (err instanceof Error) return err.message || err.name;
  return String(err);
}
