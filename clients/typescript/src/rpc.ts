// The ledger's RPCs: Claim, Complete, Lookup, Reconcile, ListEntries (as an async iterator) and
// RenewLease over gRPC (Connect-ES's gRPC transport on Node's http2), bearer-token credentials,
// optional TLS, per-call deadlines with a default, and Claim, Lookup, RenewLease and Complete
// sent again while the ledger answers UNAVAILABLE (a failover, a restart of its database, a cut
// connection) within a retry budget. What each takes and answers is in rpc-types.ts. The Ledger
// (ledger.ts) adds runOnce and the tool calls on top; this layer knows nothing of actions or tools.

import { create } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import {
  ClaimRequestSchema,
  CompleteRequestSchema,
  DecideRequestSchema,
  Decision as PbDecision,
  EntryView as PbEntryView,
  ExtendRunRequestSchema,
  LedgerService,
  ListEntriesRequestSchema,
  LookupRequestSchema,
  ReconcileRequestSchema,
  RenewLeaseRequestSchema,
  ResolutionSchema,
  Status as PbStatus,
  WatchApprovalsRequestSchema,
} from "./gen/idempotency/v1/ledger_pb.js";
import { DEFAULT_DEADLINE_MS, DEFAULT_RETRY_BUDGET_MS, ledgerUrl } from "./defaults.js";
import { DeadlineExceededError, UnavailableError, toLedgerError, type LedgerError } from "./errors.js";
import { traceInterceptor } from "./trace.js";
import { toArgumentsJson } from "./keys.js";
import type {
  ApprovalEvent,
  ApprovalEventKind,
  CallOptions,
  ClaimParams,
  ClaimResult,
  CompleteParams,
  CompleteResult,
  ExtendRunResult,
  LedgerRpcOptions,
  ListEntriesParams,
  LookupParams,
  ReconcileParams,
  ReconcileResult,
  TlsOptions,
  WatchApprovalsParams,
} from "./rpc-types.js";
import {
  canonicalizationValue,
  durationOf,
  entryFrom,
  msFromDuration,
  outcomeName,
  resolutionResultFrom,
  statusValue,
  waitForValue,
  type Decision,
  type LedgerEntry,
} from "./types.js";

/** The RPCs of one ledger. The Ledger (ledger.ts) is this with runOnce and the tool calls. */
/**
 * The view every Complete asks for (`defaults.complete_view` of clients/parity.json): the answer
 * leaves out the result the call sent, which `complete` puts back into the entry it returns.
 */
export const COMPLETE_VIEW = PbEntryView.BASIC;

export class LedgerRpc {
  private readonly client: Client<typeof LedgerService>;
  private readonly sessionManager: Http2SessionManager | undefined;
  /** The default deadline of each call, in milliseconds. */
  protected readonly deadlineMs: number;
  /** The default principal of claims (and of settlements). */
  readonly principal: string | undefined;
  /** How long a call is sent again while the ledger answers UNAVAILABLE. */
  readonly retryBudgetMs: number;

