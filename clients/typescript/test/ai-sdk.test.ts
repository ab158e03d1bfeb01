// The Vercel AI SDK adapter against the real `ai` package, both majors the adapter supports
// (6 with MockLanguageModelV3, 5 with MockLanguageModelV2, each from its own "ai/test"), and the
// real server: generateText with the SDK's offline test model scripting tool calls step by step.
// The transcript checked is what the model was sent in its last step. Each flavor: one effect
// per intent; the SDK's own retry exception after acting is an unknown outcome (the note, on the
// call and on the repeat); with the tool's paired read it settles at once (the result, or "not
// performed" and a clean retry); strict mode; a missing run id reaches the developer.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import * as ai6 from "ai";
import { MockLanguageModelV3 } from "ai/test";
import * as ai5 from "ai-v5";
import { MockLanguageModelV2 } from "ai-v5/test";
import { z } from "zod";
import { ledgerTool } from "../src/adapters/ai-sdk.js";
import {
  MissingRunIdError,
  NotExecutedError,
  ToolCallResult,
  NOT_PERFORMED_NOTE,
  UNKNOWN_NOTE,
  currentAttempt,
  type Ledger,
} from "../src/index.js";
import { Payments, captureLog, sleep } from "./support/payments.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

const REPLAY_NOTE = /already performed.*No new action was taken/;

/** A scripted model step: tool calls [name, input JSON as the model wrote it], or text. */
type Step = { calls: Array<[string, string]> } | { text: string };

/** What differs between the majors: the package, its mock model and its result shapes. */
interface Flavor {
  label: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  sdk: {
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    generateText: (options: any) => Promise<any>;
    stepCountIs: (n: number) => unknown;
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    tool: (t: any) => any;
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    APICallError: new (init: any) => Error;
  };
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
  const log = captureLog();
  before(async () => {
    server = await startServer();
    ledger = server.ledger({ logger: log, confirmDelayMs: 50 });
  });
  after(async () => {
    await server.stop();
  });

  const CALL = '{"customer":"c-42","amount":200,"currency":"EUR"}';
  const RESPELLED = '{"currency":"EUR","amount":2e2,"customer":"c-42"}';

