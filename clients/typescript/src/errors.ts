// Typed errors. Every error this client throws on purpose is a LedgerError (clients/parity.json
// lists them, with their parents, for both clients):
//
// - the ledger's answers: the gRPC code and the google.rpc.ErrorInfo reason the server sent
//   (domain "idempotency.v1"), the field a google.rpc.BadRequest names, and the delay a
//   google.rpc.RetryInfo suggests. Connect decodes the grpc-status-details-bin trailer (a
//   google.rpc.Status); the details are read with the schemas generated from
//   third_party/proto/google/rpc/error_details.proto;
// - the outcomes of runOnce that are not a result (in progress, unknown, previously failed,
//   awaiting approval, denied);
// - what an action throws to say how it failed (NotExecutedError, PermanentFailureError).

import { durationMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  RetryInfoSchema,
} from "./gen/google/rpc/error_details_pb.js";
import { InvalidArgumentError, LedgerError, type GrpcCode, type LedgerErrorInit } from "./error-base.js";
import type { Approval, LedgerEntry } from "./types.js";

export {
  ERROR_DOMAIN,
  InvalidArgumentError,
  LedgerError,
  type FieldViolation,
  type GrpcCode,
  type LedgerErrorInit,
} from "./error-base.js";

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

/** FAILED_PRECONDITION: the request conflicts with the entry as it stands. */
export class FailedPreconditionError extends LedgerError {}

/** KEY_REUSED_WITH_DIFFERENT_REQUEST: an explicit key sent with another tool or other arguments. */
export class KeyReusedError extends FailedPreconditionError {}

/** STALE_CLAIM_TOKEN: Complete or RenewLease with a token that is not the current claim's. */
export class StaleClaimTokenError extends FailedPreconditionError {}

/** ALREADY_RESOLVED: Complete with a different outcome for an entry already resolved. */
export class AlreadyResolvedError extends FailedPreconditionError {}

/**
 * LEASE_ENDED: RenewLease of an entry already resolved, or whose lease already ended (it reads
 * UNKNOWN and a reconciler may be asking the world about it). Nothing changed.
 */
export class LeaseEndedError extends FailedPreconditionError {}

/**
 * APPROVAL_MISMATCH: a Decide whose fingerprint is not the entry's: the person was shown other
 * arguments than the call's. Nothing changed.
 */
export class ApprovalMismatchError extends FailedPreconditionError {}

/** ALREADY_DECIDED: a Decide opposite to the decision already taken. Nothing changed. */
export class AlreadyDecidedError extends FailedPreconditionError {}

/**
 * NOT_AWAITING_APPROVAL: a Decide of an entry that awaits no decision (never gated, its request
 * lapsed at decideBy, or already used). Nothing changed.
 */
export class NotAwaitingApprovalError extends FailedPreconditionError {}

/** NOT_FOUND (ENTRY_NOT_FOUND): no such entry, it expired, or it is another tenant's. */
export class NotFoundError extends LedgerError {}

/** UNAUTHENTICATED: a missing, malformed or unknown bearer token. */
export class UnauthenticatedError extends LedgerError {}

/** PERMISSION_DENIED: the credential lacks the role the call needs. */
export class PermissionDeniedError extends LedgerError {}

/**
 * APPROVER_ROLE_REQUIRED: a Decide with a credential that has not the approver role (the tokens
 * file's third column): an agent's token cannot decide. Nothing changed.
 */
export class ApproverRoleRequiredError extends PermissionDeniedError {}

/** RESOURCE_EXHAUSTED: a limit or load shedding (OVERLOADED, RATE_LIMITED, MESSAGE_TOO_LARGE). */
export class ResourceExhaustedError extends LedgerError {}

/** STORE_FULL: the ledger's disk is full. Nothing was written; worth retrying later. */
export class StoreFullError extends ResourceExhaustedError {}

/**
 * UNAVAILABLE: the ledger or its store cannot be reached (STORE_UNAVAILABLE, STORE_IO_ERROR,
 * STORE_CONTENTION, STORE_READ_ONLY, or none when the server itself cannot be reached);
 * `retryAfter` when the server says.
 */
export class UnavailableError extends LedgerError {}

/** DEADLINE_EXCEEDED: the call's deadline passed. A write already started may still finish. */
export class DeadlineExceededError extends LedgerError {}

/** DATA_LOSS (STORE_CORRUPT): the ledger's store is damaged. Not worth retrying; tell an operator. */
export class DataLossError extends LedgerError {}

/** INTERNAL: a bug in the server; the details are in its log. */
export class InternalError extends LedgerError {}

type ErrorClass = new (message: string, init?: LedgerErrorInit) => LedgerError;

