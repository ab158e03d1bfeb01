// Runs without a model key: the agent host plays the model's calls itself, and nothing leaves the
// machine but the calls to the ledger.
//
// An MCP server whose side-effecting tools go through the ledger (one line per tool, with its
// paired read from examples/paired-reads.ts: `registerLedgerTool(server, ledger, name, config,
// callback, { confirm })`), and an agent host that calls
// them with the MCP SDK's Client over its in-memory transport, the run id in each request's
// `_meta["idempotency-ledger/run_id"]`. The host plays the model of examples/script.ts (each
// step's calls at once, as a host forwards parallel tool calls); the payments API and the mailbox
// are examples/world.ts.
//
//   LEDGER_ADDRESS=127.0.0.1:50051 [LEDGER_TOKEN=…] [RUN_ID=run-7f3a] [WORLD_FILE=world.json] \
//     node dist/examples/mcp-agent.js
//
// In your code the imports are "idempotency-ledger" and "idempotency-ledger/mcp"; the server is
// usually its own process on the stdio or HTTP transport, unchanged.

import { pathToFileURL } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { RUN_ID_META_KEY, registerLedgerTool } from "../src/adapters/mcp.js";
import { Ledger, NotExecutedError, currentAttempt, found, notFound } from "../src/index.js";
import { STEPS, runIdFromEnv } from "./script.js";
import { World } from "./world.js";

/** The MCP server of the payments and mailbox tools, each registered with its paired read. */
export function supportServer(ledger: Ledger, world: World): McpServer {
  const server = new McpServer({ name: "support-tools", version: "1.0.0" });
  registerLedgerTool(
    server,
    ledger,
    "issue_credit",
    {
      description: "Issue a credit to a customer's account.",
      inputSchema: { customer: z.string(), amount: z.number(), currency: z.string() },
    },
    async ({ customer, amount, currency }) => {
      // Refused before any effect: the intent stays retryable.
      if (amount <= 0) throw new NotExecutedError(`amount must be positive, got ${amount}`);
      // The attempt's externalRef is the payments API's idempotency reference.
      const credit = world.issueCredit({ customer, amount, currency }, currentAttempt()!.externalRef);
      return { content: [{ type: "text", text: JSON.stringify({ credit_id: credit.credit_id }) }] };
    },
    {
      // The paired read answers with the result the callback returns.
      confirm: ({ externalRef }) => {
        const credit = world.findCredit(externalRef);
        return credit ? found({ content: [{ type: "text", text: JSON.stringify({ credit_id: credit.credit_id }) }] }) : notFound;
      },
    },
  );
  registerLedgerTool(
    server,
    ledger,
    "send_reply",
    {
      description: "Reply to the customer on a support ticket.",
      inputSchema: { ticket: z.string(), body: z.string() },
    },
    async ({ ticket, body }) => {
      const reply = world.sendReply({ ticket, body }, currentAttempt()!.externalRef);
      return { content: [{ type: "text", text: JSON.stringify({ message_id: reply.message_id }) }] };
    },
    {
      confirm: ({ externalRef }) => {
        const reply = world.findReply(externalRef);
        return reply ? found({ content: [{ type: "text", text: JSON.stringify({ message_id: reply.message_id }) }] }) : notFound;
      },
    },
  );
  return server;
}

/** Plays the turn in run `runId` through an MCP client; returns [tool, input, what the model read] per call. */
export async function runAgent(ledger: Ledger, world: World, runId: string) {
  const server = supportServer(ledger, world);
  const client = new Client({ name: "agent-host", version: "1.0.0" });
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await Promise.all([server.connect(serverSide), client.connect(clientSide)]);
  const calls: Array<{ tool: string; input: string; read: string }> = [];
  try {
    for (const step of STEPS) {
      const results = await Promise.all(
        step.map(
          (c) =>
            client.callTool({
              name: c.name,
              // A host hands the server the model's arguments as parsed JSON.
              arguments: JSON.parse(c.arguments) as Record<string, unknown>,
              _meta: { [RUN_ID_META_KEY]: runId },
            }) as Promise<CallToolResult>,
        ),
      );
      results.forEach((r, i) => {
        const read = r.content.map((block) => (block.type === "text" ? block.text : `[${block.type}]`)).join(" ");
        calls.push({ tool: step[i].name, input: step[i].arguments, read });
      });
    }
  } finally {
    await client.close();
    await server.close();
  }
  return { calls };
}

export async function main(): Promise<void> {
  const ledger = new Ledger({
    address: process.env.LEDGER_ADDRESS ?? "127.0.0.1:50051",
    token: process.env.LEDGER_TOKEN || undefined,
  });
  const world = new World();
  const runId = runIdFromEnv();
  try {
    const { calls } = await runAgent(ledger, world, runId);
    for (const c of calls) console.log(`${c.tool} ${c.input}\n  -> ${c.read}`);
    console.log(`world: ${world.credits().length} credit(s), ${world.replies().length} reply(ies) (run ${runId})`);
  } finally {
    ledger.close();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exitCode = 1;
  });
}
