// The examples, run as programs against the server: the dispatcher (one effect per intent, the
// replay marker shown to the model) and the reconciler (unknown outcomes resolved by asking the
// tool's paired read by external_ref).

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { World } from "../examples/world.js";
import { InProgressError, type Ledger } from "../src/index.js";
import { runExample, startServer, uniqueRun, type TestServer } from "./support/server.js";

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

  test("reconciler: unknown outcomes are resolved by the paired read, then replayed or retried", async () => {
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
    await assert.rejects(
      ledger.runOnce(run, "issue_credit", lost, () => {
        throw timeout();
      }),
      { name: "TimeoutError" },
    );
    const before = await ledger.lookup({ runId: run, tool: "issue_credit", args: happened });
    assert.equal(before.status, "UNKNOWN");
    assert.equal((await ledger.lookup({ runId: run, tool: "issue_credit", args: lost })).status, "UNKNOWN");
    await assert.rejects(ledger.runOnce(run, "issue_credit", happened, () => "never"), InProgressError);

    const out = await runExample("reconciler", { ...env, OLDER_THAN_MS: "0", TOOL: "issue_credit" });
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stdout, new RegExp(`${before.externalRef} found: it happened`));
    assert.match(out.stdout, /not found: it did not happen/);
    assert.match(out.stdout, /reconciled 2 entries/);

    const found = await ledger.lookup({ key: before.key });
    assert.equal(found.status, "SUCCEEDED");
    const credit = world.findCredit(before.externalRef)!;
    assert.equal(new TextDecoder().decode(found.result), JSON.stringify({ credit_id: credit.credit_id }));
    const notFound = await ledger.lookup({ runId: run, tool: "issue_credit", args: lost });
    assert.equal(notFound.status, "FAILED");
    assert.equal(notFound.retryable, true);

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

    // Nothing is left to reconcile.
    const idle = await runExample("reconciler", { ...env, OLDER_THAN_MS: "0" });
    assert.equal(idle.code, 0, idle.stderr);
    assert.match(idle.stdout, /reconciled 0 entries/);
  });
});
