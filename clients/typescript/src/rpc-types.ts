// What the ledger's RPCs (rpc.ts) take and answer, in the client's terms: how to reach the
// ledger (LedgerRpcOptions, TlsOptions), each call's options (CallOptions), and the parameters
// and results of Claim, Complete, Lookup, Reconcile, ListEntries, ExtendRun and WatchApprovals.

import type { Transport } from "@connectrpc/connect";
import type { ArgumentsInput, Canonicalization } from "./keys.js";
import type { EntryStatus, LedgerEntry, Outcome, ResolutionResult, WaitFor } from "./types.js";

/** TLS settings of the connection to the ledger. */
export interface TlsOptions {
  /** PEM root certificate(s) to trust instead of the system's (a private CA, a self-signed cert). */
  rootCert?: string | Uint8Array;
  /** The name to verify the server's certificate against, when it differs from the address. */
  serverName?: string;
}

/** How to reach the ledger. */
export interface LedgerRpcOptions {
  /** `host:port`, or a URL `http://host:port` / `https://host:port` (DEFAULTS.addressForms). */
  address: string;
  /** The bearer token (sent as `authorization: Bearer <token>`); it selects the tenant. */
  token?: string | (() => string | Promise<string>);
  /** TLS: `true` for the system's roots, or options with a root certificate. Implied by https://. */
  tls?: boolean | TlsOptions;
  /** Deadline of each call in milliseconds (default 10 s); each call may set its own. */
  deadlineMs?: number;
  /** Default `principal` of claims, for the audit trail. */
  principal?: string;
  /**
   * How long Claim, Lookup, RenewLease and Complete are sent again while the ledger answers
   * UNAVAILABLE (default 30 s, long enough for a failover; 0: never). Each waits the delay the
   * server's RetryInfo asks (jittered), or a backoff when the server cannot be reached. A
   * Complete after an action keeps trying at least as long as the claim's lease.
   */
  retryBudgetMs?: number;
  /**
   * Use this transport instead of building one (tests, custom interceptors); it then carries
   * neither the token nor the trace context unless its own interceptors add them.
   */
  transport?: Transport;
}

/** Per-call options of every RPC method. */
export interface CallOptions {
  /** This call's deadline in milliseconds (default: the Ledger's), for each time it is sent. */
  deadlineMs?: number;
  signal?: AbortSignal;
  /** This call's retry budget on UNAVAILABLE (default: the Ledger's); Claim, Lookup, RenewLease and Complete. */
  retryBudgetMs?: number;
}

/** A Claim. */
export interface ClaimParams {
  /** The agent run. Required unless `key` is set. */
  runId?: string;
  tool: string;
  /** JSON text or a JS value (see the README for the rules on JS values). */
  args: ArgumentsInput;
  /** An explicit key such as `{workflowRunId}:{stepId}` instead of the derived one. */
  key?: string;
  canonicalization?: Canonicalization;
  leaseMs?: number;
  retentionMs?: number;
  /** Hold the call up to this long while another attempt is in flight (server-side wait). */
  waitMs?: number;
  /**
   * What the wait waits for besides an attempt in flight. Unset (the server's default,
   * "ATTEMPT_OR_DECISION"): a repeat of a call awaiting a person's decision waits for the
   * decision too. "ATTEMPT": such a call is answered at once (AWAITING_APPROVAL); runOnce sends it.
   */
  waitFor?: WaitFor;
  principal?: string;
  /**
   * Ask a person first, whatever the server's approval policy says: a new entry awaits a
   * decision (AWAITING_APPROVAL) instead of being claimed. The policy may gate a call without
   * it; it cannot ungate one. Ignored when the entry exists already.
   */
  requireApproval?: boolean;
}

/** What ExtendRun did. */
export interface ExtendRunResult {
  /** How many finished entries of the run now expire later than they did. */
  extended: number;
  /** The earliest a finished entry of the run may now expire (undefined when it has none). */
  keptUntil: Date | undefined;
}

/** The options of watchApprovals. */
export interface WatchApprovalsParams {
  /** The cursor of the last event seen: the events after it. Unset or empty: from now. */
  cursor?: string;
}

/** What happened to an approval: a request, a decision, its use or its expiry. */
export type ApprovalEventKind = "requested" | "approved" | "denied" | "expired" | "used";

