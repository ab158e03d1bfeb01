// The outside world of the adapter tests: a payments API that issues one credit per call,
// recorded with the reference the tool passed (the attempt's externalRef), and its paired read.
// `visible` false plays a read that lags the write: confirm cannot tell yet.

import { cannotTell, found, notFound, type Confirm, type LedgerLogger } from "../../src/index.js";

export interface Credit {
  customer: string;
  amount: number;
  ref: string;
  credit_id: string;
}

export class Payments {
  readonly credits: Credit[] = [];
  /** False: the paired read cannot tell (the API's search has not caught up). */
  visible = true;
  /** How many times confirm was asked. */
  asked = 0;

  issue(input: { customer: string; amount: number }, ref: string): { credit_id: string } {
    const credit = { customer: input.customer, amount: input.amount, ref, credit_id: `cr-${this.credits.length + 1}` };
    this.credits.push(credit);
    return { credit_id: credit.credit_id };
  }

  /** The paired read: the credit issued with this reference, as the tool returns it. */
  readonly confirm: Confirm<{ credit_id: string }> = ({ externalRef }) => {
    this.asked++;
    if (!this.visible) return cannotTell;
    const credit = this.credits.find((c) => c.ref === externalRef);
    return credit ? found({ credit_id: credit.credit_id }) : notFound;
  };
}

/** A logger that keeps its lines, for the tests to read. */
export function captureLog(): LedgerLogger & { lines: string[] } {
  const lines: string[] = [];
  return {
    lines,
    error: (m) => lines.push(`ERROR ${m}`),
    warn: (m) => lines.push(`WARN ${m}`),
    info: (m) => lines.push(`INFO ${m}`),
  };
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((done, fail) => {
    if (signal?.aborted) return fail(signal.reason);
    const timer = setTimeout(done, ms);
    signal?.addEventListener(
      "abort",
      () => {
        clearTimeout(timer);
        fail(signal.reason);
      },
      { once: true },
    );
  });
}
