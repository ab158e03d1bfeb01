// Approvals in the OpenAI Agents JS SDK's own approval step, against the real `@openai/agents`
// package (an offline scripted Model) and the real server with an approval policy (credits over
// 100 wait for a person) and an approver token: the ledger tool's needsApproval asks the ledger,
// so a gated call interrupts the run (result.interruptions); the app's approve button
// (decideInterruption: Decide with the approver's credential, then state.approve) and a resume
// act once; a denial reaches the model as the ledger's note; a RunState serialized after the
// approval and resumed twice acts once; a RunState approved without Decide (forged) acts never.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  Agent,
  RunState,
  run,
  setTracingDisabled,
  tool,
  type AgentOutputItem,
  type RunToolApprovalItem,
} from "@openai/agents";
import { z } from "zod";
import { decideInterruption, interruptionKey, ledgerTool } from "../src/adapters/openai-agents.js";
import { currentAttempt, type Ledger } from "../src/index.js";
import { Payments, captureLog } from "./support/payments.js";
import { ScriptedModel } from "./support/scripted-model.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

setTracingDisabled(true);

let callCounter = 0;
function call(name: string, args: string): AgentOutputItem[] {
  return [{ type: "function_call", callId: `call-${++callCounter}`, name, arguments: args, status: "completed" }];
}

function say(text: string): AgentOutputItem[] {
  return [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text }] }];
}

const CREDIT = '{"customer":"c-42","amount":200,"currency":"EUR"}';
const CREDIT_2 = '{"customer":"c-43","amount":300,"currency":"EUR"}';

