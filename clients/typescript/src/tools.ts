// Tool calls whose answer goes to a model: runTool (runOnce that never throws for an outcome)
// and wrapTool (any `{ execute }` tool, same shape, each call through runTool). What the model
// reads is ToolCallResult.toModelText(): the result on a first run, the stored result with the
// replay note on a repeat, and for every other outcome a sentence that says what happened and
// what not to do. An exception would be turned by the agent framework into "the tool failed,
// try again", which is exactly wrong for an attempt in flight or an unknown outcome.

import { AsyncLocalStorage } from "node:async_hooks";
import type { Codec } from "./codec.js";
import {
  InProgressError,
  InvalidArgumentError,
  LedgerError,
  NotExecutedError,
  OutcomeUnknownError,
  PermanentFailureError,
  PreviouslyFailedError,
} from "./errors.js";
import type { ArgumentsInput } from "./keys.js";
import type { ActionContext, AttemptOutcome, Ledger, RunOnceOptions } from "./ledger.js";
import type { LedgerEntry } from "./types.js";

/** What became of one tool call. */
export type ToolOutcome =
  /** The action ran now; `value` is its result. */
  | "performed"
  /** The action had already run in this intent; `value` is the stored result; nothing ran. */
  | "replayed"
  /** Another attempt of the same intent is still running (after the wait); nothing ran. */
  | "in_progress"
  /** Nobody knows whether the effect happened (now or earlier); it is never re-run silently. */
  | "outcome_unknown"
  /** The action failed permanently earlier in this intent; nothing ran. */
  | "previously_failed"
  /** The action did not run (it said so, its arguments were refused, no run id, the ledger was unreachable, an abort). */
  | "not_executed"
  /** The action ran now and failed for good (PermanentFailureError): it will not succeed with these arguments. */
  | "failed";

/** The plain-data form of a ToolCallResult (what JSON.stringify writes), with the model's text. */
export interface ToolCallResultJson<T = unknown> {
  outcome: ToolOutcome;
  value?: T;
  note: string;
  /** What the model reads: toModelText(). */
  modelText: string;
  key?: string;
  externalRef?: string;
  attempt?: number;
  status?: string;
}

/** The outcome of one tool call, with what the model should read. */
export class ToolCallResult<T = unknown> {
  /** What happened. */
  readonly outcome: ToolOutcome;
  /** The result: the action's (performed) or the stored one (replayed); undefined otherwise. */
  readonly value: T | undefined;
  /**
   * The sentence for the model: the server's replay, in-progress, unknown or previously-failed
   * note, or the client's for what it saw itself; "" when performed.
   */
  readonly note: string;
  /** The ledger entry, when the call got as far as the ledger. */
  readonly entry: LedgerEntry | undefined;
  /**
   * The error behind an outcome that is not a result (InProgressError, NotExecutedError, the
   * action's own error, …), for logs; the model reads `note`.
   */
  readonly error: unknown;
  /** With in_progress and outcome_unknown: milliseconds after which asking again is worth it. */
  readonly retryAfter: number | undefined;

  constructor(init: {
    outcome: ToolOutcome;
    value?: T;
    note?: string;
    entry?: LedgerEntry;
    error?: unknown;
    retryAfter?: number;
  }) {
    this.outcome = init.outcome;
    this.value = init.value;
    this.note = init.note ?? "";
    this.entry = init.entry;
    this.error = init.error;
    this.retryAfter = init.retryAfter;
  }

  /** True when the stored result of an earlier call was returned and nothing ran. */
  get replayed(): boolean {
    return this.outcome === "replayed";
  }

  /** True when there is a result (performed or replayed). */
  get ok(): boolean {
    return this.outcome === "performed" || this.outcome === "replayed";
  }

  /**
   * What the model reads: the result on a first run; on a repeat the replay note and the
   * stored result; otherwise the note, which says what happened and whether to call again.
   */
  toModelText(): string {
    switch (this.outcome) {
      case "performed":
        return this.value === undefined ? "Done." : resultText(this.value);
      case "replayed":
        return this.value === undefined ? this.note : `${this.note} Result: ${resultText(this.value)}`;
      default:
        return this.note;
    }
  }

