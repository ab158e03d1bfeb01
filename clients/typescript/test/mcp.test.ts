// The MCP adapter against the real `@modelcontextprotocol/sdk` and the real server: an McpServer
// with tools registered by registerLedgerTool, and the SDK's own Client over its in-memory
// transport. The client plays the agent host: it forwards the model's tool calls, the model's
// JSON text parsed as any host parses it, with the run id in the request's _meta.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { RUN_ID_META_KEY, registerLedgerTool } from "../src/adapters/mcp.js";
import { NotExecutedError, currentAttempt, type Ledger } from "../src/index.js";
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
  before(async () => {
    ledgerServer = await startServer();
    ledger = ledgerServer.ledger();
  });
  after(async () => {
    await ledgerServer.stop();
  });

  /** An MCP server with the payments tools, and a connected client. */
  async function connect() {
    const credits: Array<{ customer: string; amount: number; ref: string }> = [];
    const state = { down: false, reportError: false };
    const server = new McpServer({ name: "payments", version: "1.0.0" });
    registerLedgerTool(
      server,
      ledger,
      "issue_credit",
      {
        description: "Issue a credit to a customer's account.",
        inputSchema: { customer: z.string(), amount: z.number(), currency: z.string() },
      },
      async ({ customer, amount }) => {
        if (state.down) throw new NotExecutedError("the payments API refused the connection");
        if (state.reportError) return { content: [{ type: "text", text: "payments API: 502 Bad Gateway" }], isError: true };
        credits.push({ customer, amount, ref: currentAttempt()!.externalRef });
        return { content: [{ type: "text", text: JSON.stringify({ credit_id: `cr-${credits.length}` }) }] };
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
    return { credits, state, client, callTool, close };
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

  test("a call without the run id in _meta is a clear tool error, and nothing runs", async () => {
    const mcp = await connect();
    try {
      const out = await mcp.callTool(undefined, "issue_credit", CALL);
      assert.equal(out.isError, true);
      assert.match(texts(out)[0], /not performed: the tool issue_credit was called without a run id/);
      assert.match(texts(out)[0], /_meta\["idempotency-ledger\/run_id"\]/);
      const empty = await mcp.callTool("", "issue_credit", CALL);
      assert.equal(empty.isError, true);
      assert.equal(mcp.credits.length, 0);
    } finally {
      await mcp.close();
    }
  });

  test("a result the tool marks isError may follow an effect: UNKNOWN, the tool's words and the note", async () => {
    const mcp = await connect();
    try {
      const run = uniqueRun("mcp-error");
      mcp.state.reportError = true;
      const out = await mcp.callTool(run, "issue_credit", CALL);
      assert.equal(out.isError, true);
      assert.equal(texts(out)[0], "payments API: 502 Bad Gateway");
      assert.match(texts(out)[1], /outcome of this action is unknown/);
      assert.equal((await ledger.lookup({ runId: run, tool: "issue_credit", args: CALL })).status, "UNKNOWN");
      mcp.state.reportError = false;
      const again = await mcp.callTool(run, "issue_credit", CALL);
      assert.notEqual(again.isError, true, "an unknown outcome is not a failure to retry");
      assert.match(texts(again)[0], /outcome is unknown and is being reconciled/);
      assert.equal(mcp.credits.length, 0, "never re-run silently");
    } finally {
      await mcp.close();
    }
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
