// The Ledger client: Claim, Complete, Lookup, Reconcile, ListEntries (as an async iterator) and
// RenewLease over gRPC (Connect-ES's gRPC transport on Node's http2), bearer-token credentials,
// optional TLS, per-call deadlines with a default; runOnce, the claim → act → complete loop
// around one side-effecting tool call (renewing the lease while the action runs); and the tool
// wrappers built on it (runTool, wrapTool; see tools.ts).

import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import {
  ClaimRequestSchema,
  CompleteRequestSchema,
  LedgerService,
  ListEntriesRequestSchema,
  LookupRequestSchema,
  ReconcileRequestSchema,
  RenewLeaseRequestSchema,
  ResolutionSchema,
  Status as PbStatus,
} from "./gen/idempotency/v1/ledger_pb.js";
import { jsonCodec, type Codec } from "./codec.js";
import {
  DEFAULT_DEADLINE_MS,
  DEFAULT_WAIT_MS,
  RENEW_EVERY_FRACTION_OF_LEASE,
  ledgerUrl,
} from "./defaults.js";
import {
  ActionTimeoutError,
  DeadlineExceededError,
  FailedPreconditionError,
  InProgressError,
  InvalidArgumentError,
  LedgerError,
  NotExecutedError,
  OutcomeUnknownError,
  PermanentFailureError,
  PreviouslyFailedError,
  ResultNotEncodableError,
  UNKNOWN_RETRY_AFTER_MS,
  UnavailableError,
  toLedgerError,
} from "./errors.js";
import { toArgumentsJson, type ArgumentsInput, type Canonicalization } from "./keys.js";
import {
  runTool,
  wrapTool,
  type RunToolOptions,
  type ToolCallResult,
  type ToolLike,
  type WrapToolOptions,
  type WrappedTool,
} from "./tools.js";
import {
  canonicalizationValue,
  durationOf,
  entryFrom,
  msFromDuration,
  outcomeName,
  statusValue,
  type EntryStatus,
  type LedgerEntry,
  type Outcome,
} from "./types.js";

export { DEFAULT_DEADLINE_MS };

/** TLS settings of the connection to the ledger. */
export interface TlsOptions {
  /** PEM root certificate(s) to trust instead of the system's (a private CA, a self-signed cert). */
  rootCert?: string | Uint8Array;
  /** The name to verify the server's certificate against, when it differs from the address. */
  serverName?: string;
}

/** How to reach the ledger. */
export interface LedgerOptions {
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
  /** Use this transport instead of building one (tests, custom interceptors). */
  transport?: Transport;
}

