// The context every TypeScript snippet of the docs (docs/*.md, the README) is compiled with: the
// names a snippet uses but does not make, declared once, each with why the snippet may assume it.
// It is a global declaration file in the snippets' temp project, so a snippet that makes one of
// these names itself (the README's first lines make `ledger`) shadows it. It declares values and
// functions of the app's own only: never a name a snippet must import (`z`, `tool`, `Ledger`,
// `ledgerTool`, …), so a snippet that forgets an import fails to compile.

export const SNIPPET_PRELUDE = `// The docs' TypeScript snippets assume these names (test/support/snippet-prelude.ts).
type CreditShape = {
  customer: import("zod").ZodString;
  amount: import("zod").ZodNumber;
  currency: import("zod").ZodString;
};

/** The agent's client, made once at start-up with the agent's token (the README's first lines). */
declare const ledger: import("idempotency-ledger").Ledger;
/** A client made with a person's token of the approver role: what the app's approve button calls. */
declare const approver: import("idempotency-ledger").Ledger;
/** The run's id: the app's own (a conversation turn's or a job's), the same across its retries. */
declare const runId: string;
/** The user's request, as the app received it. */
declare const prompt: string;
/** A Vercel AI SDK model: whichever provider the app uses. */
declare const model: import("ai").LanguageModel;

/** The credit examples' payments API: a credit with an idempotency key, and its search by that key. */
declare const payments: {
  issueCredit(request: { customer: string; amount: number; currency: string; idempotencyKey: string }): Promise<{ credit_id: string }>;
  findCredit(query: { idempotencyKey: string }): Promise<{ id: string } | undefined>;
};
/** The approval examples' payments API: the refund a person has to approve. */
declare function refundOrder(order: string, amount: number): Promise<{ refund_id: string }>;

/** The credit tool's own parts, which its framework definition carries with or without the ledger. */
declare const description: string;
declare const inputSchema: import("zod").ZodObject<CreditShape>;
declare const parameters: import("zod").ZodObject<CreditShape>;
declare function execute(input: { customer: string; amount: number; currency: string }): Promise<{ credit_id: string }>;
/** The credit tool's paired read: the README's snippet that introduces it makes it. */
declare const findCredit: import("idempotency-ledger").Confirm<{ credit_id: string }>;
/** The app's MCP server, and the credit tool's MCP callback. */
declare const server: import("@modelcontextprotocol/sdk/server/mcp.js").McpServer;
declare const callback: import("@modelcontextprotocol/sdk/server/mcp.js").ToolCallback<typeof inputSchema>;
/** The tools the app wrapped, handed to a Reconciler. */
declare const tools: import("idempotency-ledger").ReconcilerTools;

/** A tool call's arguments, as the model wrote them. */
declare const args: Record<string, unknown>;
/** An action's result, encoded: results are bytes on the wire. */
declare const result: Uint8Array;

/** Where the app keeps the approval watch's cursor, and its chat with the people who decide. */
declare function loadCursor(): string;
declare function postToChat(entry: import("idempotency-ledger").LedgerEntry): Promise<void>;
`;

/** The names the prelude declares, in order. */
export function preludeNames(prelude = SNIPPET_PRELUDE): string[] {
  return [...prelude.matchAll(/^declare (?:const|function) (\w+)/gm)].map((m) => m[1]);
}
