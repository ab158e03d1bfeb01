// The examples, run as programs against the server: the dispatcher (one effect per intent, the
// replay marker shown to the model), the reconciler process (idempotency-ledger-reconciler
// loading examples/paired-reads.js: unknown outcomes settled by asking each tool's paired read
// by external_ref, another tool's left alone), and one agent per framework adapter (Vercel AI
// SDK, OpenAI Agents SDK, MCP), each playing examples/script.ts with its framework's offline
// model.

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import * as aiSdkAgent from "../examples/ai-sdk-agent.js";
import { aiSdkApproval, mcpApproval, openAiAgentsApproval, type Decide } from "../examples/approvals.js";
import * as mcpAgent from "../examples/mcp-agent.js";
import * as openAiAgentsAgent from "../examples/openai-agents-agent.js";
import { World } from "../examples/world.js";
import { InProgressError, type Ledger } from "../src/index.js";
import { PACKAGE_ROOT, runExample, runScript, startServer, uniqueRun, type TestServer } from "./support/server.js";

describe("examples", () => {
  let server: TestServer;
  let ledger: Ledger;
  let worldFile: string;
  let env: Record<string, string>;
  before(async () => {
    server = await startServer();
    ledger = server.ledger();
    worldFile = join(server.dir, "world.json");
    env = { LEDGER_ADDRESS: server.address, WORLD_FILE: worldFile };
  });
  after(async () => {
    await server.stop();
  });

  test("dispatcher: each intent has one effect; the model is told about replays", async () => {
    const world = new World(worldFile);
    const run = uniqueRun("dispatch");
    const first = await runExample("dispatcher", { ...env, RUN_ID: run });
    assert.equal(first.code, 0, first.stderr);
    assert.equal(world.credits().length, 1, first.stdout);
    assert.equal(world.replies().length, 1, first.stdout);
    const lines = first.stdout.split("\n").filter((l) => l.includes("->"));
    assert.equal(lines.length, 5, first.stdout);
    assert.match(lines[0], /-> Done\. Result: \{"credit_id":"cr-[0-9a-f]+"\}/);
    assert.match(lines[1], /-> This action was already performed in this run.*No new action was taken/);
    assert.match(lines[2], /-> Done\. Result: \{"message_id":/);
    assert.match(lines[3], /already performed/);
    assert.match(lines[4], /refused \(DUPLICATE_MEMBER\)/);
    assert.match(first.stdout, /world: 1 credit\(s\), 1 reply\(ies\)/);

    // The whole turn again in the same run (a runtime restart): nothing new happens.
    const again = await runExample("dispatcher", { ...env, RUN_ID: run });
    assert.equal(again.code, 0, again.stderr);
    assert.equal(world.credits().length, 1);
    assert.equal(again.stdout.split("\n").filter((l) => l.includes("already performed")).length, 4);

    // A person asking again in a new run is a new intent.
    const other = await runExample("dispatcher", { ...env, RUN_ID: uniqueRun("dispatch") });
    assert.equal(other.code, 0, other.stderr);
    assert.equal(world.credits().length, 2);
    assert.equal(world.replies().length, 2);
  });

  // Each framework example plays the same turn: issue_credit twice at once, then again respelled
  // next to send_reply. The model must read one credit result and two replay notes.
  const agents = {
    "ai-sdk-agent": aiSdkAgent.runAgent,
    "openai-agents-agent": openAiAgentsAgent.runAgent,
    "mcp-agent": mcpAgent.runAgent,
  };
  for (const [example, runAgent] of Object.entries(agents)) {
    test(`${example}: one credit and one reply per run; the model reads the replays as replays`, async () => {
      const file = join(server.dir, `world-${example}.json`);
      const world = new World(file);
      const exampleEnv = { LEDGER_ADDRESS: server.address, WORLD_FILE: file };
      const run = uniqueRun(example);
      const read = (stdout: string) =>
        stdout
          .split("\n")
          .filter((l) => l.startsWith("  -> "))
          .map((l) => l.slice(5));

      const first = await runExample(example, { ...exampleEnv, RUN_ID: run });
      assert.equal(first.code, 0, first.stderr);
      assert.equal(world.credits().length, 1, first.stdout);
      assert.equal(world.replies().length, 1, first.stdout);
      const answers = read(first.stdout);
      assert.equal(answers.length, 4, first.stdout);
      const credit = world.credits()[0];
      const results = answers.filter((a) => !/already performed/.test(a));
      assert.deepEqual(results.sort(), [
        JSON.stringify({ credit_id: credit.credit_id }),
        JSON.stringify({ message_id: world.replies()[0].message_id }),
      ].sort());
      const replays = answers.filter((a) => /already performed.*No new action was taken/.test(a));
      assert.equal(replays.length, 2, first.stdout);
      for (const r of replays) assert.ok(r.includes(credit.credit_id), r);
      assert.match(first.stdout, /world: 1 credit\(s\), 1 reply\(ies\)/);
      // The credit carries the ledger's external_ref as its idempotency reference.
      const ledgerEntry = await ledger.lookup({ runId: run, tool: "issue_credit", args: { customer: "c-42", amount: 200, currency: "EUR" } });
      assert.equal(credit.ref, ledgerEntry.externalRef);

      // The same run again (a restarted worker), in this process: everything is a replay.
      const again = await runAgent(ledger, world, run);
      assert.equal(again.calls.length, 4);
      assert.ok(again.calls.every((c) => /already performed/.test(c.read)), JSON.stringify(again.calls));
      assert.equal(world.credits().length, 1);

      // A new run is a new intent.
      await runAgent(ledger, world, uniqueRun(example));
      assert.equal(world.credits().length, 2);
      assert.equal(world.replies().length, 2);
    });
  }

  test("the reconciler process settles the unknown outcomes of the module's tools only, then they replay or retry", async () => {
    const file = join(server.dir, "world-reconcile.json");
    const world = new World(file);
    const env = { LEDGER_ADDRESS: server.address, WORLD_FILE: file };
    const run = uniqueRun("reconcile");
    const timeout = () => new DOMException("the payments API did not answer", "TimeoutError");

    // The credit was issued, but the answer was lost: UNKNOWN.
    const happened = { customer: "c-42", amount: 200, currency: "EUR" };
    await assert.rejects(
      ledger.runOnce(run, "issue_credit", happened, (ctx) => {
        world.issueCredit(happened, ctx.externalRef);
        throw timeout();
      }),
      { name: "TimeoutError" },
    );
    // The request timed out before it reached the API: also UNKNOWN, as far as anyone knows.
    const lost = { customer: "c-43", amount: 50, currency: "EUR" };
    await assert.rejects(ledger.runOnce(run, "issue_credit", lost, () => Promise.reject(timeout())), { name: "TimeoutError" });
    // A tool the module does not export: never the reconciler's to settle.
    await assert.rejects(ledger.runOnce(run, "open_ticket", { subject: "refund" }, () => Promise.reject(timeout())), {
      name: "TimeoutError",
    });
    const before = await ledger.lookup({ runId: run, tool: "issue_credit", args: happened });
    assert.equal(before.status, "UNKNOWN");
    await assert.rejects(ledger.runOnce(run, "issue_credit", happened, () => "never"), InProgressError);

    const cli = join(PACKAGE_ROOT, "dist/src/cli/reconciler.js");
    const tools = join(PACKAGE_ROOT, "dist/examples/paired-reads.js");
    const out = await runScript(cli, [tools, "--once", "--older-than", "0s", "--principal", "night-shift"], env);
    assert.equal(out.code, 0, out.stderr);
    assert.match(
      out.stderr,
      new RegExp(`settled key=${before.key} tool=issue_credit external_ref=${before.externalRef} outcome=found status=SUCCEEDED resolved_by=night-shift`),
    );
    assert.match(out.stderr, /tool=issue_credit external_ref=idem-[0-9a-f]{16} outcome=not_found status=FAILED resolved_by=night-shift/);
    assert.doesNotMatch(out.stderr, /open_ticket/);
    assert.match(out.stderr, /handed out 2, settled 2 \(found 1, not found 1\), cannot tell 0, findings not applied 0 \(stale 0, already resolved 0\), gone 0; nothing more handed out/);

    const found = await ledger.lookup({ key: before.key });
    assert.equal(found.status, "SUCCEEDED");
    assert.equal(found.resolvedBy, "night-shift");
    const credit = world.findCredit(before.externalRef)!;
    assert.equal(new TextDecoder().decode(found.result), JSON.stringify({ credit_id: credit.credit_id }));
    const notFound = await ledger.lookup({ runId: run, tool: "issue_credit", args: lost });
    assert.equal(notFound.status, "FAILED");
    assert.equal(notFound.retryable, true);
    assert.equal((await ledger.lookup({ runId: run, tool: "open_ticket", args: { subject: "refund" } })).status, "UNKNOWN");

    // The model's next call: the credit that happened is replayed, the lost one is retried.
    let calls = 0;
    const replay = await ledger.runOnce(run, "issue_credit", happened, () => ++calls);
    assert.equal(replay.replayed, true);
    assert.deepEqual(replay.value, { credit_id: credit.credit_id });
    const retried = await ledger.runOnce(run, "issue_credit", lost, (ctx) => {
      calls++;
      return { credit_id: world.issueCredit(lost, ctx.externalRef).credit_id, attempt: ctx.attempt };
    });
    assert.equal(calls, 1);
    assert.equal((retried.value as { attempt: number }).attempt, 2);
    assert.equal(world.credits().length, 2);

    // Nothing of its tools is left; it says so and exits.
    const idle = await runScript(cli, [tools, "--once", "--older-than", "0s"], env);
    assert.equal(idle.code, 0, idle.stderr);
    assert.match(idle.stderr, /handed out 0, settled 0 .*; nothing more handed out/);
  });

  test("the reconciler process refuses a module without tools, and a bad flag, with why", async () => {
    const cli = join(PACKAGE_ROOT, "dist/src/cli/reconciler.js");
    const usage = await runScript(cli, [], {});
    assert.equal(usage.code, 2);
    assert.match(usage.stderr, /usage: idempotency-ledger-reconciler TOOLS_MODULE/);
    const bad = await runScript(cli, [join(PACKAGE_ROOT, "dist/examples/paired-reads.js"), "--older-than", "soon"], {
      LEDGER_ADDRESS: server.address,
    });
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /--older-than: expected a duration such as 250ms, 10s, 5m or 1h, got "soon"/);
    const none = await runScript(cli, [join(PACKAGE_ROOT, "dist/examples/script.js")], { LEDGER_ADDRESS: server.address });
    assert.equal(none.code, 1);
    assert.match(none.stderr, /no tool registered with this ledger has a paired read/);
    // A plain JavaScript tool module whose paired read takes the reference and the attempt's number
    // as two parameters (it is given one object): refused before it could answer "not found".
    const positional = join(server.dir, "positional-read.mjs");
    writeFileSync(
      positional,
      "export const tools = [{ name: 'issue_credit', confirm: (externalRef, attempt) => ({ kind: 'not_found' }) }];\n",
    );
    const refused = await runScript(cli, [positional, "--once"], { LEDGER_ADDRESS: server.address });
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /Reconciler: the tool issue_credit: confirm declares 2 parameters, but it is called with one: the attempt/);
    assert.doesNotMatch(refused.stderr, /settled/);
  });
});