/** Per-call options of every RPC method. */
export interface CallOptions {
  /** This call's deadline in milliseconds (default: the Ledger's). */
  deadlineMs?: number;
  signal?: AbortSignal;
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
  principal?: string;
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

/** What a tool's own read found for one unresolved entry. */
export interface Resolution {
  key: string;
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
}

/** What the action of runOnce is given: the attempt, to pass downstream. */
export interface ActionContext {
  runId: string;
  tool: string;
  key: string;
  /** Pass it to the external system as its idempotency key or memo, so a reconciler can ask. */
  externalRef: string;
  /** 1 for the first attempt, one more after each retryable failure. */
  attempt: number;
  /** Aborted when `timeoutMs` passes, or when the runOnce `signal` aborts. */
  signal: AbortSignal;
  /** The entry as the claim returned it. */
  entry: LedgerEntry;
}

/** The options of runOnce. */
export interface RunOnceOptions<T> {
  /** An explicit key instead of the derived one. */
  key?: string;
  canonicalization?: Canonicalization;
  /**
   * How long the attempt may go without a sign of life before it counts as unknown (the
   * server's default, 60 s, when unset). runOnce renews it while the action runs.
   */
  leaseMs?: number;
  retentionMs?: number;
  principal?: string;
  /**
   * When another attempt of the same intent is in flight: wait up to this long for it (the
   * server's `wait`), then replay its result, or run if it failed retryably. Default
   * DEFAULT_WAIT_MS (10 s); 0 throws InProgressError at once.
   */
  waitMs?: number;
  /** The action's time limit: past it, the entry is completed UNKNOWN and ActionTimeoutError thrown. */
  timeoutMs?: number;
  /**
   * Renew the lease every RENEW_EVERY_FRACTION_OF_LEASE of it while the action runs (default
   * true), so that a duplicate sees the attempt in flight (IN_PROGRESS, ATTEMPTING), not UNKNOWN.
   */
  renewLease?: boolean;
  /** How results are stored: JSON by default. */
  codec?: Codec<T>;
  /** Deadline of each ledger call (not of the action). */
  deadlineMs?: number;
  /**
   * Cancels the call. Aborted before the action starts: nothing runs, an attempt already
   * claimed is completed FAILED retryable, and NotExecutedError is thrown. Aborted while the
   * action runs: `ctx.signal` is aborted and the action decides.
   */
  signal?: AbortSignal;
}

/** What runOnce returns: the action's result, or the stored one on a repeat. */
export interface RunOnceResult<T> {
  value: T;
  /** True when the stored result of an earlier call was returned and nothing was executed. */
  replayed: boolean;
  /** With a replay: the server's note for the model ("already performed … no new action"). */
  note: string;
  entry: LedgerEntry;
}

/**
 * What one attempt came to, before runOnce throws or runTool renders it. `actionRan` says
 * whether this call started the action (so an error afterwards may follow an effect).
 */
export type AttemptOutcome<T> =
  | { kind: "performed"; value: T; entry: LedgerEntry }
  | { kind: "replayed"; value: T; note: string; entry: LedgerEntry }
  | { kind: "thrown"; error: unknown; actionRan: boolean };

const TRANSIENT_COMPLETE_RETRIES = [100, 300, 900];

/** The client of one ledger: its RPCs, runOnce and the tool wrappers. */
export class Ledger {
  private readonly client: Client<typeof LedgerService>;
  private readonly sessionManager: Http2SessionManager | undefined;
  private readonly deadlineMs: number;
  private readonly principal: string | undefined;

  constructor(options: LedgerOptions) {
    this.deadlineMs = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
    this.principal = options.principal;
    let transport = options.transport;
    if (!transport) {
      const tlsOpts: TlsOptions | undefined =
        typeof options.tls === "object" ? options.tls : options.tls ? {} : undefined;
      const url = ledgerUrl(options.address, tlsOpts !== undefined);
      const baseUrl = url.origin;
      const secure = url.protocol === "https:";
      const nodeOptions = secure
        ? {
            ...(tlsOpts?.rootCert !== undefined ? { ca: tlsOpts.rootCert as string | Buffer } : {}),
            ...(tlsOpts?.serverName !== undefined ? { servername: tlsOpts.serverName } : {}),
          }
        : {};
      this.sessionManager = new Http2SessionManager(baseUrl, {}, nodeOptions);
      const interceptors: Interceptor[] = [];
      const token = options.token;
      if (token !== undefined) {
        interceptors.push((next) => async (req) => {
          const value = typeof token === "function" ? await token() : token;
          req.header.set("authorization", `Bearer ${value}`);
          return next(req);
        });
      }
      transport = createGrpcTransport({
        baseUrl,
        sessionManager: this.sessionManager,
        interceptors,
      });
    }
    this.client = createClient(LedgerService, transport);
  }

  /** Closes the connection. Calls made afterwards open a new one. */
  close(): void {
    this.sessionManager?.abort();
  }

  private callOptions(opts: CallOptions | undefined, extraMs = 0) {
    return {
      timeoutMs: opts?.deadlineMs ?? this.deadlineMs + extraMs,
      signal: opts?.signal,
    };
  }

  /** Claims the key of one tool call before acting. A repeat is never an error. */
  async claim(params: ClaimParams, opts?: CallOptions): Promise<ClaimResult> {
    const req = create(ClaimRequestSchema, {
      runId: params.runId ?? "",
      tool: params.tool,
      argumentsJson: toArgumentsJson(params.args),
      key: params.key ?? "",
      canonicalization: canonicalizationValue(params.canonicalization),
      lease: durationOf(params.leaseMs, "leaseMs"),
      retention: durationOf(params.retentionMs, "retentionMs"),
      wait: params.waitMs ? durationOf(params.waitMs, "waitMs") : undefined,
      principal: params.principal ?? this.principal ?? "",
    });
    try {
      // A waiting claim gets the wait on top of the default deadline.
      const res = await this.client.claim(req, this.callOptions(opts, params.waitMs ?? 0));
      return {
        outcome: outcomeName(res.outcome),
        entry: entryFrom(res.entry),
        claimToken: res.claimToken,
        note: res.note,
        retryAfter: msFromDuration(res.retryAfter),
      };
    } catch (err) {
      throw toLedgerError(err);
    }
  }

