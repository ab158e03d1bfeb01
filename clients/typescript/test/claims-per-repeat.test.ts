// One Claim per repeat (issue 35, item 6): runOnce sends its wait with `wait_for:
// WAIT_FOR_ATTEMPT`, so the one Claim of a repeat waits for an attempt in flight and replays its
// result, and a repeat of a call awaiting a person's decision is answered at once (a decision
// may take days) rather than held for the whole wait. Counted on the wire: the repeat's Ledger
// sends through an interceptor that keeps every Claim it sends (a resend counts too), against
// the real server with an approval policy.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { WaitFor as PbWaitFor, type ClaimRequest } from "../src/gen/idempotency/v1/ledger_pb.js";
import { AwaitingApprovalError, Ledger } from "../src/index.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

/** A Ledger whose every Claim sent is kept, in order. */
function countingLedger(address: string, token: string): { ledger: Ledger; claims: ClaimRequest[]; close(): void } {
  const claims: ClaimRequest[] = [];
  const baseUrl = `http://${address}`;
  const sessions = new Http2SessionManager(baseUrl);
  const transport = createGrpcTransport({
    baseUrl,
    sessionManager: sessions,
    interceptors: [
      (next) => async (req) => {
        req.header.set("authorization", `Bearer ${token}`);
        if (req.method.name === "Claim") claims.push(req.message as ClaimRequest);
        return next(req);
      },
    ],
  });
  return { ledger: new Ledger({ address, transport }), claims, close: () => sessions.abort() };
}

describe("one Claim per repeat (runOnce's wait is for an attempt in flight only)", () => {
  let server: TestServer;
  let agent: Ledger;
  let counted: ReturnType<typeof countingLedger>;
  before(async () => {
    server = await startServer({
      tokens: [
        ["acme", "tok-agent"],
        ["acme", "tok-dana", "approver=dana"],
      ],
      approvalPolicy: "*  issue_refund  /amount  >  100\n",
    });
    agent = server.ledger({ token: "tok-agent" });
    counted = countingLedger(server.address, "tok-agent");
  });
  after(async () => {
    counted.close();
    await server.stop();
  });

  test("a repeat meeting an attempt in flight sends one Claim, which waits for the attempt and replays its result", async () => {
    const runId = uniqueRun("in-flight");
    const args = { order: "o-1", amount: 20 };
    let release!: () => void;
    const released = new Promise<void>((done) => (release = done));
    let started!: () => void;
    const running = new Promise<void>((done) => (started = done));
    const first = agent.runOnce(runId, "issue_refund", args, async () => {
      started();
      await released;
      return { refund_id: "rf-1" };
    });
    await running;
    let repeatActed = 0;
    const before = counted.claims.length;
    const repeat = counted.ledger.runOnce(runId, "issue_refund", args, () => ++repeatActed, { waitMs: 20_000 });
    // Released once the repeat's Claim is on its way: either order ends in one effect.
    while (counted.claims.length === before) await new Promise((r) => setImmediate(r));
    release();
    const [done, replay] = await Promise.all([first, repeat]);
    assert.equal(repeatActed, 0, "the repeat ran nothing");
    assert.equal(replay.replayed, true);
    assert.deepEqual(replay.value, done.value);
    const sent = counted.claims.slice(before);
    assert.equal(sent.length, 1, "one Claim");
    assert.equal(sent[0].waitFor, PbWaitFor.ATTEMPT);
    assert.equal(Number(sent[0].wait?.seconds), 20);
  });

  test("a repeat of a call awaiting a person's decision sends one Claim and is answered at once, not after its 20 s wait; approved, the next one acts in one Claim", async () => {
    const runId = uniqueRun("awaiting");
    const args = { order: "o-2", amount: 250 };
    let acted = 0;
    const act = () => ({ refund_id: `rf-${++acted}` });
    const asked = await agent.runOnce(runId, "issue_refund", args, act).catch((e: unknown) => e);
    assert.ok(asked instanceof AwaitingApprovalError, String(asked));

    const before = counted.claims.length;
    const started = Date.now();
    const repeat = await counted.ledger.runOnce(runId, "issue_refund", args, act, { waitMs: 20_000 }).catch((e: unknown) => e);
    const took = Date.now() - started;
    assert.ok(repeat instanceof AwaitingApprovalError, String(repeat));
    assert.equal(acted, 0);
    // A quarter of the wait: far from a race with the clock, and far from being held for it.
    assert.ok(took < 5_000, `answered after ${took} ms: held for the decision`);
    const sent = counted.claims.slice(before);
    assert.equal(sent.length, 1, "one Claim");
    assert.equal(sent[0].waitFor, PbWaitFor.ATTEMPT);
    assert.equal(Number(sent[0].wait?.seconds), 20, "the wait was sent: only what it waits for changed");

    // runTool, what every adapter calls: the same one Claim, the model reads the awaiting note.
    const toolBefore = counted.claims.length;
    const read = await counted.ledger.runTool(runId, "issue_refund", args, act, { waitMs: 20_000 });
    assert.equal(read.outcome, "awaiting_approval");
    assert.equal(counted.claims.length - toolBefore, 1);

    const approver = server.ledger({ token: "tok-dana" });
    await approver.decide(repeat.key, repeat.fingerprint, "APPROVE", "checked the order");
    const afterDecision = counted.claims.length;
    const done = await counted.ledger.runOnce(runId, "issue_refund", args, act, { waitMs: 20_000 });
    assert.deepEqual(done.value, { refund_id: "rf-1" });
    assert.equal(acted, 1, "one effect");
    assert.equal(counted.claims.length - afterDecision, 1, "one Claim, CLAIMED");
  });
});
