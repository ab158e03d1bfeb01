// The paired reads of the examples' write tools ("did this happen?"): each looks the effect up in
// the outside world (examples/world.ts) by the reference the tool passed it, the attempt's
// externalRef, and answers found with the result the tool itself returns, or notFound. The
// agents register them with their tools (`confirm`), so an unknown outcome is settled at once;
// this module is also what the reconciler process loads:
//
//   LEDGER_ADDRESS=127.0.0.1:50051 [WORLD_FILE=world.json] \
//     node dist/src/cli/reconciler.js dist/examples/paired-reads.js [--once] [--older-than 0s]
//
// (installed, the command is `npx idempotency-ledger-reconciler ./paired-reads.js`).

import { found, notFound, type Confirm, type ToolRegistration } from "../src/index.js";
import { World } from "./world.js";

/** issue_credit's paired read: the credit issued with this reference, as the tool returns it. */
export function confirmCredit(world: World): Confirm<{ credit_id: string }> {
  return ({ externalRef }) => {
    const credit = world.findCredit(externalRef);
    return credit ? found({ credit_id: credit.credit_id }) : notFound;
  };
}

/** send_reply's paired read: the reply sent with this reference. */
export function confirmReply(world: World): Confirm<{ message_id: string }> {
  return ({ externalRef }) => {
    const reply = world.findReply(externalRef);
    return reply ? found({ message_id: reply.message_id }) : notFound;
  };
}

/** The tools with their paired reads, as a reconciler is given them. */
export function pairedReads(world: World): ToolRegistration[] {
  return [
    { name: "issue_credit", confirm: confirmCredit(world) as ToolRegistration["confirm"] },
    { name: "send_reply", confirm: confirmReply(world) as ToolRegistration["confirm"] },
  ];
}

/** What `idempotency-ledger-reconciler` loads from this module. */
export const tools = pairedReads(new World());
