// A person in the loop. Runs without a model key: each framework's model is offline (its own
// test model, or a scripted Model), and nothing leaves the machine but the calls to the ledger.
//
// Refunds over 100 wait for a person's decision (the server's approval policy,
// `*  issue_refund  /amount  >  100`), in each framework's own approval step, with the ledger as
// the authority. The model asks for two refunds in one step, so every loop below handles any
// number of gated calls. The lines you write are between the "you write" comments: the tool, the
// app's approve/deny buttons (with an approver's token: the tokens file's third column), and the
// resume. Where the person decides:
//
//   - in the app (DECIDED_IN=app, the default): its buttons record each decision in the ledger
//     (Decide), then resume the run in the framework;
//   - elsewhere (DECIDED_IN=console): in the console or with the CLI (`idempotency-ledger approve
//     KEY --fingerprint HEX`), which this program plays with a Decide of its own; the app still
//     resumes the run in the framework's own state, answering every gated call "approved", since
//     the ledger holds the decision and each tool asks it.
//
// Denied or approved, the app answers the framework "approved": the call goes back to its tool,
// which asks the ledger, so a denial reaches the model in the ledger's words, with the person's
// reason, and nothing acts.
//
//   LEDGER_ADDRESS=127.0.0.1:50051 LEDGER_TOKEN=<agent token> APPROVER_TOKEN=<approver token> \
//     [DECISION=approve|deny] [DECIDED_IN=app|console] node dist/examples/approvals.js
//
// In your code the imports are "idempotency-ledger" and "idempotency-ledger/<framework>".

import { randomUUID } from "node:crypto";
import { pathToFileURL } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import {
  Agent,
  RunState,
  Usage,
  run,
  setTracingDisabled,
  tool as agentsTool,
  type AgentInputItem,
  type AgentOutputItem,
  type Model,
  type ModelRequest,
  type ModelResponse,
} from "@openai/agents";
import { generateText, stepCountIs, tool as aiTool, type ModelMessage } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";
import { approvalMessage, decideApprovals, ledgerTool as aiSdkLedgerTool } from "../src/adapters/ai-sdk.js";
import { RUN_ID_META_KEY, registerLedgerTool } from "../src/adapters/mcp.js";
import { decideInterruption, ledgerTool as agentsLedgerTool } from "../src/adapters/openai-agents.js";
import { Ledger } from "../src/index.js";

/** One refund the model asks for. */
export interface Refund {
  order: string;
  amount: number;
}

/** A person's decision about one refund (the app shows them its arguments). */
export type Decide = (refund: Refund) => { decision: "approve" | "deny"; reason: string };

/** Where the person decides: the app's buttons, or the console / the CLI. */
export type DecidedIn = "app" | "console";

/** What one framework's turn came to: the refunds made, and what the model read of each call. */
export interface ApprovalOutcome {
  refunds: string[];
  /** What the model read of the refund calls after the person decided, one text per call. */
  read: string[];
}

/** The two refunds the model asks for in one step. */
export const REFUNDS: Refund[] = [
  { order: "o-1", amount: 250 },
  { order: "o-2", amount: 400 },
];

/** The payments API of the example. */
function refundOrder(refunds: string[], order: string, amount: number) {
  refunds.push(`${order}:${amount}`);
  return { refund_id: `rf-${order}` };
}

/**
 * The console or the CLI, played: a person decides each call of the run awaiting a decision,
 * shown its arguments as the ledger stored them.
 */
async function decideInConsole(approver: Ledger, runId: string, decide: Decide): Promise<void> {
  for await (const entry of approver.listEntries({ runId, status: "AWAITING_APPROVAL" })) {
    const { decision, reason } = decide(JSON.parse(entry.argumentsJson) as Refund);
    await approver.decide(entry.key, entry.fingerprint, decision, reason);
  }
}

// --- OpenAI Agents JS ---------------------------------------------------------------------------

/** An offline Model: it asks for both refunds at once, then answers with text. */
class RefundsModel implements Model {
  readonly requests: ModelRequest[] = [];
  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.requests.push(request);
    const output: AgentOutputItem[] =
      this.requests.length === 1
        ? REFUNDS.map((r) => ({
            type: "function_call" as const,
            callId: `call-${randomUUID()}`,
            name: "issue_refund",
            arguments: JSON.stringify(r),
            status: "completed" as const,
          }))
        : [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "Done." }] }];
    return { usage: new Usage(), output, responseId: `resp-${this.requests.length}` };
  }
  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the example's model does not stream");
  }
  toolOutputs(): string[] {
    const input = this.requests.at(-1)!.input as AgentInputItem[];
    return input.filter((i) => i.type === "function_call_result").map((i) => (i as { output: { text: string } }).output.text);
  }
}

