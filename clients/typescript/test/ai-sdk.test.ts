// The Vercel AI SDK adapter against the real `ai` package, both majors the adapter supports
// (6 with MockLanguageModelV3, 5 with MockLanguageModelV2, each from its own "ai/test"), and the
// real server: generateText with the SDK's offline test model scripting tool calls step by step.
// The transcript checked is what the model was sent in its last step.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import * as ai6 from "ai";
import { MockLanguageModelV3 } from "ai/test";
import * as ai5 from "ai-v5";
import { MockLanguageModelV2 } from "ai-v5/test";
import { z } from "zod";
import { ledgerTool } from "../src/adapters/ai-sdk.js";
import { NotExecutedError, ToolCallResult, currentAttempt, type Ledger } from "../src/index.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

const REPLAY_NOTE = /already performed.*No new action was taken/;

/** A scripted model step: tool calls [name, input JSON as the model wrote it], or text. */
type Step = { calls: Array<[string, string]> } | { text: string };

/** What differs between the majors: the package, its mock model and its result shapes. */
interface Flavor {
  label: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  sdk: { generateText: (options: any) => Promise<any>; stepCountIs: (n: number) => unknown; tool: (t: any) => any };
  model(steps: Step[]): { doGenerateCalls: Array<{ prompt: unknown; tools?: unknown[] }> };
}

let ids = 0;
const toolCalls = (calls: Array<[string, string]>) =>
  calls.map(([toolName, input]) => ({ type: "tool-call" as const, toolCallId: `call-${++ids}`, toolName, input }));

const V3_USAGE = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};
const V2_USAGE = { inputTokens: 1, outputTokens: 1, totalTokens: 2 };

const FLAVORS: Flavor[] = [
  {
    label: "ai 6 (MockLanguageModelV3)",
    sdk: ai6,
    model: (steps) =>
      new MockLanguageModelV3({
        doGenerate: steps.map((step) =>
          "calls" in step
            ? { content: toolCalls(step.calls), finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage: V3_USAGE, warnings: [] }
            : { content: [{ type: "text", text: step.text }], finishReason: { unified: "stop", raw: "stop" }, usage: V3_USAGE, warnings: [] },
        ),
      }),
  },
  {
    label: "ai 5 (MockLanguageModelV2)",
    sdk: ai5,
    model: (steps) =>
      new MockLanguageModelV2({
        doGenerate: steps.map((step) =>
          "calls" in step
            ? { content: toolCalls(step.calls), finishReason: "tool-calls", usage: V2_USAGE, warnings: [] }
            : { content: [{ type: "text", text: step.text }], finishReason: "stop", usage: V2_USAGE, warnings: [] },
        ),
      }),
  },
];

/** The tool results the model read, in order (from the prompt of its last step). */
function toolResultsRead(model: ReturnType<Flavor["model"]>): string[] {
  const prompt = model.doGenerateCalls.at(-1)!.prompt as Array<{ role: string; content: unknown }>;
  const out: string[] = [];
  for (const message of prompt) {
    if (message.role !== "tool") continue;
    for (const part of message.content as Array<{ type: string; output: { type: string; value: string } }>) {
      if (part.type !== "tool-result") continue;
      assert.equal(part.output.type, "text", "the model reads text");
      out.push(part.output.value);
    }
  }
  return out;
}

