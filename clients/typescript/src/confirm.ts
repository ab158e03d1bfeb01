// The paired read of a write tool ("did this happen?"), registered with the tool as `confirm`.
// It turns an unknown outcome into a known one: runOnce and the tool wrappers ask it right after
// an unknown outcome and when a repeat meets one, and the Reconciler asks it for the entries the
// ledger hands out. Only types and three constructors live here (the model layer); the asking is
// the ledger's (settle.ts).

import type { LedgerEntry } from "./types.js";

/** What a paired read is asked about: one attempt whose outcome nobody knows. */
export interface ConfirmAttempt<A = unknown> {
  /** The entry's key. */
  key: string;
  /** The reference the action passed to the outside world (its idempotency key or memo). */
  externalRef: string;
  /**
   * The call's arguments, as JSON values. Asked by a reconciler, they are the ones the ledger
   * kept (`--store-arguments`, redacted by default: members named like secrets read
   * "[REDACTED]"; undefined when the server keeps none).
   */
  arguments: A;
  /** The attempt number (1 for the first; one more after each retryable failure). */
  attempt: number;
  runId: string;
  tool: string;
  /** The entry as the ledger handed it out. */
  entry: LedgerEntry;
}

/** The paired read found the effect: `result` is what the tool would have returned. */
export interface Found<T = unknown> {
  readonly kind: "found";
  readonly result: T;
}

/** The paired read is sure the effect did not happen (and will not happen late). */
export interface NotFound {
  readonly kind: "not_found";
}

/** The paired read cannot tell (the system is down, the reference is not searchable yet). */
export interface CannotTell {
  readonly kind: "cannot_tell";
}

/** What a paired read answers. */
export type Confirmation<T = unknown> = Found<T> | NotFound | CannotTell;

/**
 * A tool's paired read. Throwing counts as "cannot tell" (and is logged); so does any answer
 * that is not one of found(), notFound and cannotTell.
 */
export type Confirm<T = unknown, A = unknown> = (
  attempt: ConfirmAttempt<A>,
) => Confirmation<T> | Promise<Confirmation<T>>;

/** The effect happened; the model reads `result` as the tool's answer. */
export function found<T>(result: T): Found<T> {
  return Object.freeze({ kind: "found", result });
}

/** The effect certainly did not happen: the intent may be tried again. */
export const notFound: NotFound = Object.freeze({ kind: "not_found" });

/** Nobody can tell yet: the entry stays UNKNOWN for the next round or for a person. */
export const cannotTell: CannotTell = Object.freeze({ kind: "cannot_tell" });

/**
 * Why `confirm` cannot be registered as a tool's paired read, or undefined when it can
 * (undefined itself is "no paired read", which is the caller's to allow). A paired read is
 * called with one argument, the attempt: a read declaring more required parameters
 * (`(externalRef, attempt) => …`, as if called with them one by one) would take the attempt
 * object for its reference, find nothing and answer "not found", the one answer that lets the
 * tool act again. TypeScript refuses that at compile time; this refuses it in plain JavaScript.
 */
export function confirmProblem(confirm: unknown): string | undefined {
  if (confirm === undefined) return undefined;
  const shape = "(attempt) => found(result) | notFound | cannotTell, looking the effect up by attempt.externalRef";
  if (typeof confirm !== "function") {
    return `confirm must be a function ${shape}; got ${confirm === null ? "null" : typeof confirm}`;
  }
  if (confirm.length > 1) {
    return (
      `confirm declares ${confirm.length} parameters, but it is called with one: the attempt ` +
      `({ key, externalRef, arguments, attempt, runId, tool, entry }). Write it as ${shape} ` +
      `(for example ({ externalRef }) => …): a read that takes something else for the reference ` +
      `finds nothing, and its "not found" lets the tool act again`
    );
  }
  return undefined;
}

/** The answer, checked: anything that is not a Confirmation is "cannot tell", with why. */
export function checkConfirmation<T>(answer: unknown): { confirmation: Confirmation<T>; problem?: string } {
  if (answer !== null && typeof answer === "object") {
    const kind = (answer as { kind?: unknown }).kind;
    if (kind === "found" && "result" in answer) return { confirmation: answer as Found<T> };
    if (kind === "not_found") return { confirmation: notFound };
    if (kind === "cannot_tell") return { confirmation: cannotTell };
  }
  return {
    confirmation: cannotTell,
    problem: `confirm answered ${describeValue(answer)}, not found(result), notFound or cannotTell`,
  };
}

function describeValue(v: unknown): string {
  if (v === undefined) return "undefined";
  try {
    return JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}