  /** Records the outcome of a claimed attempt (durable when this returns). */
  async complete(params: CompleteParams, opts?: CallOptions): Promise<CompleteResult> {
    const req = create(CompleteRequestSchema, {
      key: params.key,
      claimToken: params.claimToken,
      status: statusValue(params.status),
      result: params.result ?? new Uint8Array(0),
      error: params.error ?? "",
      retryable: params.retryable ?? false,
    });
    try {
      const res = await this.client.complete(req, this.callOptions(opts));
      return { entry: entryFrom(res.entry), alreadyCompleted: res.alreadyCompleted };
    } catch (err) {
      throw toLedgerError(err);
    }
  }

  /**
   * Extends the lease of the caller's own attempt, counted from now, while a slow action runs,
   * so that a duplicate keeps getting IN_PROGRESS (ATTEMPTING) instead of UNKNOWN. `leaseMs`
   * unset means the server's default lease. Throws StaleClaimTokenError for a token that is
   * not the current claim's, LeaseEndedError when the entry is resolved or its lease already
   * ended (nothing changes then), InvalidArgumentError above the server's --max-lease.
   * runOnce and the tool wrappers renew by themselves.
   */
  async renewLease(
    key: string,
    claimToken: string,
    leaseMs?: number,
    opts?: CallOptions,
  ): Promise<LedgerEntry> {
    const req = create(RenewLeaseRequestSchema, {
      key,
      claimToken,
      lease: durationOf(leaseMs, "leaseMs"),
    });
    try {
      const res = await this.client.renewLease(req, this.callOptions(opts));
      return entryFrom(res.entry);
    } catch (err) {
      throw toLedgerError(err);
    }
  }

  /** Reads an entry by key, or by run, tool and arguments (derived as Claim does). */
  async lookup(params: LookupParams, opts?: CallOptions): Promise<LedgerEntry> {
    const req =
      "key" in params
        ? create(LookupRequestSchema, { key: params.key })
        : create(LookupRequestSchema, {
            runId: params.runId,
            tool: params.tool,
            argumentsJson: toArgumentsJson(params.args),
            canonicalization: canonicalizationValue(params.canonicalization),
          });
    try {
      const res = await this.client.lookup(req, this.callOptions(opts));
      return entryFrom(res.entry);
    } catch (err) {
      throw toLedgerError(err);
    }
  }

  /**
   * Hands out unresolved entries and applies what the tools' reads found for earlier ones;
   * with `resolveOnly`, only applies them.
   */
  async reconcile(params: ReconcileParams = {}, opts?: CallOptions): Promise<ReconcileResult> {
    const req = create(ReconcileRequestSchema, {
      olderThan: durationOf(params.olderThanMs, "olderThanMs"),
      tool: params.tool ?? "",
      limit: params.limit ?? 0,
      resolutions: (params.resolutions ?? []).map((r) =>
        create(ResolutionSchema, {
          key: r.key,
          status: statusValue(r.status),
          result: r.result ?? new Uint8Array(0),
          error: r.error ?? "",
          retryable: r.retryable ?? false,
        }),
      ),
      resolveOnly: params.resolveOnly ?? false,
    });
    try {
      const res = await this.client.reconcile(req, this.callOptions(opts));
      return { pending: res.pending.map(entryFrom), resolved: res.resolved.map(entryFrom) };
    } catch (err) {
      throw toLedgerError(err);
    }
  }