describe("Vercel AI SDK", () => {
  let server: TestServer;
  let ledger: Ledger;
  before(async () => {
    server = await startServer();
    ledger = server.ledger();
  });
  after(async () => {
    await server.stop();
  });

  const CALL = '{"customer":"c-42","amount":200,"currency":"EUR"}';
  const RESPELLED = '{"currency":"EUR","amount":2e2,"customer":"c-42"}';

  for (const flavor of FLAVORS) {
    const { sdk } = flavor;

    /** The payments API of these tests: one credit per call, the attempt's externalRef attached. */
    function payments() {
      const credits: Array<{ customer: string; amount: number; currency: string; ref: string }> = [];
      let down = false;
      const issueCredit = ledgerTool(
        ledger,
        "issue_credit",
        sdk.tool({
          description: "Issue a credit to a customer's account.",
          inputSchema: z.object({ customer: z.string(), amount: z.number(), currency: z.string() }),
          execute: async (input: { customer: string; amount: number; currency: string }) => {
            if (down) throw new NotExecutedError("the payments API refused the connection");
            credits.push({ ...input, ref: currentAttempt()!.externalRef });
            return { credit_id: `cr-${credits.length}` };
          },
        }),
      );
      return { credits, issueCredit, setDown: (d: boolean) => (down = d) };
    }

    /** One generateText: the scripted steps, then a closing text; the run id in the context. */
    async function turn(tools: Record<string, unknown>, runId: string | undefined, steps: Step[]) {
      const model = flavor.model([...steps, { text: "Done: the credit is issued." }]);
      const result = await sdk.generateText({
        model,
        tools,
        prompt: "Credit 200 EUR to customer c-42.",
        stopWhen: sdk.stepCountIs(steps.length + 1),
        ...(runId === undefined ? {} : { experimental_context: { runId } }),
      });
      return { model, result: result as { text: string; steps: Array<{ toolResults: Array<{ output: unknown }> }> } };
    }

    describe(flavor.label, () => {
      test("two parallel identical calls and a respelled one: one credit, one result and two replay notes", async () => {
        const { credits, issueCredit } = payments();
        const run = uniqueRun("ai-sdk");
        const { model, result } = await turn({ issue_credit: issueCredit }, run, [
          { calls: [["issue_credit", CALL], ["issue_credit", CALL]] },
          { calls: [["issue_credit", RESPELLED]] },
        ]);
        assert.equal(credits.length, 1, "the side effect happened once");
        const read = toolResultsRead(model);
        assert.equal(read.length, 3);
        assert.deepEqual(read.filter((t) => !REPLAY_NOTE.test(t)), ['{"credit_id":"cr-1"}']);
        const replays = read.filter((t) => REPLAY_NOTE.test(t));
        assert.equal(replays.length, 2);
        for (const t of replays) assert.match(t, /Result: \{"credit_id":"cr-1"\}$/);
        // In code, the step's tool result is the ToolCallResult.
        const outputs = result.steps.flatMap((s) => s.toolResults.map((r) => r.output));
        assert.ok(outputs.every((o) => o instanceof ToolCallResult));
        assert.deepEqual(outputs.map((o) => (o as ToolCallResult).outcome).sort(), ["performed", "replayed", "replayed"]);
        const performed = outputs.find((o) => (o as ToolCallResult).outcome === "performed") as ToolCallResult;
        assert.equal(credits[0].ref, performed.entry!.externalRef);
        assert.equal(result.text, "Done: the credit is issued.");

        // A second run of the same conversation acts again.
        const second = await turn({ issue_credit: issueCredit }, uniqueRun("ai-sdk"), [{ calls: [["issue_credit", CALL]] }]);
        assert.equal(credits.length, 2);
        assert.deepEqual(toolResultsRead(second.model), ['{"credit_id":"cr-2"}']);
      });

      test("a tool that throws before acting leaves the intent retryable: FAILED retryable, then attempt 2", async () => {
        const { credits, issueCredit, setDown } = payments();
        const run = uniqueRun("ai-sdk-retry");
        setDown(true);
        const failed = await turn({ issue_credit: issueCredit }, run, [{ calls: [["issue_credit", CALL]] }]);
        const [note] = toolResultsRead(failed.model);
        assert.match(note, /^This action was not performed: the payments API refused the connection\. Nothing happened/);
        const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL });
        assert.equal(entry.status, "FAILED");
        assert.equal(entry.retryable, true);
        assert.equal(credits.length, 0);

        setDown(false);
        const retried = await turn({ issue_credit: issueCredit }, run, [{ calls: [["issue_credit", RESPELLED]] }]);
        assert.deepEqual(toolResultsRead(retried.model), ['{"credit_id":"cr-1"}']);
        assert.equal((await ledger.lookup({ key: entry.key })).attempt, 2);
      });

      test("no run id in experimental_context: not performed, and the model is told why", async () => {
        const { credits, issueCredit } = payments();
        const { model } = await turn({ issue_credit: issueCredit }, undefined, [{ calls: [["issue_credit", CALL]] }]);
        const [note] = toolResultsRead(model);
        assert.match(note, /not performed: the tool issue_credit was called without a run id/);
        assert.match(note, /experimental_context: \{ runId \}/);
        assert.equal(credits.length, 0);
      });

      test("the wrapped tool is the same tool to the SDK: description and schema", async () => {
        const { issueCredit } = payments();
        const { model } = await turn({ issue_credit: issueCredit }, "r", []);
        const [sent] = (model.doGenerateCalls[0].tools ?? []) as Array<{ name: string; description?: string }>;
        assert.equal(sent.name, "issue_credit");
        assert.equal(sent.description, "Issue a credit to a customer's account.");
        const schema = (sent as unknown as { inputSchema: { properties: Record<string, unknown> } }).inputSchema;
        assert.deepEqual(Object.keys(schema.properties).sort(), ["amount", "currency", "customer"]);
        assert.throws(() => ledgerTool(ledger, "t", sdk.tool({ inputSchema: z.object({}) })), /no execute function/);
      });
    });
  }
});
