// A reconciler worker: asks the ledger for the entries whose outcome nobody knows (a claimant
// that timed out, or whose lease expired), asks each tool's own paired read whether the effect
// exists by the entry's external_ref, and sends the answers back. Nothing is re-executed.
//
//   LEDGER_ADDRESS=127.0.0.1:50051 [LEDGER_TOKEN=…] [OLDER_THAN_MS=30000] [WORLD_FILE=world.json] \
//     node dist/examples/reconciler.js
//
// It works in rounds until the ledger hands out nothing more: each Reconcile call carries the
// answers for the entries of the previous round and receives the next ones. With MAX_ROUNDS it
// stops after that many rounds, sending its last answers with resolveOnly, so that it takes no
// entry it will not answer (others get them at once instead of after the reconcile lease).

import { pathToFileURL } from "node:url";
import { jsonCodec, Ledger, type LedgerEntry, type Resolution } from "../src/index.js";
import { World } from "./world.js";

/** Each tool's paired read: what the outside world holds for an external_ref, if anything. */
export function pairedReads(world: World): Record<string, (ref: string) => unknown> {
  return {
    // The result stored for a found effect has the shape the tool itself returns.
    issue_credit: (ref) => {
      const credit = world.findCredit(ref);
      return credit && { credit_id: credit.credit_id };
    },
    send_reply: (ref) => {
      const reply = world.findReply(ref);
      return reply && { message_id: reply.message_id };
    },
  };
}

export interface ReconcileOptions {
  olderThanMs?: number;
  tool?: string;
  limit?: number;
  /** Stop after this many rounds of entries handed out (the last answers are still sent). */
  maxRounds?: number;
  log?: (line: string) => void;
}

/** Resolves every unresolved entry the ledger hands out; returns the entries it resolved. */
export async function reconcileAll(
  ledger: Ledger,
  reads: Record<string, (ref: string) => unknown>,
  options: ReconcileOptions = {},
): Promise<LedgerEntry[]> {
  const log = options.log ?? (() => {});
  const resolvedAll: LedgerEntry[] = [];
  let answers: Resolution[] = [];
  for (let round = 1; ; round++) {
    // Past the last round, only the answers go out: nothing new is handed out or held.
    const last = options.maxRounds !== undefined && round > options.maxRounds;
    const { pending, resolved } = await ledger.reconcile({
      olderThanMs: options.olderThanMs,
      tool: options.tool,
      limit: options.limit,
      resolutions: answers,
      resolveOnly: last,
    });
    for (const entry of resolved) {
      log(`resolved ${entry.tool} ${entry.externalRef}: ${entry.status}`);
      resolvedAll.push(entry);
    }
    if (pending.length === 0) return resolvedAll;
    answers = [];
    for (const entry of pending) {
      const read = reads[entry.tool];
      if (!read) {
        // No paired read for this tool: leave it to a person (handed out again after the hold).
        log(`skipped ${entry.tool} ${entry.externalRef}: no paired read`);
        continue;
      }
      const found = read(entry.externalRef);
      if (found !== undefined) {
        log(`round ${round}: ${entry.tool} ${entry.externalRef} found: it happened`);
        answers.push({ key: entry.key, status: "SUCCEEDED", result: jsonCodec.encode(found) });
      } else {
        log(`round ${round}: ${entry.tool} ${entry.externalRef} not found: it did not happen`);
        answers.push({
          key: entry.key,
          status: "FAILED",
          retryable: true, // the effect did not happen: the intent may be tried again
          error: `no effect with reference ${entry.externalRef} in the outside world`,
        });
      }
    }
    if (answers.length === 0) return resolvedAll;
  }
}

export async function main(): Promise<void> {
  const ledger = new Ledger({
    address: process.env.LEDGER_ADDRESS ?? "127.0.0.1:50051",
    token: process.env.LEDGER_TOKEN || undefined,
  });
  try {
    const resolved = await reconcileAll(ledger, pairedReads(new World()), {
      olderThanMs: Number(process.env.OLDER_THAN_MS ?? 30_000),
      tool: process.env.TOOL || undefined,
      limit: process.env.LIMIT ? Number(process.env.LIMIT) : undefined,
      maxRounds: process.env.MAX_ROUNDS ? Number(process.env.MAX_ROUNDS) : undefined,
      log: (line) => console.log(line),
    });
    console.log(`reconciled ${resolved.length} entr${resolved.length === 1 ? "y" : "ies"}`);
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