  constructor(options: LedgerRpcOptions) {
    this.deadlineMs = options.deadlineMs ?? DEFAULT_DEADLINE_MS;
    this.retryBudgetMs = options.retryBudgetMs ?? DEFAULT_RETRY_BUDGET_MS;
    if (!(this.retryBudgetMs >= 0)) throw new RangeError("retryBudgetMs: must be a non-negative number of milliseconds");
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
      // The caller's OpenTelemetry span, when there is one, as traceparent.
      const interceptors: Interceptor[] = [traceInterceptor];
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

  /**
   * A call's answer, or its error as a typed LedgerError (what `retrying` decides on). A call
   * cancelled though its caller did not cancel it lost its connection (Node's HTTP/2 resets
   * the streams of a session whose socket closed): UNAVAILABLE, as gRPC says of a transport
   * failure, not CANCELLED.
   */
  private async send<T>(call: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
    try {
      return await call;
    } catch (err) {
      const e = toLedgerError(err);
      if (e.code === "CANCELLED" && !signal?.aborted) {
        throw new UnavailableError(`the connection to the ledger closed before it answered (${e.message})`, {
          code: "UNAVAILABLE",
          cause: err,
        });
      }
      throw e;
    }
  }

  /**
   * Sends a call, and again while the ledger answers UNAVAILABLE (and, for `deadlineToo`,
   * DEADLINE_EXCEEDED: a Complete whose answer was lost is sent again identically), within the
   * retry budget: after the delay the server's RetryInfo asks, or a doubling backoff from 100 ms
   * to 2 s when there is none (the server could not be reached), each stretched by up to half
   * (jitter, so that clients do not come back in step). The last error is thrown once the next
   * wait would pass the budget, or the call's signal aborts.
   */
  protected async retrying<T>(
    opts: CallOptions | undefined,
    send: () => Promise<T>,
    { minBudgetMs = 0, deadlineToo = false }: { minBudgetMs?: number; deadlineToo?: boolean } = {},
  ): Promise<T> {
    const budget = Math.max(opts?.retryBudgetMs ?? this.retryBudgetMs, minBudgetMs);
    const started = Date.now();
    for (let failures = 0; ; failures++) {
      try {
        return await send();
      } catch (err) {
        const transient = err instanceof UnavailableError || (deadlineToo && err instanceof DeadlineExceededError);
        if (!transient || opts?.signal?.aborted) throw err;
        const asked = (err as LedgerError).retryAfter;
        const delay = (asked ?? Math.min(2_000, 100 * 2 ** failures)) * (1 + Math.random() / 2);
        if (Date.now() - started + delay > budget) throw err;
        await pause(delay, opts?.signal);
      }
    }
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
      waitFor: waitForValue(params.waitFor),
      principal: params.principal ?? this.principal ?? "",
      requireApproval: params.requireApproval ?? false,
    });
    try {
      // A waiting claim gets the wait on top of the default deadline.
      const res = await this.retrying(opts, () => this.send(this.client.claim(req, this.callOptions(opts, params.waitMs ?? 0)), opts?.signal));
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

  /**
   * Records the outcome of a claimed attempt (durable when this returns). Sent again on
   * UNAVAILABLE and DEADLINE_EXCEEDED within the retry budget, or `minBudgetMs` if longer: the
   * identical Complete is idempotent (`alreadyCompleted`).
   */
  async complete(params: CompleteParams, opts?: CallOptions, minBudgetMs = 0): Promise<CompleteResult> {
    const req = create(CompleteRequestSchema, {
      key: params.key,
      claimToken: params.claimToken,
      status: statusValue(params.status),
      result: params.result ?? new Uint8Array(0),
      error: params.error ?? "",
      retryable: params.retryable ?? false,
      view: COMPLETE_VIEW,
    });
    try {
      const res = await this.retrying(opts, () => this.send(this.client.complete(req, this.callOptions(opts)), opts?.signal), {
        minBudgetMs,
        deadlineToo: true,
      });
      // The basic view leaves out the result this call sent, which a Complete that succeeded
      // recorded (or found recorded): the entry returned reads as the full view's.
      return { entry: { ...entryFrom(res.entry), result: req.result }, alreadyCompleted: res.alreadyCompleted };
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
      const res = await this.retrying(opts, () => this.send(this.client.renewLease(req, this.callOptions(opts)), opts?.signal));
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
      const res = await this.retrying(opts, () => this.send(this.client.lookup(req, this.callOptions(opts)), opts?.signal));
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
          attempt: r.attempt ?? 0,
          holdToken: r.holdToken ?? "",
        }),
      ),
      resolveOnly: params.resolveOnly ?? false,
      keys: params.keys ?? [],
      principal: params.principal ?? "",
    });
    try {
      const res = await this.client.reconcile(req, this.callOptions(opts));
      return {
        pending: res.pending.map(entryFrom),
        resolved: res.resolved.map(entryFrom),
        results: res.results.map(resolutionResultFrom),
      };
    } catch (err) {
      throw toLedgerError(err);
    }
  }

  /**
   * A person's decision about a call awaiting approval, with an approver's credential (the
   * tokens file's third column; the Ledger's `token`): `decision` "APPROVE" lets the next Claim
   * of the key act, once, before `approval.executeBy`; "DENY" makes the entry DENIED for good,
   * and every repeat reads `reason`. `fingerprint` is the one of the arguments the person was
   * shown: another is ApprovalMismatchError and changes nothing. The ledger records who decided
   * (`approval.decidedBy`) from the credential, never from the request. The same decision again
   * changes nothing; the opposite is AlreadyDecidedError; an entry that awaits no decision is
   * NotAwaitingApprovalError; a credential without the role is ApproverRoleRequiredError.
   * Returns the entry, decided.
   */
  async decide(
    key: string,
    fingerprint: string,
    decision: Decision | Lowercase<Decision>,
    reason = "",
    opts?: CallOptions,
  ): Promise<LedgerEntry> {
    const value = decisionValue(decision);
    const req = create(DecideRequestSchema, { key, fingerprint, decision: value, reason });
    try {
      const res = await this.retrying(opts, () => this.send(this.client.decide(req, this.callOptions(opts)), opts?.signal));
      return entryFrom(res.entry);
    } catch (err) {
      throw toLedgerError(err);
    }
  }

  /**
   * Keeps every finished entry of a run at least `atLeastMs` from now (unset: the server's
   * default retention; above its --max-retention is InvalidArgumentError), never shortening
   * one: for a run paused for a reason outside the ledger, whose retries after it resumes must
   * still replay. The adapters call it where the framework says a run was interrupted.
   */
  async extendRun(runId: string, atLeastMs?: number, opts?: CallOptions): Promise<ExtendRunResult> {
    const req = create(ExtendRunRequestSchema, { runId, retention: durationOf(atLeastMs, "atLeastMs") });
    try {
      const res = await this.retrying(opts, () => this.send(this.client.extendRun(req, this.callOptions(opts)), opts?.signal));
      return { extended: Number(res.extended), keptUntil: res.keptUntil ? timestampDate(res.keptUntil) : undefined };
    } catch (err) {
      throw toLedgerError(err);
    }
  }

  /**
   * The tenant's approval events as they happen (`for await (const event of
   * ledger.watchApprovals({ cursor }))`): each new request, decision, use and expiry, with the
   * entry and a cursor. Without a cursor it starts from now; with the last event's cursor it
   * resumes after it, missing nothing kept since. A stream the ledger cuts (UNAVAILABLE: a
   * restart, a failover) is opened again from the last cursor within the retry budget; other
   * errors are thrown by the iteration. It ends when `opts.signal` aborts (or the loop breaks).
   * No deadline applies unless `opts.deadlineMs` sets one.
   */
  async *watchApprovals(
    params: WatchApprovalsParams = {},
    opts?: CallOptions,
  ): AsyncGenerator<ApprovalEvent, void, undefined> {
    let cursor = params.cursor ?? "";
    let failedSince: number | undefined;
    let failures = 0;
    for (;;) {
      const req = create(WatchApprovalsRequestSchema, { after: cursor });
      try {
        const stream = this.client.watchApprovals(req, { timeoutMs: opts?.deadlineMs, signal: opts?.signal });
        for await (const res of stream) {
          failedSince = undefined;
          failures = 0;
          cursor = res.cursor;
          yield {
            cursor: res.cursor,
            kind: res.kind as ApprovalEventKind,
            at: res.at ? timestampDate(res.at) : undefined,
            principal: res.principal,
            entry: entryFrom(res.entry),
          };
        }
        return;
      } catch (err) {
        if (opts?.signal?.aborted) return;
        const e = toLedgerError(err);
        const cut = e instanceof UnavailableError || (e.code === "CANCELLED" && !opts?.signal?.aborted);
        if (!cut) throw e;
        failedSince ??= Date.now();
        const budget = opts?.retryBudgetMs ?? this.retryBudgetMs;
        const delay = (e.retryAfter ?? Math.min(2_000, 100 * 2 ** failures++)) * (1 + Math.random() / 2);
        if (Date.now() - failedSince + delay > budget) throw e;
        await pause(delay, opts?.signal);
        if (opts?.signal?.aborted) return;
      }
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
}

function decisionValue(decision: string): PbDecision {
  const upper = typeof decision === "string" ? decision.toUpperCase() : "";
  if (upper === "APPROVE") return PbDecision.APPROVE;
  if (upper === "DENY") return PbDecision.DENY;
  throw new TypeError(`decide: the decision must be "APPROVE" or "DENY", got ${String(decision)}`);
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((done) => {
    const timer = setTimeout(finish, ms);
    function finish() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", finish);
      done();
    }
    signal?.addEventListener("abort", finish, { once: true });
  });
}
