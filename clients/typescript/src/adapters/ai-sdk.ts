// The Vercel AI SDK adapter (`import { ledgerTool } from "idempotency-ledger/ai-sdk"`): the ledger
// wraps the SDK's own tool, `ledgerTool(ledger, tool({ inputSchema, execute }), { name, confirm })`,
// so that each call of it goes through the ledger. The run is read from the
// `experimental_context` given to generateText/streamText (`{ runId }`), or from the `runId`
// option. Only types are imported from "ai" (an optional peer dependency, 5 or 6): the wrapped
// tool is the same object, with its execute, onInputAvailable, toModelOutput and needsApproval
// replaced. Approvals (AI SDK 6): needsApproval asks the ledger, so a gated call ends the step
// with a tool-approval-request; decideApprovals is the app's buttons for every request of a step
// (Decide with an approver's credential, and the one tool message answering them all, since the
// SDK reads only the last); the tool acts only on the ledger's CLAIMED, whatever the history says
// was approved.

import type { Tool, ToolCallOptions } from "ai";
import type { Confirm } from "../confirm.js";
import { deriveKey, fingerprint, type ArgumentsInput, type Canonicalization } from "../keys.js";
import type { Ledger } from "../ledger.js";
import { ToolCallResult, modelTextOf } from "../outcome.js";
import type { LedgerRpc } from "../rpc.js";
import { wrapTool, type WrapToolOptions } from "../tools.js";
import type { Decision, LedgerEntry } from "../types.js";

// ToolCallOptions is the name both majors export (6 also calls it ToolExecutionOptions).
type ToolExecutionOptions = ToolCallOptions;

/** Where the developer sets the run id, said in the log line and the exception. */
const RUN_ID_FIX =
  "pass experimental_context: { runId } to generateText or streamText, or the runId option of ledgerTool";

/** The options of ledgerTool: wrapTool's, with the tool's name and its paired read. */
export interface AiSdkToolOptions<INPUT, OUTPUT = unknown>
  extends Omit<
    WrapToolOptions<[INPUT, ToolExecutionOptions]>,
    "name" | "runId" | "signal" | "throwOnMissingRunId" | "confirm" | "requireApproval" | "callId"
  > {
  /**
   * The tool's name in the ledger: its key in the tools object you give generateText (AI SDK
   * tools have no name of their own). Required.
   */
  name: string;
  /**
   * The run: a string, or a function of the call. Default: `experimental_context.runId`
   * (`generateText({ …, experimental_context: { runId } })`).
   */
  runId?: string | ((input: INPUT, options: ToolExecutionOptions) => string | undefined);
  /**
   * The paired read: given the attempt (key, externalRef, arguments, attempt number), answers
   * found(result) with what execute would have returned, notFound, or cannotTell.
   */
  confirm?: Confirm<OUTPUT, INPUT>;
  /**
   * How long the run's finished entries are kept at least (ExtendRun) when a call pauses the
   * run for a person's decision (a tool-approval-request): unset, the server's default retention.
   */
  pauseRetentionMs?: number;
}

/** The AI SDK tool a wrapped one becomes: its output is the ToolCallResult. */
export type LedgerAiSdkTool<INPUT, OUTPUT> = Tool<INPUT, ToolCallResult<OUTPUT>>;

/** The default run id: `experimental_context.runId`, when the context is an object with one. */
export function runIdFromContext(_input: unknown, options: Pick<ToolExecutionOptions, "experimental_context">): string | undefined {
  const ctx = options?.experimental_context;
  if (ctx !== null && typeof ctx === "object" && typeof (ctx as { runId?: unknown }).runId === "string") {
    return (ctx as { runId: string }).runId;
  }
  return undefined;
}

