// The Reconciler against the real server, with tools wrapped by the real adapters: it settles
// the unknown outcomes of the tools it was given with a paired read, and of those only, in a
// store that also holds other tools' unknown entries; "cannot tell" leaves an entry; every
// settlement is logged with who settled it; it runs beside the agent (start/stop), stops on an
// AbortSignal, backs off while the ledger is unreachable, and paces its confirms. Settling at
// once (runOnce with confirm) is one settlement across callers.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { tool as aiTool } from "ai";
import { z } from "zod";
import { ledgerTool } from "../src/adapters/ai-sdk.js";
import { registerLedgerTool } from "../src/adapters/mcp.js";
import { ledgerTool as agentsLedgerTool } from "../src/adapters/openai-agents.js";
import {
  Ledger,
  NotFoundError,
  Reconciler,
  cannotTell,
  wrapTool,
  found,
  notFound,
  type Confirm,
  type LedgerEntry,
  type SettlementRecord,
} from "../src/index.js";
import { captureLog, sleep } from "./support/payments.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

describe("Reconciler", () => {
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

  /** An entry of `tool` whose outcome is unknown: claimed, then completed UNKNOWN. */
  async function unknownEntry(tool: string, args: Record<string, unknown>, run = uniqueRun("rec")): Promise<LedgerEntry> {
    const claim = await ledger.claim({ runId: run, tool, args });
    return (await ledger.complete({ key: claim.entry.key, claimToken: claim.claimToken, status: "UNKNOWN", error: "timeout" })).entry;
  }

  test("settles only its tools' entries; other tools' unknown entries are left as they are", async () => {
    const suffix = uniqueRun("t").replace(/[^a-z0-9]/gi, "_");
    const credit = `issue_credit_${suffix}`;
    const reply = `send_reply_${suffix}`;
    const ticket = `open_ticket_${suffix}`;
    const other = `other_tool_${suffix}`;
    const issued = new Set<string>();
    const asked: string[] = [];
    // issue_credit: an AI SDK tool wrapped by ledgerTool, with its paired read.
    const creditTool = ledgerTool(
      ledger,
      aiTool({ inputSchema: z.object({ n: z.number() }), execute: async ({ n }) => ({ credit: n }) }),
      {
        name: credit,
        confirm: ({ externalRef, arguments: args }) => {
          asked.push(externalRef);
          return issued.has(externalRef) ? found({ credit: (args as { n: number }).n }) : notFound;
        },
      },
    );
    // send_reply: an MCP tool registered by registerLedgerTool, with its paired read.
    const mcp = new McpServer({ name: "t", version: "1" });
    const replyTool = registerLedgerTool(mcp, ledger, reply, { inputSchema: { body: z.string() } }, async () => ({ content: [] }), {
      confirm: ({ externalRef }) => {
        asked.push(externalRef);
        return found({ content: [{ type: "text", text: `sent ${externalRef}` }] });
      },
    });
    // open_ticket: wrapped without a paired read; other_tool: not registered at all.
    const a = await unknownEntry(credit, { n: 1 });
    const b = await unknownEntry(credit, { n: 2 });
    const c = await unknownEntry(reply, { body: "hi" });
    const d = await unknownEntry(ticket, { subject: "s" });
    const e = await unknownEntry(other, { x: 1 });
    issued.add(a.externalRef);

    const records: SettlementRecord[] = [];
    const reconciler = new Reconciler(ledger, [creditTool, replyTool], {
      olderThanMs: 0,
      principal: "reconciler-under-test",
      onSettlement: (r) => records.push(r),
    });
    assert.deepEqual(reconciler.tools.map((t) => t.name), [credit, reply]);
    const first = await reconciler.round();
    assert.equal(first.handedOut, 3);
    assert.deepEqual(
      records.map((r) => [r.key, r.outcome, r.resolvedBy]).sort(),
      [
        [a.key, "found", "reconciler-under-test"],
        [b.key, "not_found", "reconciler-under-test"],
        [c.key, "found", "reconciler-under-test"],
      ].sort(),
    );
    assert.equal(asked.length, 3);

    const now = async (x: LedgerEntry) => ledger.lookup({ key: x.key });
    const settledA = await now(a);
    assert.equal(settledA.status, "SUCCEEDED");
    assert.equal(settledA.resolvedBy, "reconciler-under-test");
    // The found result is stored as the tool returns it, built from the arguments it was given.
    assert.equal(new TextDecoder().decode(settledA.result), '{"credit":1}');
    const settledB = await now(b);
    assert.equal(settledB.status, "FAILED");
    assert.equal(settledB.retryable, true);
    assert.equal((await now(c)).status, "SUCCEEDED");
    assert.equal((await now(d)).status, "UNKNOWN", "a tool without a paired read is not settled");
    assert.equal((await now(e)).status, "UNKNOWN", "another tool's entry is not settled");
    assert.equal((await now(d)).resolvedBy, "");

    // Every settlement is logged: key, tool, external_ref, outcome, who.
    for (const x of [a, b, c]) {
      assert.ok(
        log.lines.some((l) =>
          new RegExp(`^INFO settled key=${x.key} tool=${x.tool} external_ref=${x.externalRef} outcome=\\w+ status=\\w+ resolved_by=reconciler-under-test via=reconciler$`).test(l),
        ),
        `${x.key} logged`,
      );
    }
    // Nothing of its tools is left.
    assert.equal((await reconciler.round()).handedOut, 0);
  });

  test("a tool without a paired read is refused; by default it takes every registered tool with one", async () => {
    const name = `no_confirm_${uniqueRun("t").replace(/[^a-z0-9]/gi, "_")}`;
    const bare = ledgerTool(ledger, aiTool({ inputSchema: z.object({}), execute: async () => 1 }), { name });
    // Refused at construction, as a TypeError that names the tool and says what to register.
    for (const given of [[bare], { [name]: bare }, [name], [{ name, execute: () => 1 }]]) {
      assert.throws(
        () => new Reconciler(ledger, given as never),
        (err: unknown) =>
          err instanceof TypeError &&
          err.message.includes(`the tool ${name} has no paired read (confirm)`) &&
          err.message.includes("Register the tool with confirm: (attempt) => found(result) | notFound | cannotTell"),
        JSON.stringify(given),
      );
    }
    // Never skipped: one tool without a paired read refuses the whole reconciler, whatever else it is given.
    assert.throws(() => new Reconciler(ledger, [{ name: "fine", confirm: () => notFound }, bare]), TypeError);
    assert.throws(() => new Reconciler(ledger, [{ execute: () => 1 }]), /is not a tool registered with the ledger/);
    const own = server.ledger({ logger: log });
    assert.throws(() => new Reconciler(own), /no tool registered with this ledger has a paired read/);
    own.register({ name: "a", confirm: () => notFound });
    own.register({ name: "b" });
    assert.deepEqual(new Reconciler(own).tools.map((t) => t.name), ["a"]);
    // By name, as an Agents SDK FunctionTool is found.
    assert.deepEqual(new Reconciler(own, [{ name: "a", type: "function" }]).tools.map((t) => t.name), ["a"]);
  });

  test("a paired read that is not a function, or declares more than one parameter, is refused at registration, naming the tool", async () => {
    const name = `bad_read_${uniqueRun("t").replace(/[^a-z0-9]/gi, "_")}`;
    // What plain JavaScript lets through (TypeScript's compiler refuses both): a read written as
    // if called with the reference and the attempt's number, and a read that is not a function.
    const positional = ((externalRef: string, attempt: number) => (externalRef === `${attempt}` ? found(1) : notFound)) as unknown as Confirm;
    const notAFunction = "yes" as unknown as Confirm;
    const cases: Array<[Confirm, RegExp]> = [
      [positional, /confirm declares 2 parameters, but it is called with one: the attempt .*attempt\.externalRef.*"not found" lets the tool act again/],
      [notAFunction, /confirm must be a function \(attempt\) => found\(result\) \| notFound \| cannotTell.*; got string/],
    ];
    for (const [confirm, why] of cases) {
      const refused = (where: string) => (err: unknown) =>
        err instanceof TypeError && err.message.startsWith(`${where}`) && err.message.includes(name) && why.test(err.message);
      const own = server.ledger({ logger: log });
      assert.throws(() => own.register({ name, confirm }), refused("registering"));
      assert.throws(() => wrapTool(own, { name, execute: () => 1 }, { runId: "r", confirm }), refused("wrapTool:"));
      assert.throws(
        () => ledgerTool(own, aiTool({ inputSchema: z.object({}), execute: async () => 1 }), { name, confirm: confirm as never }),
        refused("wrapTool:"),
      );
      assert.throws(
        () => agentsLedgerTool(own, { name, execute: () => "1" }, { confirm }),
        refused("wrapTool:"),
      );
      const mcp = new McpServer({ name: "t", version: "1" });
      assert.throws(
        () => registerLedgerTool(mcp, own, name, {}, async () => ({ content: [] }), { confirm }),
        refused("registerLedgerTool:"),
      );
      assert.throws(() => new Reconciler(own, [{ name, confirm }]), refused("Reconciler:"));
      // Nothing registered, and runOnce claims nothing before refusing it.
      assert.deepEqual(own.registeredTools(), []);
      const run = uniqueRun("bad-read");
      let ran = false;
      await assert.rejects(own.runOnce(run, name, { n: 1 }, () => (ran = true), { confirm }), refused("runOnce:"));
      await assert.rejects(own.runTool(run, name, { n: 1 }, () => (ran = true), { confirm }), refused("runOnce:"));
      assert.equal(ran, false);
      await assert.rejects(own.lookup({ runId: run, tool: name, args: { n: 1 } }), NotFoundError);
    }
    // One parameter (destructured or not), none, or a rest parameter: accepted.
    const own = server.ledger({ logger: log });
    for (const confirm of [({ externalRef }: { externalRef: string }) => (externalRef ? notFound : cannotTell), () => cannotTell, (...a: unknown[]) => (a.length ? cannotTell : notFound)]) {
      assert.doesNotThrow(() => new Reconciler(own, [{ name, confirm: confirm as Confirm }]));
    }
  });

  test("cannot tell (or a confirm that throws) leaves the entry UNKNOWN, logged", async () => {
    const name = `unsure_${uniqueRun("t").replace(/[^a-z0-9]/gi, "_")}`;
    const x = await unknownEntry(name, { n: 1 });
    const y = await unknownEntry(name, { n: 2 });
    const confirm: Confirm = ({ arguments: args }) => {
      if ((args as { n: number }).n === 1) return cannotTell;
      throw new Error("the payments API search is down");
    };
    const records: SettlementRecord[] = [];
    const reconciler = new Reconciler(ledger, [{ name, confirm }], { olderThanMs: 0, onSettlement: (r) => records.push(r) });
    await reconciler.round();
    assert.deepEqual(records.map((r) => r.outcome), ["cannot_tell", "cannot_tell"]);
    assert.equal((await ledger.lookup({ key: x.key })).status, "UNKNOWN");
    assert.equal((await ledger.lookup({ key: y.key })).status, "UNKNOWN");
    assert.ok(log.lines.some((l) => l.startsWith("WARN") && l.includes(y.key) && l.includes("the payments API search is down")));
  });

  test("beside the agent: start() settles as entries appear; stop() and an AbortSignal end it cleanly", async () => {
    const name = `beside_${uniqueRun("t").replace(/[^a-z0-9]/gi, "_")}`;
    const records: SettlementRecord[] = [];
    const reconciler = new Reconciler(ledger, [{ name, confirm: () => notFound }], {
      olderThanMs: 0,
      intervalMs: 50,
      onSettlement: (r) => records.push(r),
    }).start();
    try {
      const x = await unknownEntry(name, { n: 1 });
      for (let i = 0; i < 200 && records.length === 0; i++) await sleep(25);
      assert.deepEqual(records.map((r) => [r.key, r.outcome]), [[x.key, "not_found"]]);
    } finally {
      await reconciler.stop();
    }
    assert.equal(reconciler.stopped, true);
    // Stopped: a new entry stays as it is.
    const y = await unknownEntry(name, { n: 2 });
    await sleep(200);
    assert.equal((await ledger.lookup({ key: y.key })).status, "UNKNOWN");

    const abort = new AbortController();
    const settled: SettlementRecord[] = [];
    const other = new Reconciler(ledger, [{ name, confirm: () => notFound }], {
      olderThanMs: 0,
      intervalMs: 10_000,
      signal: abort.signal,
      onSettlement: (r) => settled.push(r),
    }).start();
    try {
      // Its first round settles y (however slow the machine), then it idles for 10 s.
      for (let i = 0; i < 400 && settled.length === 0; i++) await sleep(25);
      await sleep(100);
      const started = Date.now();
      abort.abort();
      const stopped = await Promise.race([other.done.then(() => true), sleep(5_000).then(() => false)]);
      assert.ok(stopped, "the signal stops it");
      assert.ok(Date.now() - started < 2_000, "the idle pause ends at once");
      assert.equal((await ledger.lookup({ key: y.key })).status, "FAILED", "it settled what was there before the signal");
    } finally {
      await other.stop();
    }
  });

  test("a ledger it cannot reach: each round fails, logged, with growing pauses; it still stops at once", async () => {
    const lines = captureLog();
    const down = new Ledger({ address: "127.0.0.1:1", deadlineMs: 500, logger: lines });
    const reconciler = new Reconciler(down, [{ name: "t", confirm: () => notFound }], { backoffMs: 100, maxBackoffMs: 400 }).start();
    try {
      for (let i = 0; i < 200 && lines.lines.filter((l) => l.includes("round failed")).length < 3; i++) await sleep(25);
      const failures = lines.lines.filter((l) => l.includes("round failed"));
      assert.ok(failures.length >= 3, lines.lines.join("\n"));
      const pauses = failures.map((l) => Number(/next in (\d+) ms/.exec(l)![1]));
      // Doubling, jittered to half..whole of the step, capped.
      assert.ok(pauses[0] >= 50 && pauses[0] <= 100, String(pauses));
      assert.ok(pauses[1] >= 100 && pauses[1] <= 200, String(pauses));
      assert.ok(pauses.every((p) => p <= 400), String(pauses));
      const started = Date.now();
      await reconciler.stop();
      assert.ok(Date.now() - started < 2_000);
    } finally {
      await reconciler.stop();
      down.close();
    }
  });

  test("confirms are paced: at most maxConfirmsPerSecond, even when a timer fires late", async () => {
    const name = `paced_${uniqueRun("t").replace(/[^a-z0-9]/gi, "_")}`;
    for (let n = 0; n < 5; n++) await unknownEntry(name, { n });
    const at: number[] = [];
    const confirm: Confirm = () => {
      at.push(Date.now());
      if (at.length === 1) {
        // The process is busy (70 ms of work 20 ms after the first confirm): the timer of the
        // second fires late, and the third must still come a full interval after the second.
        setTimeout(() => {
          const end = Date.now() + 70;
          while (Date.now() < end);
        }, 20);
      }
      return notFound;
    };
    const reconciler = new Reconciler(ledger, [{ name, confirm }], { olderThanMs: 0, maxConfirmsPerSecond: 20 });
    await reconciler.round();
    assert.equal(at.length, 5);
    assert.ok(at[1] - at[0] >= 80, `the second was held up: ${at[1] - at[0]} ms`);
    // 20 a second: 50 ms apart at least, however late the timers fired.
    for (let i = 1; i < at.length; i++) assert.ok(at[i] - at[i - 1] >= 49, `${at.map((t, j) => (j ? t - at[j - 1] : 0)).join(", ")} ms apart`);
  });

  test("two callers meeting the same unknown outcome: one settles it (confirm asked once), both replay the result", async () => {
    const name = `shared_${uniqueRun("t").replace(/[^a-z0-9]/gi, "_")}`;
    const run = uniqueRun("shared");
    const x = await unknownEntry(name, { n: 7 }, run);
    let asked = 0;
    const confirm: Confirm<{ ok: number }> = async () => {
      asked++;
      await sleep(100); // slow enough for the other caller to arrive while this one holds the entry
      return found({ ok: 7 });
    };
    const one = server.ledger({ logger: log, confirmDelayMs: 0 });
    const two = server.ledger({ logger: log, confirmDelayMs: 0 });
    let ran = 0;
    const results = await Promise.all(
      [one, two].map((l) => l.runOnce(run, name, { n: 7 }, () => ({ ok: ++ran }), { confirm, waitMs: 0 }).catch((e: unknown) => e)),
    );
    assert.equal(asked, 1, "one settlement");
    assert.equal(ran, 0, "nothing re-ran");
    const settled = await ledger.lookup({ key: x.key });
    assert.equal(settled.status, "SUCCEEDED");
    // The one that settled it replays the found result; the other replays it too, or (if it
    // asked while the entry was held) still reads the outcome as unknown, never a new effect.
    const replays = results.filter((r) => (r as { replayed?: boolean }).replayed === true);
    assert.ok(replays.length >= 1, JSON.stringify(results));
    for (const r of replays) assert.deepEqual((r as { value: unknown }).value, { ok: 7 });
  });
});
