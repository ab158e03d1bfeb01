// RenewLease against the real server (the RPC, its refusals), runOnce renewing the lease of a
// slow action by itself (a duplicate sees the attempt in flight, not UNKNOWN, and renewals stop
// with the action), and Reconcile's resolve_only.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  InvalidArgumentError,
  LeaseEndedError,
  RENEW_EVERY_FRACTION_OF_LEASE,
  StaleClaimTokenError,
  type Ledger,
  type LedgerEntry,
} from "../src/index.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Reads the entry until `done` holds (the server decides when; the loop only looks). */
async function until(ledger: Ledger, key: string, done: (e: LedgerEntry) => boolean): Promise<LedgerEntry> {
  for (;;) {
    const e = await ledger.lookup({ key });
    if (done(e)) return e;
    await sleep(50);
  }
}

/** Counts the RenewLease calls a ledger makes (runOnce calls the instance's method). */
function countRenewals(ledger: Ledger): { count(): number; leases: Array<number | undefined> } {
  const real = ledger.renewLease.bind(ledger);
  const leases: Array<number | undefined> = [];
  ledger.renewLease = (key, token, leaseMs, opts) => {
    leases.push(leaseMs);
    return real(key, token, leaseMs, opts);
  };
  return { count: () => leases.length, leases };
}

describe("RenewLease", () => {
  let server: TestServer;
  let ledger: Ledger;
  before(async () => {
    server = await startServer({ args: ["--max-lease", "1m"] });
    ledger = server.ledger();
  });
  after(async () => {
    await server.stop();
  });

  test("the holder extends its lease, counted from now", async () => {
    const claim = await ledger.claim({ runId: uniqueRun("renew"), tool: "t", args: {}, leaseMs: 5_000 });
    const before = claim.entry.leaseExpiresAt!.getTime();
    const renewed = await ledger.renewLease(claim.entry.key, claim.claimToken, 50_000);
    assert.equal(renewed.status, "ATTEMPTING");
    assert.equal(renewed.key, claim.entry.key);
    assert.ok(renewed.leaseExpiresAt!.getTime() >= before + 45_000, "the new lease is 50 s from now");
    // Unset, the lease is the server's default (60 s), again counted from now.
    const byDefault = await ledger.renewLease(claim.entry.key, claim.claimToken);
    assert.ok(byDefault.leaseExpiresAt!.getTime() > renewed.leaseExpiresAt!.getTime());
    assert.equal((await ledger.lookup({ key: claim.entry.key })).leaseExpiresAt?.getTime(), byDefault.leaseExpiresAt?.getTime());
  });

  test("a wrong token is StaleClaimTokenError; a lease above --max-lease is InvalidArgumentError", async () => {
    const claim = await ledger.claim({ runId: uniqueRun("renew"), tool: "t", args: {} });
    await assert.rejects(
      ledger.renewLease(claim.entry.key, "0".repeat(32)),
      (e: unknown) => e instanceof StaleClaimTokenError && e.reason === "STALE_CLAIM_TOKEN",
    );
    await assert.rejects(
      ledger.renewLease(claim.entry.key, claim.claimToken, 2 * 60_000),
      (e: unknown) => e instanceof InvalidArgumentError && e.field === "lease",
    );
  });

  test("a resolved entry, or one whose lease ended, is LeaseEndedError and stays as it is", async () => {
    const done = await ledger.claim({ runId: uniqueRun("renew"), tool: "t", args: {} });
    await ledger.complete({ key: done.entry.key, claimToken: done.claimToken, status: "SUCCEEDED" });
    await assert.rejects(
      ledger.renewLease(done.entry.key, done.claimToken),
      (e: unknown) => e instanceof LeaseEndedError && e.reason === "LEASE_ENDED" && e.code === "FAILED_PRECONDITION",
    );
    assert.equal((await ledger.lookup({ key: done.entry.key })).status, "SUCCEEDED");

    // The claimant's own "I do not know" reads UNKNOWN too: a reconciler may be asking the world.
    const unknown = await ledger.claim({ runId: uniqueRun("renew"), tool: "t", args: {} });
    await ledger.complete({ key: unknown.entry.key, claimToken: unknown.claimToken, status: "UNKNOWN", error: "timed out" });
    await assert.rejects(ledger.renewLease(unknown.entry.key, unknown.claimToken), LeaseEndedError);
    assert.equal((await ledger.lookup({ key: unknown.entry.key })).status, "UNKNOWN");

    const lapsed = await ledger.claim({ runId: uniqueRun("renew"), tool: "t", args: {}, leaseMs: 200 });
    await until(ledger, lapsed.entry.key, (e) => e.status === "UNKNOWN");
    await assert.rejects(ledger.renewLease(lapsed.entry.key, lapsed.claimToken), LeaseEndedError);
    assert.equal((await ledger.lookup({ key: lapsed.entry.key })).status, "UNKNOWN");
  });
});

