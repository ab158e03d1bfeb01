// runOnce against the real server: first call, replay with the marker, reordered arguments,
// a new run, in progress (thrown and waited for), permanent and retryable failures, unknown
// after a timeout, and the result codec.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  ActionTimeoutError,
  deriveKey,
  InProgressError,
  NotExecutedError,
  PermanentFailureError,
  PreviouslyFailedError,
  textCodec,
  type Ledger,
} from "../src/index.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

const REPLAY_NOTE = /already performed.*No new action was taken/;

describe("runOnce", () => {
  let server: TestServer;
  let ledger: Ledger;
  before(async () => {
    server = await startServer();
    ledger = server.ledger({ principal: "ts-tests" });
  });
  after(async () => {
    await server.stop();
  });

  test("the first call runs the action and stores its result", async () => {
    const run = uniqueRun("first");
    let calls = 0;
    const out = await ledger.runOnce(run, "issue_credit", { customer: "c-42", amount: 200 }, (ctx) => {
      calls++;
      assert.equal(ctx.attempt, 1);
      assert.match(ctx.externalRef, /^idem-[0-9a-f]{16}$/);
      assert.equal(ctx.key, deriveKey(run, "issue_credit", { customer: "c-42", amount: 200 }));
      return { credit_id: "cr-1" };
    });
    assert.equal(calls, 1);
    assert.deepEqual(out.value, { credit_id: "cr-1" });
    assert.equal(out.replayed, false);
    assert.equal(out.note, "");
    assert.equal(out.entry.status, "SUCCEEDED");
    assert.equal(out.entry.principal, "ts-tests");
    assert.equal(new TextDecoder().decode(out.entry.result), '{"credit_id":"cr-1"}');
  });

  test("a repeat replays the stored result with the marker and the note, and runs nothing", async () => {
    const run = uniqueRun("replay");
    let calls = 0;
    const action = () => {
      calls++;
      return { credit_id: `cr-${calls}` };
    };
    await ledger.runOnce(run, "issue_credit", '{"customer":"c-42","amount":200,"currency":"EUR"}', action);
    const again = await ledger.runOnce(run, "issue_credit", '{"currency":"EUR","amount":2e2,"customer":"c-42"}', action);
    assert.equal(calls, 1);
    assert.equal(again.replayed, true);
    assert.match(again.note, REPLAY_NOTE);
    assert.deepEqual(again.value, { credit_id: "cr-1" });
    assert.equal(again.entry.replayCount, 1);
  });

  test("the same run, tool and reordered arguments run the action once", async () => {
    const run = uniqueRun("reordered");
    let calls = 0;
    const action = () => ++calls;
    const a = await ledger.runOnce(run, "send_reply", { ticket: "T-1", body: "hi", tags: ["x", "y"] }, action);
    const b = await ledger.runOnce(run, "send_reply", { tags: ["x", "y"], body: "hi", ticket: "T-1" }, action);
    assert.equal(calls, 1);
    assert.equal(a.replayed, false);
    assert.equal(b.replayed, true);
    assert.equal(b.value, 1);
    assert.equal(a.entry.key, b.entry.key);
  });

  test("a new run id is a new intent: the action runs again", async () => {
    let calls = 0;
    const action = () => ++calls;
    const args = { ticket: "T-2", body: "hello" };
    const a = await ledger.runOnce(uniqueRun("run-a"), "send_reply", args, action);
    const b = await ledger.runOnce(uniqueRun("run-b"), "send_reply", args, action);
    assert.equal(calls, 2);
    assert.equal(a.replayed, false);
    assert.equal(b.replayed, false);
    assert.notEqual(a.entry.key, b.entry.key);
    assert.equal(a.entry.fingerprint, b.entry.fingerprint);
  });

  test("an attempt in flight: InProgressError with retryAfter, or a wait that ends in the replay", async () => {
    const run = uniqueRun("in-progress");
    const args = { customer: "c-7", amount: 5 };
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    let started!: () => void;
    const isStarted = new Promise<void>((r) => (started = r));
    let calls = 0;
    const first = ledger.runOnce(run, "issue_credit", args, async () => {
      calls++;
      started();
      await released;
      return { credit_id: "cr-slow" };
    });
    await isStarted;

    const err = await ledger.runOnce(run, "issue_credit", args, () => ++calls).then(
      () => assert.fail("expected InProgressError"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof InProgressError, String(err));
    assert.ok(err.retryAfter > 0 && err.retryAfter <= 1000, `retryAfter ${err.retryAfter}`);
    assert.equal(err.entry.status, "ATTEMPTING");
    assert.ok(err.note.length > 0);

    // A waiting call is answered once the first completes.
    const waiting = ledger.runOnce(run, "issue_credit", args, () => ++calls, { waitMs: 10_000 });
    setTimeout(release, 300);
    const [a, b] = await Promise.all([first, waiting]);
    assert.equal(calls, 1);
    assert.equal(a.replayed, false);
    assert.equal(b.replayed, true);
    assert.deepEqual(b.value, { credit_id: "cr-slow" });
  });

  test("a permanent failure is stored; the next call gets PreviouslyFailedError with the stored error", async () => {
    const run = uniqueRun("permanent");
    const args = { customer: "c-closed", amount: 10 };
    let calls = 0;
    await assert.rejects(
      ledger.runOnce(run, "issue_credit", args, () => {
        calls++;
        throw new PermanentFailureError("account c-closed is closed");
      }),
      PermanentFailureError,
    );
    const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args });
    assert.equal(entry.status, "FAILED");
    assert.equal(entry.retryable, false);
    const err = await ledger.runOnce(run, "issue_credit", args, () => ++calls).catch((e: unknown) => e);
    assert.ok(err instanceof PreviouslyFailedError, String(err));
    assert.match(err.storedError, /account c-closed is closed/);
    assert.ok(err.note.length > 0);
    assert.equal(calls, 1);
  });

  test("a retryable failure (NotExecutedError) lets the next call run again as attempt 2", async () => {
    const run = uniqueRun("retryable");
    const args = { customer: "c-9", amount: 3 };
    const attempts: number[] = [];
    await assert.rejects(
      ledger.runOnce(run, "issue_credit", args, (ctx) => {
        attempts.push(ctx.attempt);
        throw new NotExecutedError("payments API refused the connection");
      }),
      NotExecutedError,
    );
    const failed = await ledger.lookup({ runId: run, tool: "issue_credit", args });
    assert.equal(failed.status, "FAILED");
    assert.equal(failed.retryable, true);
    const out = await ledger.runOnce(run, "issue_credit", args, (ctx) => {
      attempts.push(ctx.attempt);
      return "ok";
    });
    assert.deepEqual(attempts, [1, 2]);
    assert.equal(out.value, "ok");
    assert.equal(out.entry.attempt, 2);
  });

  test("an action that throws a timeout error completes UNKNOWN; lookup shows it; nothing re-runs", async () => {
    const run = uniqueRun("unknown");
    const args = { customer: "c-3", amount: 70 };
    const timeout = new DOMException("the payments API did not answer in 5 s", "TimeoutError");
    await assert.rejects(
      ledger.runOnce(run, "issue_credit", args, () => {
        throw timeout;
      }),
      (e: unknown) => e === timeout,
    );
    const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args });
    assert.equal(entry.status, "UNKNOWN");
    assert.match(entry.error, /TimeoutError/);
    let calls = 0;
    const err = await ledger.runOnce(run, "issue_credit", args, () => ++calls).catch((e: unknown) => e);
    assert.ok(err instanceof InProgressError, String(err));
    assert.equal(err.entry.status, "UNKNOWN");
    assert.equal(calls, 0);
  });

  test("timeoutMs: an action that outlives it completes UNKNOWN with ActionTimeoutError", async () => {
    const run = uniqueRun("timeout");
    let aborted = false;
    const err = await ledger
      .runOnce(
        run,
        "send_reply",
        { ticket: "T-9", body: "slow" },
        (ctx) =>
          new Promise((resolve) => {
            ctx.signal.addEventListener("abort", () => {
              aborted = true;
              resolve("too late");
            });
          }),
        { timeoutMs: 200 },
      )
      .catch((e: unknown) => e);
    assert.ok(err instanceof ActionTimeoutError, String(err));
    assert.equal(aborted, true);
    const entry = await ledger.lookup({ runId: run, tool: "send_reply", args: { ticket: "T-9", body: "slow" } });
    assert.equal(entry.status, "UNKNOWN");
  });

  test("an explicit key replays across runs; a codec stores text as it is, NUL included", async () => {
    const key = `wf-${uniqueRun("k")}:step-3`;
    let calls = 0;
    const action = () => `reply #${++calls}\u0000end`;
    const a = await ledger.runOnce("run-x", "send_reply", "{}", action, { key, codec: textCodec });
    const b = await ledger.runOnce("run-y", "send_reply", "{}", action, { key, codec: textCodec });
    assert.equal(calls, 1);
    assert.equal(a.entry.key, key);
    assert.equal(b.replayed, true);
    assert.equal(b.value, "reply #1\u0000end");
  });

  test("a result of undefined is stored as no bytes and replayed as undefined", async () => {
    const run = uniqueRun("void");
    const a = await ledger.runOnce(run, "send_reply", { ticket: "T-3" }, () => undefined);
    const b = await ledger.runOnce(run, "send_reply", { ticket: "T-3" }, () => "never");
    assert.equal(a.value, undefined);
    assert.equal(b.replayed, true);
    assert.equal(b.value, undefined);
  });
});
