// What one tool call came to, and what the model reads about it: ToolCallResult, rendered from
// an attempt's outcome. The model reads ToolCallResult.toModelText(): the result on a first run,
// the stored result with the replay note on a repeat, and for every other outcome a sentence
// that says what happened and what not to do. An exception would be turned by the agent
// framework into "the tool failed, try again", which is exactly wrong for an attempt in flight
// or an unknown outcome.

import type { Codec } from "./codec.js";
import {
  AwaitingApprovalError,
  DeniedError,
  InProgressError,
  InvalidArgumentError,
  LedgerError,
  MissingRunIdError,
  NotExecutedError,
  OutcomeUnknownError,
  PermanentFailureError,
  PreviouslyFailedError,
  UNKNOWN_NOTE,
} from "./errors.js";
import type { LedgerEntry } from "./types.js";

/** What became of one tool call. */
export type ToolOutcome =
  /** The action ran now (or its paired read found the effect); `value` is its result. */
  | "performed"
  /** The action had already run in this intent; `value` is the stored result; nothing ran. */
  | "replayed"
  /** Another attempt of the same intent is still running (after the wait); nothing ran. */
  | "in_progress"
  /** Nobody knows whether the effect happened (now or earlier); it is never re-run silently. */
  | "outcome_unknown"
  /** The action failed permanently earlier in this intent; nothing ran. */
  | "previously_failed"
  /** The action did not run or had no effect (it said so, its paired read found nothing, its arguments were refused, no run id, the ledger was unreachable, an abort). */
  | "not_executed"
  /** The action ran now and failed for good (PermanentFailureError): it will not succeed with these arguments. */
  | "failed"
  /** The call waits for a person's decision (a gated tool): nothing was done; the note says until when. */
  | "awaiting_approval"
  /** A person declined the call: nothing was done, and the note gives their reason. */
  | "denied";

/**
 * What one attempt came to, before runOnce throws or runTool renders it. `actionRan` says
 * whether this call started the action (so an error afterwards may follow an effect);
 * `recorded` how the ledger recorded a failed action (FAILED retryable, FAILED for good,
 * UNKNOWN), `entry` the entry as recorded.
 */
export type AttemptOutcome<T> =
  | { kind: "performed"; value: T; entry: LedgerEntry; confirmed?: boolean }
  | { kind: "replayed"; value: T; note: string; entry: LedgerEntry }
  | {
      kind: "thrown";
      error: unknown;
      actionRan: boolean;
      /** How the ledger recorded it; `not_found`: unknown, then settled FAILED retryable by confirm. */
      recorded?: "not_executed" | "not_found" | "failed" | "unknown";
      entry?: LedgerEntry;
    };

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
  /**
   * True when the action's outcome was unknown and the tool's paired read settled it: found
   * (performed) or found nothing (not_executed).
   */
  readonly confirmed: boolean;

  constructor(init: {
    outcome: ToolOutcome;
    value?: T;
    note?: string;
    entry?: LedgerEntry;
    error?: unknown;
    retryAfter?: number;
    confirmed?: boolean;
  }) {
    this.outcome = init.outcome;
    this.value = init.value;
    this.note = init.note ?? "";
    this.entry = init.entry;
    this.error = init.error;
    this.retryAfter = init.retryAfter;
    this.confirmed = init.confirmed ?? false;
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

/**
 * What the model reads when an outcome was unknown and the tool's paired read found nothing:
 * word for word the Python client's (clients/parity.json, model_reads.not_performed).
 */
export const NOT_PERFORMED_NOTE =
  "This action did not take effect: its outcome was unknown, and a check found that nothing " +
  "happened. No action was taken; it may be called again.";

/** The note of a call that did not run, and may be made again. */
export function notExecutedNote(err: unknown): string {
  return `This action was not performed: ${describe(err)}. Nothing happened, so it may be called again.`;
}

/**
 * What the model reads of a call that came without a run id: word for word the Python client's
 * (clients/parity.json, model_reads.missing_run_id). The fix is the developer's, in the log.
 */
export function missingRunIdNote(tool: string): string {
  return (
    `This action was not performed: the tool ${tool} was called without a run id, so the ` +
    `idempotency ledger cannot tell a repeat from a new request. Nothing happened.`
  );
}

/** The result of a call that came without a run id: nothing ran, and the model is told why. */
export function missingRunIdResult(error: MissingRunIdError): ToolCallResult<never> {
  return new ToolCallResult<never>({ outcome: "not_executed", note: missingRunIdNote(error.tool), error });
}

/** What the model reads about one attempt's outcome. */
export function render<T>(out: AttemptOutcome<T>): ToolCallResult<T> {
  if (out.kind === "performed") {
    return new ToolCallResult({ outcome: "performed", value: out.value, entry: out.entry, confirmed: out.confirmed });
  }
  if (out.kind === "replayed") {
    return new ToolCallResult({ outcome: "replayed", value: out.value, note: out.note, entry: out.entry });
  }
  const err = out.error;
  const entry = out.entry ?? (err as { entry?: LedgerEntry } | null)?.entry;
  switch (out.recorded) {
    case "not_executed":
      return new ToolCallResult({ outcome: "not_executed", note: notExecutedNote(err), entry, error: err });
    case "not_found":
      return new ToolCallResult({ outcome: "not_executed", note: NOT_PERFORMED_NOTE, entry, error: err, confirmed: true });
    case "failed":
      return failedResult(err, entry);
    case "unknown":
      return unknownResult(err, entry);
    default:
      break;
  }
  if (err instanceof OutcomeUnknownError) return unknownResult(err, err.entry);
  if (err instanceof InProgressError) {
    return new ToolCallResult({
      outcome: "in_progress",
      note: err.note || err.message,
      entry: err.entry,
      error: err,
      retryAfter: err.retryAfter,
    });
  }
  // A gated call and a declined one: the server's note, as every client and framework says it
  // (clients/parity.json, model_reads.awaiting_approval and .denied). Nothing ran.
  if (err instanceof AwaitingApprovalError) {
    return new ToolCallResult({ outcome: "awaiting_approval", note: err.note || err.message, entry: err.entry, error: err });
  }
  if (err instanceof DeniedError) {
    return new ToolCallResult({ outcome: "denied", note: err.note || err.message, entry: err.entry, error: err });
  }
  if (err instanceof PreviouslyFailedError) {
    return new ToolCallResult({ outcome: "previously_failed", note: err.message, entry: err.entry, error: err });
  }
  if (err instanceof NotExecutedError) {
    return new ToolCallResult({ outcome: "not_executed", note: notExecutedNote(err), entry: err.entry, error: err });
  }
  if (err instanceof PermanentFailureError) return failedResult(err, err.entry);
  if (out.actionRan) {
    // The ledger failing to record the action's outcome: it may have acted.
    return unknownResult(err, entry);
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

function unknownResult<T>(err: unknown, entry: LedgerEntry | undefined): ToolCallResult<T> {
  const note = err instanceof OutcomeUnknownError && err.note ? err.note : UNKNOWN_NOTE;
  const retryAfter = err instanceof InProgressError ? err.retryAfter : undefined;
  return new ToolCallResult({ outcome: "outcome_unknown", note, entry, error: err, retryAfter });
}

function failedResult<T>(err: unknown, entry: LedgerEntry | undefined): ToolCallResult<T> {
  return new ToolCallResult({
    outcome: "failed",
    note:
      `This action failed and will not succeed with the same arguments: ${describe(err)}. ` +
      `Nothing happened; do not call it again with the same arguments.`,
    entry,
    error: err,
  });
}
