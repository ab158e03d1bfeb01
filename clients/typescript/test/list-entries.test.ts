// listEntries against the real server: an async iterator over every page of a run, with no gaps
// or repeats, filters, and entries carrying the arguments the server kept for audit.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Ledger, LedgerEntry } from "../src/index.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

/** More than two pages of PAGE entries, so the iteration must follow two page tokens. */
const COUNT = 23;
const PAGE = 10;

async function collect(entries: AsyncIterable<LedgerEntry>): Promise<LedgerEntry[]> {
  const out: LedgerEntry[] = [];
  for await (const e of entries) out.push(e);
  return out;
}

describe("listEntries", () => {
  let server: TestServer;
  let ledger: Ledger;
  before(async () => {
    server = await startServer();
    ledger = server.ledger();
  });
  after(async () => {
    await server.stop();
  });

  /** COUNT entries in a new run, every fifth left in flight; returns the run and key → n. */
  async function fill(label: string): Promise<{ run: string; keys: Map<string, number> }> {
    const run = uniqueRun(label);
    const keys = new Map<string, number>();
    for (let n = 0; n < COUNT; n++) {
      const claimed = await ledger.claim({ runId: run, tool: "issue_credit", args: { n, customer: "c-42" } });
      if (n % 5 !== 0) {
        await ledger.complete({
          key: claimed.entry.key,
          claimToken: claimed.claimToken,
          status: "SUCCEEDED",
          result: new TextEncoder().encode("{}"),
        });
      }
      keys.set(claimed.entry.key, n);
    }
    await ledger.claim({ runId: `${run}-other`, tool: "issue_credit", args: { n: 0 } });
    return { run, keys };
  }

  test("pages through a run with more entries than one page, without gaps or repeats", async () => {
    const { run, keys } = await fill("list");
    const listed = await collect(ledger.listEntries({ runId: run, pageSize: PAGE }));
    assert.equal(listed.length, COUNT);
    assert.deepEqual(new Set(listed.map((e) => e.key)), new Set(keys.keys()));
    const started = listed.map((e) => e.startedAt!.getTime());
    assert.deepEqual(started, [...started].sort((a, b) => a - b), "oldest attempt first");
    for (const e of listed) {
      assert.equal(e.runId, run);
      assert.equal(e.argumentsJson, `{"customer":"c-42","n":${keys.get(e.key)}}`);
    }
    // The default page size holds them all: the same entries in the same order.
    const whole = await collect(ledger.listEntries({ runId: run }));
    assert.deepEqual(
      whole.map((e) => e.key),
      listed.map((e) => e.key),
    );
    // Lookup tells the same entry, arguments included.
    assert.deepEqual(await ledger.lookup({ key: listed[0].key }), listed[0]);
  });

  test("filters by status, tool and start time", async () => {
    const { run, keys } = await fill("filters");
    const attempting = await collect(ledger.listEntries({ runId: run, status: "ATTEMPTING", pageSize: 2 }));
    assert.deepEqual(attempting.map((e) => keys.get(e.key)).sort((a, b) => a! - b!), [0, 5, 10, 15, 20]);
    assert.ok(attempting.every((e) => e.status === "ATTEMPTING"));
    const succeeded = await collect(ledger.listEntries({ runId: run, status: "SUCCEEDED" }));
    assert.equal(succeeded.length, COUNT - 5);
    assert.deepEqual(await collect(ledger.listEntries({ runId: run, tool: "send_reply" })), []);
    const future = new Date(Date.now() + 3_600_000);
    assert.deepEqual(await collect(ledger.listEntries({ runId: run, startedAfter: future })), []);
    assert.equal((await collect(ledger.listEntries({ runId: run, startedBefore: future }))).length, COUNT);
  });
});
