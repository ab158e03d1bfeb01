// runTool and wrapTool against the real server, without a framework: the wrapped tool keeps its
// shape, records execute's first argument, hands the attempt to the tool (currentAttempt), and
// never throws for an outcome: toModelText() says what happened, for every outcome. What the
// tool throws decides the record: NotExecutedError (itself or as the cause) and the classes it
// declares notExecuted are FAILED retryable, anything else UNKNOWN (read as the ledger's note).

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  InProgressError,
  LEDGER_TOOL,
  Ledger,
  MissingRunIdError,
  NotExecutedError,
  UNKNOWN_NOTE,
  notFound,
  registrationOf,
  OutcomeUnknownError,
  PermanentFailureError,
  ToolCallResult,
  currentAttempt,
  deriveKey,
  modelTextOf,
  wrapTool,
  type ActionContext,
} from "../src/index.js";
import { captureLog } from "./support/payments.js";
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
  const log = captureLog();
  before(async () => {
    server = await startServer();
    ledger = server.ledger({ logger: log });
  });
  after(async () => {
    await server.stop();
  });

  const wrap = (tool: CreditTool) =>
    wrapTool(ledger, tool, { runId: (_input: unknown, context: { runId?: string }) => context.runId, runIdHint: "pass { runId } as the context" });

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
    // The ledger's own note, word for word, as a repeat reads it (and the Python client says).
    assert.equal(out.toModelText(), UNKNOWN_NOTE);
    const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args });
    assert.equal(entry.status, "UNKNOWN");
    assert.match(entry.error, /TimeoutError: the payments API did not answer/, "the tool's error is kept for people");
    const again = await wrapped.execute(args, { runId: run });
    assert.equal(again.outcome, "outcome_unknown");
    assert.ok(again.error instanceof OutcomeUnknownError);
    assert.equal(again.toModelText(), UNKNOWN_NOTE);
    assert.equal(tool.credits.length, 0);
  });

  test("NotExecutedError as the cause, or a class the tool declares notExecuted: FAILED retryable; other errors UNKNOWN", async () => {
    class ValidationError extends Error {}
    let attempt = 0;
    const throwing = (error: () => Error) =>
      wrapTool(
        ledger,
        { name: `validate_${++attempt}`, execute: (_input: object) => Promise.reject(error()) },
        { runId: uniqueRun("classes"), notExecuted: [ValidationError] },
      );
    const framed = await throwing(() => new Error("the framework's retry", { cause: new NotExecutedError("no effect") })).execute({});
    assert.equal(framed.outcome, "not_executed");
    assert.equal(framed.entry?.status, "FAILED");
    assert.equal(framed.entry?.retryable, true);
    const declared = await throwing(() => new ValidationError("amount: expected a number")).execute({});
    assert.equal(declared.outcome, "not_executed");
    assert.match(declared.toModelText(), /^This action was not performed: amount: expected a number\. Nothing happened, so it may be called again\.$/);
    assert.equal(declared.entry?.retryable, true);
    // A cause that is not NotExecutedError proves nothing.
    const other = await throwing(() => new Error("retry later", { cause: new ValidationError("?") })).execute({});
    assert.equal(other.outcome, "outcome_unknown");
    assert.equal(other.entry?.status, "UNKNOWN");
  });

  test("a missing run id is logged once per tool, naming the fix; throwOnMissingRunId throws it to the developer", async () => {
    const tool = new CreditTool();
    const name = `no_run_${uniqueRun("t")}`;
    const quiet = wrapTool(ledger, tool, { name, runId: () => undefined, runIdHint: "set it in the context" });
    await quiet.execute({ customer: "c", amount: 1 }, {});
    await quiet.execute({ customer: "c", amount: 1 }, {});
    const lines = log.lines.filter((l) => l.includes(`${name} was called without a run id`));
    assert.deepEqual(lines.length, 1);
    assert.match(lines[0], /^ERROR .*nothing ran\. Fix: set it in the context\. \(Logged once per tool\.\)$/);
    const loud = wrapTool(ledger, tool, { name, runId: () => undefined, throwOnMissingRunId: true });
    await assert.rejects(loud.execute({ customer: "c", amount: 1 }, {}), MissingRunIdError);
    assert.equal(tool.credits.length, 0);
  });

  test("a wrapped tool is registered with the ledger, with its paired read; strict mode refuses one without", async () => {
    const confirm = () => notFound;
    const wrapped = wrapTool(ledger, new CreditTool(), { runId: "r", name: "registered_tool", confirm });
    assert.equal(registrationOf(wrapped)?.confirm, confirm);
    assert.equal((wrapped as unknown as Record<symbol, unknown>)[LEDGER_TOOL], registrationOf(wrapped));
    assert.ok(!Object.keys(wrapped).some((k) => k.includes("ledger")), "not an enumerable property");
    assert.equal(ledger.registeredTools().find((r) => r.name === "registered_tool")?.confirm, confirm);
    const strict = server.ledger({ requireConfirm: true });
    assert.throws(
      () => wrapTool(strict, new CreditTool(), { runId: "r" }),
      /wrapTool: issue_credit: this Ledger requires a paired read \(requireConfirm: true\) and the tool has none/,
    );
    await assert.rejects(strict.runTool("r", "t", {}, () => 1), /runOnce: t: this Ledger requires a paired read/);
    await assert.rejects(strict.runOnce("r", "t", {}, () => 1), /runOnce: t: this Ledger requires a paired read/);
  });

  test("an attempt still in flight after the wait: in progress, with the server's note", async () => {
    const run = uniqueRun("in-flight");
    const args = { customer: "c-3", amount: 3 };
    await ledger.claim({ runId: run, tool: "issue_credit", args });
    const tool = new CreditTool();
    const wrapped = wrapTool(ledger, tool, { runId: run, waitMs: 0 });
    const out = await wrapped.execute(args, {});
    assert.equal(out.outcome, "in_progress");
    assert.ok(out.error instanceof InProgressError);
    assert.match(out.toModelText(), /already being performed by another attempt.*do not repeat it/);
    assert.ok((out.retryAfter ?? 0) > 0);
    assert.equal(tool.credits.length, 0);
  });

  test("arguments the ledger refuses, an unreachable ledger: not performed, with the reason", async () => {
    const tool = new CreditTool();
    const refused = await wrapTool(ledger, tool, { runId: uniqueRun("refused") })
      .execute({ customer: "c-4", amount: 2n ** 53n + 1n } as unknown as { customer: string; amount: number }, {});
    assert.equal(refused.outcome, "not_executed");
    assert.match(refused.toModelText(), /arguments were refused \(UNSAFE_INTEGER\)/);

    const down = new Ledger({ address: "127.0.0.1:1", deadlineMs: 2_000, retryBudgetMs: 0 });
    try {
      const out = await wrapTool(down, tool, { runId: "r" }).execute({ customer: "c-4", amount: 4 }, {});
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
    const out = await wrapTool(ledger, tool, {
        runId: "r",
        arguments: () => {
          throw new Error("no arguments today");
        },
      })
      .execute({ customer: "c", amount: 1 }, {});
    assert.equal(out.outcome, "not_executed");
    assert.match(out.toModelText(), /could not prepare the call: no arguments today/);
    assert.throws(() => wrapTool(ledger, { execute: () => 1 }, { runId: "r" }), /has no name; pass options.name/);
    assert.throws(() => wrapTool(ledger, { name: "t" } as never, { runId: "r" }), /an execute function/);
    assert.throws(() => wrapTool(ledger, tool, {} as never), /runId is required/);
  });

  test("a streaming execute (an async iterable) is stored with its last value", async () => {
    const tool = {
      name: "count_up",
      async *execute(input: { to: number }) {
        for (let i = 1; i <= input.to; i++) yield { n: i };
      },
    };
    const run = uniqueRun("stream");
    const wrapped = wrapTool(ledger, tool, { runId: run });
    const out = await wrapped.execute({ to: 3 });
    assert.deepEqual(out.value, { n: 3 });
    const again = await wrapped.execute({ to: 3 });
    assert.deepEqual(again.value, { n: 3 });
    assert.equal(again.outcome, "replayed");
  });

  test("toJSON carries the model's text, so a persisted output still reads right", async () => {
    const run = uniqueRun("json");
    const wrapped = wrapTool(ledger, { name: "send_reply", execute: (input: { body: string }) => `sent: ${input.body}` }, { runId: run });
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
