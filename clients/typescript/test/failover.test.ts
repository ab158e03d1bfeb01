// The client rides out a failover: Claim, Lookup, RenewLease and Complete are sent again while
// the ledger answers UNAVAILABLE (after its RetryInfo delay, jittered) within the retry budget,
// so a restart of the ledger's PostgreSQL, or a cut connection, in the middle of a tool call
// changes no outcome and nothing the model reads. A real PostgreSQL cluster the test starts
// (restarted with `pg_ctl stop -m immediate`, then started again), the real server on it, and a
// TCP proxy between the client and the server that the test cuts.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Ledger, UnavailableError, toLedgerError } from "../src/index.js";
import { Payments, sleep } from "./support/payments.js";
import { postgresMissing, startPostgres, type PgCluster } from "./support/postgres.js";
import { startProxy, type TcpProxy } from "./support/proxy.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

const skip = postgresMissing();

describe("riding out a failover", { skip }, () => {
  let pg: PgCluster;
  let server: TestServer;
  let proxy: TcpProxy;
  let ledger: Ledger;
  /** Every call the client sent: when, which, and the RetryInfo delay of an UNAVAILABLE answer. */
  const sent: Array<{ at: number; method: string; retryAfter?: number; code?: string }> = [];
  const recording: Interceptor = (next) => async (req) => {
    const call = { at: Date.now(), method: req.method.name };
    sent.push(call);
    try {
      return await next(req);
    } catch (err) {
      const e = toLedgerError(err);
      Object.assign(call, { code: e.code, retryAfter: e.retryAfter });
      throw err;
    }
  };
  before(async () => {
    pg = await startPostgres();
    server = await startServer({ databaseUrl: pg.url });
    proxy = await startProxy(server.address);
    const transport = createGrpcTransport({ baseUrl: `http://${proxy.address}`, interceptors: [recording] });
    ledger = new Ledger({ address: proxy.address, deadlineMs: 5_000, transport });
  });
  after(async () => {
    await server?.stop();
    await proxy?.close();
    await pg?.destroy();
  });

  /** Restarts PostgreSQL: killed at once, started again after `downMs`. */
  async function restartPostgres(downMs: number): Promise<void> {
    await pg.crash();
    await sleep(downMs);
    await pg.start();
  }

  test("PostgreSQL restarted while the tool runs: the Complete waits it out; SUCCEEDED, one credit, the model reads the result", async () => {
    const world = new Payments();
    const run = uniqueRun("pg-restart");
    const args = { customer: "c-1", amount: 5 };
    let restarted: Promise<void> | undefined;
    const out = await ledger.runTool(run, "issue_credit", args, (ctx) => {
      const credit = world.issue(args, ctx.externalRef);
      // The database goes down after the effect and before the Complete, and is back in 3 s.
      restarted = restartPostgres(3_000);
      return sleep(200).then(() => credit);
    });
    await restarted;
    assert.equal(out.outcome, "performed", out.note);
    // The Complete was answered UNAVAILABLE with the server's RetryInfo, and sent again no
    // sooner than that delay each time, until it was recorded.
    const completes = sent.filter((c) => c.method === "Complete");
    const refused = completes.filter((c) => c.code === "UNAVAILABLE");
    assert.ok(refused.length >= 1, JSON.stringify(completes));
    assert.equal(completes.at(-1)?.code, undefined, "the last one was answered");
    for (let i = 1; i < completes.length; i++) {
      const asked = completes[i - 1].retryAfter ?? 100;
      assert.ok(completes[i].at - completes[i - 1].at >= asked - 5, `sent again ${completes[i].at - completes[i - 1].at} ms after a ${asked} ms RetryInfo`);
    }
    assert.equal(out.toModelText(), '{"credit_id":"cr-1"}');
    assert.equal(out.entry?.status, "SUCCEEDED");
    const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args });
    assert.equal(entry.status, "SUCCEEDED");
    const again = await ledger.runTool(run, "issue_credit", args, () => world.issue(args, "never"));
    assert.equal(again.outcome, "replayed");
    assert.equal(world.credits.length, 1);
  });

  test("a tool called while PostgreSQL is down: the Claim waits it out, then the tool runs once", async () => {
    const world = new Payments();
    const run = uniqueRun("pg-down");
    const args = { customer: "c-2", amount: 7 };
    await pg.crash();
    const back = sleep(3_000).then(() => pg.start());
    const started = Date.now();
    const out = await ledger.runTool(run, "issue_credit", args, (ctx) => world.issue(args, ctx.externalRef));
    await back;
    assert.equal(out.outcome, "performed", out.note);
    assert.ok(Date.now() - started >= 2_500, "it did wait for the database");
    assert.equal(world.credits.length, 1);
    assert.equal((await ledger.lookup({ runId: run, tool: "issue_credit", args })).status, "SUCCEEDED");
  });

  test("the connection to the ledger cut while the tool runs: SUCCEEDED once it is back, one credit", async () => {
    const world = new Payments();
    const run = uniqueRun("cut");
    const args = { customer: "c-3", amount: 9 };
    const out = await ledger.runTool(run, "issue_credit", args, async (ctx) => {
      const credit = world.issue(args, ctx.externalRef);
      proxy.cut();
      setTimeout(() => proxy.restore(), 2_000);
      return credit;
    });
    assert.equal(out.outcome, "performed", out.note);
    assert.equal(out.entry?.status, "SUCCEEDED");
    const again = await ledger.runTool(run, "issue_credit", args, () => world.issue(args, "never"));
    assert.equal(again.outcome, "replayed");
    assert.equal(world.credits.length, 1);
  });

  test("past the budget the last UNAVAILABLE is thrown, and a tool call is not performed", async () => {
    proxy.cut();
    try {
      const started = Date.now();
      const before = sent.length;
      await assert.rejects(ledger.lookup({ key: "k" }, { retryBudgetMs: 1_000 }), UnavailableError);
      const elapsed = Date.now() - started;
      // Sent again (a doubling backoff from 100 ms: nobody answers), and given up before the
      // next wait would pass the budget.
      assert.ok(sent.slice(before).length >= 3, `sent ${sent.slice(before).length} times`);
      assert.ok(elapsed >= 300 && elapsed <= 1_500, `gave up after ${elapsed} ms`);
      const world = new Payments();
      const short = server.ledger({ address: proxy.address, retryBudgetMs: 1_000 });
      const out = await short.runTool(uniqueRun("gone"), "issue_credit", { customer: "c-4", amount: 1 }, (ctx) =>
        world.issue({ customer: "c-4", amount: 1 }, ctx.externalRef),
      );
      assert.equal(out.outcome, "not_executed");
      assert.match(out.toModelText(), /ledger could not be asked whether it already ran \(UNAVAILABLE/);
      assert.equal(world.credits.length, 0);
    } finally {
      proxy.restore();
    }
  });
});