describe("runOnce renews the lease while the action runs", { concurrency: true }, () => {
  let server: TestServer;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server.stop();
  });

  /**
   * A 3 s action under a 1 s lease: once the lease would have ended twice over, a duplicate
   * claims the same intent; then the action finishes. Returns what the duplicate saw.
   */
  async function slowAction(label: string, renewLease: boolean) {
    const ledger = server.ledger();
    const renewals = countRenewals(ledger);
    const run = uniqueRun(label);
    const args = { ticket: "T-7", body: "slow" };
    let duplicate: Awaited<ReturnType<Ledger["claim"]>> | undefined;
    let calls = 0;
    const out = await ledger.runOnce(
      run,
      "send_reply",
      args,
      async (ctx) => {
        calls++;
        const claimedAt = ctx.entry.startedAt!.getTime();
        await sleep(Math.max(0, claimedAt + 2_000 - Date.now()));
        duplicate = await server.ledger().claim({ runId: run, tool: "send_reply", args });
        await sleep(Math.max(0, claimedAt + 3_000 - Date.now()));
        return { message_id: "msg-slow" };
      },
      { leaseMs: 1_000, renewLease },
    );
    return { ledger, out, duplicate: duplicate!, renewals, calls, run, args };
  }

  test("a duplicate during a 3 s action under a 1 s lease sees IN_PROGRESS, ATTEMPTING", async () => {
    const { ledger, out, duplicate, renewals, calls, run, args } = await slowAction("renewed", true);
    assert.equal(duplicate.outcome, "IN_PROGRESS");
    assert.equal(duplicate.entry.status, "ATTEMPTING", "the renewed attempt is in flight, not UNKNOWN");
    assert.ok((duplicate.retryAfter ?? 0) <= 1_000, "an attempt in flight is worth asking again soon");
    assert.equal(calls, 1);
    assert.equal(out.replayed, false);
    assert.equal(out.entry.status, "SUCCEEDED");
    // Every third of the lease for 3 s: about 9 renewals, each asking for the claim's lease.
    const during = renewals.count();
    assert.ok(during >= 5, `${during} renewals`);
    assert.ok(renewals.leases.every((l) => l === 1_000));
    // They stopped with the action.
    await sleep(3 * 1_000 * RENEW_EVERY_FRACTION_OF_LEASE);
    assert.equal(renewals.count(), during, "no renewal after the action ended");
    const replay = await ledger.runOnce(run, "send_reply", args, () => "never");
    assert.equal(replay.replayed, true);
    assert.deepEqual(replay.value, { message_id: "msg-slow" });
  });

  test("without renewals the same duplicate sees UNKNOWN (what the renewals prevent)", async () => {
    const { duplicate, renewals, out } = await slowAction("unrenewed", false);
    assert.equal(duplicate.outcome, "IN_PROGRESS");
    assert.equal(duplicate.entry.status, "UNKNOWN");
    assert.equal(renewals.count(), 0);
    // The late Complete with the claim's token is still accepted: nobody had resolved it.
    assert.equal(out.entry.status, "SUCCEEDED");
  });

  test("a claim with the server's default lease is renewed with it", async () => {
    const ledger = server.ledger();
    const renewals = countRenewals(ledger);
    // The server's default lease is 60 s: a renewal every 20 s, none in a short action.
    const out = await ledger.runOnce(uniqueRun("default-lease"), "t", {}, () => "quick");
    assert.equal(out.value, "quick");
    assert.equal(renewals.count(), 0);
  });
});

describe("Reconcile resolve_only", () => {
  let server: TestServer;
  let ledger: Ledger;
  before(async () => {
    server = await startServer();
    ledger = server.ledger();
  });
  after(async () => {
    await server.stop();
  });

  async function unknownEntry(label: string): Promise<LedgerEntry> {
    const run = uniqueRun(label);
    await assert.rejects(
      ledger.runOnce(run, "issue_credit", { amount: 1 }, () => {
        throw new DOMException("no answer", "TimeoutError");
      }),
    );
    const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: { amount: 1 } });
    assert.equal(entry.status, "UNKNOWN");
    return entry;
  }

  test("applies the resolutions and hands out nothing, holding nothing", async () => {
    const resolvedOne = await unknownEntry("resolve-only");
    const leftOver = await unknownEntry("resolve-only");
    // The finding is about the entry as it was handed out: its attempt and hold token.
    const { pending: [held] } = await ledger.reconcile({ keys: [resolvedOne.key] });
    assert.equal(held.key, resolvedOne.key);
    const out = await ledger.reconcile({
      resolveOnly: true,
      olderThanMs: 0,
      resolutions: [{ key: held.key, attempt: held.attempt, holdToken: held.holdToken, status: "FAILED", retryable: true, error: "not found" }],
    });
    assert.deepEqual(out.pending, []);
    assert.deepEqual(out.resolved.map((e) => [e.key, e.status, e.retryable]), [[resolvedOne.key, "FAILED", true]]);
    assert.deepEqual(out.results.map((r) => [r.key, r.result]), [[resolvedOne.key, "APPLIED"]]);
    assert.equal((await ledger.lookup({ key: leftOver.key })).status, "UNKNOWN");
    // Nothing was held for this caller: a plain Reconcile hands the other entry out at once.
    const next = await ledger.reconcile({ olderThanMs: 0, tool: "issue_credit", limit: 1000 });
    assert.ok(next.pending.some((e) => e.key === leftOver.key));
    assert.ok(!next.pending.some((e) => e.key === resolvedOne.key));
  });
});
