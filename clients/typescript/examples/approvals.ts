// A person in the loop: a refund over 100 waits for a person's decision (the server's approval
// policy, `*  issue_refund  /amount  >  100`), in each framework's own approval step, with the
// ledger as the authority. The lines you write are between the "you write" comments: the tool,
// the app's approve/deny button (with an approver's token: the tokens file's third column), and
// the resume. The models are offline (no API key, no network).
//
//   LEDGER_ADDRESS=127.0.0.1:50051 LEDGER_TOKEN=<agent token> APPROVER_TOKEN=<approver token> \
//     [DECISION=approve|deny] node dist/examples/approvals.js
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
import { decideApproval, ledgerTool as aiSdkLedgerTool, type AiSdkApprovalRequest } from "../src/adapters/ai-sdk.js";
import { RUN_ID_META_KEY, registerLedgerTool } from "../src/adapters/mcp.js";
import { decideInterruption, ledgerTool as agentsLedgerTool } from "../src/adapters/openai-agents.js";
import { Ledger } from "../src/index.js";

/** The refunds the payments API made: one per effect. */
export type Refunds = string[];

/** What one framework's turn came to: the refunds made, and what the model read. */
export interface ApprovalOutcome {
  refunds: Refunds;
  /** What the model read of the refund call after the person decided. */
  read: string;
}

const ORDER = { order: "o-1", amount: 250 };

/** The payments API of the example. */
function refundOrder(refunds: Refunds, order: string, amount: number) {
  refunds.push(`${order}:${amount}`);
  return { refund_id: `rf-${order}` };
}

// --- OpenAI Agents JS ---------------------------------------------------------------------------

/** An offline Model: it calls issue_refund once, then answers with text. */
class OneCallModel implements Model {
  readonly requests: ModelRequest[] = [];
  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.requests.push(request);
    const output: AgentOutputItem[] =
      this.requests.length === 1
        ? [{ type: "function_call", callId: `call-${randomUUID()}`, name: "issue_refund", arguments: JSON.stringify(ORDER), status: "completed" }]
        : [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "Done." }] }];
    return { usage: new Usage(), output, responseId: `resp-${this.requests.length}` };
  }
  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the example's model does not stream");
  }
  lastToolOutput(): string {
    const input = this.requests.at(-1)!.input as AgentInputItem[];
    const out = input.filter((i) => i.type === "function_call_result").at(-1) as { output: { text: string } } | undefined;
    return out?.output.text ?? "";
  }
}

export async function openAiAgentsApproval(
  ledger: Ledger,
  approver: Ledger,
  runId: string,
  decision: "approve" | "deny",
  reason: string,
): Promise<ApprovalOutcome> {
  setTracingDisabled(true);
  const refunds: Refunds = [];
  const model = new OneCallModel();
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
  const paused = await run(agent, "Refund order o-1.", { context: { runId } });
  const saved = paused.state.toString(); // the paused run, kept wherever you keep it
  // --- you write: the app's approve / deny button, with the person's approver token
  const state = await RunState.fromString(agent, saved);
  for (const interruption of state.getInterruptions()) {
    await decideInterruption(approver, state, interruption, decision, reason);
  }
  // --- you write: the resume
  await run(agent, state);
  // --- end
  return { refunds, read: model.lastToolOutput() };
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
  decision: "approve" | "deny",
  reason: string,
): Promise<ApprovalOutcome> {
  const refunds: Refunds = [];
  const model = new MockLanguageModelV3({
    doGenerate: [
      {
        content: [{ type: "tool-call", toolCallId: `call-${randomUUID()}`, toolName: "issue_refund", input: JSON.stringify(ORDER) }],
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
  const messages: ModelMessage[] = [{ role: "user", content: "Refund order o-1." }];
  const first = await generateText({ model, tools, messages, experimental_context: { runId }, stopWhen: stepCountIs(5) });
  messages.push(...first.response.messages);
  // --- you write: the app's approve / deny button, with the person's approver token
  for (const part of first.content) {
    if (part.type !== "tool-approval-request") continue;
    const { response } = await decideApproval(approver, part as AiSdkApprovalRequest, decision, reason, { runId });
    messages.push({ role: "tool", content: [response] });
  }
  // --- you write: the resume
  await generateText({ model, tools, messages, experimental_context: { runId }, stopWhen: stepCountIs(5) });
  // --- end
  const prompt = model.doGenerateCalls.at(-1)!.prompt as Array<{ role: string; content: Array<{ type: string; output?: { value?: string } }> }>;
  const read = prompt.filter((m) => m.role === "tool").flatMap((m) => m.content.map((c) => c.output?.value ?? "")).filter(Boolean).at(-1) ?? "";
  return { refunds, read };
}

// --- MCP ----------------------------------------------------------------------------------------

export async function mcpApproval(
  ledger: Ledger,
  approver: Ledger,
  runId: string,
  decision: "approve" | "deny",
  reason: string,
): Promise<ApprovalOutcome & { first: string }> {
  const refunds: Refunds = [];
  const server = new McpServer({ name: "payments", version: "1.0.0" });
  // --- you write: the tool (a gated call answers the ledger's awaiting note; MCP has no approval step)
  registerLedgerTool(
    server,
    ledger,
    "issue_refund",
    { description: "Refund an order.", inputSchema: { order: z.string(), amount: z.number() } },
    async ({ order, amount }) => ({ content: [{ type: "text", text: JSON.stringify(refundOrder(refunds, order, amount)) }] }),
  );
  // --- you write: where people decide: new requests as they happen (post them to a chat), and the button
  const watching = new AbortController();
  const decided = (async () => {
    for await (const event of approver.watchApprovals({}, { signal: watching.signal })) {
      if (event.kind !== "requested" || event.entry.runId !== runId) continue;
      // … shown to a person with event.entry.argumentsJson; their button:
      await approver.decide(event.entry.key, event.entry.fingerprint, decision, reason);
      return event.cursor; // keep it: watchApprovals({ cursor }) resumes after it
    }
  })();
  // --- end
  await new Promise((r) => setTimeout(r, 200)); // the watch is open (an empty cursor starts from now)
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  const client = new Client({ name: "agent-host", version: "1.0.0" });
  await Promise.all([server.connect(serverSide), client.connect(clientSide)]);
  const call = async () => {
    const out = (await client.callTool({ name: "issue_refund", arguments: ORDER, _meta: { [RUN_ID_META_KEY]: runId } })) as CallToolResult;
    return out.content.map((c) => (c.type === "text" ? c.text : "")).join("\n");
  };
  try {
    const first = await call(); // the model reads: a person has been asked
    await decided;
    const read = await call(); // after the decision: the refund once, or the denial
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
  try {
    for (const [name, play] of [
      ["openai-agents", openAiAgentsApproval],
      ["ai-sdk", aiSdkApproval],
      ["mcp", mcpApproval],
    ] as const) {
      const runId = `${process.env.RUN_ID ?? "approvals"}-${name}-${randomUUID().slice(0, 8)}`;
      const { refunds, read } = await play(ledger, approver, runId, decision, reason);
      console.log(`${name}: ${decision} -> ${refunds.length} refund(s); the model read: ${read}`);
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