// A reason names a subclass only under the code it belongs to, so that an unexpected pairing
// still lands in the class of its code.
const BY_REASON: Record<string, { code: GrpcCode; cls: ErrorClass }> = {
  KEY_REUSED_WITH_DIFFERENT_REQUEST: { code: "FAILED_PRECONDITION", cls: KeyReusedError },
  STALE_CLAIM_TOKEN: { code: "FAILED_PRECONDITION", cls: StaleClaimTokenError },
  ALREADY_RESOLVED: { code: "FAILED_PRECONDITION", cls: AlreadyResolvedError },
  LEASE_ENDED: { code: "FAILED_PRECONDITION", cls: LeaseEndedError },
  APPROVAL_MISMATCH: { code: "FAILED_PRECONDITION", cls: ApprovalMismatchError },
  ALREADY_DECIDED: { code: "FAILED_PRECONDITION", cls: AlreadyDecidedError },
  NOT_AWAITING_APPROVAL: { code: "FAILED_PRECONDITION", cls: NotAwaitingApprovalError },
  APPROVER_ROLE_REQUIRED: { code: "PERMISSION_DENIED", cls: ApproverRoleRequiredError },
  STORE_FULL: { code: "RESOURCE_EXHAUSTED", cls: StoreFullError },
};

const BY_CODE: Partial<Record<GrpcCode, ErrorClass>> = {
  INVALID_ARGUMENT: InvalidArgumentError,
  FAILED_PRECONDITION: FailedPreconditionError,
  NOT_FOUND: NotFoundError,
  UNAUTHENTICATED: UnauthenticatedError,
  PERMISSION_DENIED: PermissionDeniedError,
  RESOURCE_EXHAUSTED: ResourceExhaustedError,
  UNAVAILABLE: UnavailableError,
  DEADLINE_EXCEEDED: DeadlineExceededError,
  DATA_LOSS: DataLossError,
  INTERNAL: InternalError,
};