/** One event of watchApprovals. */
export interface ApprovalEvent {
  /** Pass it as `cursor` to resume after this event (after a reconnect, a restart). */
  cursor: string;
  kind: ApprovalEventKind;
  at: Date | undefined;
  /** Who: the approver of a decision, the claimant of a request or a use. */
  principal: string;
  /** The entry as it stood just after (its tool, arguments as stored, run, fingerprint, approval). */
  entry: LedgerEntry;
}

/** What a Claim found. */
export interface ClaimResult {
  outcome: Outcome;
  entry: LedgerEntry;
  /** Set only with CLAIMED: the fencing token to complete with. */
  claimToken: string;
  /** A sentence written for the model (empty with CLAIMED). */
  note: string;
  /** With IN_PROGRESS: milliseconds after which a new claim is worth trying. */
  retryAfter: number | undefined;
}

/** A Complete. */
export interface CompleteParams {
  key: string;
  claimToken: string;
  status: "SUCCEEDED" | "FAILED" | "UNKNOWN";
  /** Only with SUCCEEDED. */
  result?: Uint8Array;
  error?: string;
  /** Only with FAILED: true when the effect certainly did not happen. */
  retryable?: boolean;
}

/** The entry after a Complete. */
export interface CompleteResult {
  entry: LedgerEntry;
  /** True when this exact outcome had already been recorded: nothing changed. */
  alreadyCompleted: boolean;
}

/** A Lookup: by key, or by run, tool and arguments (derived as Claim does). */
export type LookupParams =
  | { key: string }
  | { runId: string; tool: string; args: ArgumentsInput; canonicalization?: Canonicalization };

/**
 * What a tool's own read found for one unresolved entry, fenced: it names the attempt the read
 * was about and the hold it was handed, both copied from the pending entry (`attempt`,
 * `holdToken`). The ledger applies it only if the entry is still unresolved at that attempt and
 * nobody was handed it since; otherwise nothing changes and the call's `results` say why. A
 * resolution without them is refused (InvalidArgumentError, reason UNFENCED_RESOLUTION).
 */
export interface Resolution {
  key: string;
  /** The attempt the read was about: the pending entry's `attempt`. */
  attempt: number;
  /** The hold the entry was handed out with: the pending entry's `holdToken`. */
  holdToken: string;
  /** SUCCEEDED when the tool's read found the effect (with its result), FAILED when not. */
  status: "SUCCEEDED" | "FAILED";
  result?: Uint8Array;
  error?: string;
  /** With FAILED: true when the intent may be tried again (the usual case). */
  retryable?: boolean;
}

/** A Reconcile. */
export interface ReconcileParams {
  /** Only entries started at least this long ago (ms). */
  olderThanMs?: number;
  tool?: string;
  /** How many pending entries to hand out (0 or unset: the server's default). */
  limit?: number;
  resolutions?: Resolution[];
  /**
   * Apply the resolutions and hand out nothing new (a worker's last call before it stops):
   * `pending` is then empty and no entry is held for this caller.
   */
  resolveOnly?: boolean;
  /**
   * Hand out only these keys (each if it is unresolved and not held by another reconciler), so
   * that a caller settles one entry without taking any other.
   */
  keys?: string[];
  /** Who reconciles: recorded as `resolvedBy` on every entry this call resolves. */
  principal?: string;
}

/** The filters of listEntries. */
export interface ListEntriesParams {
  /** Only entries claimed by this run. */
  runId?: string;
  /** Only entries of this tool. */
  tool?: string;
  /** Only entries in this state (an attempt past its lease is UNKNOWN). */
  status?: Exclude<EntryStatus, "UNSPECIFIED">;
  /** Only entries whose current attempt started at or after this time. */
  startedAfter?: Date;
  /** Only entries whose current attempt started before this time. */
  startedBefore?: Date;
  /** Entries fetched per call (default 100, at most 1000). */
  pageSize?: number;
}

/** What a Reconcile answered. */
export interface ReconcileResult {
  /** Unresolved entries, oldest first, now held for this caller for the reconcile lease. */
  pending: LedgerEntry[];
  /** The entries the resolutions named, as they stand afterwards. */
  resolved: LedgerEntry[];
  /** What became of each resolution, in the request's order: applied, or why not. */
  results: ResolutionResult[];
}
