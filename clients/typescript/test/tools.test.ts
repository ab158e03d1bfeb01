// runTool and wrapTool against the real server, without a framework: the wrapped tool keeps its
// shape, records execute's first argument, hands the attempt to the tool (currentAttempt), and
// never throws for an outcome: toModelText() says what happened, for every outcome.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  InProgressError,
  Ledger,
  NotExecutedError,
  OutcomeUnknownError,
  PermanentFailureError,
  ToolCallResult,
  currentAttempt,
  deriveKey,
  modelTextOf,
  type ActionContext,
} from "../src/index.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

const REPLAY_NOTE = /already performed.*No new action was taken/;

/** A tool as frameworks define one: a name, a schema, an execute(input, frameworkContext). */
class CreditTool {
  readonly name = "issue_credit";
  readonly description = "Issues a credit to a customer.";
  readonly parameters = { type: "object", properties: { customer: { type: "string" }, amount: { type: "number" } } };
  readonly credits: Array<{ customer: string; amount: number; ref: string }> = [];
  seen: ActionContext | undefined;

  execute(input: { customer: string; amount: number }, context: { runId?: string }) {
    void context;
    const attempt = currentAttempt();
    this.seen = attempt;
    if (input.amount <= 0) throw new NotExecutedError(`amount must be positive, got ${input.amount}`);
    if (input.customer === "c-closed") throw new PermanentFailureError("account c-closed is closed");
    if (input.customer === "c-timeout") throw new DOMException("the payments API did not answer", "TimeoutError");
    this.credits.push({ ...input, ref: attempt!.externalRef });
    return { credit_id: `cr-${this.credits.length}` };
  }

  describeSelf(): string {
    return `${this.name}: ${this.description}`;
  }
}

