// The Ledger client: Claim, Complete, Lookup, Reconcile, ListEntries (as an async iterator) over gRPC (Connect-ES's gRPC transport
// on Node's http2), bearer-token credentials, optional TLS, per-call deadlines with a default,
// and runOnce, the claim → act → complete loop around one side-effecting tool call.

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
  ResolutionSchema,
  Status as PbStatus,
} from "./gen/idempotency/v1/ledger_pb.js";
import { jsonCodec, type Codec } from "./codec.js";
import {
  ActionTimeoutError,
  DeadlineExceededError,
  InProgressError,
  InvalidArgumentError,
  LedgerError,
  NotExecutedError,
  PermanentFailureError,
  PreviouslyFailedError,
  UnavailableError,
  toLedgerError,
} from "./errors.js";
import { toArgumentsJson, type ArgumentsInput, type Canonicalization } from "./keys.js";
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

/** The default deadline of every call, unless the Ledger or the call sets another. */
export const DEFAULT_DEADLINE_MS = 10_000;

export interface TlsOptions {
  /** PEM root certificate(s) to trust instead of the system's (a private CA, a self-signed cert). */
  rootCert?: string | Uint8Array;
  /** The name to verify the server's certificate against, when it differs from the address. */
  serverName?: string;
}

export interface LedgerOptions {
  /** `host:port`, or a URL `http://host:port` / `https://host:port`. */
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

export interface CallOptions {
  /** This call's deadline in milliseconds (default: the Ledger's). */
  deadlineMs?: number;
  signal?: AbortSignal;
}

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

export interface CompleteResult {
  entry: LedgerEntry;
  /** True when this exact outcome had already been recorded: nothing changed. */
  alreadyCompleted: boolean;
}

export type LookupParams =
  | { key: string }
  | { runId: string; tool: string; args: ArgumentsInput; canonicalization?: Canonicalization };

export interface Resolution {
  key: string;
  /** SUCCEEDED when the tool's read found the effect (with its result), FAILED when not. */
  status: "SUCCEEDED" | "FAILED";
  result?: Uint8Array;
  error?: string;
  /** With FAILED: true when the intent may be tried again (the usual case). */
  retryable?: boolean;
}

export interface ReconcileParams {
  /** Only entries started at least this long ago (ms). */
  olderThanMs?: number;
  tool?: string;
  /** How many pending entries to hand out (0 or unset: the server's default). */
  limit?: number;
  resolutions?: Resolution[];
}

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

export interface ReconcileResult {
  /** Unresolved entries, oldest first, now held for this caller for the reconcile lease. */
  pending: LedgerEntry[];
  /** The entries the resolutions named, as they stand afterwards. */
  resolved: LedgerEntry[];
}

/** What the action of runOnce is given. */
export interface ActionContext {
  runId: string;
  tool: string;
  key: string;
  /** Pass it to the external system as its idempotency key or memo, so a reconciler can ask. */
  externalRef: string;
  attempt: number;
  /** Aborted when `timeoutMs` passes. */
  signal: AbortSignal;
  entry: LedgerEntry;
}

export interface RunOnceOptions<T> {
  /** An explicit key instead of the derived one. */
  key?: string;
  canonicalization?: Canonicalization;
  leaseMs?: number;
  retentionMs?: number;
  principal?: string;
  /**
   * When another attempt is in flight: wait up to this long for it (the server's `wait`) before
   * giving up with InProgressError. Default 0: throw InProgressError at once.
   */
  waitMs?: number;
  /** The action's time limit: past it, the entry is completed UNKNOWN and ActionTimeoutError thrown. */
  timeoutMs?: number;
  /** How results are stored: JSON by default. */
  codec?: Codec<T>;
  /** Deadline of each ledger call (not of the action). */
  deadlineMs?: number;
}

export interface RunOnceResult<T> {
  value: T;
  /** True when the stored result of an earlier call was returned and nothing was executed. */
  replayed: boolean;
  /** With a replay: the server's note for the model ("already performed … no new action"). */
  note: string;
  entry: LedgerEntry;
}

function baseUrlOf(address: string, tls: boolean): string {
  if (/^https?:\/\//i.test(address)) return address.replace(/\/+$/, "");
  return `${tls ? "https" : "http"}://${address}`;
}

const TRANSIENT_COMPLETE_RETRIES = [100, 300, 900];

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
      const baseUrl = baseUrlOf(options.address, tlsOpts !== undefined);
      const secure = baseUrl.startsWith("https:");
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

  /** Hands out unresolved entries and applies what the tools' reads found for earlier ones. */
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
   * - CLAIMED: runs the action and completes the entry with its result; returns
   *   `{ value, replayed: false }`. If the action throws NotExecutedError the entry is completed
   *   FAILED retryable, PermanentFailureError FAILED for good; on a timeout (`timeoutMs`) or any
   *   other error it is completed UNKNOWN (to be reconciled). The error is re-thrown.
   * - REPLAYED: returns the stored result, `{ value, replayed: true, note }`; nothing runs.
   * - IN_PROGRESS: waits up to `waitMs` for the other attempt, then throws InProgressError.
   * - PREVIOUSLY_FAILED: throws PreviouslyFailedError with the stored error.
   */
  async runOnce<T = unknown>(
    runId: string,
    tool: string,
    args: ArgumentsInput,
    action: (ctx: ActionContext) => T | Promise<T>,
    options: RunOnceOptions<T> = {},
  ): Promise<RunOnceResult<T>> {
    const codec = options.codec ?? (jsonCodec as Codec<T>);
    const callOpts: CallOptions = { deadlineMs: options.deadlineMs };
    const claimed = await this.claim(
      {
        runId,
        tool,
        args,
        key: options.key,
        canonicalization: options.canonicalization,
        leaseMs: options.leaseMs,
        retentionMs: options.retentionMs,
        waitMs: options.waitMs,
        principal: options.principal,
      },
      options.deadlineMs === undefined
        ? undefined
        : { deadlineMs: options.deadlineMs + (options.waitMs ?? 0) },
    );
    const { entry } = claimed;
    switch (claimed.outcome) {
      case "REPLAYED":
        return { value: codec.decode(entry.result), replayed: true, note: claimed.note, entry };
      case "IN_PROGRESS":
        throw new InProgressError(claimed.note, claimed.retryAfter ?? 1000, entry);
      case "PREVIOUSLY_FAILED":
        throw new PreviouslyFailedError(claimed.note, entry.error, entry);
      case "CLAIMED":
        break;
      default:
        throw new Error(`the ledger answered an unexpected outcome ${claimed.outcome}`);
    }

    const finish = (p: Omit<CompleteParams, "key" | "claimToken">) =>
      this.completeWithRetry({ key: entry.key, claimToken: claimed.claimToken, ...p }, callOpts);

    const controller = new AbortController();
    const ctx: ActionContext = {
      runId,
      tool,
      key: entry.key,
      externalRef: entry.externalRef,
      attempt: entry.attempt,
      signal: controller.signal,
      entry,
    };
    let value: T;
    try {
      value = await withTimeout(() => action(ctx), options.timeoutMs, controller);
    } catch (err) {
      let completion: Omit<CompleteParams, "key" | "claimToken">;
      if (err instanceof NotExecutedError) {
        completion = { status: "FAILED", retryable: true, error: describe(err) };
      } else if (err instanceof PermanentFailureError) {
        completion = { status: "FAILED", retryable: false, error: describe(err) };
      } else {
        completion = { status: "UNKNOWN", error: describe(err) };
      }
      try {
        await finish(completion);
      } catch (ledgerErr) {
        // The entry stays as claimed and reads UNKNOWN once its lease ends: reconciled later.
        // The ledger's error is thrown (the caller must learn the outcome was not recorded),
        // carrying the action's error.
        if (ledgerErr instanceof LedgerError) ledgerErr.actionError = err;
        throw ledgerErr;
      }
      throw err;
    }

    let result: Uint8Array;
    try {
      result = codec.encode(value);
    } catch (err) {
      // The effect happened but its result cannot be stored: say so, and let reconciliation decide.
      await finish({ status: "UNKNOWN", error: `the result could not be encoded: ${describe(err)}` });
      throw err;
    }
    let done: CompleteResult;
    try {
      done = await finish({ status: "SUCCEEDED", result });
    } catch (err) {
      if (err instanceof InvalidArgumentError) {
        // The ledger refused the result (RESULT_TOO_LARGE): the effect happened but cannot be
        // replayed, so record that the outcome is unknown rather than leave the claim hanging.
        await finish({ status: "UNKNOWN", error: `the result was refused: ${err.message}` }).catch(
          () => {},
        );
      }
      throw err;
    }
    return { value, replayed: false, note: "", entry: done.entry };
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

function describe(err: unknown): string {
  if (err instanceof Error) return `${err.name}: ${err.message}`;
  return String(err);
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
      const err = new ActionTimeoutError(timeoutMs);
      controller.abort(err);
      reject(err);
    }, timeoutMs);
  });
  try {
    return await Promise.race([Promise.resolve().then(run), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
