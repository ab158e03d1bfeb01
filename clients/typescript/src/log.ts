// Where the client tells the developer and the operator what the model is not told: a tool
// called without a run id, a paired read that failed, every settlement of an unknown outcome.

import { hostname } from "node:os";

/** The client's log lines go here; `LedgerOptions.logger` replaces the default (stderr). */
export interface LedgerLogger {
  error(message: string): void;
  warn(message: string): void;
  info(message: string): void;
}

const line = (level: string, message: string) => process.stderr.write(`idempotency-ledger ${level}: ${message}\n`);

/** The default: one line per event on stderr, with its level. */
export const stderrLogger: LedgerLogger = {
  error: (m) => line("ERROR", m),
  warn: (m) => line("WARN", m),
  info: (m) => line("INFO", m),
};

/**
 * Who settles, when nobody said: the role, the host and the process (recorded as the entry's
 * resolvedBy, so an operator can tell which worker settled what).
 */
export function defaultPrincipal(role: string): string {
  return `${role}@${hostname()}:${process.pid}`.replace(/[\u0000-\u001f\u007f]/g, "").slice(0, 256);
}
