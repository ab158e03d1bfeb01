// The OpenAI Agents JS SDK adapter against the real `@openai/agents` package and the real
// server: `run(agent, input, { context: { runId } })` with an offline Model implementation that
// scripts the model's function calls turn by turn. The transcript checked is the input of the
// model's last turn.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  Agent,
  ToolCallError,
  run,
  setTracingDisabled,
  tool,
  type AgentOutputItem,
} from "@openai/agents";
import { z } from "zod";
import { ledgerTool } from "../src/adapters/openai-agents.js";
import { MissingRunIdError, NotExecutedError, NOT_PERFORMED_NOTE, UNKNOWN_NOTE, currentAttempt, type Ledger } from "../src/index.js";
import { Payments, captureLog, sleep } from "./support/payments.js";
import { ScriptedModel } from "./support/scripted-model.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

const REPLAY_NOTE = /already performed.*No new action was taken/;

// No API key, no network: nothing may try to export traces.
setTracingDisabled(true);

let callCounter = 0;
function calls(...calls: Array<[string, string]>): AgentOutputItem[] {
  return calls.map(([name, args]) => ({
    type: "function_call",
    callId: `call-${++callCounter}`,
    name,
    arguments: args,
    status: "completed",
  }));
}

function say(text: string): AgentOutputItem[] {
  return [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text }] }];
}

