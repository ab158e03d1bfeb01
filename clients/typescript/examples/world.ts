// The outside world of the examples: a payments API and a support mailbox, simulated in one JSON
// file (WORLD_FILE, default ./world.json) so that the dispatcher and the reconciler, two
// processes, see the same state. Each write tool takes an idempotency reference (the ledger
// entry's external_ref) and each has a paired read that finds an effect by that reference:
// exactly what a reconciler needs to turn "unknown" into an answer.

import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { randomBytes } from "node:crypto";

export interface Credit {
  credit_id: string;
  customer: string;
  amount: number;
  currency: string;
  /** The idempotency reference the credit was issued with (the ledger's external_ref). */
  ref: string;
}

export interface Reply {
  message_id: string;
  ticket: string;
  body: string;
  ref: string;
}

interface State {
  credits: Credit[];
  replies: Reply[];
}

export class World {
  constructor(readonly file: string = process.env.WORLD_FILE ?? "world.json") {}

  private load(): State {
    if (!existsSync(this.file)) return { credits: [], replies: [] };
    return JSON.parse(readFileSync(this.file, "utf8")) as State;
  }

  private save(state: State): void {
    writeFileSync(this.file, JSON.stringify(state, null, 2));
  }

  /** The payments API's write: issues a credit (it cannot deduplicate by itself). */
  issueCredit(args: { customer: string; amount: number; currency: string }, ref: string): Credit {
    if (typeof args.amount !== "number" || args.amount <= 0) {
      throw new RangeError(`amount must be positive, got ${String(args.amount)}`);
    }
    const state = this.load();
    const credit: Credit = {
      credit_id: `cr-${randomBytes(4).toString("hex")}`,
      customer: args.customer,
      amount: args.amount,
      currency: args.currency,
      ref,
    };
    state.credits.push(credit);
    this.save(state);
    return credit;
  }

  /** The payments API's paired read: the credit issued with this reference, if any. */
  findCredit(ref: string): Credit | undefined {
    return this.load().credits.find((c) => c.ref === ref);
  }

  /** The mailbox's write: sends a reply on a ticket. */
  sendReply(args: { ticket: string; body: string }, ref: string): Reply {
    const state = this.load();
    const reply: Reply = {
      message_id: `msg-${randomBytes(4).toString("hex")}`,
      ticket: args.ticket,
      body: args.body,
      ref,
    };
    state.replies.push(reply);
    this.save(state);
    return reply;
  }

  /** The mailbox's paired read. */
  findReply(ref: string): Reply | undefined {
    return this.load().replies.find((r) => r.ref === ref);
  }

  credits(): Credit[] {
    return this.load().credits;
  }

  replies(): Reply[] {
    return this.load().replies;
  }
}
