// Approvals through MCP, which has no approval step of its own: the tool answers the ledger's
// awaiting note (a person has been asked; nothing was done) as a normal result, and a denied one
// the ledger's denial note with the person's reason as a tool error. Against the real
// `@modelcontextprotocol/sdk` (McpServer and Client over the in-memory transport) and the real
// server with an approval policy and an approver token: approve → the next call acts once;
// deny → the model reads the denial; a tool registered with requireApproval is gated too.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { RUN_ID_META_KEY, registerLedgerTool } from "../src/adapters/mcp.js";
import { currentAttempt, type Ledger } from "../src/index.js";
import { Payments } from "./support/payments.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

const CREDIT = { customer: "c-42", amount: 200, currency: "EUR" };

function text(result: CallToolResult): string {
  return result.content.map((c) => (c.type === "text" ? c.text : `<${c.type}>`)).join("\n");
}

describe("MCP approvals (the awaiting and denied notes)", () => {
  let server: TestServer;
  let ledger: Ledger;
  let approver: Ledger;
  before(async () => {
    server = await startServer({
      tokens: [
        ["acme", "tok-agent"],
        ["acme", "tok-dana", "approver=dana"],
      ],
      approvalPolicy: "*  issue_credit  /amount  >  100\n",
    });
    ledger = server.ledger({ token: "tok-agent" });
    approver = server.ledger({ token: "tok-dana" });
  });
  after(async () => {
    await server.stop();
  });

  async function connect() {
    const world = new Payments();
    const mcp = new McpServer({ name: "payments", version: "1.0.0" });
    const issue = async (input: { customer: string; amount: number }) => ({
      content: [{ type: "text" as const, text: JSON.stringify(world.issue(input, currentAttempt()!.externalRef)) }],
    });
    registerLedgerTool(
      mcp,
      ledger,
      "issue_credit",
      { description: "Issue a credit.", inputSchema: { customer: z.string(), amount: z.number(), currency: z.string() } },
      issue,
    );
    registerLedgerTool(
      mcp,
      ledger,
      "close_account",
      { description: "Close an account.", inputSchema: { customer: z.string() } },
      async ({ customer }) => issue({ customer, amount: 0 }),
      { requireApproval: true },
    );
    const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
    const client = new Client({ name: "agent-host", version: "1.0.0" });
    await Promise.all([mcp.connect(serverSide), client.connect(clientSide)]);
    const call = (runId: string, name: string, args: Record<string, unknown>) =>
      client.callTool({ name, arguments: args, _meta: { [RUN_ID_META_KEY]: runId } }) as Promise<CallToolResult>;
    return { world, call, close: () => client.close() };
  }

  test("a gated call reads the ledger's awaiting note and acts nothing; approved, the next call acts once, then replays", async () => {
    const { world, call, close } = await connect();
    try {
      const runId = uniqueRun("mcp-approve");
      const asked = await call(runId, "issue_credit", CREDIT);
      assert.equal(world.credits.length, 0);
      assert.ok(!asked.isError, "not a failure to retry: a person has been asked");
      const entry = await ledger.lookup({ runId, tool: "issue_credit", args: CREDIT });
      assert.equal(entry.status, "AWAITING_APPROVAL");
      assert.equal(text(asked), (await ledger.claim({ runId, tool: "issue_credit", args: CREDIT })).note);

      await approver.decide(entry.key, entry.fingerprint, "APPROVE", "fine");
      const done = await call(runId, "issue_credit", CREDIT);
      assert.equal(text(done), '{"credit_id":"cr-1"}');
      const again = await call(runId, "issue_credit", CREDIT);
      assert.match(text(again), /already performed/);
      assert.equal(world.credits.length, 1);
    } finally {
      await close();
    }
  });

  test("denied: the model reads the ledger's denial with the person's reason (a tool error); nothing acts", async () => {
    const { world, call, close } = await connect();
    try {
      const runId = uniqueRun("mcp-deny");
      await call(runId, "issue_credit", CREDIT);
      const entry = await ledger.lookup({ runId, tool: "issue_credit", args: CREDIT });
      await approver.decide(entry.key, entry.fingerprint, "DENY", "duplicate of ticket 881");
      const denied = await call(runId, "issue_credit", CREDIT);
      assert.equal(denied.isError, true);
      assert.match(text(denied), /duplicate of ticket 881/);
      assert.equal(world.credits.length, 0);
    } finally {
      await close();
    }
  });

  test("requireApproval gates a tool the policy does not name", async () => {
    const { world, call, close } = await connect();
    try {
      const runId = uniqueRun("mcp-require");
      const asked = await call(runId, "close_account", { customer: "c-7" });
      assert.equal(world.credits.length, 0);
      assert.equal((await ledger.lookup({ runId, tool: "close_account", args: { customer: "c-7" } })).status, "AWAITING_APPROVAL");
      assert.match(text(asked), /.+/);
    } finally {
      await close();
    }
  });
});
