// An MCP server whose effects are counted, for the gateway's tests: the upstream that
// `idempotency-ledger mcp` stands in front of, written with the official TypeScript SDK's v2
// server (`@modelcontextprotocol/server`), served by its `serveStdio`, which speaks the current
// revision (2026-07-28, no handshake) and the session-based ones (`initialize`) from one factory.
// The tests run it compiled: `node dist/test/support/gateway-upstream.js`.
//
// Every call of a tool is appended to the file $UPSTREAM_LOG (one JSON line: the tool, its
// arguments, the process id) before the tool does anything else, so the tests count what reached
// the upstream; an email sent is appended to $UPSTREAM_EFFECTS. The tools:
//
// - `send_email(to, subject)`: the effect; answers `sent #n to …: …`.
// - `send_then_die(to, subject)`: the effect, then the process exits (3) before answering.
// - `slow_send(to, subject, seconds)`: waits, then the effect.
// - `find_email(subject)`: read-only (its annotations say so): whether such an email was sent.
// - `confirm_send(to, subject)`: asks the user to confirm first (an `input_required` result on
//   2026-07-28, which the client answers by calling again with `inputResponses`; on the
//   session-based revisions the SDK asks with an `elicitation/create` request inside the call),
//   then the effect. Each call it receives is logged, with whether it carried the answer.

import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { McpServer, acceptedContent, inputRequired } from "@modelcontextprotocol/server";
import { serveStdio } from "@modelcontextprotocol/server/stdio";
import { z } from "zod";

function log(tool: string, args: Record<string, unknown>): void {
  appendFileSync(process.env.UPSTREAM_LOG!, JSON.stringify({ tool, arguments: args, pid: process.pid }) + "\n");
}

function lines(file: string): string[] {
  return existsSync(file) ? readFileSync(file, "utf8").split("\n").filter((l) => l !== "") : [];
}

/** Sends (appends) one email; returns how many were sent in all. */
function effect(to: string, subject: string): number {
  const file = process.env.UPSTREAM_EFFECTS!;
  appendFileSync(file, JSON.stringify({ to, subject }) + "\n");
  return lines(file).length;
}

const text = (t: string) => ({ content: [{ type: "text" as const, text: t }] });
const email = z.object({ to: z.string(), subject: z.string() });

function server(): McpServer {
  const s = new McpServer({ name: "counted-upstream", version: "1.0.0" }, { capabilities: { tools: {} } });
  s.registerTool("send_email", { description: "Send an email (counted).", inputSchema: email }, async ({ to, subject }) => {
    log("send_email", { to, subject });
    return text(`sent #${effect(to, subject)} to ${to}: ${subject}`);
  });
  s.registerTool(
    "send_then_die",
    { description: "Send an email, then die before answering.", inputSchema: email },
    async ({ to, subject }) => {
      log("send_then_die", { to, subject });
      effect(to, subject);
      process.exit(3);
    },
  );
  s.registerTool(
    "slow_send",
    { description: "Wait, then send.", inputSchema: email.extend({ seconds: z.number() }) },
    async ({ to, subject, seconds }) => {
      log("slow_send", { to, subject, seconds });
      await new Promise((done) => setTimeout(done, seconds * 1000));
      return text(`sent #${effect(to, subject)} to ${to} after ${seconds}s`);
    },
  );
  s.registerTool(
    "find_email",
    {
      description: "Whether an email with this subject was sent.",
      inputSchema: z.object({ subject: z.string() }),
      outputSchema: z.object({ found: z.boolean() }),
      annotations: { readOnlyHint: true },
    },
    async ({ subject }) => {
      log("find_email", { subject });
      const found = lines(process.env.UPSTREAM_EFFECTS!).some((l) => JSON.parse(l).subject === subject);
      return { ...text(JSON.stringify({ found })), structuredContent: { found } };
    },
  );
  const confirmation = z.object({ confirm: z.boolean() });
  s.registerTool(
    "confirm_send",
    { description: "Ask the user to confirm, then send.", inputSchema: email },
    async ({ to, subject }, ctx) => {
      const answer = acceptedContent(ctx.mcpReq.inputResponses, "confirm", confirmation);
      log("confirm_send", { to, subject, answered: answer !== undefined });
      if (answer?.confirm !== true) {
        const ask = inputRequired.elicit({ message: `Send "${subject}" to ${to}?`, requestedSchema: confirmation });
        return inputRequired({ inputRequests: { confirm: ask } });
      }
      return text(`sent #${effect(to, subject)} to ${to}: ${subject}`);
    },
  );
  return s;
}

serveStdio(server);
