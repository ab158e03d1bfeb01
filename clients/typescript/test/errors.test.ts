// Typed errors decoded from the server's google.rpc details (ErrorInfo reason, BadRequest
// field), and the transport's own failures.

import assert from "node:assert/strict";
import { createServer as createHttp2Server } from "node:http2";
import { createServer } from "node:net";
import { after, before, describe, test } from "node:test";
import {
  AlreadyResolvedError,
  DeadlineExceededError,
  FailedPreconditionError,
  InvalidArgumentError,
  KeyReusedError,
  Ledger,
  LedgerError,
  NotFoundError,
  OutcomeUnknownError,
  ResultNotEncodableError,
  StaleClaimTokenError,
  UnavailableError,
} from "../src/index.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

async function rejection<T extends Error>(p: Promise<unknown>, cls: new (...a: never[]) => T): Promise<T> {
  const err = await p.then(
    () => assert.fail(`expected ${cls.name}`),
    (e: unknown) => e,
  );
  assert.ok(err instanceof cls, `expected ${cls.name}, got ${String(err)}`);
  assert.ok(err instanceof LedgerError);
  return err;
}

describe("typed errors", () => {
  let server: TestServer;
  let ledger: Ledger;
  before(async () => {
    server = await startServer({ args: ["--max-result-bytes", "1024"] });
    ledger = server.ledger();
  });
  after(async () => {
    await server.stop();
  });

  test("a duplicate member is InvalidArgumentError, reason DUPLICATE_MEMBER, field arguments_json", async () => {
    const err = await rejection(
      ledger.claim({ runId: uniqueRun("dup"), tool: "issue_credit", args: '{"a":1,"a":2}' }),
      InvalidArgumentError,
    );
    assert.equal(err.code, "INVALID_ARGUMENT");
    assert.equal(err.reason, "DUPLICATE_MEMBER");
    assert.equal(err.domain, "idempotency.v1");
    assert.equal(err.field, "arguments_json");
    assert.match(err.message, /duplicate member name "a" at byte 7/);
    assert.equal(err.local, false);
  });

  test("runOnce surfaces the same refusal and does not run the action", async () => {
    let calls = 0;
    const err = await rejection(
      ledger.runOnce(uniqueRun("dup"), "issue_credit", '{"n":9007199254740993}', () => ++calls),
      InvalidArgumentError,
    );
    assert.equal(err.reason, "UNSAFE_INTEGER");
    assert.equal(calls, 0);
  });

  test("a bad field names it: INVALID_FIELD", async () => {
    const err = await rejection(
      ledger.claim({ runId: uniqueRun("field"), tool: "", args: "{}" }),
      InvalidArgumentError,
    );
    assert.equal(err.reason, "INVALID_FIELD");
    assert.equal(err.field, "tool");
    const lease = await rejection(
      ledger.claim({ runId: uniqueRun("field"), tool: "t", args: "{}", leaseMs: 48 * 3600_000 }),
      InvalidArgumentError,
    );
    assert.equal(lease.field, "lease");
  });

  test("an explicit key reused with other arguments is KeyReusedError", async () => {
    const key = `wf-${uniqueRun("reuse")}:step-1`;
    const first = await ledger.claim({ tool: "issue_credit", args: { amount: 1 }, key });
    assert.equal(first.outcome, "CLAIMED");
    const err = await rejection(
      ledger.claim({ tool: "issue_credit", args: { amount: 2 }, key }),
      KeyReusedError,
    );
    assert.ok(err instanceof FailedPreconditionError);
    assert.equal(err.code, "FAILED_PRECONDITION");
    assert.equal(err.reason, "KEY_REUSED_WITH_DIFFERENT_REQUEST");
  });

  test("a wrong claim token is StaleClaimTokenError; a different outcome later is AlreadyResolvedError", async () => {
    const claim = await ledger.claim({ runId: uniqueRun("stale"), tool: "send_reply", args: { t: 1 } });
    const stale = await rejection(
      ledger.complete({ key: claim.entry.key, claimToken: "0".repeat(32), status: "SUCCEEDED" }),
      StaleClaimTokenError,
    );
    assert.equal(stale.reason, "STALE_CLAIM_TOKEN");
    const done = await ledger.complete({
      key: claim.entry.key,
      claimToken: claim.claimToken,
      status: "SUCCEEDED",
      result: new TextEncoder().encode('"sent"'),
    });
    assert.equal(done.alreadyCompleted, false);
    // Completes ask for the basic view (no echo of the result on the wire); the client puts the
    // result it sent back, so the entry reads as the full view's, which is Lookup's without
    // the audit arguments.
    assert.deepEqual(done.entry.result, new TextEncoder().encode('"sent"'));
    const stored = await ledger.lookup({ key: claim.entry.key });
    assert.deepEqual(done.entry, { ...stored, argumentsJson: "" });
    const again = await ledger.complete({
      key: claim.entry.key,
      claimToken: claim.claimToken,
      status: "SUCCEEDED",
      result: new TextEncoder().encode('"sent"'),
    });
    assert.equal(again.alreadyCompleted, true);
    const resolved = await rejection(
      ledger.complete({ key: claim.entry.key, claimToken: claim.claimToken, status: "FAILED", error: "no" }),
      AlreadyResolvedError,
    );
    assert.equal(resolved.reason, "ALREADY_RESOLVED");
  });

  test("a result over --max-result-bytes is RESULT_TOO_LARGE and changes nothing; runOnce then records UNKNOWN", async () => {
    const claim = await ledger.claim({ runId: uniqueRun("big"), tool: "t", args: {} });
    const err = await rejection(
      ledger.complete({ key: claim.entry.key, claimToken: claim.claimToken, status: "SUCCEEDED", result: new Uint8Array(2048) }),
      InvalidArgumentError,
    );
    assert.equal(err.reason, "RESULT_TOO_LARGE");
    assert.equal(err.field, "result");
    assert.equal((await ledger.lookup({ key: claim.entry.key })).status, "ATTEMPTING");

    // After the action ran, a refused result means the effect happened but cannot be replayed:
    // the entry is UNKNOWN, and the error says so and how to settle it.
    const run = uniqueRun("big");
    const tooBig = await rejection(
      ledger.runOnce(run, "t", { n: 1 }, () => "x".repeat(2048)),
      ResultNotEncodableError,
    );
    assert.ok(tooBig instanceof OutcomeUnknownError);
    assert.ok(tooBig.cause instanceof InvalidArgumentError);
    assert.equal(tooBig.cause.reason, "RESULT_TOO_LARGE");
    assert.equal(tooBig.entry.status, "UNKNOWN");
    assert.match(tooBig.message, /RESULT_TOO_LARGE/);
    assert.match(tooBig.message, /is UNKNOWN/);
    assert.match(tooBig.message, /Reconcile/);
    assert.match(tooBig.message, /idempotency-ledger resolve/);
    const entry = await ledger.lookup({ runId: run, tool: "t", args: { n: 1 } });
    assert.equal(entry.status, "UNKNOWN");
    assert.match(entry.error, /result could not be stored/);
  });

  test("a result the codec cannot encode: ResultNotEncodableError, the entry UNKNOWN", async () => {
    const run = uniqueRun("encode");
    let calls = 0;
    const err = await rejection(
      ledger.runOnce(run, "t", { n: 2 }, () => {
        calls++;
        return { n: 1n }; // JSON.stringify cannot write a bigint
      }),
      ResultNotEncodableError,
    );
    assert.equal(err.entry.status, "UNKNOWN");
    assert.match(err.message, /could not be stored/);
    assert.match(err.message, /BigInt/);
    assert.match(err.message, new RegExp(err.entry.key));
    assert.equal((await ledger.lookup({ runId: run, tool: "t", args: { n: 2 } })).status, "UNKNOWN");
    // Never re-run silently.
    await rejection(ledger.runOnce(run, "t", { n: 2 }, () => ++calls), OutcomeUnknownError);
    assert.equal(calls, 1);
  });

  test("an absent entry is NotFoundError, reason ENTRY_NOT_FOUND", async () => {
    const err = await rejection(ledger.lookup({ key: `absent-${uniqueRun("nf")}` }), NotFoundError);
    assert.equal(err.code, "NOT_FOUND");
    assert.equal(err.reason, "ENTRY_NOT_FOUND");
    const byArgs = await rejection(
      ledger.lookup({ runId: uniqueRun("nf"), tool: "t", args: { a: 1 } }),
      NotFoundError,
    );
    assert.equal(byArgs.reason, "ENTRY_NOT_FOUND");
  });

  test("a waiting claim is answered within its deadline (IN_PROGRESS near the deadline)", async () => {
    // The server holds the call: another claim holds the entry and the wait is longer than the
    // deadline. It answers IN_PROGRESS a reserve before the deadline (a fifth of it, at most
    // 250 ms), so with 1.5 s the client's own timer never comes first, even on a loaded machine.
    const run = uniqueRun("deadline");
    await ledger.claim({ runId: run, tool: "t", args: {} });
    const started = Date.now();
    const out = await ledger.claim({ runId: run, tool: "t", args: {}, waitMs: 5_000 }, { deadlineMs: 1_500 });
    const elapsed = Date.now() - started;
    assert.equal(out.outcome, "IN_PROGRESS");
    assert.equal(out.entry.status, "ATTEMPTING");
    assert.ok((out.retryAfter ?? 0) > 0);
    // It was held (nothing changed the entry), and answered before the deadline.
    assert.ok(elapsed >= 1_000 && elapsed < 1_500, `took ${elapsed} ms`);
  });

  test("a call that outlives its deadline is DeadlineExceededError (the default and per call)", async () => {
    // An HTTP/2 server that accepts calls and never answers.
    const silent = createHttp2Server();
    const sessions = new Set<import("node:http2").ServerHttp2Session>();
    silent.on("session", (session) => {
      sessions.add(session);
      session.on("error", () => {});
    });
    silent.on("stream", (stream) => stream.on("error", () => {}));
    await new Promise<void>((done) => silent.listen(0, "127.0.0.1", done));
    const port = (silent.address() as { port: number }).port;
    const stalled = new Ledger({ address: `127.0.0.1:${port}`, deadlineMs: 200 });
    try {
      for (const opts of [undefined, { deadlineMs: 100 }]) {
        const started = Date.now();
        const err = await rejection(stalled.lookup({ key: "k" }, opts), DeadlineExceededError);
        const elapsed = Date.now() - started;
        assert.equal(err.code, "DEADLINE_EXCEEDED");
        assert.ok(elapsed >= (opts?.deadlineMs ?? 200) - 20 && elapsed < 2_000, `took ${elapsed} ms`);
      }
    } finally {
      stalled.close();
      for (const session of sessions) session.destroy();
      await new Promise((done) => silent.close(done));
    }
  });

  test("a ledger nobody listens on is UnavailableError", async () => {
    const port = await new Promise<number>((done) => {
      const s = createServer();
      s.listen(0, "127.0.0.1", () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => done(p));
      });
    });
    const down = new Ledger({ address: `127.0.0.1:${port}`, deadlineMs: 2_000, retryBudgetMs: 0 });
    try {
      const err = await rejection(down.lookup({ key: "k" }), UnavailableError);
      assert.equal(err.code, "UNAVAILABLE");
      // Sent again within the budget (a doubling backoff from 100 ms: nobody answers with a
      // RetryInfo), then the last error: not before the budget is nearly spent, not long after.
      const started = Date.now();
      await rejection(down.lookup({ key: "k" }, { retryBudgetMs: 1_500 }), UnavailableError);
      const elapsed = Date.now() - started;
      assert.ok(elapsed >= 700 && elapsed < 5_000, `gave up after ${elapsed} ms`);
    } finally {
      down.close();
    }
  });
});
