// Starts the real server binary for the tests: a free port (the server picks it: --listen
// 127.0.0.1:0, and its start-up log names it), a temp SQLite file, optional tokens file, and
// --reconcile-grace 0s unless the test sets its own.

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Ledger, type LedgerOptions } from "../../src/index.js";

/** The package root (clients/typescript), from dist/test/support/. */
export const PACKAGE_ROOT = fileURLToPath(new URL("../../../", import.meta.url));
export const REPO_ROOT = resolve(PACKAGE_ROOT, "../..");

export function serverBinary(): string {
  const bin = process.env.LEDGER_BIN || join(REPO_ROOT, "target/debug/idempotency-ledger");
  if (!existsSync(bin)) {
    throw new Error(`server binary ${bin} not found: set LEDGER_BIN or run cargo build (test.sh does)`);
  }
  return bin;
}

export interface ServerOptions {
  /**
   * Tenants and their tokens, with an optional role (`approver` or `approver=NAME`): writes a
   * tokens file and passes --auth-tokens-file.
   */
  tokens?: Array<[tenant: string, token: string, role?: string]>;
  /** The approval policy's text: written to a file passed as --approval-policy. */
  approvalPolicy?: string;
  /**
   * More flags. Without a `--reconcile-grace` among them the server gets `--reconcile-grace 0s`,
   * so that Reconcile hands an unknown outcome out at once (the server's default waits 10 s
   * after the outcome became unknown); a test that shows the grace sets its own.
   */
  args?: string[];
  /** The store (default a temp SQLite file). */
  databaseUrl?: string;
  /** RUST_LOG (default "info"). */
  rustLog?: string;
}

export interface TestServer {
  address: string;
  dir: string;
  log(): string;
  ledger(options?: Partial<LedgerOptions>): Ledger;
  stop(): Promise<void>;
}

const running = new Set<ChildProcess>();
process.on("exit", () => {
  for (const child of running) child.kill("SIGKILL");
});

export async function startServer(options: ServerOptions = {}): Promise<TestServer> {
  const dir = mkdtempSync(join(tmpdir(), "ledger-ts-"));
  const args = [
    "--listen",
    "127.0.0.1:0",
    "--database-url",
    options.databaseUrl ?? `sqlite://${join(dir, "ledger.db")}`,
    ...(options.args ?? []),
  ];
  if (!args.some((a) => a === "--reconcile-grace" || a.startsWith("--reconcile-grace="))) {
    args.push("--reconcile-grace", "0s");
  }
  if (options.tokens) {
    const file = join(dir, "tokens.txt");
    writeFileSync(file, options.tokens.map(([tenant, token, role]) => `${tenant} ${token}${role ? ` ${role}` : ""}\n`).join(""));
    args.push("--auth-tokens-file", file);
  }
  if (options.approvalPolicy !== undefined) {
    const file = join(dir, "approval-policy.txt");
    writeFileSync(file, options.approvalPolicy);
    args.push("--approval-policy", file);
  }
  const child = spawn(serverBinary(), args, {
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, RUST_LOG: options.rustLog ?? "info", NO_COLOR: "1" },
  });
  running.add(child);
  let log = "";
  const exited = new Promise<void>((done) => child.once("exit", () => done()));
  const address = await new Promise<string>((ready, fail) => {
    let listen: string | undefined;
    const timer = setTimeout(() => fail(new Error(`server did not start in 20 s:\n${log}`)), 20_000);
    child.stderr!.setEncoding("utf8");
    child.stderr!.on("data", (chunk: string) => {
      log += chunk;
      listen ??= /listen=(\S+)/.exec(log)?.[1];
      if (listen && log.includes("store reachable")) {
        clearTimeout(timer);
        ready(listen);
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      fail(new Error(`server exited with ${code} before serving:\n${log}`));
    });
  });
  const ledgers: Ledger[] = [];
  return {
    address,
    dir,
    log: () => log,
    ledger(opts = {}) {
      const ledger = new Ledger({ address, ...opts });
      ledgers.push(ledger);
      return ledger;
    },
    async stop() {
      for (const l of ledgers) l.close();
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
        await exited;
        clearTimeout(timer);
      }
      running.delete(child);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Runs a compiled example (dist/examples/NAME.js) and returns its output. */
export function runExample(
  name: string,
  env: Record<string, string>,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return runScript(join(PACKAGE_ROOT, "dist/examples", `${name}.js`), [], env);
}

/** Runs a compiled script of the package with arguments and returns its output. */
export async function runScript(
  script: string,
  args: string[],
  env: Record<string, string>,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [script, ...args], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (c: string) => (stdout += c));
  child.stderr.setEncoding("utf8").on("data", (c: string) => (stderr += c));
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  const code = await new Promise<number | null>((done) => child.once("close", done));
  clearTimeout(timer);
  return { code, stdout, stderr };
}

/** A run id no other test uses. */
export function uniqueRun(label: string): string {
  return `${label}-${process.pid}-${Math.random().toString(36).slice(2, 10)}`;
}
