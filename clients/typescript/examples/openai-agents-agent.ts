// Runs without a model key: the model is an offline Model implementation (no OpenAI call, tracing
// off), and nothing leaves the machine but the calls to the ledger.
//
// An agent on the OpenAI Agents JS SDK whose side-effecting tools go through the ledger: the
// ledger wraps each tool's definition with its paired read from examples/paired-reads.ts
// (`tool(ledgerTool(ledger, { name, parameters, execute }, { confirm }))`) and the run id is in
// the run context (`run(agent, input, { context: { runId } })`). The model is an offline Model
// implementation playing examples/script.ts (no API key, no network; tracing off); the payments
// API and the mailbox are examples/world.ts.
//
//   LEDGER_ADDRESS=127.0.0.1:50051 [LEDGER_TOKEN=…] [RUN_ID=run-7f3a] [WORLD_FILE=world.json] \
//     node dist/examples/openai-agents-agent.js
//
// In your code the imports are "idempotency-ledger" and "idempotency-ledger/openai-agents".

import { pathToFileURL } from "node:url";
import {
  Agent,
  Usage,
  run,
  setTracingDisabled,
  tool,
  type AgentOutputItem,
  type Model,
  type ModelRequest,
  type ModelResponse,
} from "@openai/agents";
import { z } from "zod";
import { ledgerTool } from "../src/adapters/openai-agents.js";
import { Ledger, NotExecutedError, currentAttempt } from "../src/index.js";
import { confirmCredit, confirmReply } from "./paired-reads.js";
import { FINAL_TEXT, PROMPT, STEPS, runIdFromEnv } from "./script.js";
import { World } from "./world.js";

/** The agent's write tools, each wrapped by the ledger with its paired read. */
export function supportTools(ledger: Ledger, world: World) {
  return [
    tool(
      ledgerTool(ledger, {
        name: "issue_credit",
        description: "Issue a credit to a customer's account.",
        parameters: z.object({ customer: z.string(), amount: z.number(), currency: z.string() }),
        execute: async ({ customer, amount, currency }) => {
          // Refused before any effect: the intent stays retryable.
          if (amount <= 0) throw new NotExecutedError(`amount must be positive, got ${amount}`);
          // The attempt's externalRef is the payments API's idempotency reference.
          const credit = world.issueCredit({ customer, amount, currency }, currentAttempt()!.externalRef);
          return { credit_id: credit.credit_id };
        },
      }, { confirm: confirmCredit(world) }),
    ),
    tool(
      ledgerTool(ledger, {
        name: "send_reply",
        description: "Reply to the customer on a support ticket.",
        parameters: z.object({ ticket: z.string(), body: z.string() }),
        execute: async ({ ticket, body }) => {
          const reply = world.sendReply({ ticket, body }, currentAttempt()!.externalRef);
          return { message_id: reply.message_id };
        },
      }, { confirm: confirmReply(world) }),
    ),
  ];
}

/** An offline Model: each turn answers with the next step of examples/script.ts. */
export class ScriptedModel implements Model {
  private turn = 0;
  private calls = 0;

  async getResponse(_request: ModelRequest): Promise<ModelResponse> {
    const step = STEPS[this.turn++];
    const output: AgentOutputItem[] = step
      ? step.map((c) => ({
          type: "function_call",
          callId: `call-${++this.calls}`,
          name: c.name,
          arguments: c.arguments,
          status: "completed",
        }))
      : [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: FINAL_TEXT }] }];
    return { usage: new Usage(), output, responseId: `resp-${this.turn}` };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the scripted model does not stream");
  }
}

/** Plays the turn in run `runId`; returns [tool, input, what the model read] for each call, and the answer. */
export async function runAgent(ledger: Ledger, world: World, runId: string) {
  setTracingDisabled(true);
  const agent = new Agent({
    name: "support",
    instructions: "You are a support agent. Use the tools to fix the customer's problem.",
    model: new ScriptedModel(),
    tools: supportTools(ledger, world),
  });
  const result = await run(agent, PROMPT, { context: { runId } });
  const calls = result.newItems
    .filter((item) => item.type === "tool_call_output_item")
    .map((item) => {
      const raw = item.rawItem as { name: string; callId: string; output: { text: string } };
      const call = result.newItems.find(
        (i) => i.type === "tool_call_item" && (i.rawItem as { callId?: string }).callId === raw.callId,
      );
      return { tool: raw.name, input: (call?.rawItem as { arguments: string }).arguments, read: raw.output.text };
    });
  return { calls, text: String(result.finalOutput) };
}

export async function main(): Promise<void> {
  const ledger = new Ledger({
    address: process.env.LEDGER_ADDRESS ?? "127.0.0.1:50051",
    token: process.env.LEDGER_TOKEN || undefined,
  });
  const world = new World();
  const runId = runIdFromEnv();
  try {
    const { calls, text } = await runAgent(ledger, world, runId);
    for (const c of calls) console.log(`${c.tool} ${c.input}\n  -> ${c.read}`);
    console.log(`model: ${text}`);
    console.log(`world: ${world.credits().length} credit(s), ${world.replies().length} reply(ies) (run ${runId})`);
  } finally {
    ledger.close();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exitCode = 1;
  });
}
