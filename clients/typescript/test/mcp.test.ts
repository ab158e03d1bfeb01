// The MCP adapter against the real `@modelcontextprotocol/sdk` and the real server: an McpServer
// with tools registered by registerLedgerTool, and the SDK's own Client over its in-memory
// transport. The client plays the agent host: it forwards the model's tool calls, the model's
// JSON text parsed as any host parses it, with the run id in the request's _meta. As for every
// adapter: one effect per intent; the SDK's own error (McpError) or an isError result after
// acting is an unknown outcome (the note, as a normal result, on the call and on the repeat);
// with the tool's paired read it settles at once; strict mode; a missing run id is logged.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { ErrorCode, McpError, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { RUN_ID_META_KEY, registerLedgerTool } from "../src/adapters/mcp.js";
import { NOT_PERFORMED_NOTE, NotExecutedError, UNKNOWN_NOTE, currentAttempt, found, notFound, type Ledger } from "../src/index.js";
import { Payments, captureLog, sleep } from "./support/payments.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

const REPLAY_NOTE = /already performed.*No new action was taken/;

const CALL = '{"customer":"c-42","amount":200,"currency":"EUR"}';
// The model's respelling; JSON-RPC carries the parsed value, so the ledger sees 200 either way.
const RESPELLED = '{"currency":"EUR","amount":2e2,"customer":"c-42"}';

function texts(result: CallToolResult): string[] {
  return result.content.map((c) => (c.type === "text" ? c.text : `<${c.type}>`));
}