// examples/approvals.ts: refunds over 100 wait for a person in each framework's own approval
// step (the server's approval policy), against a server with an agent's and an approver's token;
// the model asks for two refunds in one step.
describe("examples/approvals.ts (a person in the loop)", () => {
  let server: TestServer;
  let ledger: Ledger;
  let approver: Ledger;
  before(async () => {
    server = await startServer({
      tokens: [
        ["acme", "tok-agent"],
        ["acme", "tok-dana", "approver=dana"],
      ],
      approvalPolicy: "*  issue_refund  /amount  >  100\n",
    });
    ledger = server.ledger({ token: "tok-agent" });
    approver = server.ledger({ token: "tok-dana" });
  });
  after(async () => {
    await server.stop();
  });

  const all = (decision: "approve" | "deny", reason: string): Decide => () => ({ decision, reason });
  const plays = { "openai-agents": openAiAgentsApproval, "ai-sdk": aiSdkApproval, mcp: mcpApproval };
  for (const [name, play] of Object.entries(plays)) {
    test(`${name}: two refunds in one step, decided in the app: approved, each happens once; denied, the model reads the person's reason and nothing happens`, async () => {
      const approved = await play(ledger, approver, uniqueRun(`${name}-yes`), all("approve", "checked the order"));
      assert.deepEqual(approved.refunds.sort(), ["o-1:250", "o-2:400"]);
      assert.deepEqual(approved.read.sort(), ['{"refund_id":"rf-o-1"}', '{"refund_id":"rf-o-2"}']);
      const denied = await play(ledger, approver, uniqueRun(`${name}-no`), all("deny", "the order was not returned"));
      assert.deepEqual(denied.refunds, []);
      assert.equal(denied.read.length, 2);
      for (const read of denied.read) assert.match(read, /the order was not returned/);
    });

    test(`${name}: one approved and one denied, decided in the console: the app answers both "approved" in the framework, and only the approved one happens`, async () => {
      const decide: Decide = ({ order }) =>
        order === "o-2" ? { decision: "approve", reason: "ok" } : { decision: "deny", reason: "o-1 was refunded by hand" };
      const out = await play(ledger, approver, uniqueRun(`${name}-console`), decide, "console");
      assert.deepEqual(out.refunds, ["o-2:400"]);
      assert.equal(out.read.length, 2);
      assert.ok(out.read.includes('{"refund_id":"rf-o-2"}'), out.read.join(" | "));
      assert.ok(out.read.some((r) => /o-1 was refunded by hand/.test(r)), out.read.join(" | "));
    });
  }

  test("the program runs without a model key: each framework, approved, then denied, then decided in the console", async () => {
    const env = { LEDGER_ADDRESS: server.address, LEDGER_TOKEN: "tok-agent", APPROVER_TOKEN: "tok-dana", OPENAI_API_KEY: "" };
    const yes = await runExample("approvals", env);
    assert.equal(yes.code, 0, yes.stderr);
    for (const name of ["openai-agents", "ai-sdk", "mcp"]) {
      assert.match(yes.stdout, new RegExp(`^${name}: approve -> 2 refund\\(s\\); the model read: \\{"refund_id":"rf-o-\\d"\\} \\| \\{"refund_id":"rf-o-\\d"\\}$`, "m"));
    }
    const no = await runExample("approvals", { ...env, DECISION: "deny", REASON: "not returned yet" });
    assert.equal(no.code, 0, no.stderr);
    for (const name of ["openai-agents", "ai-sdk", "mcp"]) {
      assert.match(no.stdout, new RegExp(`^${name}: deny -> 0 refund\\(s\\); the model read: .*not returned yet.* \\| .*not returned yet`, "m"));
    }
    const console = await runExample("approvals", { ...env, DECIDED_IN: "console" });
    assert.equal(console.code, 0, console.stderr);
    for (const name of ["openai-agents", "ai-sdk", "mcp"]) {
      assert.match(console.stdout, new RegExp(`^${name}: approve -> 2 refund\\(s\\)`, "m"));
    }
  });
});