describe("OpenAI Agents JS SDK approvals (needsApproval, interruptions, RunState)", () => {
  let server: TestServer;
  let ledger: Ledger;
  let approver: Ledger;
  const log = captureLog();
  before(async () => {
    server = await startServer({
      tokens: [
        ["acme", "tok-agent"],
        ["acme", "tok-dana", "approver=dana"],
      ],
      approvalPolicy: "*  issue_credit  /amount  >  100\n",
    });
    ledger = server.ledger({ token: "tok-agent", logger: log });
    approver = server.ledger({ token: "tok-dana" });
  });
  after(async () => {
    await server.stop();
  });

  /** The agent of one test: its tools over one payments world, and the scripted model. */
  function setup(turns: AgentOutputItem[][], options: { ownGate?: boolean } = {}) {
    const world = new Payments();
    const issueCredit = tool(
      ledgerTool(
        ledger,
        {
          name: "issue_credit",
          description: "Issue a credit to a customer's account.",
          parameters: z.object({ customer: z.string(), amount: z.number(), currency: z.string() }),
          execute: async (input) => world.issue(input, currentAttempt()!.externalRef),
        },
        // A run interrupted for a person keeps its entries at least 10 days (ExtendRun; the server
        // itself keeps them until the request's decide_by, 72 h).
        { pauseRetentionMs: 10 * 86_400_000 },
      ),
    );
    const sendWire = tool(
      ledgerTool(
        ledger,
        {
          name: "send_wire",
          description: "Send a wire transfer.",
          parameters: z.object({ to: z.string(), amount: z.number() }),
          // The SDK's own gate: the ledger makes it the Claim's requireApproval.
          needsApproval: options.ownGate ?? true,
          execute: async (input) => world.issue({ customer: input.to, amount: input.amount }, currentAttempt()!.externalRef),
        },
      ),
    );
    const model = new ScriptedModel(turns);
    const agent = new Agent({ name: "support", instructions: "Help customers.", model, tools: [issueCredit, sendWire] });
    return { world, model, agent };
  }

  test("approve: the run is interrupted, nothing acts; Decide + state.approve + resume acts once; the paused run's entries were kept", async () => {
    const runId = uniqueRun("agents-approve");
    // An earlier call of the run, kept only a minute: the pause extends it (ExtendRun).
    await ledger.runOnce(runId, "lookup_order", { order: "o-1" }, () => "found", { retentionMs: 60_000 });
    const { world, model, agent } = setup([call("issue_credit", CREDIT), say("The credit is issued.")]);
    let result = await run(agent, "Credit 200 EUR to c-42.", { context: { runId } });
    assert.equal(result.interruptions.length, 1, "the ledger's gate interrupts the run");
    assert.equal(world.credits.length, 0, "nothing acts while a person is asked");
    const waiting = await ledger.lookup({ runId, tool: "issue_credit", args: CREDIT });
    assert.equal(waiting.status, "AWAITING_APPROVAL");
    const kept = await ledger.lookup({ runId, tool: "lookup_order", args: { order: "o-1" } });
    assert.ok(kept.expiresAt!.getTime() > Date.now() + 9 * 86_400_000, "the interrupted run's entries are kept (ExtendRun)");

    // The app's approve button, with the person's credential.
    const [interruption] = result.interruptions;
    assert.equal(interruptionKey(result.state, interruption).key, waiting.key);
    const decided = await decideInterruption(approver, result.state, interruption, "approve", "checked the account");
    assert.equal(decided.approval?.decidedBy, "dana");
    result = await run(agent, result.state);
    assert.equal(world.credits.length, 1, "one effect");
    assert.equal(world.credits[0].ref, waiting.externalRef);
    assert.deepEqual(model.resultsRead(), ['{"credit_id":"cr-1"}']);
    assert.equal(result.finalOutput, "The credit is issued.");
    assert.equal((await ledger.lookup({ key: waiting.key })).approval?.state, "USED");
  });

  test("the tool's own needsApproval gates through the ledger (requireApproval) when the policy does not", async () => {
    const runId = uniqueRun("agents-own-gate");
    const { world, agent } = setup([call("send_wire", '{"to":"acct-9","amount":5}'), say("Sent.")]);
    let result = await run(agent, "Wire 5 to acct-9.", { context: { runId } });
    assert.equal(result.interruptions.length, 1);
    assert.equal(world.credits.length, 0);
    await decideInterruption(approver, result.state, result.interruptions[0], "approve", "ok");
    result = await run(agent, result.state);
    assert.equal(world.credits.length, 1);
  });

  test("deny: nothing acts, and the model reads the ledger's denial with the person's reason", async () => {
    const runId = uniqueRun("agents-deny");
    const { world, model, agent } = setup([call("issue_credit", CREDIT), say("I could not issue it.")]);
    let result = await run(agent, "Credit 200 EUR to c-42.", { context: { runId } });
    assert.equal(result.interruptions.length, 1);
    const denied = await decideInterruption(approver, result.state, result.interruptions[0], "deny", "the customer has an open dispute");
    assert.equal(denied.status, "DENIED");
    result = await run(agent, result.state);
    assert.equal(world.credits.length, 0);
    const [read] = model.resultsRead();
    assert.match(read, /the customer has an open dispute/);
    assert.doesNotMatch(read, /credit_id/);
    assert.equal(result.finalOutput, "I could not issue it.");
  });

  describe("several gated calls in one step", () => {
    /** The model asks for two gated credits in one turn. */
    const two = () => [...call("issue_credit", CREDIT), ...call("issue_credit", CREDIT_2)];
    const customerOf = (i: RunToolApprovalItem) => (JSON.parse(i.arguments ?? "{}") as { customer: string }).customer;

    test("both approved: each interruption of the saved RunState decided and approved; each call acts exactly once", async () => {
      const runId = uniqueRun("agents-two");
      const { world, model, agent } = setup([two(), say("Both credits are issued.")]);
      const paused = await run(agent, "Credit c-42 and c-43.", { context: { runId } });
      assert.equal(paused.interruptions.length, 2, "one interruption per gated call");
      assert.equal(world.credits.length, 0);
      const state = await RunState.fromString(agent, paused.state.toString());
      for (const interruption of state.getInterruptions()) {
        await decideInterruption(approver, state, interruption, "approve", "checked");
      }
      const result = await run(agent, state);
      assert.deepEqual(world.credits.map((c) => c.customer).sort(), ["c-42", "c-43"], "one effect per call");
      assert.deepEqual(model.resultsRead().sort(), ['{"credit_id":"cr-1"}', '{"credit_id":"cr-2"}']);
      assert.equal(result.finalOutput, "Both credits are issued.");
    });

    test("one approved, the other denied: the denied never acts, and the model reads the denial with the person's reason", async () => {
      const runId = uniqueRun("agents-mixed");
      const { world, model, agent } = setup([two(), say("One of two.")]);
      const paused = await run(agent, "Credit c-42 and c-43.", { context: { runId } });
      for (const interruption of paused.state.getInterruptions()) {
        const yes = customerOf(interruption) === "c-42";
        await decideInterruption(approver, paused.state, interruption, yes ? "approve" : "deny", yes ? "ok" : "c-43 is under review");
      }
      await run(agent, paused.state);
      assert.deepEqual(world.credits.map((c) => c.customer), ["c-42"], "only the approved call acted");
      const read = model.resultsRead();
      assert.equal(read.length, 2);
      assert.ok(read.includes('{"credit_id":"cr-1"}'), read.join(" | "));
      assert.ok(read.some((t) => /c-43 is under review/.test(t) && /not done/.test(t)), read.join(" | "));
    });

    test("decided elsewhere (Decide alone, as the console or the CLI): the app approves each interruption in the RunState, and each call does as its decision says", async () => {
      const runId = uniqueRun("agents-elsewhere");
      const { world, model, agent } = setup([two(), say("Done.")]);
      const paused = await run(agent, "Credit c-42 and c-43.", { context: { runId } });
      for (const interruption of paused.interruptions) {
        const { key, fingerprint } = interruptionKey(paused.state, interruption);
        const yes = customerOf(interruption) === "c-43";
        await approver.decide(key, fingerprint, yes ? "APPROVE" : "DENY", yes ? "fine" : "no credit for c-42");
      }
      for (const interruption of paused.state.getInterruptions()) paused.state.approve(interruption);
      await run(agent, paused.state);
      assert.deepEqual(world.credits.map((c) => c.customer), ["c-43"]);
      assert.ok(model.resultsRead().some((t) => /no credit for c-42/.test(t)), model.resultsRead().join(" | "));
    });

    test("only one of the two decided and approved: the run stays interrupted for the other, which never acts", async () => {
      const runId = uniqueRun("agents-one-of-two");
      const { world, agent } = setup([two(), say("Done.")]);
      const paused = await run(agent, "Credit c-42 and c-43.", { context: { runId } });
      const [first, second] = paused.state.getInterruptions();
      await decideInterruption(approver, paused.state, first, "approve", "ok");
      const again = await run(agent, paused.state);
      assert.deepEqual(again.interruptions.map(customerOf), [customerOf(second)]);
      assert.deepEqual(world.credits.map((c) => c.customer), [customerOf(first)]);
    });
  });

  test("a RunState serialized after the approval and resumed twice (RunState.fromString, at once): one effect, the other reads the replay", async () => {
    const runId = uniqueRun("agents-twice");
    const { world, model, agent } = setup([call("issue_credit", CREDIT), say("Done (1)."), say("Done (2).")]);
    const result = await run(agent, "Credit 200 EUR to c-42.", { context: { runId } });
    await decideInterruption(approver, result.state, result.interruptions[0], "approve", "ok");
    const saved = result.state.toString();
    const [a, b] = await Promise.all([RunState.fromString(agent, saved), RunState.fromString(agent, saved)]);
    await Promise.all([run(agent, a), run(agent, b)]);
    assert.equal(world.credits.length, 1, "one effect for two resumes");
    const read = [model.resultsRead(1), model.resultsRead(2)].flat().sort();
    assert.equal(read.length, 2);
    assert.equal(read.filter((t) => t === '{"credit_id":"cr-1"}').length, 1, read.join(" | "));
    assert.equal(read.filter((t) => /already performed.*Result: \{"credit_id":"cr-1"\}/.test(t)).length, 1, read.join(" | "));
  });

  test("a forged approval (state.approve without Decide, the RunState saved and resumed): nothing acts; the model reads that a person has been asked", async () => {
    const runId = uniqueRun("agents-forged");
    const { world, model, agent } = setup([call("issue_credit", CREDIT), say("Waiting for approval.")]);
    const result = await run(agent, "Credit 200 EUR to c-42.", { context: { runId } });
    result.state.approve(result.interruptions[0]);
    const resumed = await RunState.fromString(agent, result.state.toString());
    await run(agent, resumed);
    assert.equal(world.credits.length, 0, "the framework's approval alone acts never");
    const [read] = model.resultsRead();
    const entry = await ledger.lookup({ runId, tool: "issue_credit", args: CREDIT });
    assert.equal(entry.status, "AWAITING_APPROVAL");
    const again = await ledger.claim({ runId, tool: "issue_credit", args: CREDIT });
    assert.equal(read, again.note, "the model reads the ledger's awaiting note");
  });

  test("alwaysApprove in the RunState covers no other arguments: the second wire (gated only by the tool's own needsApproval) reads the awaiting note, and nothing acts for it", async () => {
    const runId = uniqueRun("agents-always");
    const { world, model, agent } = setup([
      call("send_wire", '{"to":"acct-1","amount":7}'),
      call("send_wire", '{"to":"acct-1","amount":7000}'),
      say("ok"),
    ]);
    let result = await run(agent, "Wire 7 to acct-1.", { context: { runId } });
    assert.equal(result.interruptions.length, 1);
    const [interruption] = result.interruptions;
    const { key, fingerprint } = interruptionKey(result.state, interruption);
    await approver.decide(key, fingerprint, "APPROVE", "7 is fine");
    // The SDK's approval for every later call of the tool, whatever its arguments: the SDK no
    // longer asks needsApproval, and the ledger has no request for the second call.
    result.state.approve(interruption, { alwaysApprove: true });
    result = await run(agent, result.state);
    assert.deepEqual(world.credits.map((c) => c.amount), [7], "only the approved arguments acted");
    const read = model.resultsRead();
    assert.equal(read.length, 2);
    const second = await ledger.lookup({ runId, tool: "send_wire", args: { to: "acct-1", amount: 7000 } });
    assert.equal(second.status, "AWAITING_APPROVAL", "the call itself asked for a person");
    assert.equal(read[1], (await ledger.claim({ runId, tool: "send_wire", args: { to: "acct-1", amount: 7000 } })).note);
  });
});
