// Fenced findings (issue 27) against the real server: every finding the client sends (the
// Reconciler's, a repeat's settle-at-once) names the attempt it was about and the hold token
// it was handed; the ledger applies it only while that hold is the newest and the attempt the
// current one, and says what became of it (`results`). A finding the ledger did not apply is
// logged with the attempt seen and the attempt and status now, counted, and never taken as
// settled by its sender. The server holds reconcile hand-outs for 1 s here (--reconcile-lease),
// so that a hold can end under a slow read. Also: the grace before an unknown outcome is handed
// out, and a call's own "not found" after its action was cut off (timeout, abort).

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  ActionTimeoutError,
  InvalidArgumentError,
  NotExecutedError,
  OutcomeUnknownError,
  Reconciler,
  found,
  notFound,
  type Confirm,
  type ConfirmAttempt,
  type Confirmation,
  type Ledger,
  type LedgerEntry,
  type Resolution,
  type SettlementRecord,
} from "../src/index.js";
import { captureLog, sleep } from "./support/payments.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

/** The server's reconcile lease in these tests, and a wait that outlasts it. */
const HOLD_MS = 1_000;
const PAST_HOLD_MS = 1_600;

/** A paired read that answers `answer` only when released; `asked` resolves with what it was asked. */
function gated<T>(answer: Confirmation<T>): { confirm: Confirm<T>; asked: Promise<ConfirmAttempt>; release(): void } {
  let release!: () => void;
  const released = new Promise<void>((done) => (release = done));
  let onAsked!: (a: ConfirmAttempt) => void;
  const asked = new Promise<ConfirmAttempt>((done) => (onAsked = done));
  return {
    confirm: async (attempt) => {
      onAsked(attempt);
      await released;
      return answer;
    },
    asked,
    release,
  };
}

/** Records the resolutions a ledger sends to Reconcile. */
function spyResolutions(ledger: Ledger): Resolution[] {
  const sent: Resolution[] = [];
  const real = ledger.reconcile.bind(ledger);
  ledger.reconcile = (params, opts) => {
    sent.push(...(params?.resolutions ?? []));
    return real(params, opts);
  };
  return sent;
}

const toolName = (label: string) => `${label}_${uniqueRun("t").replace(/[^a-z0-9]/gi, "_")}`;