/**
 * Wraps an AI SDK tool: `issue_credit: ledgerTool(ledger, tool({ … }), { name: "issue_credit",
 * confirm })`. Each call claims the key of (run, `name`, input) before execute runs; a repeat of
 * the same intent in the run gets the stored result with the ledger's replay note, and nothing
 * runs. The model reads `toModelText()` of the ToolCallResult (the tool's own `toModelOutput`
 * is replaced); the step's tool result is the ToolCallResult itself. An exception thrown by
 * execute after it started is an unknown outcome (settled with `confirm` if given), unless it is
 * NotExecutedError (itself or as its `cause`) or of a `notExecuted` class. A call without a run
 * id makes generateText/streamText throw MissingRunIdError before the tool runs (logged once).
 * Inside execute, `currentAttempt()` gives the attempt (its `externalRef` is the idempotency key
 * to pass downstream). The call's `abortSignal` aborted before execute starts leaves the intent
 * retryable.
 */
export function ledgerTool<INPUT, OUTPUT>(
  ledger: Ledger,
  tool: Tool<INPUT, OUTPUT>,
  options: AiSdkToolOptions<INPUT, OUTPUT>,
): LedgerAiSdkTool<INPUT, OUTPUT> {
  if (typeof tool === "string") {
    throw new TypeError(
      `ledgerTool(ledger, "${String(tool)}", tool): the name is an option now: ledgerTool(ledger, tool({ … }), { name: "${String(tool)}" })`,
    );
  }
  const name = options?.name;
  if (typeof name !== "string" || name === "") {
    throw new TypeError(
      "ledgerTool: options.name is required (the tool's key in the tools object): AI SDK tools have no name of " +
        "their own, and the ledger keys each call by it",
    );
  }
  if (typeof tool?.execute !== "function") {
    throw new TypeError(`ledgerTool(${name}): the tool has no execute function to wrap`);
  }
  const { runId = runIdFromContext, confirm, pauseRetentionMs, ...rest } = options;
  const runIdOf = (input: INPUT, callOptions: ToolExecutionOptions) =>
    typeof runId === "function" ? runId(input, callOptions) : runId;
  // The tool's own approval gate (AI SDK 6's needsApproval): it becomes the Claim's
  // requireApproval, and the ledger answers the SDK's question.
  const ownGate = (tool as { needsApproval?: boolean | ApprovalGate<INPUT> }).needsApproval;
  const gated = async (input: INPUT, gateOptions: GateOptions) =>
    typeof ownGate === "function" ? await ownGate(input, gateOptions) : (ownGate ?? false);
  const wrapped = wrapTool(
    ledger,
    tool as Tool<INPUT, OUTPUT> & { execute: (input: INPUT, options: ToolExecutionOptions) => unknown },
    {
      ...rest,
      confirm: confirm as Confirm<unknown> | undefined,
      name,
      runId: runIdOf as WrapToolOptions<[INPUT, ToolExecutionOptions]>["runId"],
      signal: (_input: INPUT, callOptions: ToolExecutionOptions) => callOptions?.abortSignal,
      // Asked again at the call itself: a call resumed with an approval the ledger never gave
      // (a client that sent both the request and the response) still asks for one, and only
      // the ledger's CLAIMED acts.
      requireApproval: (input: INPUT, callOptions: ToolExecutionOptions) =>
        gated(input, {
          toolCallId: callOptions?.toolCallId,
          messages: callOptions?.messages ?? [],
          experimental_context: callOptions?.experimental_context,
        }),
      callId: (_input: INPUT, callOptions: ToolExecutionOptions) => callOptions?.toolCallId,
      runIdHint: RUN_ID_FIX,
    },
  );
  // The SDK's approval step, with the ledger as its authority (AI SDK 6): true while the call's
  // entry awaits a person (the server's policy gated it, or the tool's own needsApproval asked),
  // so that generateText answers a tool-approval-request; and true again when the SDK asks on
  // the resume for a call the ledger has an approval for (approved, used or denied), so that it
  // hands the call to the tool, which asks the ledger: it acts only on CLAIMED.
  const needsApproval = async (input: INPUT, gateOptions: GateOptions): Promise<boolean> => {
    const run = runIdOf(input, gateOptions as unknown as ToolExecutionOptions);
    if (typeof run !== "string" || run === "") return false;
    const callOptions = gateOptions as unknown as ToolExecutionOptions;
    return ledger.needsApproval(run, name, (rest.arguments ? rest.arguments(input, callOptions) : input) as ArgumentsInput, {
      callId: gateOptions?.toolCallId,
      requireApproval: await gated(input, gateOptions),
      key: rest.key?.(input, callOptions),
      canonicalization: rest.canonicalization,
      principal: rest.principal,
      leaseMs: rest.leaseMs,
      retentionMs: rest.retentionMs,
      askedAgainOnResume: true,
      pauseRetentionMs,
      deadlineMs: rest.deadlineMs,
    });
  };
  // The SDK calls onInputAvailable before execute, and lets what it throws reach the caller of
  // generateText/streamText: the one place a missing run id can reach the developer.
  const own = tool.onInputAvailable;
  const onInputAvailable = async (event: Parameters<NonNullable<Tool<INPUT, OUTPUT>["onInputAvailable"]>>[0]) => {
    const run = runIdOf(event.input as INPUT, event as unknown as ToolExecutionOptions);
    if (typeof run !== "string" || run === "") throw ledger.missingRunId(name, RUN_ID_FIX);
    await own?.call(tool, event);
  };
  return Object.assign(wrapped, { toModelOutput, onInputAvailable, needsApproval }) as unknown as LedgerAiSdkTool<INPUT, OUTPUT>;
}