describe("MCP TypeScript SDK (McpServer, Client, in-memory transport)", () => {
  let ledgerServer: TestServer;
  let ledger: Ledger;
  const log = captureLog();
  before(async () => {
    ledgerServer = await startServer();
    ledger = ledgerServer.ledger({ logger: log, confirmDelayMs: 50 });
  });
  after(async () => {
    await ledgerServer.stop();
  });

  /** An MCP server with the payments tools, and a connected client. */
  async function connect(
    options: {
      confirm?: boolean;
      /** Thrown after the credit is issued, as a payments client that lost the answer would. */
      failAfter?: () => Error;
      /** Thrown before the credit is issued (not declared as not acting: an unknown outcome). */
      failBefore?: () => Error;
      /** The ledger's time limit of the callback; it then waits, acting only if not stopped. */
      timeoutMs?: number;
    } = {},
  ) {
    const world = new Payments();
    const credits = world.credits;
    const state = { down: false, reportError: false };
    const server = new McpServer({ name: "payments", version: "1.0.0" });
    const text = (v: unknown) => ({ content: [{ type: "text" as const, text: JSON.stringify(v) }] });
    registerLedgerTool(
      server,
      ledger,
      "issue_credit",
      {
        description: "Issue a credit to a customer's account.",
        inputSchema: { customer: z.string(), amount: z.number(), currency: z.string() },
      },
      async (input) => {
        if (state.down) throw new NotExecutedError("the payments API refused the connection");
        const attempt = currentAttempt()!;
        if (options.timeoutMs !== undefined) await sleep(options.timeoutMs * 20, attempt.signal);
        if (options.failBefore) throw options.failBefore();
        if (state.reportError) {
          world.issue(input, attempt.externalRef);
          return { content: [{ type: "text", text: "payments API: 502 Bad Gateway" }], isError: true };
        }
        const out = world.issue(input, attempt.externalRef);
        if (options.failAfter) throw options.failAfter();
        return text(out);
      },
      {
        ...(options.confirm
          ? {
              // The paired read answers with the result the callback returns.
              confirm: async (attempt) => {
                const answer = await world.confirm(attempt);
                return answer.kind === "found" ? found(text(answer.result)) : answer;
              },
            }
          : {}),
        ...(options.timeoutMs !== undefined ? { timeoutMs: options.timeoutMs } : {}),
      },
    );
    registerLedgerTool(
      server,
      ledger,
      "open_ticket",
      {
        description: "Open a support ticket.",
        inputSchema: { subject: z.string() },
        outputSchema: { ticket_id: z.string() },
      },
      async ({ subject }) => {
        const ticket = { ticket_id: `T-${subject.length}` };
        return { content: [{ type: "text", text: JSON.stringify(ticket) }], structuredContent: ticket };
      },
    );
    const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
    const client = new Client({ name: "agent-host", version: "1.0.0" });
    await Promise.all([server.connect(serverSide), client.connect(clientSide)]);
    const callTool = async (runId: string | undefined, name: string, argsJson: string) =>
      (await client.callTool({
        name,
        arguments: JSON.parse(argsJson) as Record<string, unknown>,
        ...(runId === undefined ? {} : { _meta: { [RUN_ID_META_KEY]: runId } }),
      })) as CallToolResult;
    const close = async () => {
      await client.close();
      await server.close();
    };
    return { credits, world, state, client, callTool, close };
  }

  test("two parallel identical calls and a respelled one: one credit, one result and two replay notes", async () => {
    const mcp = await connect();
    try {
      const run = uniqueRun("mcp");
      const parallel = await Promise.all([
        mcp.callTool(run, "issue_credit", CALL),
        mcp.callTool(run, "issue_credit", CALL),
      ]);
      const respelled = await mcp.callTool(run, "issue_credit", RESPELLED);
      assert.equal(mcp.credits.length, 1, "the side effect happened once");
      const results = [...parallel, respelled];
      assert.ok(results.every((r) => !r.isError));
      const firsts = results.filter((r) => !REPLAY_NOTE.test(texts(r)[0]));
      assert.deepEqual(firsts.map(texts), [['{"credit_id":"cr-1"}']]);
      const replays = results.filter((r) => REPLAY_NOTE.test(texts(r)[0]));
      assert.equal(replays.length, 2);
      // A replay is the stored result, the note first.
      for (const r of replays) assert.deepEqual(texts(r).slice(1), ['{"credit_id":"cr-1"}']);
      const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL });
      assert.equal(entry.externalRef, mcp.credits[0].ref);

      await mcp.callTool(uniqueRun("mcp"), "issue_credit", CALL);
      assert.equal(mcp.credits.length, 2, "a second run acts again");
    } finally {
      await mcp.close();
    }
  });

  test("a tool that throws before acting leaves the intent retryable: FAILED retryable, then attempt 2", async () => {
    const mcp = await connect();
    try {
      const run = uniqueRun("mcp-retry");
      mcp.state.down = true;
      const failed = await mcp.callTool(run, "issue_credit", CALL);
      assert.equal(failed.isError, true, "nothing happened: a tool error the model may retry");
      assert.match(texts(failed)[0], /^This action was not performed: the payments API refused the connection/);
      const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL });
      assert.equal(entry.status, "FAILED");
      assert.equal(entry.retryable, true);

      mcp.state.down = false;
      const retried = await mcp.callTool(run, "issue_credit", RESPELLED);
      assert.deepEqual(texts(retried), ['{"credit_id":"cr-1"}']);
      assert.equal((await ledger.lookup({ key: entry.key })).attempt, 2);
    } finally {
      await mcp.close();
    }
  });

  test("a call without the run id in _meta is a clear tool error, logged once, and nothing runs", async () => {
    const mcp = await connect();
    try {
      const out = await mcp.callTool(undefined, "issue_credit", CALL);
      assert.equal(out.isError, true);
      assert.match(texts(out)[0], /not performed: the tool issue_credit was called without a run id/);
      assert.match(texts(out)[0], /_meta\["idempotency-ledger\/run_id"\]/);
      assert.doesNotMatch(texts(out)[0], /try again/i);
      const empty = await mcp.callTool("", "issue_credit", CALL);
      assert.equal(empty.isError, true);
      assert.equal(mcp.credits.length, 0);
      // The SDK lets no exception reach the host: the server's log tells the developer, once.
      const logged = log.lines.filter((l) => l.includes("issue_credit was called without a run id"));
      assert.equal(logged.length, 1);
      assert.match(logged[0], /^ERROR .*Fix: the MCP client sends it as _meta\["idempotency-ledger\/run_id"\]/);
    } finally {
      await mcp.close();
    }
  });

  test("a result the tool marks isError may follow an effect: UNKNOWN, the note as a normal result, on the call and the repeat", async () => {
    const mcp = await connect();
    try {
      const run = uniqueRun("mcp-error");
      mcp.state.reportError = true;
      const out = await mcp.callTool(run, "issue_credit", CALL);
      assert.notEqual(out.isError, true, "an unknown outcome is not a failure to retry");
      assert.deepEqual(texts(out), [UNKNOWN_NOTE]);
      const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL });
      assert.equal(entry.status, "UNKNOWN");
      assert.match(entry.error, /payments API: 502 Bad Gateway/, "the tool's words are the entry's error");
      mcp.state.reportError = false;
      const again = await mcp.callTool(run, "issue_credit", CALL);
      assert.notEqual(again.isError, true);
      assert.deepEqual(texts(again), [UNKNOWN_NOTE], "the repeat reads the same");
      assert.equal(mcp.credits.length, 1, "never re-run silently");
    } finally {
      await mcp.close();
    }
  });

  test("the SDK's own error after acting (McpError): one credit, the unknown note on the call and on the repeat", async () => {
    const mcp = await connect({ failAfter: () => new McpError(ErrorCode.InternalError, "payments API: connection reset") });
    try {
      const run = uniqueRun("mcp-unknown");
      const out = await mcp.callTool(run, "issue_credit", CALL);
      assert.notEqual(out.isError, true);
      assert.deepEqual(texts(out), [UNKNOWN_NOTE]);
      assert.equal((await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL })).status, "UNKNOWN");
      const again = await mcp.callTool(run, "issue_credit", RESPELLED);
      assert.deepEqual(texts(again), [UNKNOWN_NOTE]);
      assert.equal(mcp.credits.length, 1);
    } finally {
      await mcp.close();
    }
  });

  test("with confirm, the same failure settles SUCCEEDED and the client reads the result on the first call", async () => {
    const mcp = await connect({ confirm: true, failAfter: () => new McpError(ErrorCode.InternalError, "payments API: 504") });
    try {
      const run = uniqueRun("mcp-confirm");
      const out = await mcp.callTool(run, "issue_credit", CALL);
      assert.notEqual(out.isError, true);
      assert.deepEqual(texts(out), ['{"credit_id":"cr-1"}']);
      assert.equal((await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL })).status, "SUCCEEDED");
      const again = await mcp.callTool(run, "issue_credit", CALL);
      assert.match(texts(again)[0], REPLAY_NOTE);
      assert.deepEqual(texts(again).slice(1), ['{"credit_id":"cr-1"}']);
      assert.equal(mcp.credits.length, 1);
    } finally {
      await mcp.close();
    }
  });

  test("an error thrown before acting (no timeout), with confirm: it found nothing, so the client reads that nothing happened; FAILED retryable, and the next call acts once", async () => {
    const failing = await connect({ confirm: true, failBefore: () => new Error("socket hang up") });
    const run = uniqueRun("mcp-not-performed");
    try {
      const out = await failing.callTool(run, "issue_credit", CALL);
      assert.notEqual(out.isError, true, "a normal result");
      assert.deepEqual(texts(out), [NOT_PERFORMED_NOTE]);
      const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL });
      assert.deepEqual([entry.status, entry.retryable], ["FAILED", true]);
      assert.equal(failing.credits.length, 0);
    } finally {
      await failing.close();
    }
    const quick = await connect({ confirm: true });
    try {
      assert.deepEqual(texts(await quick.callTool(run, "issue_credit", CALL)), ['{"credit_id":"cr-1"}']);
      assert.equal((await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL })).attempt, 2);
    } finally {
      await quick.close();
    }
  });

  test("a timeout before acting, with confirm: UNKNOWN (the action may still land), and the next call (the test server's grace is 0 s) finds nothing and acts once", async () => {
    const slow = await connect({ confirm: true, timeoutMs: 150 });
    const run = uniqueRun("mcp-timeout");
    try {
      const out = await slow.callTool(run, "issue_credit", CALL);
      assert.notEqual(out.isError, true, "a normal result, like the unknown outcome it was");
      assert.deepEqual(texts(out), [UNKNOWN_NOTE]);
      const entry = await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL });
      assert.equal(entry.status, "UNKNOWN");
      assert.equal(slow.credits.length, 0);
    } finally {
      await slow.close();
    }
    const quick = await connect({ confirm: true });
    try {
      const retried = await quick.callTool(run, "issue_credit", CALL);
      assert.deepEqual(texts(retried), ['{"credit_id":"cr-1"}']);
      assert.equal(quick.credits.length, 1);
      assert.equal((await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL })).attempt, 2);
    } finally {
      await quick.close();
    }
  });

  test("strict mode refuses a tool without confirm, saying why", () => {
    const strict = ledgerServer.ledger({ requireConfirm: true });
    const server = new McpServer({ name: "strict", version: "1.0.0" });
    const callback = async () => ({ content: [] });
    assert.throws(
      () => registerLedgerTool(server, strict, "issue_credit", { description: "d" }, callback),
      /registerLedgerTool: issue_credit: this Ledger requires a paired read \(requireConfirm: true\)/,
    );
    assert.doesNotThrow(() =>
      registerLedgerTool(server, strict, "issue_credit", { description: "d" }, callback, { confirm: () => notFound }),
    );
  });

  test("the tool is listed as registerTool lists it; a replay keeps its structured content", async () => {
    const mcp = await connect();
    try {
      const { tools } = await mcp.client.listTools();
      const credit = tools.find((t) => t.name === "issue_credit")!;
      assert.equal(credit.description, "Issue a credit to a customer's account.");
      assert.deepEqual(Object.keys(credit.inputSchema.properties ?? {}).sort(), ["amount", "currency", "customer"]);
      assert.ok(tools.find((t) => t.name === "open_ticket")?.outputSchema);

      const run = uniqueRun("mcp-structured");
      const first = await mcp.callTool(run, "open_ticket", '{"subject":"refund"}');
      assert.deepEqual(first.structuredContent, { ticket_id: "T-6" });
      const again = await mcp.callTool(run, "open_ticket", '{"subject":"refund"}');
      assert.deepEqual(again.structuredContent, { ticket_id: "T-6" });
      assert.match(texts(again)[0], REPLAY_NOTE);
    } finally {
      await mcp.close();
    }
  });
});