export async function openAiAgentsApproval(
  ledger: Ledger,
  approver: Ledger,
  runId: string,
  decide: Decide,
  decidedIn: DecidedIn = "app",
): Promise<ApprovalOutcome> {
  setTracingDisabled(true);
  const refunds: string[] = [];
  const model = new RefundsModel();
  // --- you write: the tool (needsApproval asks the ledger; the server's policy gates refunds over 100)
  const issueRefund = agentsTool(
    agentsLedgerTool(ledger, {
      name: "issue_refund",
      description: "Refund an order.",
      parameters: z.object({ order: z.string(), amount: z.number() }),
      execute: async ({ order, amount }) => refundOrder(refunds, order, amount),
    }),
  );
  const agent = new Agent({ name: "support", instructions: "Refund what the customer asks.", model, tools: [issueRefund] });
  const paused = await run(agent, "Refund orders o-1 and o-2.", { context: { runId } });
  const saved = paused.state.toString(); // the paused run, kept wherever you keep it
  // --- end
  if (decidedIn === "console") await decideInConsole(approver, runId, decide);
  // --- you write: the resume, once people decided; one interruption per gated call, any number
  const state = await RunState.fromString(agent, saved);
  for (const interruption of state.getInterruptions()) {
    if (decidedIn === "app") {
      // The app's button: Decide with the person's token, then state.approve(interruption).
      const { decision, reason } = decide(JSON.parse(interruption.arguments ?? "{}") as Refund);
      await decideInterruption(approver, state, interruption, decision, reason);
    } else {
      // Decided in the console or the CLI: approve in the RunState only, for a denial too.
      state.approve(interruption);
    }
  }
  await run(agent, state); // each tool asks the ledger: approved, it acts once; denied, the model reads why
  // --- end
  return { refunds, read: model.toolOutputs() };
}

// --- Vercel AI SDK 6 ----------------------------------------------------------------------------

const USAGE = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};

export async function aiSdkApproval(
  ledger: Ledger,
  approver: Ledger,
  runId: string,
  decide: Decide,
  decidedIn: DecidedIn = "app",
): Promise<ApprovalOutcome> {
  const refunds: string[] = [];
  const model = new MockLanguageModelV3({
    doGenerate: [
      {
        content: REFUNDS.map((r) => ({
          type: "tool-call" as const,
          toolCallId: `call-${randomUUID()}`,
          toolName: "issue_refund",
          input: JSON.stringify(r),
        })),
        finishReason: { unified: "tool-calls", raw: "tool_calls" },
        usage: USAGE,
        warnings: [],
      },
      { content: [{ type: "text", text: "Done." }], finishReason: { unified: "stop", raw: "stop" }, usage: USAGE, warnings: [] },
    ],
  });
  // --- you write: the tool (its needsApproval asks the ledger)
  const tools = {
    issue_refund: aiSdkLedgerTool(
      ledger,
      aiTool({
        description: "Refund an order.",
        inputSchema: z.object({ order: z.string(), amount: z.number() }),
        execute: async ({ order, amount }) => refundOrder(refunds, order, amount),
      }),
      { name: "issue_refund" },
    ),
  };
  const messages: ModelMessage[] = [{ role: "user", content: "Refund orders o-1 and o-2." }];
  const first = await generateText({ model, tools, messages, experimental_context: { runId }, stopWhen: stepCountIs(5) });
  messages.push(...first.response.messages);
  // --- end
  if (decidedIn === "console") await decideInConsole(approver, runId, decide);
  // --- you write: the resume, once people decided: ONE tool message answering every request of the step
  if (decidedIn === "app") {
    // The app's buttons: Decide each request with the person's token.
    const { message } = await decideApprovals(approver, first.content, (request) => decide(request.toolCall.input as Refund), { runId });
    messages.push(message);
  } else {
    // Decided in the console or the CLI: every call handed back "approved", for a denial too.
    messages.push(approvalMessage(first.content));
  }
  await generateText({ model, tools, messages, experimental_context: { runId }, stopWhen: stepCountIs(5) });
  // --- end
  const prompt = model.doGenerateCalls.at(-1)!.prompt as Array<{ role: string; content: Array<{ type: string; output?: { value?: string } }> }>;
  const read = prompt.filter((m) => m.role === "tool").flatMap((m) => m.content.map((c) => c.output?.value ?? "")).filter(Boolean);
  return { refunds, read };
}

