// Typed errors. A ledger error carries the gRPC code and the google.rpc.ErrorInfo reason the
// server sent (domain "idempotency.v1"), the field a google.rpc.BadRequest names, and the delay
// a google.rpc.RetryInfo suggests. Connect decodes the grpc-status-details-bin trailer (a
// google.rpc.Status); the details are read with the schemas generated from
// third_party/proto/google/rpc/error_details.proto.

import { durationMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  RetryInfoSchema,
} from "./gen/google/rpc/error_details_pb.js";
import type { LedgerEntry } from "./types.js";

/** gRPC status code names, as in the gRPC specification. */
export type GrpcCode =
  | "CANCELLED"
  | "UNKNOWN"
  | "INVALID_ARGUMENT"
  | "DEADLINE_EXCEEDED"
  | "NOT_FOUND"
  | "ALREADY_EXISTS"
  | "PERMISSION_DENIED"
  | "RESOURCE_EXHAUSTED"
  | "FAILED_PRECONDITION"
  | "ABORTED"
  | "OUT_OF_RANGE"
  | "UNIMPLEMENTED"
  | "INTERNAL"
  | "UNAVAILABLE"
  | "DATA_LOSS"
  | "UNAUTHENTICATED";

const CODE_NAMES: Record<Code, GrpcCode> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

export const ERROR_DOMAIN = "idempotency.v1";

export interface FieldViolation {
  field: string;
  description: string;
}

export interface LedgerErrorInit {
  code?: GrpcCode;
  reason?: string;
  domain?: string;
  field?: string;
  fieldViolations?: FieldViolation[];
  retryAfter?: number;
  metadata?: Record<string, string>;
  /** True when the client refused the input itself, before any call (same reason as the server's). */
  local?: boolean;
  cause?: unknown;
}

/** An error answered by the ledger (or raised by the client for input the ledger would refuse). */
export class LedgerError extends Error {
  /** The gRPC status code, such as "INVALID_ARGUMENT". */
  readonly code: GrpcCode;
  /** The ErrorInfo reason, such as "DUPLICATE_MEMBER"; "" when the answer carried none. */
  readonly reason: string;
  /** The ErrorInfo domain ("idempotency.v1" for the ledger's own errors). */
  readonly domain: string;
  /** The first field a BadRequest names, such as "arguments_json". */
  readonly field: string | undefined;
  readonly fieldViolations: FieldViolation[];
  /** Milliseconds to wait before trying again (RetryInfo), when the server suggests it. */
  readonly retryAfter: number | undefined;
  readonly metadata: Record<string, string>;
  /** True when the client refused the input itself, before any call. */
  readonly local: boolean;
  /**
   * Set by runOnce when the action failed and recording that failure failed too: the action's
   * own error. The entry then reads UNKNOWN once its lease ends and waits for reconciliation.
   */
  actionError?: unknown;

  constructor(message: string, init: LedgerErrorInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.code = init.code ?? "UNKNOWN";
    this.reason = init.reason ?? "";
    this.domain = init.domain ?? ERROR_DOMAIN;
    this.fieldViolations = init.fieldViolations ?? [];
    this.field = init.field ?? this.fieldViolations[0]?.field;
    this.retryAfter = init.retryAfter;
    this.metadata = init.metadata ?? {};
    this.local = init.local ?? false;
  }
}

/** INVALID_ARGUMENT: malformed input (INVALID_FIELD, INVALID_JSON, DUPLICATE_MEMBER, …). */
export class InvalidArgumentError extends LedgerError {
  constructor(message: string, init: LedgerErrorInit = {}) {
    super(message, { ...init, code: "INVALID_ARGUMENT" });
  }
}

/** FAILED_PRECONDITION: the request conflicts with the entry as it stands. */
export class FailedPreconditionError extends LedgerError {}

/** KEY_REUSED_WITH_DIFFERENT_REQUEST: an explicit key sent with another tool or other arguments. */
export class KeyReusedError extends FailedPreconditionError {}

/** STALE_CLAIM_TOKEN: Complete with a token that is not the current claim's. */
export class StaleClaimTokenError extends FailedPreconditionError {}

/** ALREADY_RESOLVED: Complete with a different outcome for an entry already resolved. */
export class AlreadyResolvedError extends FailedPreconditionError {}

/** NOT_FOUND (ENTRY_NOT_FOUND): no such entry, it expired, or it is another tenant's. */
export class NotFoundError extends LedgerError {}