  /**
   * Yields the tenant's entries that match, oldest attempt first (by startedAt, then key),
   * fetching a page at a time as the iteration goes (`for await (const e of
   * ledger.listEntries({ runId }))`). Unset filters match everything. The deadline applies to
   * each page's call; errors are thrown by the iteration.
   */
  async *listEntries(
    params: ListEntriesParams = {},
    opts?: CallOptions,
  ): AsyncGenerator<LedgerEntry, void, undefined> {
    const req = create(ListEntriesRequestSchema, {
      runId: params.runId ?? "",
      tool: params.tool ?? "",
      status: params.status === undefined ? PbStatus.UNSPECIFIED : statusValue(params.status),
      startedAfter: params.startedAfter ? timestampFromDate(params.startedAfter) : undefined,
      startedBefore: params.startedBefore ? timestampFromDate(params.startedBefore) : undefined,
      pageSize: params.pageSize ?? 0,
    });
    for (;;) {
      let res;
      try {
        res = await this.client.listEntries(req, this.callOptions(opts));
      } catch (err) {
        throw toLedgerError(err);
      }
      for (const e of res.entries) yield entryFrom(e);
      if (!res.nextPageToken) return;
      // A server handing out the same token again would page forever.
      if (res.nextPageToken === req.pageToken) {
        throw new Error("the ledger answered the same page token twice");
      }
      req.pageToken = res.nextPageToken;
    }
  }

  /**
   * Runs `action` at most once per intent (run, tool, canonical arguments):
   *
   * - CLAIMED: runs the action (renewing the lease while it runs) and completes the entry with
   *   its result; returns `{ value, replayed: false }`. If the action throws NotExecutedError
   *   the entry is completed FAILED retryable, PermanentFailureError FAILED for good (both get
   *   `entry` set and are re-thrown); on a timeout (`timeoutMs`, ActionTimeoutError) or any
   *   other error it is completed UNKNOWN (to be reconciled) and the error re-thrown. A result
   *   that cannot be stored leaves it UNKNOWN too (ResultNotEncodableError).
   * - REPLAYED: returns the stored result, `{ value, replayed: true, note }`; nothing runs.
   * - IN_PROGRESS: the server holds the claim up to `waitMs` (default 10 s) for the other
   *   attempt, then replays its result (or runs, if it failed retryably); if it is still in
   *   flight, throws InProgressError; if its outcome is unknown, OutcomeUnknownError.
   * - PREVIOUSLY_FAILED: throws PreviouslyFailedError with the stored error.
   */
  async runOnce<T = unknown>(
    runId: string,
    tool: string,
    args: ArgumentsInput,
    action: (ctx: ActionContext) => T | Promise<T>,
    options: RunOnceOptions<T> = {},
  ): Promise<RunOnceResult<T>> {
    const out = await this.attempt(runId, tool, args, action, options);
    switch (out.kind) {
      case "performed":
        return { value: out.value, replayed: false, note: "", entry: out.entry };
      case "replayed":
        return { value: out.value, replayed: true, note: out.note, entry: out.entry };
      default:
        throw out.error;
    }
  }

  /**
   * runOnce for a tool call whose answer goes to a model: never throws for an outcome. The
   * result says what happened (`outcome`), carries the value on a first run or a replay, and
   * `toModelText()` is what the model should read: the result; on a repeat the stored result
   * with the replay note; for in progress, previously failed, unknown and not executed, the
   * note. See tools.ts.
   */
  runTool<T = unknown>(
    runId: string | undefined,
    tool: string,
    args: ArgumentsInput,
    action: (ctx: ActionContext) => T | Promise<T>,
    options: RunToolOptions<T> = {},
  ): Promise<ToolCallResult<T>> {
    return runTool(this, runId, tool, args, action, options);
  }

  /**
   * Wraps a tool (any object with an `execute` function) so that each call goes through
   * runTool: the same object shape, with an `execute` that takes the same arguments and
   * returns a ToolCallResult. The tool name defaults to `tool.name`; the arguments recorded
   * are `execute`'s first argument (what the model sent, the framework's context left out);
   * `runId` is required (a string, or a function of execute's arguments). The tool's own
   * execute can read the attempt (key, externalRef, attempt) with currentAttempt().
   * The framework adapters (idempotency-ledger/ai-sdk, /openai-agents, /mcp) build on it.
   */
  wrapTool<Tool extends ToolLike>(
    tool: Tool,
    options: WrapToolOptions<Parameters<Tool["execute"]>>,
  ): WrappedTool<Tool> {
    return wrapTool(this, tool, options);
  }