// --- MCP ----------------------------------------------------------------------------------------

export async function mcpApproval(
  ledger: Ledger,
  approver: Ledger,
  runId: string,
  decide: Decide,
  decidedIn: DecidedIn = "app",
): Promise<ApprovalOutcome & { first: string[] }> {
  const refunds: string[] = [];
  const server = new McpServer({ name: "payments", version: "1.0.0" });
  // --- you write: the tool (a gated call answers the ledger's awaiting note; MCP has no approval step)
  registerLedgerTool(
    server,
    ledger,
    "issue_refund",
    { description: "Refund an order.", inputSchema: { order: z.string(), amount: z.number() } },
    async ({ order, amount }) => ({ content: [{ type: "text", text: JSON.stringify(refundOrder(refunds, order, amount)) }] }),
  );
  // --- end
  const watching = new AbortController();
  let decided: Promise<unknown> = Promise.resolve();
  if (decidedIn === "app") {
    // --- you write: where people decide: new requests as they happen (post them to a chat), and the buttons
    decided = (async () => {
      let left = REFUNDS.length;
      for await (const event of approver.watchApprovals({}, { signal: watching.signal })) {
        if (event.kind !== "requested" || event.entry.runId !== runId) continue;
        // … shown to a person with event.entry.argumentsJson; their button:
        const { decision, reason } = decide(JSON.parse(event.entry.argumentsJson) as Refund);
        await approver.decide(event.entry.key, event.entry.fingerprint, decision, reason);
        if (--left === 0) return event.cursor; // keep it: watchApprovals({ cursor }) resumes after it
      }
    })();
    // --- end
    await new Promise((r) => setTimeout(r, 200)); // the watch is open (an empty cursor starts from now)
  }
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  const client = new Client({ name: "agent-host", version: "1.0.0" });
  await Promise.all([server.connect(serverSide), client.connect(clientSide)]);
  // The host forwards the model's calls, both at once.
  const calls = () =>
    Promise.all(
      REFUNDS.map(async (args) => {
        const out = (await client.callTool({ name: "issue_refund", arguments: { ...args }, _meta: { [RUN_ID_META_KEY]: runId } })) as CallToolResult;
        return out.content.map((c) => (c.type === "text" ? c.text : "")).join("\n");
      }),
    );
  try {
    const first = await calls(); // the model reads: a person has been asked
    if (decidedIn === "console") await decideInConsole(approver, runId, decide);
    await decided;
    const read = await calls(); // after the decisions, the same calls: each refund once, or the denial
    return { refunds, read, first };
  } finally {
    watching.abort();
    await client.close();
  }
}

export async function main(): Promise<void> {
  const address = process.env.LEDGER_ADDRESS ?? "127.0.0.1:50051";
  const ledger = new Ledger({ address, token: process.env.LEDGER_TOKEN || undefined });
  const approver = new Ledger({ address, token: process.env.APPROVER_TOKEN || undefined });
  const decision = process.env.DECISION === "deny" ? "deny" : "approve";
  const reason = process.env.REASON ?? (decision === "deny" ? "the order was not returned" : "checked the order");
  const decidedIn: DecidedIn = process.env.DECIDED_IN === "console" ? "console" : "app";
  try {
    for (const [name, play] of [
      ["openai-agents", openAiAgentsApproval],
      ["ai-sdk", aiSdkApproval],
      ["mcp", mcpApproval],
    ] as const) {
      const runId = `${process.env.RUN_ID ?? "approvals"}-${name}-${randomUUID().slice(0, 8)}`;
      const { refunds, read } = await play(ledger, approver, runId, () => ({ decision, reason }), decidedIn);
      console.log(`${name}: ${decision} -> ${refunds.length} refund(s); the model read: ${read.join(" | ")}`);
    }
  } finally {
    ledger.close();
    approver.close();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exitCode = 1;
  });
}