  for (const flavor of FLAVORS) {
    const { sdk } = flavor;

    /** The payments API of these tests: one credit per call, the attempt's externalRef attached. */
    function payments(
      options: {
        confirm?: boolean;
        /** Thrown after the credit is issued, as a payments client that lost the answer would. */
        failAfter?: () => Error;
        /** Thrown before the credit is issued (not declared as not acting: an unknown outcome). */
        failBefore?: () => Error;
        /** The ledger's time limit of the action; execute then waits, acting only if not stopped. */
        timeoutMs?: number;
        on?: Ledger;
      } = {},
    ) {
      const world = new Payments();
      let down = false;
      const issueCredit = ledgerTool(
        options.on ?? ledger,
        sdk.tool({
          description: "Issue a credit to a customer's account.",
          inputSchema: z.object({ customer: z.string(), amount: z.number(), currency: z.string() }),
          execute: async (input: { customer: string; amount: number; currency: string }) => {
            if (down) throw new NotExecutedError("the payments API refused the connection");
            const attempt = currentAttempt()!;
            if (options.timeoutMs !== undefined) await sleep(options.timeoutMs * 20, attempt.signal);
            if (options.failBefore) throw options.failBefore();
            const out = world.issue(input, attempt.externalRef);
            if (options.failAfter) throw options.failAfter();
            return out;
          },
        }),
        {
          name: "issue_credit",
          ...(options.confirm ? { confirm: world.confirm } : {}),
          ...(options.timeoutMs !== undefined ? { timeoutMs: options.timeoutMs } : {}),
        },
      );
      return { credits: world.credits, world, issueCredit, setDown: (d: boolean) => (down = d) };
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

      test("no run id in experimental_context: generateText throws MissingRunIdError, logged once, nothing runs", async () => {
        const { credits, issueCredit } = payments();
        const before = log.lines.length;
        for (let i = 0; i < 2; i++) {
          await assert.rejects(
            turn({ issue_credit: issueCredit }, undefined, [{ calls: [["issue_credit", CALL]] }]),
            (err: unknown) =>
              err instanceof MissingRunIdError &&
              err.tool === "issue_credit" &&
              /experimental_context: \{ runId \}/.test(err.message),
          );
        }
        assert.equal(credits.length, 0);
        const logged = log.lines.slice(before).filter((l) => l.includes("without a run id"));
        // Once per tool and ledger: the first flavor logged it, the second finds it logged.
        assert.ok(logged.length <= 1, logged.join("\n"));
        assert.ok(log.lines.some((l) => /^ERROR the tool issue_credit was called without a run id.*Fix: pass experimental_context/.test(l)));
        assert.ok(!log.lines.some((l) => /try again/i.test(l)));
      });

      test("the SDK's retry exception after acting (APICallError, retryable): one credit, the unknown note on the call and on the repeat", async () => {
        const failAfter = () =>
          new sdk.APICallError({
            message: "payments API: the connection was reset",
            url: "https://payments.example/credits",
            requestBodyValues: {},
            isRetryable: true,
          });
        const { credits, issueCredit } = payments({ failAfter });
        const run = uniqueRun("ai-sdk-unknown");
        const first = await turn({ issue_credit: issueCredit }, run, [{ calls: [["issue_credit", CALL]] }]);
        assert.deepEqual(toolResultsRead(first.model), [UNKNOWN_NOTE]);
        const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL });
        assert.equal(entry.status, "UNKNOWN");
        assert.match(entry.error, /AI_APICallError: payments API: the connection was reset/);
        const again = await turn({ issue_credit: issueCredit }, run, [{ calls: [["issue_credit", RESPELLED]] }]);
        assert.deepEqual(toolResultsRead(again.model), [UNKNOWN_NOTE], "the repeat reads the same");
        assert.equal(credits.length, 1, "never re-run silently");
      });

