// The defaults both clients share (clients/parity.json, checked by test/parity.test.ts), and the
// forms of address the client accepts.

import { InvalidArgumentError } from "./error-base.js";
import type { Canonicalization } from "./keys.js";
import type { WaitFor } from "./types.js";

/** The default deadline of every call, unless the Ledger or the call sets another. */
export const DEFAULT_DEADLINE_MS = 10_000;

/**
 * How long runOnce and the tool wrappers wait, by default, for an attempt of the same intent
 * that is in flight (the Claim's server-side `wait`). Parallel identical tool calls are the
 * common case (a model emitting the same call twice in one step): the duplicate waits for the
 * first and gets its result as a replay instead of "already being performed".
 */
export const DEFAULT_WAIT_MS = 10_000;

/**
 * What runOnce's wait waits for (the Claim's `wait_for`): an attempt in flight only. A call
 * awaiting a person's decision is answered at once, since a decision may take days and the
 * caller has a model or a person to tell meanwhile; so a repeat costs one Claim whatever it
 * meets.
 */
export const RUN_ONCE_WAIT_FOR: WaitFor = "ATTEMPT";

/**
 * runOnce renews the lease of its claim every this fraction of the lease while the action runs,
 * so a slow action keeps its attempt ATTEMPTING (a duplicate reads IN_PROGRESS, not UNKNOWN).
 * A third leaves two renewals' worth of slack before the lease could end.
 */
export const RENEW_EVERY_FRACTION_OF_LEASE = 1 / 3;

/**
 * How long, by default, Claim, Lookup, RenewLease and Complete are sent again while the ledger
 * answers UNAVAILABLE: long enough for a database failover (a standby promoted in about ten
 * seconds) to change no outcome.
 */
export const DEFAULT_RETRY_BUDGET_MS = 30_000;

/**
 * How long, by default, runOnce and the tool wrappers wait after an unknown outcome before asking
 * the tool's paired read (`confirm`): the outside world may need a moment to show a late write.
 */
export const DEFAULT_CONFIRM_DELAY_MS = 1_000;

/**
 * A repeat that meets an unknown outcome another caller is settling (the ledger does not hand
 * it out) looks it up until it is settled or its wait is over: first after this pause, then
 * doubling up to the second (`settling_poll_seconds`).
 */
export const SETTLING_POLL_MS = Object.freeze([50, 1_000] as const);

/** The canonicalization of a claim that sets none (the proto's CANONICALIZATION_JCS). */
export const DEFAULT_CANONICALIZATION: Canonicalization = "JCS";

/** The forms of `LedgerOptions.address`; `https://` implies TLS. */
export const ADDRESS_FORMS = ["host:port", "http://host:port", "https://host:port"] as const;

/** The shared defaults, in one object (the names of clients/parity.json's "defaults"). */
export const DEFAULTS = Object.freeze({
  waitMs: DEFAULT_WAIT_MS,
  runOnceWaitFor: RUN_ONCE_WAIT_FOR,
  retryBudgetMs: DEFAULT_RETRY_BUDGET_MS,
  confirmDelayMs: DEFAULT_CONFIRM_DELAY_MS,
  settlingPollMs: SETTLING_POLL_MS,
  renewEveryFractionOfLease: RENEW_EVERY_FRACTION_OF_LEASE,
  canonicalization: DEFAULT_CANONICALIZATION,
  addressForms: ADDRESS_FORMS,
});

// A host name, an IPv4 address or a bracketed IPv6 address, then a port.
const HOST_PORT = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):([0-9]{1,5})$/;

function badAddress(address: string, why: string): never {
  throw new InvalidArgumentError(
    `address ${JSON.stringify(address)}: ${why} (use ${ADDRESS_FORMS.join(", ")})`,
    { reason: "INVALID_FIELD", field: "address", local: true },
  );
}

/**
 * The base URL of the ledger at `address` (one of ADDRESS_FORMS). `tls` asks for TLS with a bare
 * `host:port`; an `http://` address with TLS asked for is refused rather than silently sent in
 * plaintext.
 */
export function ledgerUrl(address: string, tls: boolean): URL {
  if (typeof address !== "string" || address === "") badAddress(String(address), "missing");
  let url: URL;
  if (/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(address)) {
    try {
      url = new URL(address);
    } catch {
      badAddress(address, "not a URL");
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      badAddress(address, `the scheme ${url.protocol} is not http: or https:`);
    }
    if ((url.pathname !== "/" && url.pathname !== "") || url.search || url.hash || url.username) {
      badAddress(address, "a ledger address has no path, query or credentials");
    }
    if (url.protocol === "http:" && tls) {
      badAddress(address, "TLS options were given for an http:// address");
    }
  } else {
    const m = HOST_PORT.exec(address);
    if (!m) badAddress(address, "expected host:port");
    const port = Number(m[2]);
    if (port < 1 || port > 65535) badAddress(address, "the port must be 1 to 65535");
    url = new URL(`${tls ? "https" : "http"}://${address}`);
  }
  if (url.port !== "" && (Number(url.port) < 1 || Number(url.port) > 65535)) {
    badAddress(address, "the port must be 1 to 65535");
  }
  return url;
}