  toJSON(): ToolCallResultJson<T> {
    return {
      outcome: this.outcome,
      ...(this.value === undefined ? {} : { value: this.value }),
      note: this.note,
      modelText: this.toModelText(),
      ...(this.entry
        ? {
            key: this.entry.key,
            externalRef: this.entry.externalRef,
            attempt: this.entry.attempt,
            status: this.entry.status,
          }
        : {}),
    };
  }
}

/**
 * The model's text of a tool output: a ToolCallResult, or its JSON form after a round trip
 * through storage (a chat UI that persists tool outputs), or anything else as JSON text.
 */
export function modelTextOf(output: unknown): string {
  if (output instanceof ToolCallResult) return output.toModelText();
  if (output !== null && typeof output === "object" && typeof (output as ToolCallResultJson).modelText === "string") {
    return (output as ToolCallResultJson).modelText;
  }
  return resultText(output);
}

function resultText(value: unknown): string {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

function describe(err: unknown): string {
  if (err instanceof Error) return err.message || err.name;
  return String(err);
}

const attempts = new AsyncLocalStorage<ActionContext>();

/**
 * The attempt of the tool call being executed, inside a wrapped tool's execute (wrapTool and
 * the framework adapters): its key, externalRef and attempt number, to pass downstream (an
 * idempotency key header, a memo field). Undefined outside one.
 */
export function currentAttempt(): ActionContext | undefined {
  return attempts.getStore();
}

/** Runs `fn` with `ctx` as the current attempt. */
export function withAttempt<R>(ctx: ActionContext, fn: () => R): R {
  return attempts.run(ctx, fn);
}

/**
 * The wrappers' default codec: JSON, and on a replay of bytes that are not JSON (a result a
 * reconciler or another client stored as text) the text itself, so that a replay is never
 * lost to a decoding error.
 */
export const toolResultCodec: Codec<unknown> = {
  encode(value: unknown): Uint8Array {
    if (value === undefined) return new Uint8Array(0);
    const text = JSON.stringify(value);
    if (text === undefined) throw new TypeError(`a ${typeof value} is not JSON`);
    return new TextEncoder().encode(text);
  },
  decode(bytes: Uint8Array): unknown {
    if (bytes.length === 0) return undefined;
    const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  },
};

/** The options of runTool: runOnce's. The default codec is toolResultCodec. */
export type RunToolOptions<T> = RunOnceOptions<T>;

/** runTool's rendering of every outcome; see Ledger.runTool. */
export async function runTool<T>(
  ledger: Ledger,
  runId: string | undefined,
  tool: string,
  args: ArgumentsInput,
  action: (ctx: ActionContext) => T | Promise<T>,
  options: RunToolOptions<T> = {},
): Promise<ToolCallResult<T>> {
  if (typeof runId !== "string" || runId === "") {
    return missingRunId(tool);
  }
  let out: AttemptOutcome<T>;
  try {
    out = await ledger.attempt(runId, tool, args, action, {
      ...options,
      codec: options.codec ?? (toolResultCodec as Codec<T>),
    });
  } catch (err) {
    out = { kind: "thrown", error: err, actionRan: false };
  }
  return render(out);
}

/** The result for a call that came without a run id: nothing ran, and the model is told why. */
export function missingRunId(tool: string, hint = ""): ToolCallResult<never> {
  const error = new NotExecutedError(
    `the tool ${tool} was called without a run id, so the idempotency ledger cannot tell a ` +
      `repeat from a new request${hint ? ` (${hint})` : ""}`,
  );
  return new ToolCallResult<never>({
    outcome: "not_executed",
    note: `This action was not performed: ${error.message}. Nothing happened.`,
    error,
  });
}

function render<T>(out: AttemptOutcome<T>): ToolCallResult<T> {
  if (out.kind === "performed") return new ToolCallResult({ outcome: "performed", value: out.value, entry: out.entry });
  if (out.kind === "replayed") {
    return new ToolCallResult({ outcome: "replayed", value: out.value, note: out.note, entry: out.entry });
  }
  const err = out.error;
  if (err instanceof OutcomeUnknownError) {
    return new ToolCallResult({
      outcome: "outcome_unknown",
      note: err.note || unknownNote(err),
      entry: err.entry,
      error: err,
      retryAfter: err.retryAfter,
    });
  }
  if (err instanceof InProgressError) {
    return new ToolCallResult({ outcome: "in_progress", note: err.note || err.message, entry: err.entry, error: err, retryAfter: err.retryAfter });
  }
  if (err instanceof PreviouslyFailedError) {
    return new ToolCallResult({ outcome: "previously_failed", note: err.message, entry: err.entry, error: err });
  }
  if (err instanceof NotExecutedError) {
    return new ToolCallResult({
      outcome: "not_executed",
      note: `This action was not performed: ${describe(err)}. Nothing happened, so it may be called again.`,
      entry: err.entry,
      error: err,
    });
  }
  if (err instanceof PermanentFailureError) {
    return new ToolCallResult({
      outcome: "failed",
      note:
        `This action failed and will not succeed with the same arguments: ${describe(err)}. ` +
        `Nothing happened; do not call it again with the same arguments.`,
      entry: err.entry,
      error: err,
    });
  }
  if (out.actionRan) {
    // The action's own error (recorded UNKNOWN), or the ledger failing to record the outcome.
    return new ToolCallResult({ outcome: "outcome_unknown", note: unknownNote(err), error: err });
  }
  if (err instanceof InvalidArgumentError) {
    return new ToolCallResult({
      outcome: "not_executed",
      note: `This action was not performed: its arguments were refused (${err.reason || err.code}): ${err.message}. Nothing happened.`,
      error: err,
    });
  }
  if (err instanceof LedgerError) {
    return new ToolCallResult({
      outcome: "not_executed",
      note:
        `This action was not performed: the idempotency ledger could not be asked whether it ` +
        `already ran (${err.code ?? "error"}${err.reason && err.reason !== err.code ? ` ${err.reason}` : ""}: ` +
        `${err.message}), so nothing was done. Try again later.`,
      error: err,
      retryAfter: err.retryAfter,
    });
  }
  return new ToolCallResult({
    outcome: "not_executed",
    note: `This action was not performed: ${describe(err)}. Nothing happened.`,
    error: err,
  });
}

function unknownNote(err: unknown): string {
  return (
    `The outcome of this action is unknown (${describe(err)}): it may or may not have taken ` +
    `effect. It will be checked and is not repeated; do not call it again with the same arguments.`
  );
}

// --- wrapTool ------------------------------------------------------------------------------

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
export interface WrapToolOptions<A extends unknown[]> extends Omit<RunToolOptions<unknown>, "key" | "signal"> {
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
  /** The framework's abort signal of the call, if it has one. */
  signal?: (...args: A) => AbortSignal | undefined;
  /** Added to the model's note when a call comes without a run id: where the developer sets it. */
  runIdHint?: string;
}

/** See Ledger.wrapTool. */
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
  const original = tool.execute;
  const { runId, arguments: argsOf, key, signal, runIdHint, name: _name, ...runOptions } = options;
  const execute = async (...callArgs: A) => {
    let run: string | undefined;
    let args: ArgumentsInput;
    let explicitKey: string | undefined;
    let callSignal: AbortSignal | undefined;
    try {
      run = typeof runId === "function" ? runId(...callArgs) : runId;
      args = argsOf ? argsOf(...callArgs) : ((callArgs[0] ?? {}) as ArgumentsInput);
      explicitKey = key?.(...callArgs);
      callSignal = signal?.(...callArgs);
    } catch (err) {
      // Nothing was claimed yet: the call is simply not performed, and the model says why.
      return render<never>({
        kind: "thrown",
        error: new NotExecutedError(`the tool wrapper could not prepare the call: ${describe(err)}`, { cause: err }),
        actionRan: false,
      });
    }
    if (typeof run !== "string" || run === "") return missingRunId(name, runIdHint);
    return runTool(
      ledger,
      run,
      name,
      args,
      (ctx) => withAttempt(ctx, () => settle(original.apply(tool, callArgs))),
      { ...runOptions, key: explicitKey, signal: callSignal },
    );
  };
  const wrapped = Object.create(Object.getPrototypeOf(tool) as object) as WrappedTool<Tool>;
  Object.assign(wrapped, tool, { execute });
  return wrapped;
}

/** The value of an execute's result: awaited, or the last item of an async iterable (streamed). */
async function settle(result: unknown): Promise<unknown> {
  if (result !== null && typeof result === "object" && !("then" in result) && Symbol.asyncIterator in result) {
    let last: unknown;
    for await (const item of result as AsyncIterable<unknown>) last = item;
    return last;
  }
  return await result;
}
