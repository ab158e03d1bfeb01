// The base of the client's errors: LedgerError and InvalidArgumentError, which the key
// derivation (keys.ts) throws for arguments the ledger would refuse. It imports nothing, so that
// the bottom layer (codec and keys) can throw the client's own errors; the rest of the errors,
// and the conversion of the ledger's answers, are errors.ts.

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

/** The ErrorInfo domain of the ledger's own errors. */
export const ERROR_DOMAIN = "idempotency.v1";

/** One field a google.rpc.BadRequest names. */
export interface FieldViolation {
  field: string;
  description: string;
}

/** What a LedgerError is made of; every member is optional. */
export interface LedgerErrorInit {
  /** The gRPC code; unset for errors that are not a call's answer (runOnce's outcomes). */
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

/**
 * The base of every error this client throws on purpose: an answer of the ledger, an input the
 * client refuses as the ledger would, an outcome of runOnce that is not a result, or what an
 * action throws to say how it failed.
 */
export class LedgerError extends Error {
  /**
   * The gRPC status code, such as "INVALID_ARGUMENT"; undefined for the errors that are not a
   * call's answer (InProgressError, PreviouslyFailedError, NotExecutedError, …).
   */
  readonly code: GrpcCode | undefined;
  /** The ErrorInfo reason, such as "DUPLICATE_MEMBER"; "" when the answer carried none. */
  readonly reason: string;
  /** The ErrorInfo domain ("idempotency.v1" for the ledger's own errors). */
  readonly domain: string;
  /** The first field a BadRequest names, such as "arguments_json". */
  readonly field: string | undefined;
  /** Every field a BadRequest names, with the server's description. */
  readonly fieldViolations: FieldViolation[];
  /** Milliseconds to wait before trying again (RetryInfo), when the server suggests it. */
  readonly retryAfter: number | undefined;
  /** The ErrorInfo metadata. */
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
    this.code = init.code;
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
