// Runs without a model key: the model is the AI SDK's offline test model, and nothing leaves the
// machine but the calls to the ledger.
//
// An agent on the Vercel AI SDK whose side-effecting tools go through the ledger: the ledger
// wraps each tool (`ledgerTool(ledger, tool({ … }), { name, confirm })`, with its paired read
// from examples/paired-reads.ts) and the run id is in `experimental_context`. A Reconciler runs
// beside the agent for the unknown outcomes nobody repeats. The model is the SDK's own offline
// test model (MockLanguageModelV3 from "ai/test") playing examples/script.ts; the payments API
// and the mailbox are examples/world.ts.
//
//   LEDGER_ADDRESS=127.0.0.1:50051 [LEDGER_TOKEN=…] [RUN_ID=run-7f3a] [WORLD_FILE=world.json] \
//     node dist/examples/ai-sdk-agent.js
//
// In your code the imports are "idempotency-ledger" and "idempotency-ledger/ai-sdk".

import { pathToFileURL } from "node:url";
import { generateText, stepCountIs, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";
import { ledgerTool } from "../src/adapters/ai-sdk.js";
import { Ledger, NotExecutedError, Reconciler, currentAttempt, type ToolCallResult } from "../src/index.js";
import { confirmCredit, confirmReply } from "./paired-reads.js";
import { FINAL_TEXT, PROMPT, STEPS, runIdFromEnv } from "./script.js";
import { World } from "./world.js";

/** The agent's write tools, each wrapped by the ledger with its paired read. */
export function supportTools(ledger: Ledger, world: World) {
  return {
    issue_credit: ledgerTool(
      ledger,
      tool({
        description: "Issue a credit to a customer's account.",
        inputSchema: z.object({ customer: z.string(), amount: z.number(), currency: z.string() }),
        execute: async ({ customer, amount, currency }) => {
          // Refused before any effect: the intent stays retryable.
          if (amount <= 0) throw new NotExecutedError(`amount must be positive, got ${amount}`);
          // The attempt's externalRef is the payments API's idempotency reference.
          const credit = world.issueCredit({ customer, amount, currency }, currentAttempt()!.externalRef);
          return { credit_id: credit.credit_id };
        },
      }),
      { name: "issue_credit", confirm: confirmCredit(world) },
    ),
    send_reply: ledgerTool(
      ledger,
      tool({
        description: "Reply to the customer on a support ticket.",
        inputSchema: z.object({ ticket: z.string(), body: z.string() }),
        execute: async ({ ticket, body }) => {
          const reply = world.sendReply({ ticket, body }, currentAttempt()!.externalRef);
          return { message_id: reply.message_id };
        },
      }),
      { name: "send_reply", confirm: confirmReply(world) },
    ),
  };
}

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 10, text: 10, reasoning: undefined },
};

/** The offline model: each step of examples/script.ts, then the closing text. */
export function scriptedModel(): MockLanguageModelV3 {
  let id = 0;
  return new MockLanguageModelV3({
    doGenerate: [
      ...STEPS.map((calls) => ({
        content: calls.map((c) => ({
          type: "tool-call" as const,
          toolCallId: `call-${++id}`,
          toolName: c.name,
          input: c.arguments,
        })),
        finishReason: { unified: "tool-calls" as const, raw: "tool_calls" },
        usage,
        warnings: [],
      })),
      { content: [{ type: "text" as const, text: FINAL_TEXT }], finishReason: { unified: "stop" as const, raw: "stop" }, usage, warnings: [] },
    ],
  });
}

/** Plays the turn in run `runId`; returns [tool, input, what the model read] for each call, and the answer. */
export async function runAgent(ledger: Ledger, world: World, runId: string, tools = supportTools(ledger, world)) {
  const result = await generateText({
    model: scriptedModel(),
    tools,
    system: "You are a support agent. Use the tools to fix the customer's problem.",
    prompt: PROMPT,
    stopWhen: stepCountIs(STEPS.length + 1),
    experimental_context: { runId },
  });
  const calls = result.steps.flatMap((step) =>
    step.toolResults.map((r) => ({
      tool: r.toolName,
      input: JSON.stringify(r.input),
      read: (r.output as ToolCallResult).toModelText(),
    })),
  );
  return { calls, text: result.text };
}

export async function main(): Promise<void> {
  const ledger = new Ledger({
    address: process.env.LEDGER_ADDRESS ?? "127.0.0.1:50051",
    token: process.env.LEDGER_TOKEN || undefined,
  });
  const world = new World();
  const runId = runIdFromEnv();
  const tools = supportTools(ledger, world);
  // Beside the agent: settles the unknown outcomes of these tools nobody repeats.
  const reconciler = new Reconciler(ledger, tools).start();
  try {
    const { calls, text } = await runAgent(ledger, world, runId, tools);
    for (const c of calls) console.log(`${c.tool} ${c.input}\n  -> ${c.read}`);
    console.log(`model: ${text}`);
    console.log(`world: ${world.credits().length} credit(s), ${world.replies().length} reply(ies) (run ${runId})`);
  } finally {
    await reconciler.stop();
    ledger.close();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exitCode = 1;
  });
}