describe("OpenAI Agents JS SDK (@openai/agents, a scripted Model)", () => {
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

  function payments(
    options: {
      confirm?: boolean;
      /** Thrown after the credit is issued, as a payments client that lost the answer would. */
      failAfter?: () => Error;
      /** Thrown before the credit is issued (not declared as not acting: an unknown outcome). */
      failBefore?: () => Error;
      /** The tool's own timeoutMs (the SDK's option): ledgerTool makes it the ledger's. */
      timeoutMs?: number;
      on?: Ledger;
    } = {},
  ) {
    const world = new Payments();
    let down = false;
    const issueCredit = tool(
      ledgerTool(
        options.on ?? ledger,
        {
          name: "issue_credit",
          description: "Issue a credit to a customer's account.",
          parameters: z.object({ customer: z.string(), amount: z.number(), currency: z.string() }),
          ...(options.timeoutMs !== undefined ? { timeoutMs: options.timeoutMs } : {}),
          execute: async (input) => {
            if (down) throw new NotExecutedError("the payments API refused the connection");
            const attempt = currentAttempt()!;
            if (options.timeoutMs !== undefined) await sleep(options.timeoutMs * 20, attempt.signal);
            if (options.failBefore) throw options.failBefore();
            const out = world.issue(input, attempt.externalRef);
            if (options.failAfter) throw options.failAfter();
            return out;
          },
        },
        options.confirm ? { confirm: world.confirm } : {},
      ),
    );
    return { credits: world.credits, world, issueCredit, setDown: (d: boolean) => (down = d) };
  }

  const CALL = '{"customer":"c-42","amount":200,"currency":"EUR"}';
  const RESPELLED = '{"currency":"EUR","amount":2e2,"customer":"c-42"}';

  async function turn(issueCredit: ReturnType<typeof payments>["issueCredit"], runId: string | undefined, turns: AgentOutputItem[][]) {
    const model = new ScriptedModel([...turns, say("The credit is issued.")]);
    const agent = new Agent({ name: "support", instructions: "Help customers.", model, tools: [issueCredit] });
    const result = await run(agent, "Credit 200 EUR to customer c-42.", runId === undefined ? {} : { context: { runId } });
    return { model, result };
  }

  test("two parallel identical calls and a respelled one: one credit, one result and two replay notes", async () => {
    const { credits, issueCredit } = payments();
    const runId = uniqueRun("agents");
    const { model, result } = await turn(issueCredit, runId, [calls(["issue_credit", CALL], ["issue_credit", CALL]), calls(["issue_credit", RESPELLED])]);
    assert.equal(credits.length, 1, "the side effect happened once");
    const read = model.resultsRead();
    assert.equal(read.length, 3);
    assert.deepEqual(read.filter((t) => !REPLAY_NOTE.test(t)), ['{"credit_id":"cr-1"}']);
    const replays = read.filter((t) => REPLAY_NOTE.test(t));
    assert.equal(replays.length, 2);
    for (const t of replays) assert.match(t, /Result: \{"credit_id":"cr-1"\}$/);
    assert.equal(result.finalOutput, "The credit is issued.");
    const entry = await ledger.lookup({ runId, tool: "issue_credit", args: CALL });
    assert.equal(entry.externalRef, credits[0].ref);
    assert.equal(entry.replayCount, 2);

    const second = await turn(issueCredit, uniqueRun("agents"), [calls(["issue_credit", CALL])]);
    assert.equal(credits.length, 2, "a second run acts again");
    assert.deepEqual(second.model.resultsRead(), ['{"credit_id":"cr-2"}']);
  });

  test("a tool that throws before acting leaves the intent retryable: FAILED retryable, then attempt 2", async () => {
    const { credits, issueCredit, setDown } = payments();
    const runId = uniqueRun("agents-retry");
    setDown(true);
    const failed = await turn(issueCredit, runId, [calls(["issue_credit", CALL])]);
    const [note] = failed.model.resultsRead();
    assert.match(note, /^This action was not performed: the payments API refused the connection\. Nothing happened/);
    assert.doesNotMatch(note, /An error occurred while running the tool/, "not the SDK's error text");
    const entry = await ledger.lookup({ runId, tool: "issue_credit", args: CALL });
    assert.equal(entry.status, "FAILED");
    assert.equal(entry.retryable, true);

    setDown(false);
    const retried = await turn(issueCredit, runId, [calls(["issue_credit", RESPELLED])]);
    assert.deepEqual(retried.model.resultsRead(), ['{"credit_id":"cr-1"}']);
    assert.equal((await ledger.lookup({ key: entry.key })).attempt, 2);
    assert.equal(credits.length, 1);
  });

  test("a run without a run id in its context: run() throws MissingRunIdError, logged once, nothing runs", async () => {
    const { credits, issueCredit } = payments();
    for (let i = 0; i < 2; i++) {
      await assert.rejects(
        turn(issueCredit, undefined, [calls(["issue_credit", CALL])]),
        // The SDK wraps what a tool throws in its ToolCallError, keeping ours as `error`.
        (err: unknown) =>
          err instanceof ToolCallError &&
          err.error instanceof MissingRunIdError &&
          /context: \{ runId \}/.test(err.error.message),
      );
    }
    assert.equal(credits.length, 0);
    const logged = log.lines.filter((l) => l.includes("issue_credit was called without a run id"));
    assert.equal(logged.length, 1, "once per tool");
    assert.match(logged[0], /^ERROR .*Fix: pass context: \{ runId \} to run\(agent, input, options\)/);
  });

  test("the SDK's tool error after acting (ToolCallError): one credit, the unknown note on the call and on the repeat", async () => {
    const failAfter = () => new ToolCallError("payments API: the connection was reset", new Error("ECONNRESET"));
    const { credits, issueCredit } = payments({ failAfter });
    const runId = uniqueRun("agents-unknown");
    const first = await turn(issueCredit, runId, [calls(["issue_credit", CALL])]);
    assert.deepEqual(first.model.resultsRead(), [UNKNOWN_NOTE]);
    const entry = await ledger.lookup({ runId, tool: "issue_credit", args: CALL });
    assert.equal(entry.status, "UNKNOWN");
    assert.match(entry.error, /ToolCallError: payments API: the connection was reset/);
    const again = await turn(issueCredit, runId, [calls(["issue_credit", RESPELLED])]);
    assert.deepEqual(again.model.resultsRead(), [UNKNOWN_NOTE], "the repeat reads the same");
    assert.equal(credits.length, 1, "never re-run silently");
  });

  test("with confirm, the same failure settles SUCCEEDED and the model reads the result on the first call", async () => {
    const failAfter = () => new ToolCallError("payments API: 504 Gateway Timeout", new Error("504"));
    const { credits, issueCredit } = payments({ failAfter, confirm: true });
    const runId = uniqueRun("agents-confirm");
    const first = await turn(issueCredit, runId, [calls(["issue_credit", CALL])]);
    assert.deepEqual(first.model.resultsRead(), ['{"credit_id":"cr-1"}']);
    const entry = await ledger.lookup({ runId, tool: "issue_credit", args: CALL });
    assert.equal(entry.status, "SUCCEEDED");
    const again = await turn(issueCredit, runId, [calls(["issue_credit", CALL])]);
    const [replay] = again.model.resultsRead();
    assert.match(replay, REPLAY_NOTE);
    assert.match(replay, /Result: \{"credit_id":"cr-1"\}$/);
    assert.equal(credits.length, 1);
  });

  test("an error thrown before acting (no timeout), with confirm: it found nothing, so the model reads that nothing happened; FAILED retryable, and the next call acts once", async () => {
    const { credits, issueCredit } = payments({ failBefore: () => new Error("socket hang up"), confirm: true });
    const runId = uniqueRun("agents-not-performed");
    const first = await turn(issueCredit, runId, [calls(["issue_credit", CALL])]);
    assert.deepEqual(first.model.resultsRead(), [NOT_PERFORMED_NOTE]);
    const entry = await ledger.lookup({ runId, tool: "issue_credit", args: CALL });
    assert.deepEqual([entry.status, entry.retryable], ["FAILED", true]);
    assert.equal(credits.length, 0);
    const { issueCredit: quick } = payments({ confirm: true });
    const retried = await turn(quick, runId, [calls(["issue_credit", CALL])]);
    assert.deepEqual(retried.model.resultsRead(), ['{"credit_id":"cr-1"}']);
    assert.equal((await ledger.lookup({ key: entry.key })).attempt, 2);
  });

  test("a timeout before acting (the tool's timeoutMs), with confirm: UNKNOWN (the action may still land), and the next call (the test server's grace is 0 s) finds nothing and acts once", async () => {
    const { credits, issueCredit } = payments({ timeoutMs: 150, confirm: true });
    const runId = uniqueRun("agents-timeout");
    const first = await turn(issueCredit, runId, [calls(["issue_credit", CALL])]);
    const [note] = first.model.resultsRead();
    assert.equal(note, UNKNOWN_NOTE);
    assert.doesNotMatch(note, /timed out after/, "not the SDK's own timeout text");
    const entry = await ledger.lookup({ runId, tool: "issue_credit", args: CALL });
    assert.equal(entry.status, "UNKNOWN");
    assert.equal(credits.length, 0);

    const { issueCredit: quick } = payments({ confirm: true });
    const retried = await turn(quick, runId, [calls(["issue_credit", CALL])]);
    assert.deepEqual(retried.model.resultsRead(), ['{"credit_id":"cr-1"}']);
    assert.equal((await ledger.lookup({ key: entry.key })).attempt, 2);
  });

  test("strict mode refuses a tool without confirm, saying why", () => {
    const strict = server.ledger({ requireConfirm: true });
    assert.throws(() => payments({ on: strict }), /issue_credit: this Ledger requires a paired read \(requireConfirm: true\)/);
    assert.doesNotThrow(() => payments({ on: strict, confirm: true }));
  });

  test("the wrapped tool is the same tool to the SDK; an outputSchema is refused", async () => {
    const { issueCredit } = payments();
    assert.equal(issueCredit.type, "function");
    assert.equal(issueCredit.name, "issue_credit");
    assert.equal(issueCredit.description, "Issue a credit to a customer's account.");
    assert.deepEqual(Object.keys(issueCredit.parameters.properties).sort(), ["amount", "currency", "customer"]);
    assert.throws(
      () =>
        ledgerTool(ledger, {
          name: "t",
          description: "d",
          parameters: z.object({}),
          outputSchema: z.object({ id: z.string() }),
          execute: async () => ({ id: "x" }),
        }),
      /outputSchema cannot carry the ledger's notes/,
    );
    // What tool() returns hides execute and turns errors into results: refused, with the right line.
    assert.throws(
      () => ledgerTool(ledger, issueCredit as never),
      /this is the FunctionTool tool\(\) returns; wrap its definition instead: tool\(ledgerTool\(ledger, \{/,
    );
  });
});
