// runOnce against the real server: first call, replay with the marker, reordered arguments,
// a new run, in progress (thrown and waited for), permanent and retryable failures, unknown
// after a timeout, and the result codec.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  ActionTimeoutError,
  deriveKey,
  InProgressError,
  LedgerError,
  NotExecutedError,
  OutcomeUnknownError,
  PermanentFailureError,
  PreviouslyFailedError,
  cannotTell,
  found,
  notFound,
  textCodec,
  type Confirm,
  type Ledger,
  type LedgerEntry,
} from "../src/index.js";
import { captureLog, sleep } from "./support/payments.js";
import { REPO_ROOT, startServer, uniqueRun, type TestServer } from "./support/server.js";

/** clients/parity.json's settlement rows, which these tests show against the real server. */
const SETTLEMENT = (
  JSON.parse(readFileSync(join(REPO_ROOT, "clients/parity.json"), "utf8")) as {
    settlement: { principal_order: string[]; default_principal: { confirm: string }; log_line: string };
  }
).settlement;

/**
 * parity.json's settlement log line with the fields given filled in, the others any word;
 * `settled_by` (claimant, nobody) stands in place of `resolved_by=` when given.
 */
function logLine(fields: Record<string, string>): RegExp {
  const escape = (t: string) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  let pattern = escape(SETTLEMENT.log_line);
  if ("settled_by" in fields) pattern = pattern.replace(escape("resolved_by={resolved_by}"), escape(`settled_by=${fields.settled_by}`));
  for (const name of ["key", "tool", "external_ref", "outcome", "status", "resolved_by", "via"]) {
    pattern = pattern.replace(escape(`{${name}}`), name in fields ? escape(fields[name]) : "\\S+");
  }
  return new RegExp(`^INFO ${pattern}$`);
}

const REPLAY_NOTE = /already performed.*No new action was taken/;