describe("fenced findings", () => {
  let server: TestServer;
  let ledger: Ledger;
  const log = captureLog();
  before(async () => {
    server = await startServer({ args: ["--reconcile-lease", `${HOLD_MS}ms`] });
    ledger = server.ledger({ logger: log, confirmDelayMs: 0 });
  });
  after(async () => {
    await server.stop();
  });

  /** An entry whose outcome is unknown: claimed, then completed UNKNOWN. */
  async function unknownEntry(tool: string, args: Record<string, unknown>, run = uniqueRun("fence")): Promise<LedgerEntry> {
    const claim = await ledger.claim({ runId: run, tool, args });
    return (await ledger.complete({ key: claim.entry.key, claimToken: claim.claimToken, status: "UNKNOWN", error: "timeout" })).entry;
  }

  /** The log lines about one key. */
  const linesOf = (key: string) => log.lines.filter((l) => l.includes(`key=${key} `));

  test("a finding carries the attempt and hold token of the entry handed out; one without them is refused, changing nothing", async () => {
    const tool = toolName("carry");
    const x = await unknownEntry(tool, { n: 1 });
    // A caller in plain JavaScript, or an old client: no attempt, no hold token.
    const { pending } = await ledger.reconcile({ keys: [x.key] });
    assert.equal(pending.length, 1);
    assert.equal(pending[0].attempt, 1);
    assert.match(pending[0].holdToken, /\S/, "a hand-out carries its hold token");
    await assert.rejects(
      ledger.reconcile({ resolutions: [{ key: x.key, status: "FAILED", retryable: true } as Resolution], resolveOnly: true }),
      (err: unknown) => err instanceof InvalidArgumentError && err.reason === "UNFENCED_RESOLUTION",
    );
    assert.equal((await ledger.lookup({ key: x.key })).status, "UNKNOWN");
    // Every other answer leaves the token empty.
    assert.equal((await ledger.lookup({ key: x.key })).holdToken, "");

    const own = server.ledger({ logger: log });
    const sent = spyResolutions(own);
    const y = await unknownEntry(tool, { n: 2 });
    const records: SettlementRecord[] = [];
    const reconciler = new Reconciler(own, [{ name: tool, confirm: () => notFound }], {
      olderThanMs: 0,
      principal: "fenced-reconciler",
      onSettlement: (r) => records.push(r),
    });
    await reconciler.round();
    const mine = records.filter((r) => r.key === y.key);
    assert.deepEqual(mine.map((r) => [r.outcome, r.result, r.attemptSeen, r.entry.status, r.resolvedBy]), [
      ["not_found", "APPLIED", 1, "FAILED", "fenced-reconciler"],
    ]);
    const finding = sent.find((r) => r.key === y.key)!;
    assert.equal(finding.attempt, 1);
    assert.match(finding.holdToken, /\S/);
    assert.notEqual(finding.holdToken, pending[0].holdToken, "each hand-out has its own token");
    assert.equal(reconciler.figures.notFound, 1);
    assert.equal(reconciler.figures.stale, 0);
  });

  test("issue 27's story: A's hold ends, B settles, attempt 2 acts and is unknown; A's late 'not found' about attempt 1 is stale and changes nothing", async () => {
    const tool = toolName("late");
    const run = uniqueRun("late");
    const args = { customer: "c-42", amount: 200 };
    const x = await unknownEntry(tool, args, run);
    const slow = gated(notFound);
    const recordsA: SettlementRecord[] = [];
    const a = new Reconciler(ledger, [{ name: tool, confirm: slow.confirm }], {
      olderThanMs: 0,
      principal: "reconciler-A",
      onSettlement: (r) => recordsA.push(r),
    });
    const roundA = a.round();
    assert.equal((await slow.asked).attempt, 1);
    await sleep(PAST_HOLD_MS); // A stalls past its hold
    const b = new Reconciler(ledger, [{ name: tool, confirm: () => notFound }], { olderThanMs: 0, principal: "reconciler-B" });
    await b.round();
    assert.equal(b.figures.notFound, 1, "B was handed the entry and settled it");
    // Attempt 2 credits the customer and loses its connection: unknown too.
    let effects = 1;
    await assert.rejects(
      ledger.runOnce(run, tool, args, (ctx) => {
        assert.equal(ctx.attempt, 2);
        effects++;
        throw new Error("connection reset after the credit");
      }),
      /connection reset/,
    );
    slow.release();
    await roundA;

    const now = await ledger.lookup({ key: x.key });
    assert.deepEqual([now.status, now.attempt, now.resolvedBy], ["UNKNOWN", 2, ""], "the late finding changed nothing");
    assert.deepEqual(recordsA.map((r) => [r.outcome, r.result, r.attemptSeen, r.entry.attempt, r.entry.status]), [
      ["elsewhere", "STALE", 1, 2, "UNKNOWN"],
    ]);
    assert.deepEqual([a.figures.stale, a.figures.notFound, a.figures.found], [1, 0, 0], "counted as stale, never as settled by A");
    const warning = linesOf(x.key).find((l) => l.startsWith("WARN finding not applied"));
    assert.match(
      warning ?? "",
      new RegExp(`^WARN finding not applied key=${x.key} tool=${tool} external_ref=\\S+ finding=not_found result=STALE attempt_seen=1 attempt_now=2 status_now=UNKNOWN settled_by=nobody via=reconciler`),
      linesOf(x.key).join("\n"),
    );
    assert.ok(!linesOf(x.key).some((l) => /resolved_by=reconciler-A/.test(l)), "A is never said to have settled it");
    // So the next claim does not act a third time.
    await assert.rejects(ledger.runOnce(run, tool, args, () => effects++, { waitMs: 0 }), OutcomeUnknownError);
    assert.equal(effects, 2);
  });

  test("a stale 'found' about an earlier attempt marks the entry as a possible double effect, logged as an error", async () => {
    const tool = toolName("double");
    const run = uniqueRun("double");
    const x = await unknownEntry(tool, { n: 1 }, run);
    const slow = gated(found({ credit_id: "cr-1" }));
    const a = new Reconciler(ledger, [{ name: tool, confirm: slow.confirm }], { olderThanMs: 0, principal: "reconciler-A" });
    const roundA = a.round();
    await slow.asked;
    await sleep(PAST_HOLD_MS);
    // B (too early) finds nothing; attempt 2 runs and ends unknown.
    await new Reconciler(ledger, [{ name: tool, confirm: () => notFound }], { olderThanMs: 0, principal: "reconciler-B" }).round();
    await assert.rejects(ledger.runOnce(run, tool, { n: 1 }, () => Promise.reject(new Error("lost"))), /lost/);
    slow.release();
    const [record] = (await roundA).settlements;
    assert.equal(record.result, "STALE");
    assert.equal(record.entry.possibleDoubleEffect, true);
    const now = await ledger.lookup({ key: x.key });
    assert.deepEqual([now.status, now.attempt, now.possibleDoubleEffect], ["UNKNOWN", 2, true]);
    assert.ok(
      linesOf(x.key).some((l) => /^ERROR possible double effect key=\S+ .*attempt 1's effect was found while the entry is at attempt 2/.test(l)),
      log.lines.join("\n"),
    );
  });

  test("an expired hold nobody replaced still settles: the finding is still the newest evidence", async () => {
    const tool = toolName("expired");
    const x = await unknownEntry(tool, { n: 1 });
    const slow = gated(found({ ok: true }));
    const reconciler = new Reconciler(ledger, [{ name: tool, confirm: slow.confirm }], { olderThanMs: 0, principal: "slow-reconciler" });
    const round = reconciler.round();
    await slow.asked;
    await sleep(PAST_HOLD_MS);
    slow.release();
    const [record] = (await round).settlements;
    assert.deepEqual([record.outcome, record.result], ["found", "APPLIED"]);
    const now = await ledger.lookup({ key: x.key });
    assert.deepEqual([now.status, now.resolvedBy, now.possibleDoubleEffect], ["SUCCEEDED", "slow-reconciler", false]);
  });

  test("a repeat's settle-at-once is fenced the same way: after another hand-out its finding is stale, the repeat reads unknown; the current hold still settles", async () => {
    const tool = toolName("repeat");
    const run = uniqueRun("repeat");
    const x = await unknownEntry(tool, { n: 1 }, run);
    const slow = gated<unknown>(notFound);
    let ran = false;
    const repeat = ledger.runOnce(run, tool, { n: 1 }, () => (ran = true), { confirm: slow.confirm, principal: "the-repeat", waitMs: 0 });
    assert.equal((await slow.asked).attempt, 1);
    await sleep(PAST_HOLD_MS);
    // Someone else is handed the entry after the repeat's hold ended.
    const { pending } = await ledger.reconcile({ keys: [x.key], principal: "operator" });
    assert.deepEqual(pending.map((e) => e.key), [x.key]);
    slow.release();
    await assert.rejects(repeat, OutcomeUnknownError);
    assert.equal(ran, false);
    const now = await ledger.lookup({ key: x.key });
    assert.deepEqual([now.status, now.attempt, now.resolvedBy], ["UNKNOWN", 1, ""]);
    const lines = linesOf(x.key);
    assert.ok(
      lines.some((l) => /^WARN finding not applied .* finding=not_found result=STALE attempt_seen=1 attempt_now=1 status_now=UNKNOWN settled_by=nobody via=a repeat/.test(l)),
      lines.join("\n"),
    );
    assert.ok(lines.some((l) => /^INFO settled .* outcome=elsewhere status=UNKNOWN settled_by=nobody via=a repeat$/.test(l)), lines.join("\n"));
    assert.ok(!lines.some((l) => /resolved_by=the-repeat/.test(l)));

    // The operator's finding, under the newest hold, is applied.
    const out = await ledger.reconcile({
      resolutions: [{ key: x.key, attempt: pending[0].attempt, holdToken: pending[0].holdToken, status: "FAILED", retryable: true, error: "no credit" }],
      resolveOnly: true,
      principal: "operator",
    });
    assert.deepEqual(out.results.map((r) => [r.result, r.entry?.status, r.entry?.resolvedBy]), [["APPLIED", "FAILED", "operator"]]);
  });

  test("a repeat whose finding arrives after the entry was settled by someone else replays their result", async () => {
    const tool = toolName("repeat_settled");
    const run = uniqueRun("repeat-settled");
    const x = await unknownEntry(tool, { n: 1 }, run);
    const slow = gated<unknown>(notFound);
    const repeat = ledger.runOnce(run, tool, { n: 1 }, () => assert.fail("acted again"), { confirm: slow.confirm, waitMs: 0 });
    await slow.asked;
    await sleep(PAST_HOLD_MS);
    const { pending } = await ledger.reconcile({ keys: [x.key], principal: "operator" });
    await ledger.reconcile({
      resolutions: [{ key: x.key, attempt: pending[0].attempt, holdToken: pending[0].holdToken, status: "SUCCEEDED", result: new TextEncoder().encode('{"credit_id":"cr-op"}') }],
      resolveOnly: true,
      principal: "operator",
    });
    slow.release();
    const out = await repeat;
    assert.equal(out.replayed, true);
    assert.deepEqual(out.value, { credit_id: "cr-op" });
    assert.equal(out.entry.resolvedBy, "operator");
    assert.ok(linesOf(x.key).some((l) => /^WARN finding not applied .* finding=not_found result=(STALE|ALREADY_RESOLVED) attempt_seen=1 attempt_now=1 status_now=SUCCEEDED resolved_by=operator via=a repeat/.test(l)));
  });

  test("an action cut off (timeoutMs, or an abort) whose paired read finds nothing stays UNKNOWN; found settles it at once; a throw that ended it is FAILED retryable", async () => {
    const tool = toolName("cut_off");
    const run = uniqueRun("cut-off");
    const timedOut = await ledger
      .runOnce(run, tool, { n: 1 }, (ctx) => sleep(10_000, ctx.signal), { confirm: () => notFound, timeoutMs: 100 })
      .then(() => assert.fail("expected ActionTimeoutError"), (e: unknown) => e);
    assert.ok(timedOut instanceof ActionTimeoutError, String(timedOut));
    assert.equal(timedOut.entry?.status, "UNKNOWN");
    assert.match(timedOut.entry?.error ?? "", /found no effect yet .* may still be running or landing/);
    assert.ok(linesOf(timedOut.entry!.key).some((l) => /^INFO settled .* outcome=not_found status=UNKNOWN settled_by=nobody via=run_once$/.test(l)));

    const abort = new AbortController();
    const aborted = ledger.runOnce(
      run,
      tool,
      { n: 2 },
      async (ctx) => {
        setImmediate(() => abort.abort(new Error("the user left")));
        await sleep(10_000, ctx.signal);
      },
      { confirm: () => notFound, signal: abort.signal },
    );
    await assert.rejects(aborted, /the user left/);
    const abortedEntry = await ledger.lookup({ runId: run, tool, args: { n: 2 } });
    assert.equal(abortedEntry.status, "UNKNOWN");

    const foundAfterTimeout = await ledger.runOnce<unknown>(run, tool, { n: 3 }, (ctx) => sleep(10_000, ctx.signal), {
      confirm: () => found({ credit_id: "cr-3" }),
      timeoutMs: 100,
    });
    assert.deepEqual([foundAfterTimeout.confirmed, foundAfterTimeout.entry.status], [true, "SUCCEEDED"]);

    // An action that ended by throwing was not cut off: its "not found" is believed.
    const thrown = await ledger
      .runOnce(run, tool, { n: 4 }, () => Promise.reject(new Error("socket hang up")), { confirm: () => notFound })
      .then(() => assert.fail("expected NotExecutedError"), (e: unknown) => e);
    assert.ok(thrown instanceof NotExecutedError, String(thrown));
    assert.deepEqual([thrown.entry?.status, thrown.entry?.retryable], ["FAILED", true]);
  });
});

describe("the grace before an unknown outcome is handed out", () => {
  let server: TestServer;
  let ledger: Ledger;
  const GRACE_MS = 4_000;
  before(async () => {
    server = await startServer({ args: ["--reconcile-grace", `${GRACE_MS}ms`] });
    ledger = server.ledger({ logger: captureLog(), confirmDelayMs: 0 });
  });
  after(async () => {
    await server.stop();
  });

  test("inside the grace a repeat is not handed the entry, and waits (its waitMs) without asking; after it, the repeat settles it", async () => {
    const tool = toolName("grace");
    const run = uniqueRun("grace");
    const claim = await ledger.claim({ runId: run, tool, args: { n: 1 } });
    await ledger.complete({ key: claim.entry.key, claimToken: claim.claimToken, status: "UNKNOWN", error: "timeout" });
    const unknownSince = Date.now();
    let asked = 0;
    const confirm: Confirm<{ credit_id: string }> = () => (asked++, found({ credit_id: "cr-g" }));
    const started = Date.now();
    await assert.rejects(
      ledger.runOnce(run, tool, { n: 1 }, () => assert.fail("acted again"), { confirm, waitMs: 1_000 }),
      OutcomeUnknownError,
    );
    assert.ok(Date.now() - started >= 900, `it waited ${Date.now() - started} ms`);
    assert.equal(asked, 0, "not handed out: nobody asked the outside world");
    const reconciler = new Reconciler(ledger, [{ name: tool, confirm }], { olderThanMs: 0 });
    assert.equal((await reconciler.round()).handedOut, 0, "nor is a reconciler");
    assert.ok(Date.now() - unknownSince < GRACE_MS, "all of it inside the grace");
    assert.equal((await ledger.lookup({ key: claim.entry.key })).status, "UNKNOWN");

    await sleep(unknownSince + GRACE_MS + 300 - Date.now());
    const again = await ledger.runOnce(run, tool, { n: 1 }, () => assert.fail("acted again"), { confirm, waitMs: 1_000 });
    assert.equal(asked, 1);
    assert.equal(again.replayed, true);
    assert.deepEqual(again.value, { credit_id: "cr-g" });
  });
});
