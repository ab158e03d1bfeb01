// Tenant credentials: a server with a tokens file. The bearer token selects the tenant; a
// missing or wrong token is UnauthenticatedError; another tenant's key reads as absent.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { NotFoundError, UnauthenticatedError, type Ledger } from "../src/index.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

describe("tenant credentials", () => {
  let server: TestServer;
  let tenantA: Ledger;
  let tenantB: Ledger;
  before(async () => {
    server = await startServer({ tokens: [["acme", "token-acme-1"], ["globex", "token-globex-1"]] });
    tenantA = server.ledger({ token: "token-acme-1" });
    tenantB = server.ledger({ token: async () => "token-globex-1" });
  });
  after(async () => {
    await server.stop();
  });

  test("the server runs with credentials", () => {
    assert.match(server.log(), /2 tenants by bearer token/);
  });

  test("no token is UnauthenticatedError", async () => {
    const anonymous = server.ledger();
    const err = await anonymous.claim({ runId: "r", tool: "t", args: "{}" }).catch((e: unknown) => e);
    assert.ok(err instanceof UnauthenticatedError, String(err));
    assert.equal(err.code, "UNAUTHENTICATED");
    assert.equal(err.reason, "UNAUTHENTICATED");
  });

  test("a wrong token is UnauthenticatedError", async () => {
    const wrong = server.ledger({ token: "token-acme-2" });
    const err = await wrong.lookup({ key: "k" }).catch((e: unknown) => e);
    assert.ok(err instanceof UnauthenticatedError, String(err));
    assert.equal(err.reason, "UNAUTHENTICATED");
  });

  test("tenant B cannot see, complete or replay tenant A's key: NotFoundError", async () => {
    const run = uniqueRun("tenant");
    const args = { customer: "c-1", amount: 9 };
    const a = await tenantA.runOnce(run, "issue_credit", args, () => ({ credit_id: "cr-a" }));
    assert.equal(a.replayed, false);
    assert.equal((await tenantA.lookup({ key: a.entry.key })).status, "SUCCEEDED");

    const byKey = await tenantB.lookup({ key: a.entry.key }).catch((e: unknown) => e);
    assert.ok(byKey instanceof NotFoundError, String(byKey));
    assert.equal(byKey.reason, "ENTRY_NOT_FOUND");
    const byArgs = await tenantB.lookup({ runId: run, tool: "issue_credit", args }).catch((e: unknown) => e);
    assert.ok(byArgs instanceof NotFoundError, String(byArgs));

    const claimA = await tenantA.claim({ runId: uniqueRun("tenant"), tool: "send_reply", args: {} });
    const complete = await tenantB
      .complete({ key: claimA.entry.key, claimToken: claimA.claimToken, status: "SUCCEEDED" })
      .catch((e: unknown) => e);
    assert.ok(complete instanceof NotFoundError, String(complete));

    // The same call in tenant B is its own intent: it runs there.
    let ranInB = 0;
    const b = await tenantB.runOnce(run, "issue_credit", args, () => {
      ranInB++;
      return { credit_id: "cr-b" };
    });
    assert.equal(ranInB, 1);
    assert.equal(b.replayed, false);
    assert.equal(b.entry.key, a.entry.key);
  });

  test("tenant B cannot reconcile tenant A's unknown entries", async () => {
    const run = uniqueRun("tenant-reconcile");
    await assert.rejects(
      tenantA.runOnce(run, "issue_credit", { amount: 1 }, () => {
        throw new DOMException("no answer", "TimeoutError");
      }),
      { name: "TimeoutError" },
    );
    const entry = await tenantA.lookup({ runId: run, tool: "issue_credit", args: { amount: 1 } });
    assert.equal(entry.status, "UNKNOWN");

    const seenByB = await tenantB.reconcile({ olderThanMs: 0, tool: "issue_credit", limit: 1000 });
    assert.ok(!seenByB.pending.some((e) => e.key === entry.key));
    const resolvedByB = await tenantB.reconcile({
      olderThanMs: 3_600_000,
      resolutions: [{ key: entry.key, attempt: entry.attempt, holdToken: "a-token-of-tenant-b", status: "SUCCEEDED", result: new Uint8Array([49]) }],
    });
    assert.deepEqual(resolvedByB.resolved, []);
    // Another tenant's key is no entry at all, to tenant B.
    assert.deepEqual(resolvedByB.results.map((r) => [r.key, r.result, r.entry]), [[entry.key, "NOT_FOUND", undefined]]);
    assert.equal((await tenantA.lookup({ key: entry.key })).status, "UNKNOWN");

    const seenByA = await tenantA.reconcile({ olderThanMs: 0, tool: "issue_credit", limit: 1000 });
    assert.ok(seenByA.pending.some((e) => e.key === entry.key));
  });
});