/** What the SDK gives needsApproval besides the input. */
interface GateOptions {
  toolCallId: string;
  messages: unknown[];
  experimental_context?: unknown;
}

/** The SDK's needsApproval: a boolean, or a function of the input and the call. */
type ApprovalGate<INPUT> = (input: INPUT, options: GateOptions) => boolean | PromiseLike<boolean>;

/** A tool-approval-request as generateText's `content` (and streamText's parts) carry it. */
export interface AiSdkApprovalRequest {
  type?: "tool-approval-request";
  approvalId: string;
  toolCall: { toolName: string; input: unknown; toolCallId?: string };
}

/** The tool-approval-response part to send back in a `tool` message. */
export interface AiSdkApprovalResponse {
  type: "tool-approval-response";
  approvalId: string;
  approved: boolean;
  reason?: string;
}

/** The options of decideApproval. */
export interface DecideApprovalOptions {
  /** The run, as the tool reads it (`experimental_context.runId`). Required. */
  runId: string;
  /** The tool's name in the ledger (default the request's toolName: its key in the tools object). */
  name?: string;
  /** As the tool's ledgerTool was given it. */
  canonicalization?: Canonicalization;
}

/**
 * The app's approve (or deny) button for a tool-approval-request of a ledger tool: records the
 * person's decision in the ledger with the approver's credential (`approver`: a Ledger made with
 * a token of the approver role), bound to the arguments the request shows (their fingerprint),
 * and returns the tool-approval-response to send back with the next generateText. The response
 * hands the call back to the tool (`approved: true` whatever the decision, `reason` the
 * person's), and the tool asks the ledger: after an approval it acts, once; after a denial the
 * model reads the ledger's note with the person's reason, and nothing acts. A response the
 * ledger never saw (a client that sends both the request and the response) lets nothing act:
 * the tool answers that a person has been asked. The responses to every request of a step go in
 * one tool message (decideApprovals makes it): the SDK reads only the last one.
 */