  /** One attempt of runOnce, as an outcome rather than a throw (runTool renders it). */
  async attempt<T>(
    runId: string,
    tool: string,
    args: ArgumentsInput,
    action: (ctx: ActionContext) => T | Promise<T>,
    options: RunOnceOptions<T> = {},
  ): Promise<AttemptOutcome<T>> {
    if (typeof action !== "function") {
      // Refused before claiming: an entry for an action that cannot run would only need clearing.
      throw new TypeError(`runOnce: the action must be a function, got ${typeof action}`);
    }
    const codec = options.codec ?? (jsonCodec as Codec<T>);
    const waitMs = options.waitMs ?? DEFAULT_WAIT_MS;
    const signal = options.signal;
    const notStarted = (why: string, cause?: unknown) =>
      new NotExecutedError(`${why}; the action was not started`, { cause });
    if (signal?.aborted) {
      return { kind: "thrown", error: notStarted("the call was aborted", signal.reason), actionRan: false };
    }

    // The claim is not given the signal: aborting it in flight could leave a claim the server
    // made but whose token nobody received (UNKNOWN after its lease, for an action that never
    // ran). An abort during the claim answers at once and settles the claim when it arrives.
    const claiming = this.claim(
      {
        runId,
        tool,
        args,
        key: options.key,
        canonicalization: options.canonicalization,
        leaseMs: options.leaseMs,
        retentionMs: options.retentionMs,
        waitMs,
        principal: options.principal,
      },
      options.deadlineMs === undefined ? undefined : { deadlineMs: options.deadlineMs + waitMs },
    );
    let claimed: ClaimResult;
    try {
      const raced = await raceAbort(claiming, signal);
      if (raced === ABORTED) {
        claiming.then(
          (c) => this.releaseUnstarted(c, "the call was aborted before the action started", options.deadlineMs),
          () => {},
        );
        return { kind: "thrown", error: notStarted("the call was aborted", signal?.reason), actionRan: false };
      }
      claimed = raced;
    } catch (err) {
      return { kind: "thrown", error: err, actionRan: false };
    }

    const { entry } = claimed;
    switch (claimed.outcome) {
      case "REPLAYED":
        try {
          return { kind: "replayed", value: codec.decode(entry.result), note: claimed.note, entry };
        } catch (err) {
          return { kind: "thrown", error: err, actionRan: false };
        }
      case "IN_PROGRESS": {
        const Cls = entry.status === "UNKNOWN" ? OutcomeUnknownError : InProgressError;
        const retryAfter = claimed.retryAfter ?? (entry.status === "UNKNOWN" ? UNKNOWN_RETRY_AFTER_MS : 1000);
        return { kind: "thrown", error: new Cls(claimed.note, retryAfter, entry), actionRan: false };
      }
      case "PREVIOUSLY_FAILED":
        return {
          kind: "thrown",
          error: new PreviouslyFailedError(claimed.note, entry.error, entry),
          actionRan: false,
        };
      case "CLAIMED":
        break;
      default:
        return {
          kind: "thrown",
          error: new LedgerError(`the ledger answered an unexpected outcome ${claimed.outcome}`),
          actionRan: false,
        };
    }

    const callOpts: CallOptions = { deadlineMs: options.deadlineMs };
    const finish = (p: Omit<CompleteParams, "key" | "claimToken">) =>
      this.completeWithRetry({ key: entry.key, claimToken: claimed.claimToken, ...p }, callOpts);

    if (signal?.aborted) {
      return {
        kind: "thrown",
        error: await this.recordNotStarted(notStarted("the call was aborted", signal.reason), finish),
        actionRan: false,
      };
    }

    const controller = new AbortController();
    const onAbort = () => controller.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    const ctx: ActionContext = {
      runId,
      tool,
      key: entry.key,
      externalRef: entry.externalRef,
      attempt: entry.attempt,
      signal: controller.signal,
      entry,
    };
    const renewer =
      options.renewLease === false
        ? undefined
        : LeaseRenewer.start(this, claimed, options.leaseMs, options.deadlineMs ?? this.deadlineMs);
    let value: T;
    try {
      value = await withTimeout(() => action(ctx), options.timeoutMs, controller);
    } catch (err) {
      // The renewal stops before the Complete, so that none lands after it.
      await renewer?.stop();
      signal?.removeEventListener("abort", onAbort);
      return { kind: "thrown", error: await this.recordFailure(err, options.timeoutMs, finish, entry), actionRan: true };
    }
    await renewer?.stop();
    signal?.removeEventListener("abort", onAbort);

    let result: Uint8Array;
    try {
      result = codec.encode(value);
    } catch (err) {
      const why = `the codec could not encode it: ${describe(err)}`;
      const recorded = await finish({ status: "UNKNOWN", error: `the result could not be stored: ${why}` }).then(
        (c) => c.entry,
        () => entry,
      );
      return { kind: "thrown", error: new ResultNotEncodableError(why, recorded, { cause: err }), actionRan: true };
    }
    try {
      const done = await finish({ status: "SUCCEEDED", result });
      return { kind: "performed", value, entry: done.entry };
    } catch (err) {
      if (err instanceof InvalidArgumentError) {
        // The ledger refused the result (RESULT_TOO_LARGE): the effect happened but cannot be
        // replayed, so record that the outcome is unknown rather than leave the claim hanging.
        const why = `the ledger refused it: ${err.reason || err.code}: ${err.message}`;
        const recorded = await finish({ status: "UNKNOWN", error: `the result could not be stored: ${why}` }).then(
          (c) => c.entry,
          () => entry,
        );
        return { kind: "thrown", error: new ResultNotEncodableError(why, recorded, { cause: err }), actionRan: true };
      }
      return { kind: "thrown", error: err, actionRan: true };
    }
  }