      test("with confirm, the same failure settles SUCCEEDED and the model reads the result on the first call", async () => {
        const failAfter = () => new Error("payments API: 504 Gateway Timeout");
        const { credits, issueCredit } = payments({ failAfter, confirm: true });
        const run = uniqueRun("ai-sdk-confirm");
        const { model, result } = await turn({ issue_credit: issueCredit }, run, [{ calls: [["issue_credit", CALL]] }]);
        assert.deepEqual(toolResultsRead(model), ['{"credit_id":"cr-1"}']);
        const output = result.steps[0].toolResults[0].output as ToolCallResult;
        assert.equal(output.outcome, "performed");
        assert.equal(output.confirmed, true);
        const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL });
        assert.equal(entry.status, "SUCCEEDED");
        assert.equal(new TextDecoder().decode(entry.result), '{"credit_id":"cr-1"}');
        assert.ok(
          log.lines.some((l) => l.startsWith(`INFO settled key=${entry.key} tool=issue_credit external_ref=${entry.externalRef} outcome=found`)),
          "the settlement is logged",
        );
        const again = await turn({ issue_credit: issueCredit }, run, [{ calls: [["issue_credit", CALL]] }]);
        const [replay] = toolResultsRead(again.model);
        assert.match(replay, REPLAY_NOTE);
        assert.match(replay, /Result: \{"credit_id":"cr-1"\}$/);
        assert.equal(credits.length, 1);
      });

      test("an error thrown before acting (no timeout), with confirm: it found nothing, so the model reads that nothing happened; FAILED retryable, and the next call acts once", async () => {
        const { credits, issueCredit } = payments({ failBefore: () => new Error("socket hang up"), confirm: true });
        const run = uniqueRun("ai-sdk-not-performed");
        const first = await turn({ issue_credit: issueCredit }, run, [{ calls: [["issue_credit", CALL]] }]);
        assert.deepEqual(toolResultsRead(first.model), [NOT_PERFORMED_NOTE]);
        const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL });
        assert.deepEqual([entry.status, entry.retryable], ["FAILED", true]);
        assert.equal(credits.length, 0);
        const { issueCredit: quick } = payments({ confirm: true });
        const retried = await turn({ issue_credit: quick }, run, [{ calls: [["issue_credit", CALL]] }]);
        assert.deepEqual(toolResultsRead(retried.model), ['{"credit_id":"cr-1"}']);
        assert.equal((await ledger.lookup({ key: entry.key })).attempt, 2);
      });

      test("a timeout before acting, with confirm: UNKNOWN (the action may still land), and the next call (the test server's grace is 0 s) finds nothing and acts once", async () => {
        const { credits, issueCredit } = payments({ timeoutMs: 150, confirm: true });
        const run = uniqueRun("ai-sdk-timeout");
        const first = await turn({ issue_credit: issueCredit }, run, [{ calls: [["issue_credit", CALL]] }]);
        const [note] = toolResultsRead(first.model);
        assert.equal(note, UNKNOWN_NOTE);
        const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL });
        assert.equal(entry.status, "UNKNOWN");
        assert.equal(credits.length, 0);

        const { issueCredit: quick } = payments({ confirm: true });
        const retried = await turn({ issue_credit: quick }, run, [{ calls: [["issue_credit", CALL]] }]);
        assert.deepEqual(toolResultsRead(retried.model), ['{"credit_id":"cr-1"}']);
        assert.equal((await ledger.lookup({ key: entry.key })).attempt, 2);
      });

      test("confirm cannot tell at first: UNKNOWN; the repeat asks again, settles and replays the result", async () => {
        const failAfter = () => new Error("payments API: 504 Gateway Timeout");
        const { credits, world, issueCredit } = payments({ failAfter, confirm: true });
        const run = uniqueRun("ai-sdk-later");
        world.visible = false;
        const first = await turn({ issue_credit: issueCredit }, run, [{ calls: [["issue_credit", CALL]] }]);
        assert.deepEqual(toolResultsRead(first.model), [UNKNOWN_NOTE]);
        assert.equal((await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL })).status, "UNKNOWN");
        world.visible = true;
        const again = await turn({ issue_credit: issueCredit }, run, [{ calls: [["issue_credit", CALL]] }]);
        const [replay] = toolResultsRead(again.model);
        assert.match(replay, REPLAY_NOTE);
        assert.match(replay, /Result: \{"credit_id":"cr-1"\}$/);
        assert.equal(credits.length, 1);
        assert.equal(world.asked, 2);
      });

      test("strict mode refuses a tool without confirm, saying why", () => {
        const strict = server.ledger({ requireConfirm: true });
        assert.throws(
          () => payments({ on: strict }),
          /issue_credit: this Ledger requires a paired read \(requireConfirm: true\) and the tool has none.*cannot be safely retried/,
        );
        assert.doesNotThrow(() => payments({ on: strict, confirm: true }));
      });

      test("the wrapped tool is the same tool to the SDK: description and schema", async () => {
        const { issueCredit } = payments();
        const { model } = await turn({ issue_credit: issueCredit }, "r", []);
        const [sent] = (model.doGenerateCalls[0].tools ?? []) as Array<{ name: string; description?: string }>;
        assert.equal(sent.name, "issue_credit");
        assert.equal(sent.description, "Issue a credit to a customer's account.");
        const schema = (sent as unknown as { inputSchema: { properties: Record<string, unknown> } }).inputSchema;
        assert.deepEqual(Object.keys(schema.properties).sort(), ["amount", "currency", "customer"]);
        assert.throws(() => ledgerTool(ledger, sdk.tool({ inputSchema: z.object({}) }), { name: "t" }), /no execute function/);
        assert.throws(() => ledgerTool(ledger, sdk.tool({ inputSchema: z.object({}), execute: () => 1 }), {} as never), /options.name is required/);
      });
    });
  }
});
