// idempotency-ledger: the TypeScript client of the idempotency ledger.
export { Ledger, type LedgerOptions, type ToolRegistration } from "./ledger.js";
export { classify, currentAttempt } from "./action.js";
export type {
  ActionContext,
  ErrorClass,
  NeedsApprovalOptions,
  RunOnceOptions,
  RunOnceResult,
  RunToolOptions,
} from "./run-options.js";
export { LedgerRpc } from "./rpc.js";
// What the RPCs take and answer: every type of rpc-types.ts is public.
export type * from "./rpc-types.js";
export {
  cannotTell,
  found,
  notFound,
  type CannotTell,
  type Confirm,
  type ConfirmAttempt,
  type Confirmation,
  type Found,
  type NotFound,
} from "./confirm.js";
export { defaultPrincipal, stderrLogger, type LedgerLogger } from "./log.js";
export {
  RECONCILER_DEFAULTS,
  Reconciler,
  describeFigures,
  type ReconcilerFigures,
  type ReconcilerOptions,
  type ReconcilerTools,
  type SettlementRecord,
} from "./reconciler.js";
export {
  ADDRESS_FORMS,
  DEFAULTS,
  DEFAULT_CANONICALIZATION,
  DEFAULT_CONFIRM_DELAY_MS,
  DEFAULT_DEADLINE_MS,
  DEFAULT_RETRY_BUDGET_MS,
  DEFAULT_WAIT_MS,
  RENEW_EVERY_FRACTION_OF_LEASE,
  RUN_ONCE_WAIT_FOR,
  SETTLING_POLL_MS,
  ledgerUrl,
} from "./defaults.js";
export {
  NOT_PERFORMED_NOTE,
  ToolCallResult,
  modelTextOf,
  toolResultCodec,
  type AttemptOutcome,
  type ToolCallResultJson,
  type ToolOutcome,
} from "./outcome.js";
export {
  LEDGER_TOOL,
  markRegistered,
  registrationOf,
  wrapTool,
  type ToolLike,
  type ToolValue,
  type WrapToolOptions,
  type WrappedTool,
} from "./tools.js";
export {
  ActionTimeoutError,
  AlreadyDecidedError,
  AlreadyResolvedError,
  ApprovalMismatchError,
  ApproverRoleRequiredError,
  AwaitingApprovalError,
  DataLossError,
  DeadlineExceededError,
  DeniedError,
  ERROR_DOMAIN,
  FailedPreconditionError,
  InProgressError,
  InternalError,
  InvalidArgumentError,
  KeyReusedError,
  MissingRunIdError,
  UNKNOWN_NOTE,
  LeaseEndedError,
  LedgerError,
  NotAwaitingApprovalError,
  NotExecutedError,
  NotFoundError,
  OutcomeUnknownError,
  PermanentFailureError,
  PermissionDeniedError,
  PreviouslyFailedError,
  ResourceExhaustedError,
  ResultNotEncodableError,
  StaleClaimTokenError,
  StoreFullError,
  UnauthenticatedError,
  UnavailableError,
  errorClassFor,
  toLedgerError,
  type FieldViolation,
  type GrpcCode,
  type LedgerErrorInit,
} from "./errors.js";
export {
  DEFAULT_LIMITS,
  canonicalize,
  deriveKey,
  fingerprint,
  toArgumentsJson,
  type ArgumentLimits,
  type ArgumentsInput,
  type ArgumentsRefusal,
  type Canonicalization,
} from "./keys.js";
export { bytesCodec, jsonCodec, textCodec, type Codec } from "./codec.js";
export type {
  Approval,
  ApprovalState,
  Decision,
  EntryStatus,
  LedgerEntry,
  Outcome,
  ResolutionOutcome,
  ResolutionResult,
  WaitFor,
} from "./types.js";