/** UNAUTHENTICATED: a missing, malformed or unknown bearer token. */
export class UnauthenticatedError extends LedgerError {}

/** UNAVAILABLE: the ledger or its store cannot be reached; `retryAfter` when the server says. */
export class UnavailableError extends LedgerError {}

/** DEADLINE_EXCEEDED: the call's deadline passed. A write already started may still finish. */
export class DeadlineExceededError extends LedgerError {}

/** RESOURCE_EXHAUSTED: a limit or load shedding. */
export class ResourceExhaustedError extends LedgerError {}

function classFor(code: GrpcCode, reason: string): typeof LedgerError {
  switch (reason) {
    case "KEY_REUSED_WITH_DIFFERENT_REQUEST":
      return KeyReusedError;
    case "STALE_CLAIM_TOKEN":
      return StaleClaimTokenError;
    case "ALREADY_RESOLVED":
      return AlreadyResolvedError;
    default:
      break;
  }
  switch (code) {
    case "INVALID_ARGUMENT":
      return InvalidArgumentError;
    case "FAILED_PRECONDITION":
      return FailedPreconditionError;
    case "NOT_FOUND":
      return NotFoundError;
    case "UNAUTHENTICATED":
      return UnauthenticatedError;
    case "UNAVAILABLE":
      return UnavailableError;
    case "DEADLINE_EXCEEDED":
      return DeadlineExceededError;
    case "RESOURCE_EXHAUSTED":
      return ResourceExhaustedError;
    default:
      return LedgerError;
  }
}

/** Turns whatever a call threw into a typed LedgerError, decoding the google.rpc details. */
export function toLedgerError(err: unknown): LedgerError {
  if (err instanceof LedgerError) return err;
  const ce = ConnectError.from(err);
  const code = CODE_NAMES[ce.code] ?? "UNKNOWN";
  const info = ce.findDetails(ErrorInfoSchema)[0];
  const badRequest = ce.findDetails(BadRequestSchema)[0];
  const retry = ce.findDetails(RetryInfoSchema)[0];
  const retryAfter = retry?.retryDelay ? durationMs(retry.retryDelay) : undefined;
  const reason = info?.reason ?? "";
  const Cls = classFor(code, reason);
  return new Cls(ce.rawMessage || code, {
    code,
    reason,
    domain: info?.domain ?? "",
    metadata: info ? { ...info.metadata } : {},
    fieldViolations: (badRequest?.fieldViolations ?? []).map((v) => ({
      field: v.field,
      description: v.description,
    })),
    retryAfter,
    cause: err,
  });
}

// --- errors of runOnce ---------------------------------------------------------------------

/**
 * Thrown by an action to say it certainly did not act (nothing happened, e.g. a validation error
 * from the tool before any effect). runOnce completes the entry FAILED and retryable, so the
 * next call may try again, and re-throws it.
 */
export class NotExecutedError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "NotExecutedError";
  }
}

/**
 * Thrown by an action whose effect did not and will not happen in this intent (the account is
 * closed, the request is forbidden). runOnce completes the entry FAILED, not retryable, and
 * re-throws it; later calls of the same intent get PreviouslyFailedError.
 */
export class PermanentFailureError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "PermanentFailureError";
  }
}

/** Thrown by runOnce when the action did not settle within `timeoutMs` (completed UNKNOWN). */
export class ActionTimeoutError extends Error {
  constructor(readonly timeoutMs: number) {
    super(`the action did not finish within ${timeoutMs} ms; its outcome is unknown`);
    this.name = "ActionTimeoutError";
  }
}

/**
 * runOnce: another attempt holds the key (ATTEMPTING), or its outcome is unknown (UNKNOWN) and
 * waits for reconciliation. Do not act; try again after `retryAfter` milliseconds.
 */
export class InProgressError extends Error {
  constructor(
    /** The server's note, written for the model. */
    readonly note: string,
    /** Milliseconds after which a new call is worth trying. */
    readonly retryAfter: number,
    readonly entry: LedgerEntry,
  ) {
    super(note || `the tool call is in progress (status ${entry.status})`);
    this.name = "InProgressError";
  }
}

/** runOnce: the action failed permanently in this intent; `storedError` is what was recorded. */
export class PreviouslyFailedError extends Error {
  constructor(
    readonly note: string,
    readonly storedError: string,
    readonly entry: LedgerEntry,
  ) {
    super(note ? `${note} (${storedError})` : `the tool call failed earlier: ${storedError}`);
    this.name = "PreviouslyFailedError";
  }
}