/** Records the wait of each claim a ledger sends; `sent(n)` resolves once n were sent. */
function spyClaims(ledger: Ledger): { waitMs: Array<number | undefined>; sent(n: number): Promise<void> } {
  const real = ledger.claim.bind(ledger);
  const waitMs: Array<number | undefined> = [];
  const waiters: Array<[number, () => void]> = [];
  ledger.claim = (params, opts) => {
    const call = real(params, opts);
    waitMs.push(params.waitMs);
    for (const [n, done] of waiters) if (waitMs.length >= n) done();
    return call;
  };
  return {
    waitMs,
    sent: (n) => new Promise<void>((done) => (waitMs.length >= n ? done() : waiters.push([n, done]))),
  };
}

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

    const err = await ledger.runOnce(run, "issue_credit", args, () => ++calls, { waitMs: 0 }).then(
      () => assert.fail("expected InProgressError"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof InProgressError, String(err));
    assert.ok(err.retryAfter > 0 && err.retryAfter <= 1000, `retryAfter ${err.retryAfter}`);
    assert.equal(err.entry.status, "ATTEMPTING");
    assert.ok(err.note.length > 0);

    // A waiting call (the default wait) is answered once the first completes: it replays. (The
    // first is released once the waiter's claim was sent; had the claim reached the server only
    // after the release, it would replay at once: either way nothing runs twice. That the server
    // holds a waiting claim is the errors suite's deadline test.)
    const spied = server.ledger();
    const waits = spyClaims(spied);
    const waiting = spied.runOnce(run, "issue_credit", args, () => ++calls);
    await waits.sent(1);
    assert.deepEqual(waits.waitMs, [10_000]);
    release();
    const [a, b] = await Promise.all([first, waiting]);
    assert.equal(calls, 1);
    assert.equal(a.replayed, false);
    assert.equal(b.replayed, true);
    assert.deepEqual(b.value, { credit_id: "cr-slow" });
  });

  test("parallel identical calls: the duplicate waits by default (10 s) and replays the first's result", async () => {
    const run = uniqueRun("parallel");
    const args = { customer: "c-8", amount: 12 };
    let calls = 0;
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    const action = async () => {
      calls++;
      await released;
      return { credit_id: `cr-${calls}` };
    };
    const spied = server.ledger();
    const waits = spyClaims(spied);
    const both = Promise.all([
      spied.runOnce(run, "issue_credit", args, action),
      spied.runOnce(run, "issue_credit", args, action),
    ]);
    // Released once both claims were sent. Whether the duplicate reaches the server before the
    // release (it waits, then replays) or after (it replays at once), nothing runs twice.
    await waits.sent(2);
    release();
    const outs = await both;
    assert.deepEqual(waits.waitMs, [10_000, 10_000], "the default wait is sent with each claim");
    assert.equal(calls, 1);
    assert.deepEqual(outs.map((o) => o.replayed).sort(), [false, true]);
    assert.deepEqual(outs[0].value, { credit_id: "cr-1" });
    assert.deepEqual(outs[1].value, { credit_id: "cr-1" });
  });

  test("an abort before the action starts runs nothing; a claim already made is left retryable", async () => {
    const args = { customer: "c-5", amount: 1 };
    let calls = 0;
    // Aborted before the call: nothing is claimed.
    const early = uniqueRun("abort-early");
    const err = await ledger
      .runOnce(early, "issue_credit", args, () => ++calls, { signal: AbortSignal.abort() })
      .catch((e: unknown) => e);
    assert.ok(err instanceof NotExecutedError, String(err));
    await assert.rejects(ledger.lookup({ runId: early, tool: "issue_credit", args }), { name: "NotFoundError" });

    // Aborted while the claim was on its way: runOnce answers at once; the claim, when it
    // lands, is completed FAILED retryable (never left to read UNKNOWN).
    const late = uniqueRun("abort-late");
    const controller = new AbortController();
    const claim = ledger.claim.bind(ledger);
    const aborting = server.ledger();
    aborting.claim = async (params, opts) => {
      const out = await claim(params, opts);
      controller.abort(new Error("the user stopped the run"));
      return out;
    };
    const lateErr = await aborting
      .runOnce(late, "issue_credit", args, () => ++calls, { signal: controller.signal })
      .catch((e: unknown) => e);
    assert.ok(lateErr instanceof NotExecutedError, String(lateErr));
    assert.match(lateErr.message, /aborted.*not started/);
    let entry = await ledger.lookup({ runId: late, tool: "issue_credit", args });
    while (entry.status === "ATTEMPTING") {
      await new Promise((r) => setTimeout(r, 20));
      entry = await ledger.lookup({ key: entry.key });
    }
    assert.equal(entry.status, "FAILED");
    assert.equal(entry.retryable, true);
    assert.match(entry.error, /aborted before the action started/);
    assert.equal(calls, 0);
    // The intent runs on the next call, as attempt 2.
    const out = await ledger.runOnce(late, "issue_credit", args, (ctx) => ctx.attempt);
    assert.equal(out.value, 2);
  });

  test("an action that is not a function is refused before anything is claimed", async () => {
    const run = uniqueRun("not-a-function");
    await assert.rejects(
      ledger.runOnce(run, "t", {}, "issue it" as unknown as () => unknown),
      (e: unknown) => e instanceof TypeError && /must be a function/.test(e.message),
    );
    await assert.rejects(ledger.lookup({ runId: run, tool: "t", args: {} }), { name: "NotFoundError" });
  });

  test("a permanent failure is stored; the next call gets PreviouslyFailedError with the stored error", async () => {
    const run = uniqueRun("permanent");
    const args = { customer: "c-closed", amount: 10 };
    let calls = 0;
    const thrown = await ledger
      .runOnce(run, "issue_credit", args, () => {
        calls++;
        throw new PermanentFailureError("account c-closed is closed");
      })
      .catch((e: unknown) => e);
    assert.ok(thrown instanceof PermanentFailureError && thrown instanceof LedgerError, String(thrown));
    // The error carries the entry as recorded.
    assert.equal(thrown.entry?.status, "FAILED");
    assert.equal(thrown.entry?.retryable, false);
    const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args });
    assert.equal(entry.status, "FAILED");
    assert.equal(entry.retryable, false);
    const err = await ledger.runOnce(run, "issue_credit", args, () => ++calls).catch((e: unknown) => e);
    assert.ok(err instanceof PreviouslyFailedError && err instanceof LedgerError, String(err));
    assert.match(err.storedError, /account c-closed is closed/);
    assert.ok(err.note.length > 0);
    // The server's note quotes the stored error already: the message has it once.
    assert.equal(err.message.split("account c-closed is closed").length - 1, 1, err.message);
    assert.equal(calls, 1);
  });

  test("a retryable failure (NotExecutedError) lets the next call run again as attempt 2", async () => {
    const run = uniqueRun("retryable");
    const args = { customer: "c-9", amount: 3 };
    const attempts: number[] = [];
    const thrown = await ledger
      .runOnce(run, "issue_credit", args, (ctx) => {
        attempts.push(ctx.attempt);
        throw new NotExecutedError("payments API refused the connection");
      })
      .catch((e: unknown) => e);
    assert.ok(thrown instanceof NotExecutedError && thrown instanceof LedgerError, String(thrown));
    assert.equal(thrown.entry?.status, "FAILED");
    assert.equal(thrown.entry?.retryable, true);
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
    assert.ok(err instanceof OutcomeUnknownError, String(err));
    assert.ok(err instanceof InProgressError && err instanceof LedgerError);
    assert.equal(err.entry.status, "UNKNOWN");
    assert.match(err.note, /outcome is unknown/);
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
    assert.ok(err instanceof OutcomeUnknownError, "a timeout's outcome is unknown");
    assert.equal(err.entry.status, "UNKNOWN");
    assert.equal(err.retryAfter, 30_000, "an unknown outcome takes a reconciler's time");
    assert.match(err.message, /200 ms/);
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

  describe("with the tool's paired read (confirm)", () => {
    const credits = new Map<string, string>();
    const confirm: Confirm<{ credit_id: string }> = ({ externalRef }) => {
      const id = credits.get(externalRef);
      return id ? found({ credit_id: id }) : notFound;
    };
    let quick: Ledger;
    before(() => {
      quick = server.ledger({ principal: "ts-tests", confirmDelayMs: 20, logger: captureLog() });
    });

    test("an action that throws after acting: the found result is returned (confirmed), the entry SUCCEEDED", async () => {
      const run = uniqueRun("confirm-found");
      const out = await quick.runOnce(
        run,
        "issue_credit",
        { customer: "c-1" },
        (ctx) => {
          credits.set(ctx.externalRef, "cr-77");
          throw new Error("the answer was lost");
        },
        { confirm },
      );
      assert.deepEqual(out.value, { credit_id: "cr-77" });
      assert.equal(out.confirmed, true);
      assert.equal(out.replayed, false);
      assert.equal(out.entry.status, "SUCCEEDED");
      const again = await quick.runOnce(run, "issue_credit", { customer: "c-1" }, () => ({ credit_id: "never" }), { confirm });
      assert.equal(again.replayed, true);
      assert.deepEqual(again.value, { credit_id: "cr-77" });
    });

    test("a timeout whose paired read finds nothing: ActionTimeoutError, UNKNOWN (it may still land); a repeat after the ledger's grace asks again, and runs attempt 2", async () => {
      const run = uniqueRun("confirm-timeout");
      const err = await quick
        .runOnce(run, "issue_credit", { customer: "c-2" }, (ctx) => sleep(5_000, ctx.signal).then(() => ({ credit_id: "late" })), {
          confirm,
          timeoutMs: 100,
        })
        .then(() => assert.fail("expected ActionTimeoutError"), (e: unknown) => e);
      assert.ok(err instanceof ActionTimeoutError, String(err));
      assert.equal(err.entry?.status, "UNKNOWN");
      assert.match(err.entry?.error ?? "", /the attempt was cut off \(the action did not finish within 100 ms\); the tool's paired read found no effect yet/);
      // The test server's grace is 0 s: the repeat is handed the entry at once, still finds nothing, runs again.
      const retried = await quick.runOnce(run, "issue_credit", { customer: "c-2" }, (ctx) => ({ credit_id: `attempt-${ctx.attempt}` }), { confirm });
      assert.deepEqual(retried.value, { credit_id: "attempt-2" });
    });

    test("cannot tell, or an answer that is not one: the action's error, the entry UNKNOWN", async () => {
      const log = captureLog();
      const unsure = server.ledger({ confirmDelayMs: 0, logger: log });
      const run = uniqueRun("confirm-unsure");
      const odd = (() => ({ maybe: true })) as unknown as Confirm;
      await assert.rejects(
        unsure.runOnce(run, "t", { n: 1 }, () => Promise.reject(new TypeError("socket hang up")), { confirm: odd }),
        /socket hang up/,
      );
      assert.equal((await unsure.lookup({ runId: run, tool: "t", args: { n: 1 } })).status, "UNKNOWN");
      assert.ok(log.lines.some((l) => /^WARN .*confirm answered \{"maybe":true\}, not found\(result\), notFound or cannotTell/.test(l)));
      await assert.rejects(
        unsure.runOnce(run, "t", { n: 2 }, () => Promise.reject(new TypeError("socket hang up")), { confirm: () => cannotTell }),
        /socket hang up/,
      );
      assert.ok(log.lines.some((l) => /^INFO settled key=.* tool=t .* outcome=cannot_tell status=UNKNOWN/.test(l)));
    });

    test("a duplicate waiting on the attempt reads the settled result, not an unknown outcome", async () => {
      const run = uniqueRun("confirm-wait");
      let started!: () => void;
      const isStarted = new Promise<void>((r) => (started = r));
      const slowConfirm: Confirm<{ credit_id: string }> = async (attempt) => {
        started();
        await sleep(300);
        return confirm(attempt);
      };
      const first = quick.runOnce(
        run,
        "issue_credit",
        { customer: "c-3" },
        (ctx) => {
          credits.set(ctx.externalRef, "cr-3");
          throw new Error("the answer was lost");
        },
        { confirm: slowConfirm },
      );
      await isStarted;
      // While confirm is asked, the attempt still holds its claim: the duplicate waits for it.
      const duplicate = await quick.runOnce(run, "issue_credit", { customer: "c-3" }, () => ({ credit_id: "never" }), { waitMs: 5_000 });
      assert.equal(duplicate.replayed, true);
      assert.deepEqual(duplicate.value, { credit_id: "cr-3" });
      assert.equal((await first).confirmed, true);
    });

    for (const how of ["throws", "outlives timeoutMs"] as const) {
      test(`an action that ${how}: confirm is asked under the attempt's own claim (ATTEMPTING, lease renewed), completed with its token`, async () => {
        const log = captureLog();
        const holder = server.ledger({ principal: "ts-tests", logger: log });
        const run = uniqueRun("confirm-held");
        const seen: LedgerEntry[] = [];
        const held: Confirm<{ credit_id: string }> = async (attempt) => {
          seen.push(await holder.lookup({ key: attempt.key }));
          return confirm(attempt);
        };
        const out = await holder.runOnce(
          run,
          "issue_credit",
          { customer: "c-held" },
          async (ctx) => {
            credits.set(ctx.externalRef, "cr-held");
            if (how === "throws") throw new Error("the answer was lost");
            await sleep(20_000, ctx.signal);
            return { credit_id: "late" };
          },
          { confirm: held, leaseMs: 2_000, confirmDelayMs: 2_500, timeoutMs: how === "throws" ? undefined : 200 },
        );
        assert.equal(seen.length, 1);
        const [entry] = seen;
        assert.equal(entry.status, "ATTEMPTING", "confirm is asked under the attempt's own claim");
        assert.ok(entry.leaseExpiresAt!.getTime() - entry.startedAt!.getTime() > 2_000, "the lease was renewed");
        assert.equal(out.confirmed, true);
        assert.deepEqual(out.value, { credit_id: "cr-held" });
        // Completed by the attempt itself, with its claim token: no Reconcile, so no resolvedBy.
        assert.equal(out.entry.status, "SUCCEEDED");
        assert.equal(out.entry.resolvedBy, "");
        assert.equal((await holder.lookup({ key: out.entry.key })).resolvedBy, "", "the stored entry too");
        // The log says what the entry says: settled by its claimant, no resolved_by (not the settler's principal), via run_once.
        const settled = log.lines.filter((l) => l.includes(`settled key=${out.entry.key} `));
        assert.equal(settled.length, 1, log.lines.join("\n"));
        const pattern = logLine({
          key: out.entry.key,
          tool: "issue_credit",
          external_ref: out.entry.externalRef,
          outcome: "found",
          status: "SUCCEEDED",
          settled_by: "claimant",
          via: "run_once",
        });
        assert.match(settled[0], pattern);
        assert.doesNotMatch(settled[0], /resolved_by|ts-tests|confirm@/);
      });
    }

    test("after cannot tell, a repeat settles the entry at once: no reconcile hold is left behind", async () => {
      // A Reconcile hold is anonymous and lasts the server's whole reconcile lease (60 s): had the
      // first call taken the entry with one, the repeat could not take it and would answer unknown.
      const run = uniqueRun("confirm-unsure-then-sure");
      let down = true;
      const flaky: Confirm<{ credit_id: string }> = (attempt) => (down ? cannotTell : confirm(attempt));
      await assert.rejects(
        quick.runOnce(run, "issue_credit", { customer: "c-4" }, (ctx) => {
          credits.set(ctx.externalRef, "cr-4");
          throw new Error("the answer was lost");
        }, { confirm: flaky }),
        /the answer was lost/,
      );
      assert.equal((await quick.lookup({ runId: run, tool: "issue_credit", args: { customer: "c-4" } })).status, "UNKNOWN");
      down = false;
      const again = await quick.runOnce(run, "issue_credit", { customer: "c-4" }, () => assert.fail("acted again"), {
        confirm: flaky,
        waitMs: 2_000,
      });
      assert.equal(again.replayed, true);
      assert.deepEqual(again.value, { credit_id: "cr-4" });
      assert.equal(again.entry.resolvedBy, "ts-tests");
    });

    test("every settlement's log line says who settled it as the entry does: nobody while unknown, the settler's resolved_by for a repeat's", async () => {
      const log = captureLog();
      const client = server.ledger({ principal: "agent-9", confirmDelayMs: 0, logger: log });
      const run = uniqueRun("confirm-log");
      let sure = false;
      const flaky: Confirm<{ credit_id: string }> = (attempt) => (sure ? confirm(attempt) : cannotTell);
      // The call's own attempt, cannot tell: UNKNOWN, nobody resolved it.
      await assert.rejects(
        client.runOnce(run, "issue_credit", { customer: "c-log" }, (ctx) => {
          credits.set(ctx.externalRef, "cr-log");
          throw new Error("the answer was lost");
        }, { confirm: flaky }),
        /the answer was lost/,
      );
      const unknown = await client.lookup({ runId: run, tool: "issue_credit", args: { customer: "c-log" } });
      assert.equal(unknown.status, "UNKNOWN");
      assert.equal(unknown.resolvedBy, "");
      // A repeat settles it through Reconcile: the entry records the settler, and the log says so.
      sure = true;
      const again = await client.runOnce(run, "issue_credit", { customer: "c-log" }, () => assert.fail("acted again"), { confirm: flaky });
      assert.equal(again.entry.resolvedBy, "agent-9");
      const lines = log.lines.filter((l) => l.includes(`settled key=${unknown.key} `));
      assert.equal(lines.length, 2, log.lines.join("\n"));
      assert.match(lines[0], logLine({ key: unknown.key, outcome: "cannot_tell", status: "UNKNOWN", settled_by: "nobody", via: "run_once" }));
      assert.match(lines[1], logLine({ key: unknown.key, outcome: "found", status: "SUCCEEDED", resolved_by: "agent-9", via: "a repeat" }));
    });

    test("a repeat that meets an entry another caller is settling waits (up to waitMs) for that settlement", async () => {
      const never: Confirm = () => assert.fail("the entry is someone else's to settle");
      const unknownEntry = async (run: string) => {
        const claimed = await quick.claim({ runId: run, tool: "issue_credit", args: { customer: "c-5" } });
        await quick.complete({ key: claimed.entry.key, claimToken: claimed.claimToken, status: "UNKNOWN", error: "timeout" });
        const { pending } = await quick.reconcile({ keys: [claimed.entry.key], principal: "operator" });
        assert.deepEqual(pending.map((e) => e.key), [claimed.entry.key], "held by the operator");
        return pending[0];
      };
      const run = uniqueRun("confirm-elsewhere");
      const { key, attempt, holdToken } = await unknownEntry(run);
      const settling = sleep(500).then(() =>
        quick.reconcile({
          resolutions: [{ key, attempt, holdToken, status: "SUCCEEDED", result: new TextEncoder().encode('{"credit_id":"cr-9"}') }],
          resolveOnly: true,
          principal: "operator",
        }),
      );
      const waited = await quick.runOnce(run, "issue_credit", { customer: "c-5" }, () => assert.fail("acted again"), {
        confirm: never,
        waitMs: 10_000,
      });
      await settling;
      assert.equal(waited.replayed, true);
      assert.deepEqual(waited.value, { credit_id: "cr-9" });
      assert.equal(waited.entry.resolvedBy, "operator");

      // Nobody settles it within the wait: unknown, after the wait.
      const run2 = uniqueRun("confirm-elsewhere-unsettled");
      await unknownEntry(run2);
      const started = Date.now();
      await assert.rejects(
        quick.runOnce(run2, "issue_credit", { customer: "c-5" }, () => assert.fail("acted again"), { confirm: never, waitMs: 600 }),
        OutcomeUnknownError,
      );
      assert.ok(Date.now() - started >= 500, "it waited");
    });

    test("a repeat settles as the call's principal, else the Ledger's, else confirm@host:pid", async () => {
      assert.deepEqual(SETTLEMENT.principal_order, ["call", "client", "default"]);
      const byDefault = SETTLEMENT.default_principal.confirm.replace("{host}", hostname()).replace("{pid}", String(process.pid));
      const cases: Array<[ledgerPrincipal: string | undefined, callPrincipal: string | undefined, expected: string]> = [
        [undefined, undefined, byDefault],
        ["", "", byDefault],
        ["agent-7", undefined, "agent-7"],
        ["agent-7", "", "agent-7"],
        ["agent-7", "call-1", "call-1"],
      ];
      const run = uniqueRun("confirm-principal");
      for (const [n, [ledgerPrincipal, callPrincipal, expected]] of cases.entries()) {
        const client = server.ledger({ principal: ledgerPrincipal, confirmDelayMs: 0, logger: captureLog() });
        const args = { customer: `c-p${n}` };
        const claimed = await client.claim({ runId: run, tool: "issue_credit", args });
        credits.set(claimed.entry.externalRef, `cr-p${n}`);
        await client.complete({ key: claimed.entry.key, claimToken: claimed.claimToken, status: "UNKNOWN", error: "timeout" });
        const again = await client.runOnce(run, "issue_credit", args, () => assert.fail("acted again"), {
          confirm,
          principal: callPrincipal,
        });
        assert.equal(again.replayed, true);
        assert.equal(again.entry.resolvedBy, expected, `Ledger ${ledgerPrincipal}, call ${callPrincipal}`);
        client.close();
      }
    });
  });
});