export async function decideApproval(
  approver: LedgerRpc,
  request: AiSdkApprovalRequest,
  decision: Decision | Lowercase<Decision>,
  reason: string,
  options: DecideApprovalOptions,
): Promise<{ response: AiSdkApprovalResponse; entry: LedgerEntry }> {
  const tool = options.name ?? request.toolCall.toolName;
  const args = request.toolCall.input as ArgumentsInput;
  const entry = await approver.decide(
    deriveKey(options.runId, tool, args, options.canonicalization),
    fingerprint(tool, args, options.canonicalization),
    decision,
    reason,
  );
  return { response: { type: "tool-approval-response", approvalId: request.approvalId, approved: true, reason }, entry };
}

/**
 * What the model reads of a wrapped tool's output. AI SDK 6 passes `{ toolCallId, input, output }`,
 * 5 passes the output itself; either may be a ToolCallResult or its JSON form (a chat UI that
 * stored the messages and sends them back).
 */
function toModelOutput(arg: unknown): { type: "text"; value: string } {
  const output =
    arg instanceof ToolCallResult || arg === null || typeof arg !== "object" || !("output" in arg)
      ? arg
      : (arg as { output: unknown }).output;
  return { type: "text", value: modelTextOf(output) };
}

/** A tool message that answers a step's approval requests (a ModelMessage of AI SDK 6). */
export interface AiSdkApprovalMessage {
  role: "tool";
  content: AiSdkApprovalResponse[];
}

/** A person's decision about one request, as decideApprovals asks it of the app. */
export interface AiSdkDecision {
  decision: Decision | Lowercase<Decision>;
  reason: string;
}

/** The tool-approval-request parts of a step's content (generateText's `content`, a step's, or the requests). */
export function approvalRequests(content: ReadonlyArray<{ type?: string }>): AiSdkApprovalRequest[] {
  return content.filter((part) => part.type === "tool-approval-request") as AiSdkApprovalRequest[];
}

/**
 * The approve and deny buttons for every tool-approval-request of a step at once (a model may ask
 * for several gated calls in one step): asks `decide` for the person's decision about each
 * request (shown `request.toolCall`: the tool's name and arguments), records each in the ledger
 * as decideApproval does, and returns ONE tool message answering them all, to push onto the
 * messages of the next generateText. The SDK reads the approval responses of the last tool
 * message only, and a call left without an answer stops the next call (MissingToolResultsError):
 * one message per response would lose all but the last. Each request must be a ledger tool's, the
 * tool's ledger name its key in the tools object. A Decide the ledger refuses (another decision
 * was taken elsewhere: AlreadyDecidedError) throws; the decisions recorded before it stand, and
 * the same decision again is a success, so the call may be made again.
 */
export async function decideApprovals(
  approver: LedgerRpc,
  content: ReadonlyArray<{ type?: string }>,
  decide: (request: AiSdkApprovalRequest) => AiSdkDecision | Promise<AiSdkDecision>,
  options: Omit<DecideApprovalOptions, "name">,
): Promise<{ message: AiSdkApprovalMessage; entries: LedgerEntry[] }> {
  const responses: AiSdkApprovalResponse[] = [];
  const entries: LedgerEntry[] = [];
  for (const request of approvalRequests(content)) {
    const { decision, reason } = await decide(request);
    const { response, entry } = await decideApproval(approver, request, decision, reason, options);
    responses.push(response);
    entries.push(entry);
  }
  return { message: { role: "tool", content: responses }, entries };
}

/**
 * The one tool message that hands every call of a step back to its tool when the person decided
 * elsewhere (the console, the CLI, another app): `approved: true` for each request, whatever the
 * decision, since the ledger holds it. Each tool asks the ledger: approved, it acts once; denied,
 * the model reads the ledger's note with the person's reason; still undecided, the model reads
 * that a person has been asked, and nothing acts.
 */
export function approvalMessage(content: ReadonlyArray<{ type?: string }>): AiSdkApprovalMessage {
  return {
    role: "tool",
    content: approvalRequests(content).map((request) => ({ type: "tool-approval-response", approvalId: request.approvalId, approved: true })),
  };
}
