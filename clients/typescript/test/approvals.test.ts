// Approvals in the client, against the real server with an approval policy and an approver
// token: Claim's requireApproval and the policy's gate (AWAITING_APPROVAL with the entry's
// approval), decide (approve: the next call acts once; deny: every repeat reads the person's
// reason), the typed errors of decide (mismatch, already decided, not awaiting, an agent's token),
// runOnce and runTool on a gated call (nothing acts on an approval the ledger has not given),
// extendRun, and watchApprovals resumed from a cursor.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  AlreadyDecidedError,
  ApprovalMismatchError,
  ApproverRoleRequiredError,
  AwaitingApprovalError,
  DeniedError,
  FailedPreconditionError,
  NotAwaitingApprovalError,
  PermissionDeniedError,
  type ApprovalEvent,
  type Ledger,
} from "../src/index.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

const POLICY = "*  issue_refund  /amount  >  100\n";

describe("approvals", () => {
  let server: TestServer;
  let agent: Ledger;
  let approver: Ledger;
  before(async () => {
    server = await startServer({
      tokens: [
        ["acme", "tok-agent"],
        ["acme", "tok-dana", "approver=dana@acme.example"],
      ],
      approvalPolicy: POLICY,
    });
    agent = server.ledger({ token: "tok-agent" });
    approver = server.ledger({ token: "tok-dana" });
  });
  after(async () => {
    await server.stop();
  });

  test("the policy gates a refund over 100: AWAITING_APPROVAL with the entry's approval; 100 is not gated", async () => {
    const runId = uniqueRun("policy");
    const gated = await agent.claim({ runId, tool: "issue_refund", args: { order: "o-1", amount: 250 } });
    assert.equal(gated.outcome, "AWAITING_APPROVAL");
    assert.equal(gated.claimToken, "");
    assert.match(gated.note, /.+/);
    assert.equal(gated.entry.status, "AWAITING_APPROVAL");
    assert.equal(gated.entry.approval?.state, "REQUESTED");
    assert.ok(gated.entry.approval?.decideBy instanceof Date && gated.entry.approval.decideBy > new Date());
    assert.match(gated.entry.fingerprint, /^[0-9a-f]{64}$/);
    const small = await agent.claim({ runId, tool: "issue_refund", args: { order: "o-2", amount: 100 } });
    assert.equal(small.outcome, "CLAIMED");
    assert.equal(small.entry.approval, undefined);
  });

  test("requireApproval gates a call the policy does not", async () => {
    const runId = uniqueRun("require");
    const gated = await agent.claim({ runId, tool: "send_wire", args: { to: "x" }, requireApproval: true });
    assert.equal(gated.outcome, "AWAITING_APPROVAL");
  });

  test("approve: the next runOnce acts once, recorded as the approver's credential says; repeats replay", async () => {
    const runId = uniqueRun("approve");
    const args = { order: "o-3", amount: 500 };
    let effects = 0;
    const act = () => ({ refund: ++effects });
    // The default wait (10 s) is for an attempt in flight: a call awaiting a person answers at once.
    const first = await agent.runOnce(runId, "issue_refund", args, act).catch((e: unknown) => e);
    assert.ok(first instanceof AwaitingApprovalError, String(first));
    assert.equal(effects, 0, "nothing acts while a person is asked");
    assert.equal(first.approval?.state, "REQUESTED");
    assert.equal(first.key, first.entry.key);
    const decided = await approver.decide(first.key, first.fingerprint, "APPROVE", "checked the order");
    assert.equal(decided.approval?.state, "APPROVED");
    assert.equal(decided.approval?.decidedBy, "dana@acme.example");
    assert.equal(decided.approval?.reason, "checked the order");
    assert.ok(decided.approval?.executeBy instanceof Date);
    // The same decision again changes nothing.
    assert.equal((await approver.decide(first.key, first.fingerprint, "approve", "again")).approval?.state, "APPROVED");
    const done = await agent.runOnce(runId, "issue_refund", args, act);
    assert.deepEqual([done.value, done.replayed, effects], [{ refund: 1 }, false, 1]);
    assert.equal(done.entry.approval?.state, "USED");
    const again = await agent.runOnce(runId, "issue_refund", args, act);
    assert.deepEqual([again.value, again.replayed, effects], [{ refund: 1 }, true, 1]);
  });

  test("deny: nothing acts, ever; runTool reads the ledger's denial note with the person's reason", async () => {
    const runId = uniqueRun("deny");
    const args = { order: "o-4", amount: 900 };
    let effects = 0;
    const act = () => ++effects;
    const asked = await agent.runTool(runId, "issue_refund", args, act);
    assert.equal(asked.outcome, "awaiting_approval");
    assert.equal(asked.toModelText(), asked.note);
    assert.match(asked.note, /.+/);
    const entry = asked.entry!;
    await approver.decide(entry.key, entry.fingerprint, "DENY", "the order was never delivered");
    const denied = await agent.runTool(runId, "issue_refund", args, act);
    assert.equal(denied.outcome, "denied");
    assert.match(denied.toModelText(), /the order was never delivered/);
    assert.equal(denied.entry?.approval?.decidedBy, "dana@acme.example");
    const thrown = await agent.runOnce(runId, "issue_refund", args, act).catch((e: unknown) => e);
    assert.ok(thrown instanceof DeniedError);
    assert.equal(thrown.approval?.reason, "the order was never delivered");
    assert.equal(effects, 0);
  });

  test("decide's refusals are typed and change nothing", async () => {
    const runId = uniqueRun("refusals");
    const gated = await agent.claim({ runId, tool: "issue_refund", args: { order: "o-5", amount: 300 } });
    const { key, fingerprint } = gated.entry;
    const other = await agent.claim({ runId, tool: "issue_refund", args: { order: "o-5", amount: 301 } });

    const agentTries = await agent.decide(key, fingerprint, "APPROVE", "").catch((e: unknown) => e);
    assert.ok(agentTries instanceof ApproverRoleRequiredError, String(agentTries));
    assert.ok(agentTries instanceof PermissionDeniedError);
    assert.equal(agentTries.code, "PERMISSION_DENIED");
    assert.equal(agentTries.reason, "APPROVER_ROLE_REQUIRED");

    const mismatch = await approver.decide(key, other.entry.fingerprint, "APPROVE", "").catch((e: unknown) => e);
    assert.ok(mismatch instanceof ApprovalMismatchError, String(mismatch));
    assert.ok(mismatch instanceof FailedPreconditionError);
    assert.equal((await agent.lookup({ key })).approval?.state, "REQUESTED", "a mismatch changes nothing");

    await approver.decide(key, fingerprint, "DENY", "no");
    const conflicting = await approver.decide(key, fingerprint, "APPROVE", "yes").catch((e: unknown) => e);
    assert.ok(conflicting instanceof AlreadyDecidedError, String(conflicting));
    assert.equal((await agent.lookup({ key })).status, "DENIED");

    const plain = await agent.claim({ runId, tool: "issue_refund", args: { order: "o-6", amount: 1 } });
    const notAwaiting = await approver
      .decide(plain.entry.key, plain.entry.fingerprint, "APPROVE", "")
      .catch((e: unknown) => e);
    assert.ok(notAwaiting instanceof NotAwaitingApprovalError, String(notAwaiting));
    await assert.rejects(approver.decide(key, fingerprint, "MAYBE" as never, ""), TypeError);
  });

  test("needsApproval (the adapters' check): a gated call answers true; another is claimed once, its claim taken up by the call with the same callId, or released FAILED retryable when no call comes", async () => {
    const runId = uniqueRun("check");
    assert.equal(await agent.needsApproval(runId, "issue_refund", { order: "o-8", amount: 800 }, { callId: "c-1" }), true);
    assert.equal(await agent.needsApproval(runId, "issue_refund", { order: "o-8", amount: 800 }, { callId: "c-1" }), true, "asked again: still waiting");
    assert.equal(await agent.needsApproval(runId, "send_wire", { to: "y" }, { callId: "c-2", requireApproval: true }), true);

    // Not gated: claimed by the check, and the call with the same callId acts on that claim.
    const small = { order: "o-9", amount: 5 };
    assert.equal(await agent.needsApproval(runId, "issue_refund", small, { callId: "c-3" }), false);
    assert.equal((await agent.lookup({ runId, tool: "issue_refund", args: small })).status, "ATTEMPTING");
    let effects = 0;
    const done = await agent.runOnce(runId, "issue_refund", small, () => ++effects, { callId: "c-3", waitMs: 0 });
    assert.deepEqual([done.value, done.replayed, done.entry.attempt, effects], [1, false, 1, 1]);

    // A check whose call never comes (the framework did not run the tool): released, retryable.
    const orphan = { order: "o-10", amount: 6 };
    assert.equal(await agent.needsApproval(runId, "issue_refund", orphan, { callId: "c-4", leaseMs: 2_000 }), false);
    await new Promise((r) => setTimeout(r, 1_500));
    const released = await agent.lookup({ runId, tool: "issue_refund", args: orphan });
    assert.deepEqual([released.status, released.retryable], ["FAILED", true]);
    const later = await agent.runOnce(runId, "issue_refund", orphan, () => ++effects);
    assert.deepEqual([later.entry.attempt, effects], [2, 2]);

    // Without a call id the check keeps no claim: released at once.
    const unkept = { order: "o-11", amount: 7 };
    assert.equal(await agent.needsApproval(runId, "issue_refund", unkept), false);
    const entry = await agent.lookup({ runId, tool: "issue_refund", args: unkept });
    assert.deepEqual([entry.status, entry.retryable], ["FAILED", true]);
  });

  test("extendRun keeps a run's finished entries at least that long", async () => {
    const runId = uniqueRun("extend");
    await agent.runOnce(runId, "send_reply", { text: "hi" }, () => "ok", { retentionMs: 60_000 });
    const out = await agent.extendRun(runId, 3_600_000);
    assert.equal(out.extended, 1);
    assert.ok(out.keptUntil && out.keptUntil.getTime() > Date.now() + 3_500_000);
    const entry = await agent.lookup({ runId, tool: "send_reply", args: { text: "hi" } });
    assert.ok(entry.expiresAt!.getTime() > Date.now() + 3_500_000);
    // Never shortened.
    assert.equal((await agent.extendRun(runId, 60_000)).extended, 0);
  });

  test("watchApprovals: requests and decisions as they happen, resumed after the last cursor", async () => {
    const runId = uniqueRun("watch");
    const controller = new AbortController();
    const seen: ApprovalEvent[] = [];
    const first = (async () => {
      for await (const event of approver.watchApprovals({}, { signal: controller.signal })) {
        if (event.entry.runId !== runId) continue;
        seen.push(event);
        if (seen.length === 1) break;
      }
    })();
    // The stream is open before the request is made (an empty cursor starts from now).
    await new Promise((r) => setTimeout(r, 300));
    const gated = await agent.claim({ runId, tool: "issue_refund", args: { order: "o-7", amount: 700 } });
    await first;
    assert.equal(seen[0].kind, "requested");
    assert.equal(seen[0].entry.key, gated.entry.key);
    assert.equal(seen[0].entry.approval?.state, "REQUESTED");
    assert.match(seen[0].cursor, /.+/);

    // Decided while nobody watches; resumed from the last cursor, the decision is there.
    await approver.decide(gated.entry.key, gated.entry.fingerprint, "APPROVE", "fine");
    for await (const event of approver.watchApprovals({ cursor: seen[0].cursor }, { signal: controller.signal })) {
      if (event.entry.runId !== runId) continue;
      seen.push(event);
      break;
    }
    assert.equal(seen[1].kind, "approved");
    assert.equal(seen[1].principal, "dana@acme.example");
    assert.equal(seen[1].entry.approval?.decidedBy, "dana@acme.example");
    controller.abort();
  });
});