  /** Records a failed action and returns the error runOnce throws. */
  private async recordFailure(
    err: unknown,
    timeoutMs: number | undefined,
    finish: (p: Omit<CompleteParams, "key" | "claimToken">) => Promise<CompleteResult>,
    claimedEntry: LedgerEntry,
  ): Promise<unknown> {
    let completion: Omit<CompleteParams, "key" | "claimToken">;
    if (err instanceof NotExecutedError) {
      completion = { status: "FAILED", retryable: true, error: describe(err) };
    } else if (err instanceof PermanentFailureError) {
      completion = { status: "FAILED", retryable: false, error: describe(err) };
    } else if (err instanceof ActionTimedOut) {
      completion = { status: "UNKNOWN", error: `the action did not finish within ${timeoutMs} ms` };
    } else {
      completion = { status: "UNKNOWN", error: describe(err) };
    }
    let recorded: CompleteResult;
    try {
      recorded = await finish(completion);
    } catch (ledgerErr) {
      // The entry stays as claimed and reads UNKNOWN once its lease ends: reconciled later.
      // The ledger's error is thrown (the caller must learn the outcome was not recorded),
      // carrying the action's error.
      if (ledgerErr instanceof LedgerError) {
        ledgerErr.actionError = err instanceof ActionTimedOut ? new ActionTimeoutError(err.timeoutMs, claimedEntry) : err;
      }
      return ledgerErr;
    }
    if (err instanceof NotExecutedError || err instanceof PermanentFailureError) {
      err.entry = recorded.entry;
    }
    if (err instanceof ActionTimedOut) return new ActionTimeoutError(err.timeoutMs, recorded.entry);
    return err;
  }

  /** Completes FAILED retryable an attempt claimed but never started; returns `error` with its entry. */
  private async recordNotStarted(
    error: NotExecutedError,
    finish: (p: Omit<CompleteParams, "key" | "claimToken">) => Promise<CompleteResult>,
  ): Promise<unknown> {
    try {
      error.entry = (await finish({ status: "FAILED", retryable: true, error: describe(error) })).entry;
      return error;
    } catch (ledgerErr) {
      if (ledgerErr instanceof LedgerError) ledgerErr.actionError = error;
      return ledgerErr;
    }
  }

  /** Settles, in the background, a claim that arrived after its caller had given up. */
  private async releaseUnstarted(claimed: ClaimResult, why: string, deadlineMs: number | undefined) {
    if (claimed.outcome !== "CLAIMED") return;
    await this.completeWithRetry(
      {
        key: claimed.entry.key,
        claimToken: claimed.claimToken,
        status: "FAILED",
        retryable: true,
        error: `NotExecutedError: ${why}`,
      },
      { deadlineMs },
    ).catch(() => {});
  }