/** The class of an answer with this code and reason (LedgerError itself for other codes). */
export function errorClassFor(code: GrpcCode, reason: string): ErrorClass {
  const byReason = BY_REASON[reason];
  if (byReason && byReason.code === code) return byReason.cls;
  return BY_CODE[code] ?? LedgerError;
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
  const Cls = errorClassFor(code, reason);
  // The message is the server's own text; the code and reason are fields, not repeated in it.
  return new Cls(ce.rawMessage || `the ledger answered ${code} without a message`, {
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

// --- what an action throws -----------------------------------------------------------------

/**
 * Thrown by an action to say it certainly did not act (nothing happened, e.g. a validation error
 * from the tool before any effect). runOnce completes the entry FAILED and retryable, so the
 * next call may try again, sets `entry` to the entry as recorded, and re-throws it. runOnce and
 * the tool wrappers also throw it themselves when they stop before the action started (an
 * aborted call), with the same record.
 */
export class NotExecutedError extends LedgerError {
  /** The entry as runOnce recorded it (FAILED, retryable); unset until then. */
  entry: LedgerEntry | undefined;

  constructor(message: string, options?: { cause?: unknown }) {
    super(message, { cause: options?.cause });
  }
}

/**
 * Thrown by an action whose effect did not and will not happen in this intent (the account is
 * closed, the request is forbidden). runOnce completes the entry FAILED, not retryable, sets
 * `entry` to the entry as recorded and re-throws it; later calls of the same intent get
 * PreviouslyFailedError.
 */
export class PermanentFailureError extends LedgerError {
  /** The entry as runOnce recorded it (FAILED, not retryable); unset until then. */
  entry: LedgerEntry | undefined;

  constructor(message: string, options?: { cause?: unknown }) {
    super(message, { cause: options?.cause });
  }
}

// --- outcomes of runOnce that are not a result ---------------------------------------------

/**
 * runOnce: another attempt holds the key (ATTEMPTING) and did not finish within the wait. Do not
 * act; try again after `retryAfter` milliseconds. Its subclass OutcomeUnknownError says the
 * outcome is unknown (UNKNOWN) rather than in flight.
 */
export class InProgressError extends LedgerError {
  constructor(
    /** The server's note, written for the model. */
    readonly note: string,
    /** Milliseconds after which a new call is worth trying. */
    readonly retryAfter: number,
    /** The entry as the claim found it. */
    readonly entry: LedgerEntry,
    message?: string,
    options?: { cause?: unknown },
  ) {
    super(message ?? (note || `the tool call is in progress (status ${entry.status})`), {
      cause: options?.cause,
      retryAfter,
    });
  }
}

/**
 * runOnce: the outcome of this intent is unknown (the entry is UNKNOWN): an earlier attempt
 * timed out, failed in a way that may have had an effect, or outlived its lease. It is never
 * re-run silently: the tool's paired read (confirm) or a Reconciler asks the outside world.
 */
export class OutcomeUnknownError extends InProgressError {}

/** When asking again about an UNKNOWN entry is worth it: what the server suggests (reconciliation takes time). */
export const UNKNOWN_RETRY_AFTER_MS = 30_000;

/**
 * What the model reads about an unknown outcome, on the call that met it and on every repeat:
 * the ledger's own note for an UNKNOWN entry, word for word (the server's answer to a repeat, and
 * the Python client's UNKNOWN_NOTE), so that both clients and every framework say the same.
 */
export const UNKNOWN_NOTE =
  "An earlier attempt of this action may or may not have taken effect: its outcome is unknown " +
  "and is being reconciled. Do not repeat it. No new action was taken.";

/**
 * runOnce: the action outlived `timeoutMs`; the entry is completed UNKNOWN and the action's
 * `signal` aborted.
 */
export class ActionTimeoutError extends OutcomeUnknownError {
  constructor(
    readonly timeoutMs: number,
    entry: LedgerEntry,
  ) {
    super(
      UNKNOWN_NOTE,
      UNKNOWN_RETRY_AFTER_MS,
      entry,
      `the action did not finish within ${timeoutMs} ms; its outcome is unknown and entry ` +
        `${entry.key} is UNKNOWN until it is reconciled`,
    );
  }
}

/**
 * runOnce: the action ran, but its result could not be stored (the codec could not encode it,
 * or the ledger refused it, RESULT_TOO_LARGE): the effect may have happened and cannot be
 * replayed, so the entry is UNKNOWN. `cause` is the encoding error or the ledger's refusal.
 */
export class ResultNotEncodableError extends OutcomeUnknownError {
  constructor(why: string, entry: LedgerEntry, options?: { cause?: unknown }) {
    super(
      UNKNOWN_NOTE,
      UNKNOWN_RETRY_AFTER_MS,
      entry,
      `the action ran but its result could not be stored (${why}); entry ${entry.key} ` +
        `(external_ref ${entry.externalRef}) is UNKNOWN and will not be re-run: settle it with a ` +
        `Reconcile resolution (SUCCEEDED with a result the ledger can store, or FAILED if the ` +
        `effect did not happen) or with the CLI command \`idempotency-ledger resolve\``,
      options,
    );
  }
}

/** runOnce: the action failed permanently in this intent; `storedError` is what was recorded. */
export class PreviouslyFailedError extends LedgerError {
  constructor(
    /** The server's note, written for the model; it already quotes the stored error. */
    readonly note: string,
    /** The error recorded when the action failed. */
    readonly storedError: string,
    /** The entry as the claim found it. */
    readonly entry: LedgerEntry,
  ) {
    super(note || `the tool call failed permanently earlier: ${storedError}`);
  }
}

/**
 * runOnce: the call waits for a person's decision (a gated tool, or `requireApproval`): nothing
 * was done. The entry is AWAITING_APPROVAL; `approval.decideBy` says until when a person may
 * decide. An approver's `ledger.decide(key, fingerprint, "APPROVE", reason)` lets the next call
 * act, once; a denial makes it DeniedError.
 */
export class AwaitingApprovalError extends LedgerError {
  constructor(
    /** The server's note, written for the model (a person has been asked; nothing was done). */
    readonly note: string,
    /** The entry as the claim found it (its key, fingerprint and approval). */
    readonly entry: LedgerEntry,
  ) {
    super(note || `the call ${entry.key} awaits a person's decision; nothing was done`);
  }

  /** The entry's key: what an approver's decide names. */
  get key(): string {
    return this.entry.key;
  }

  /** The fingerprint of the arguments the person must be shown: what decide echoes. */
  get fingerprint(): string {
    return this.entry.fingerprint;
  }

  /** The approval: state REQUESTED (or APPROVED, not yet used), decideBy, executeBy. */
  get approval(): Approval | undefined {
    return this.entry.approval;
  }
}

/**
 * runOnce: a person declined this call: it was not done and will not be (the entry is DENIED,
 * for every repeat). `approval.reason` is theirs, `approval.decidedBy` who they are; changed
 * arguments are another request.
 */
export class DeniedError extends LedgerError {
  constructor(
    /** The server's note, written for the model (declined, with the reason; do not retry unchanged). */
    readonly note: string,
    /** The entry as the claim found it. */
    readonly entry: LedgerEntry,
  ) {
    super(note || `a person declined the call ${entry.key}`);
  }

  get key(): string {
    return this.entry.key;
  }

  get fingerprint(): string {
    return this.entry.fingerprint;
  }

  /** The approval: state DENIED, decidedBy, reason. */
  get approval(): Approval | undefined {
    return this.entry.approval;
  }
}

// --- the developer's errors -----------------------------------------------------------------

/**
 * A tool call came without a run id: the ledger cannot tell a repeat from a new request, so
 * nothing ran. It is the developer's to fix (where the run id is set is in the message), never
 * the model's to retry: the wrappers log it once per tool and throw it wherever the framework
 * lets an exception reach the developer (the AI SDK's generateText, the Agents SDK's run), and
 * otherwise answer that nothing was performed. Not a LedgerError: the ledger was never asked.
 */
export class MissingRunIdError extends Error {
  constructor(
    /** The tool that was called. */
    readonly tool: string,
    /** Where the developer sets the run id. */
    readonly fix: string,
  ) {
    super(
      `the tool ${tool} was called without a run id, so the idempotency ledger cannot tell a ` +
        `repeat from a new request${fix ? ` (${fix})` : ""}`,
    );
    this.name = "MissingRunIdError";
  }
}