describe("wrapTool and runTool", () => {
  let server: TestServer;
  let ledger: Ledger;
  before(async () => {
    server = await startServer();
    ledger = server.ledger();
  });
  after(async () => {
    await server.stop();
  });

  const wrap = (tool: CreditTool) =>
    ledger.wrapTool(tool, { runId: (_input, context) => context.runId, runIdHint: "pass { runId } as the context" });

  test("the wrapped tool keeps its shape: name, schema, prototype; only execute changes", () => {
    const tool = new CreditTool();
    const wrapped = wrap(tool);
    assert.equal(wrapped.name, "issue_credit");
    assert.equal(wrapped.description, tool.description);
    assert.equal(wrapped.parameters, tool.parameters);
    assert.ok(wrapped instanceof CreditTool);
    assert.equal(wrapped.describeSelf(), tool.describeSelf());
    assert.notEqual(wrapped.execute, tool.execute);
    assert.equal(tool.execute, CreditTool.prototype.execute, "the original is left alone");
  });

  test("first run: the result, the attempt handed to the tool; a repeat: the stored result with the note", async () => {
    const tool = new CreditTool();
    const wrapped = wrap(tool);
    const run = uniqueRun("wrap");
    const first = await wrapped.execute({ customer: "c-42", amount: 200 }, { runId: run });
    assert.ok(first instanceof ToolCallResult);
    assert.equal(first.outcome, "performed");
    assert.deepEqual(first.value, { credit_id: "cr-1" });
    assert.equal(first.toModelText(), '{"credit_id":"cr-1"}');
    // The recorded arguments are the model's (the first argument), not the framework context.
    assert.equal(first.entry!.key, deriveKey(run, "issue_credit", { amount: 200, customer: "c-42" }));
    assert.equal(tool.seen?.key, first.entry!.key);
    assert.equal(tool.seen?.externalRef, first.entry!.externalRef);
    assert.equal(tool.seen?.attempt, 1);
    assert.equal(tool.credits[0].ref, first.entry!.externalRef);
    assert.equal(currentAttempt(), undefined, "only inside the tool");

    const again = await wrapped.execute({ amount: 2e2, customer: "c-42" }, { runId: run });
    assert.equal(again.outcome, "replayed");
    assert.equal(again.replayed, true);
    assert.match(again.note, REPLAY_NOTE);
    assert.equal(again.toModelText(), `${again.note} Result: {"credit_id":"cr-1"}`);
    assert.equal(tool.credits.length, 1);

    // Another run is another intent.
    const other = await wrapped.execute({ customer: "c-42", amount: 200 }, { runId: uniqueRun("wrap") });
    assert.equal(other.outcome, "performed");
    assert.equal(tool.credits.length, 2);
  });

  test("a call without a run id is not performed, and the model is told why", async () => {
    const tool = new CreditTool();
    const out = await wrap(tool).execute({ customer: "c-1", amount: 1 }, {});
    assert.equal(out.outcome, "not_executed");
    assert.match(out.toModelText(), /^This action was not performed: the tool issue_credit was called without a run id/);
    assert.match(out.toModelText(), /pass \{ runId \} as the context/);
    assert.equal(tool.credits.length, 0);
    assert.equal(tool.seen, undefined);
  });

  test("a tool that throws NotExecutedError before acting leaves the intent retryable", async () => {
    const tool = new CreditTool();
    const wrapped = wrap(tool);
    const run = uniqueRun("not-executed");
    const out = await wrapped.execute({ customer: "c-2", amount: 0 }, { runId: run });
    assert.equal(out.outcome, "not_executed");
    assert.match(out.toModelText(), /not performed: amount must be positive, got 0\. Nothing happened, so it may be called again/);
    assert.equal(out.entry?.status, "FAILED");
    assert.equal(out.entry?.retryable, true);
    const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: { customer: "c-2", amount: 0 } });
    assert.equal(entry.status, "FAILED");
    assert.equal(entry.retryable, true);
  });

  test("a permanent failure, then the stored error on a repeat, quoted once", async () => {
    const wrapped = wrap(new CreditTool());
    const run = uniqueRun("permanent");
    const args = { customer: "c-closed", amount: 5 };
    const out = await wrapped.execute(args, { runId: run });
    assert.equal(out.outcome, "failed");
    assert.match(out.toModelText(), /will not succeed with the same arguments: account c-closed is closed/);
    const again = await wrapped.execute(args, { runId: run });
    assert.equal(again.outcome, "previously_failed");
    assert.match(again.toModelText(), /already failed permanently/);
    assert.equal(again.toModelText().split("account c-closed is closed").length - 1, 1, again.toModelText());
  });

  test("an error that may follow an effect: outcome unknown, never re-run", async () => {
    const tool = new CreditTool();
    const wrapped = wrap(tool);
    const run = uniqueRun("unknown");
    const args = { customer: "c-timeout", amount: 5 };
    const out = await wrapped.execute(args, { runId: run });
    assert.equal(out.outcome, "outcome_unknown");
    assert.match(out.toModelText(), /outcome of this action is unknown \(the payments API did not answer\)/);
    assert.match(out.toModelText(), /do not call it again/);
    assert.equal((await ledger.lookup({ runId: run, tool: "issue_credit", args })).status, "UNKNOWN");
    const again = await wrapped.execute(args, { runId: run });
    assert.equal(again.outcome, "outcome_unknown");
    assert.ok(again.error instanceof OutcomeUnknownError);
    assert.match(again.toModelText(), /outcome is unknown and is being reconciled/);
  });

  test("an attempt still in flight after the wait: in progress, with the server's note", async () => {
    const run = uniqueRun("in-flight");
    const args = { customer: "c-3", amount: 3 };
    await ledger.claim({ runId: run, tool: "issue_credit", args });
    const tool = new CreditTool();
    const wrapped = ledger.wrapTool(tool, { runId: run, waitMs: 0 });
    const out = await wrapped.execute(args, {});
    assert.equal(out.outcome, "in_progress");
    assert.ok(out.error instanceof InProgressError);
    assert.match(out.toModelText(), /already being performed by another attempt.*do not repeat it/);
    assert.ok((out.retryAfter ?? 0) > 0);
    assert.equal(tool.credits.length, 0);
  });

  test("arguments the ledger refuses, an unreachable ledger: not performed, with the reason", async () => {
    const tool = new CreditTool();
    const refused = await ledger
      .wrapTool(tool, { runId: uniqueRun("refused") })
      .execute({ customer: "c-4", amount: 2n ** 53n + 1n } as unknown as { customer: string; amount: number }, {});
    assert.equal(refused.outcome, "not_executed");
    assert.match(refused.toModelText(), /arguments were refused \(UNSAFE_INTEGER\)/);

    const down = new Ledger({ address: "127.0.0.1:1", deadlineMs: 2_000 });
    try {
      const out = await down.wrapTool(tool, { runId: "r" }).execute({ customer: "c-4", amount: 4 }, {});
      assert.equal(out.outcome, "not_executed");
      assert.match(out.toModelText(), /ledger could not be asked whether it already ran \(UNAVAILABLE: .*\), so nothing was done/);
      assert.doesNotMatch(out.toModelText(), /UNAVAILABLE UNAVAILABLE/);
    } finally {
      down.close();
    }
    assert.equal(tool.credits.length, 0);
  });

  test("the wrapper's own failure before the claim is not performed; a bad tool is refused at wrap time", async () => {
    const tool = new CreditTool();
    const out = await ledger
      .wrapTool(tool, {
        runId: "r",
        arguments: () => {
          throw new Error("no arguments today");
        },
      })
      .execute({ customer: "c", amount: 1 }, {});
    assert.equal(out.outcome, "not_executed");
    assert.match(out.toModelText(), /could not prepare the call: no arguments today/);
    assert.throws(() => ledger.wrapTool({ execute: () => 1 }, { runId: "r" }), /has no name; pass options.name/);
    assert.throws(() => ledger.wrapTool({ name: "t" } as never, { runId: "r" }), /an execute function/);
    assert.throws(() => ledger.wrapTool(tool, {} as never), /runId is required/);
  });

  test("a streaming execute (an async iterable) is stored with its last value", async () => {
    const tool = {
      name: "count_up",
      async *execute(input: { to: number }) {
        for (let i = 1; i <= input.to; i++) yield { n: i };
      },
    };
    const run = uniqueRun("stream");
    const wrapped = ledger.wrapTool(tool, { runId: run });
    const out = await wrapped.execute({ to: 3 });
    assert.deepEqual(out.value, { n: 3 });
    const again = await wrapped.execute({ to: 3 });
    assert.deepEqual(again.value, { n: 3 });
    assert.equal(again.outcome, "replayed");
  });

  test("toJSON carries the model's text, so a persisted output still reads right", async () => {
    const run = uniqueRun("json");
    const wrapped = ledger.wrapTool({ name: "send_reply", execute: (input: { body: string }) => `sent: ${input.body}` }, { runId: run });
    const first = await wrapped.execute({ body: "hi" });
    assert.equal(first.toModelText(), "sent: hi");
    const again = await wrapped.execute({ body: "hi" });
    const persisted = JSON.parse(JSON.stringify(again)) as unknown;
    assert.equal(modelTextOf(persisted), again.toModelText());
    assert.equal(modelTextOf(again), again.toModelText());
    assert.match(modelTextOf(persisted), REPLAY_NOTE);
    assert.equal(modelTextOf({ plain: 1 }), '{"plain":1}');
  });

  test("runTool: the same outcomes for a hand-written dispatcher", async () => {
    const run = uniqueRun("run-tool");
    const first = await ledger.runTool(run, "send_reply", { ticket: "T-1" }, () => undefined);
    assert.equal(first.toModelText(), "Done.");
    const again = await ledger.runTool(run, "send_reply", { ticket: "T-1" }, () => "never");
    assert.equal(again.outcome, "replayed");
    assert.equal(again.toModelText(), again.note);
    const noRun = await ledger.runTool(undefined, "send_reply", { ticket: "T-1" }, () => "never");
    assert.equal(noRun.outcome, "not_executed");
  });
});