  /** Complete, retried on transient failures (the identical Complete is idempotent). */
  private async completeWithRetry(params: CompleteParams, opts: CallOptions): Promise<CompleteResult> {
    for (let i = 0; ; i++) {
      try {
        return await this.complete(params, opts);
      } catch (err) {
        const transient = err instanceof UnavailableError || err instanceof DeadlineExceededError;
        if (!transient || i >= TRANSIENT_COMPLETE_RETRIES.length) throw err;
        const delay = (err as UnavailableError).retryAfter ?? TRANSIENT_COMPLETE_RETRIES[i];
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }
}

/**
 * Renews a claim's lease every RENEW_EVERY_FRACTION_OF_LEASE of it while the action runs. A
 * renewal the ledger refuses for good (STALE_CLAIM_TOKEN, LEASE_ENDED: the attempt lost its
 * claim) stops it; a transient failure is tried again at the next tick.
 */
class LeaseRenewer {
  private timer: NodeJS.Timeout | undefined;
  private inFlight: Promise<void> | undefined;
  private stopped = false;

  private constructor(
    private readonly ledger: Ledger,
    private readonly claimed: ClaimResult,
    private readonly leaseMs: number | undefined,
    private readonly deadlineMs: number,
  ) {}

  static start(
    ledger: Ledger,
    claimed: ClaimResult,
    leaseMs: number | undefined,
    deadlineMs: number,
  ): LeaseRenewer | undefined {
    // Unset, the lease is the server's default: what the claim's entry shows.
    const { startedAt, leaseExpiresAt } = claimed.entry;
    const lease = leaseMs ?? (startedAt && leaseExpiresAt ? leaseExpiresAt.getTime() - startedAt.getTime() : 0);
    if (!(lease > 0)) return undefined;
    const every = lease * RENEW_EVERY_FRACTION_OF_LEASE;
    // A renewal stuck longer than the interval would hold up the next one: it gives up first.
    const renewer = new LeaseRenewer(ledger, claimed, leaseMs, Math.min(deadlineMs, every));
    renewer.timer = setInterval(() => renewer.tick(), every);
    // A renewal is no reason to keep the process alive: the action is.
    renewer.timer.unref();
    return renewer;
  }

  private tick(): void {
    if (this.stopped || this.inFlight) return;
    const { entry, claimToken } = this.claimed;
    this.inFlight = this.ledger
      .renewLease(entry.key, claimToken, this.leaseMs, { deadlineMs: this.deadlineMs })
      .then(
        () => {},
        (err: unknown) => {
          if (err instanceof FailedPreconditionError) this.halt();
        },
      )
      .finally(() => {
        this.inFlight = undefined;
      });
  }

  private halt(): void {
    this.stopped = true;
    clearInterval(this.timer);
  }

  /** Stops renewing; resolves once no renewal is in flight. */
  async stop(): Promise<void> {
    this.halt();
    await this.inFlight;
  }
}

const ABORTED = Symbol("aborted");

/** `p`, or ABORTED as soon as `signal` aborts (p keeps running). */
function raceAbort<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T | typeof ABORTED> {
  if (!signal) return p;
  return new Promise<T | typeof ABORTED>((resolve, reject) => {
    const onAbort = () => resolve(ABORTED);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(e);
      },
    );
  });
}

function describe(err: unknown): string {
  if (err instanceof Error) return `${err.name}: ${err.message}`;
  return String(err);
}

/** The internal rejection of withTimeout; runOnce turns it into ActionTimeoutError with the entry. */
class ActionTimedOut extends Error {
  constructor(readonly timeoutMs: number) {
    super(`the action did not finish within ${timeoutMs} ms`);
  }
}

async function withTimeout<T>(
  run: () => T | Promise<T>,
  timeoutMs: number | undefined,
  controller: AbortController,
): Promise<T> {
  if (timeoutMs === undefined) return await run();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const err = new ActionTimedOut(timeoutMs);
      controller.abort(new DOMException(err.message, "TimeoutError"));
      reject(err);
    }, timeoutMs);
  });
  try {
    return await Promise.race([Promise.resolve().then(run), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
