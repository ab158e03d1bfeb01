// Runs without a model key: it plays a scripted model turn, with no model at all.
//
// An agent's tool dispatcher: every call of a side-effecting tool goes through the ledger, so a
// network retry, a runtime retry or the model calling the same tool twice in one run has one
// effect, and the model is told honestly when a result is a replay.
//
//   LEDGER_ADDRESS=127.0.0.1:50051 [LEDGER_TOKEN=…] [RUN_ID=run-7f3a] [WORLD_FILE=world.json] \
//     node dist/examples/dispatcher.js
//
// It plays one scripted model turn with two write tools, issue_credit and send_reply, including
// the repeats a real agent produces, and prints what the model is told after each call.

import { pathToFileURL } from "node:url";
import {
  InProgressError,
  InvalidArgumentError,
  Ledger,
  NotExecutedError,
  PreviouslyFailedError,
  type ActionContext,
} from "../src/index.js";
import { World } from "./world.js";

/** A tool call as the model emits it: a name and its arguments as JSON text. */
export interface ToolCall {
  name: string;
  arguments: string;
}

type WriteTool = (args: Record<string, unknown>, ctx: ActionContext) => unknown;

/** The write tools; each passes the ledger's external_ref to the outside system. */
export function writeTools(world: World): Record<string, WriteTool> {
  return {
    issue_credit: (args, ctx) => {
      const amount = args.amount;
      if (typeof amount !== "number" || amount <= 0) {
        // Refused before any effect: certainly not executed, so the intent may be retried.
        throw new NotExecutedError(`amount must be a positive number, got ${String(amount)}`);
      }
      const credit = world.issueCredit(
        { customer: String(args.customer), amount, currency: String(args.currency) },
        ctx.externalRef,
      );
      return { credit_id: credit.credit_id };
    },
    send_reply: (args, ctx) => {
      const reply = world.sendReply(
        { ticket: String(args.ticket), body: String(args.body) },
        ctx.externalRef,
      );
      return { message_id: reply.message_id };
    },
  };
}

/** Runs one tool call and returns the text the model is given as the tool's answer. */
export async function dispatch(
  ledger: Ledger,
  tools: Record<string, WriteTool>,
  runId: string,
  call: ToolCall,
): Promise<string> {
  const tool = tools[call.name];
  if (!tool) return `Unknown tool ${call.name}.`;
  try {
    const out = await ledger.runOnce(runId, call.name, call.arguments, (ctx) =>
      tool(JSON.parse(call.arguments) as Record<string, unknown>, ctx),
    );
    const result = JSON.stringify(out.value);
    // The replay marker: the model learns that nothing new happened.
    return out.replayed ? `${out.note} Result: ${result}` : `Done. Result: ${result}`;
  } catch (err) {
    if (err instanceof InProgressError) {
      return `${err.note} Try again in ${Math.ceil(err.retryAfter / 1000)} s; do not repeat the action.`;
    }
    if (err instanceof PreviouslyFailedError) {
      return `${err.note} The earlier error: ${err.storedError}`;
    }
    if (err instanceof InvalidArgumentError) {
      return `The arguments were refused (${err.reason}): ${err.message}`;
    }
    if (err instanceof NotExecutedError) return `Not executed: ${err.message}`;
    throw err;
  }
}

/** One model turn, with the repeats agents really produce. */
export const SCRIPT: ToolCall[] = [
  {
    name: "issue_credit",
    arguments: '{"customer":"c-42","amount":200,"currency":"EUR"}',
  },
  // The runtime retries after a dropped connection: same intent, members in another order.
  {
    name: "issue_credit",
    arguments: '{"currency": "EUR", "amount": 2e2, "customer": "c-42"}',
  },
  {
    name: "send_reply",
    arguments: '{"ticket":"T-1001","body":"We have credited 200 EUR to your account."}',
  },
  // The model calls the same tool again with the same arguments in the same run.
  {
    name: "send_reply",
    arguments: '{"body":"We have credited 200 EUR to your account.","ticket":"T-1001"}',
  },
  // Bad JSON from the model is refused by the ledger with a reason; nothing runs.
  { name: "send_reply", arguments: '{"ticket":"T-1001","ticket":"T-1002","body":"hi"}' },
];

export async function main(): Promise<void> {
  const ledger = new Ledger({
    address: process.env.LEDGER_ADDRESS ?? "127.0.0.1:50051",
    token: process.env.LEDGER_TOKEN || undefined,
  });
  const world = new World();
  const tools = writeTools(world);
  const runId = process.env.RUN_ID ?? `run-${Date.now().toString(36)}`;
  try {
    for (const call of SCRIPT) {
      const answer = await dispatch(ledger, tools, runId, call);
      console.log(`${call.name} ${call.arguments}\n  -> ${answer}`);
    }
    console.log(
      `world: ${world.credits().length} credit(s), ${world.replies().length} reply(ies) (run ${runId})`,
    );
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
