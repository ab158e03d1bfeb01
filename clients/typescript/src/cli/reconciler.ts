#!/usr/bin/env node
// idempotency-ledger-reconciler: runs a Reconciler as its own process, for the tools of a module
// of yours. The module exports its tools (wrapped tools, or registrations { name, confirm }) as
// `tools` (an array or a record), as its default export, or as named exports; and optionally
// the `ledger` they were registered with (used when no --address is given). It stops cleanly on
// SIGTERM and SIGINT (the confirm in flight is answered first); started by npm (npx, npm exec,
// npm run), also when the shell npm started it with exits (see stopWithParent); with --once it
// reconciles until nothing is handed out, then exits.
//
//   idempotency-ledger-reconciler ./dist/my-tools.js --address 127.0.0.1:50051 [--token-env LEDGER_TOKEN]
//     [--older-than 10s] [--interval 5s] [--limit 50] [--rate 10] [--principal NAME] [--once]

import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { Ledger } from "../ledger.js";
import { Reconciler, describeFigures, type ReconcilerTools } from "../reconciler.js";
import { registrationOf } from "../tools.js";

const USAGE = `usage: idempotency-ledger-reconciler TOOLS_MODULE [options]

Settles the unknown outcomes of the tools TOOLS_MODULE exports (those with a paired read,
confirm), and of those only, until SIGTERM or SIGINT (started by npm, as with npx, also when the
process that started it exits: npm passes a signal to its shell only).

  --address HOST:PORT   the ledger (default $LEDGER_ADDRESS, else the module's exported ledger)
  --token-env NAME      the environment variable holding the bearer token (default LEDGER_TOKEN)
  --older-than DUR      only entries started at least this long ago (default 10s)
  --interval DUR        the pause between rounds when nothing is handed out (default 5s)
  --limit N             entries taken per tool per round (default 50)
  --rate N              at most N confirms per second (default 10)
  --principal NAME      recorded as resolved_by (default reconciler@HOST:PID)
  --once                reconcile until nothing is handed out, then exit
Durations: 250ms, 10s, 5m, 1h.`;

/** Milliseconds of `250ms`, `10s`, `5m`, `1h` (or a bare number of milliseconds). */
export function parseDuration(text: string, flag: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text.trim());
  if (!m) throw new Error(`${flag}: expected a duration such as 250ms, 10s, 5m or 1h, got ${JSON.stringify(text)}`);
  const unit = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 }[m[2] ?? "ms"]!;
  return Number(m[1]) * unit;
}

function positive(text: string | undefined, flag: string): number | undefined {
  if (text === undefined) return undefined;
  const n = Number(text);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${flag}: expected a positive number, got ${JSON.stringify(text)}`);
  return n;
}

/** The tools a module exports: `tools`, else its default export, else every export that is one. */
function toolsOf(mod: Record<string, unknown>): ReconcilerTools | undefined {
  if (mod.tools !== undefined) return mod.tools as ReconcilerTools;
  if (mod.default !== undefined && mod.default !== null && typeof mod.default === "object") {
    return mod.default as ReconcilerTools;
  }
  const found = Object.values(mod).filter((v) => registrationOf(v) !== undefined);
  return found.length > 0 ? found : undefined;
}

/**
 * npm runs a package's command (npx, npm exec, npm run) through a shell, `sh -c`, and forwards
 * SIGTERM and SIGINT to that shell alone. A shell that does not exec the command (dash, the `sh`
 * of Debian and Ubuntu, does not) dies of the signal and leaves this process running, orphaned:
 * nobody would ever stop it. So, started by npm (it sets `npm_lifecycle_event`), the command
 * watches the process that started it and, once that has exited (this process's parent is
 * another), stops as it does on SIGTERM. Returns what cancels the watch.
 */
export function stopWithParent(stop: (parent: number) => void, env = process.env, everyMs = 200): () => void {
  if (env.npm_lifecycle_event === undefined) return () => {};
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(timer);
    stop(parent);
  }, everyMs);
  // The watch is no reason to keep the process alive: the reconciler's loop is.
  timer.unref();
  return () => clearInterval(timer);
}

export async function main(argv: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      address: { type: "string" },
      "token-env": { type: "string" },
      "older-than": { type: "string" },
      interval: { type: "string" },
      limit: { type: "string" },
      rate: { type: "string" },
      principal: { type: "string" },
      once: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  if (positionals.length !== 1) {
    process.stderr.write(`${USAGE}\n`);
    return 2;
  }
  const mod = (await import(pathToFileURL(resolve(positionals[0])).href)) as Record<string, unknown>;
  // Duck-typed: the module may have its own copy of the package.
  const candidate = mod.ledger as Partial<Ledger> | undefined;
  const exported =
    candidate && typeof candidate.registeredTools === "function" && typeof candidate.reconcile === "function"
      ? (candidate as Ledger)
      : undefined;
  const address = values.address ?? process.env.LEDGER_ADDRESS;
  let ledger: Ledger;
  if (address) {
    const token = process.env[values["token-env"] ?? "LEDGER_TOKEN"] || undefined;
    ledger = new Ledger({ address, token });
    // Tools registered by name only (an Agents SDK FunctionTool) are found in the module's ledger.
    for (const reg of exported?.registeredTools() ?? []) ledger.register(reg);
  } else if (exported) {
    ledger = exported;
  } else {
    throw new Error("no ledger: pass --address (or set LEDGER_ADDRESS), or export `ledger` from the tools module");
  }
  const tools = toolsOf(mod);
  const reconciler = new Reconciler(ledger, tools, {
    olderThanMs: values["older-than"] === undefined ? undefined : parseDuration(values["older-than"], "--older-than"),
    intervalMs: values.interval === undefined ? undefined : parseDuration(values.interval, "--interval"),
    limit: positive(values.limit, "--limit"),
    maxConfirmsPerSecond: positive(values.rate, "--rate"),
    principal: values.principal,
    stopOnSignals: ["SIGTERM", "SIGINT"],
  });
  const unwatch = stopWithParent((parent) => {
    ledger.logger.info(
      `reconciler ${reconciler.principal}: the process that started it (pid ${parent}, npm's shell) exited, ` +
        `so a signal sent to npm did not reach this one; stopping`,
    );
    void reconciler.stop();
  });
  try {
    if (values.once) {
      for (;;) {
        const { handedOut } = await reconciler.round();
        if (handedOut === 0 || reconciler.stopped) break;
      }
      ledger.logger.info(
        `reconciler ${reconciler.principal}: ${describeFigures(reconciler.figures)}; nothing more handed out`,
      );
    } else {
      reconciler.start();
      await reconciler.done;
    }
  } finally {
    unwatch();
    await reconciler.stop();
    ledger.close();
  }
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`idempotency-ledger-reconciler: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exitCode = 1;
  },
);
