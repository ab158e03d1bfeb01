// The package's shape: the adapters are subpath exports, the frameworks are optional peer
// dependencies, and neither the base client nor an adapter loads a framework at run time (the
// adapters import only its types), so `import "idempotency-ledger"` stays small.

import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { promisify } from "node:util";
import { sleep } from "./support/payments.js";
import { PACKAGE_ROOT, runScript, startServer, uniqueRun } from "./support/server.js";

const exec = promisify(execFile);

const pkg = JSON.parse(readFileSync(join(PACKAGE_ROOT, "package.json"), "utf8")) as {
  name: string;
  bin: Record<string, string>;
  exports: Record<string, { types: string; default: string }>;
  dependencies: Record<string, string>;
  peerDependencies: Record<string, string>;
  peerDependenciesMeta: Record<string, { optional?: boolean }>;
};

const FRAMEWORKS = ["ai", "@openai/agents", "@modelcontextprotocol/sdk"];
/** Loaded on demand (import()) when installed: the caller's span goes to the ledger as traceparent. */
const OPTIONAL = ["@opentelemetry/api"];

/** The module specifiers a compiled file imports at run time. */
function runtimeImports(file: string): string[] {
  const js = readFileSync(file, "utf8");
  return [...js.matchAll(/^\s*(?:import|export)\b[^'"]*?from\s*["']([^"']+)["']|^\s*import\s*["']([^"']+)["']/gm)].map(
    (m) => m[1] ?? m[2],
  );
}

/** The processes of a process group that have not exited (zombies left unreaped count as gone), from /proc. */
function liveInGroup(pgid: number): Array<{ pid: number; comm: string }> {
  const live: Array<{ pid: number; comm: string }> = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${name}/stat`, "utf8");
    } catch {
      continue; // exited meanwhile
    }
    // pid (comm) state ppid pgrp …: comm may hold spaces and parentheses, so split after the last ")".
    const [state, , pgrp] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (Number(pgrp) === pgid && state !== "Z") live.push({ pid: Number(name), comm: stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")")) });
  }
  return live;
}

describe("package", () => {
  test("each adapter is a subpath export, importable by the package's name", async () => {
    assert.deepEqual(Object.keys(pkg.exports).sort(), [".", "./ai-sdk", "./mcp", "./openai-agents"]);
    const base = (await import(pkg.name)) as Record<string, unknown>;
    assert.equal(typeof base.Ledger, "function");
    assert.equal(typeof ((await import(`${pkg.name}/ai-sdk`)) as Record<string, unknown>).ledgerTool, "function");
    assert.equal(typeof ((await import(`${pkg.name}/openai-agents`)) as Record<string, unknown>).ledgerTool, "function");
    const mcp = (await import(`${pkg.name}/mcp`)) as Record<string, unknown>;
    assert.equal(typeof mcp.registerLedgerTool, "function");
    assert.equal(mcp.RUN_ID_META_KEY, "idempotency-ledger/run_id");
  });

  test("the frameworks are optional peer dependencies, never dependencies", () => {
    assert.deepEqual(Object.keys(pkg.peerDependencies).sort(), [...FRAMEWORKS, ...OPTIONAL].sort());
    for (const name of [...FRAMEWORKS, ...OPTIONAL]) {
      assert.equal(pkg.peerDependenciesMeta[name]?.optional, true, name);
      assert.ok(!(name in pkg.dependencies), name);
    }
  });

  test("no compiled module loads a framework at run time", () => {
    const dir = join(PACKAGE_ROOT, "dist/src");
    const files = [
      ...readdirSync(dir).filter((f) => f.endsWith(".js")).map((f) => join(dir, f)),
      ...readdirSync(join(dir, "adapters")).filter((f) => f.endsWith(".js")).map((f) => join(dir, "adapters", f)),
    ];
    assert.ok(files.length >= 10);
    for (const file of files) {
      const imports = runtimeImports(file);
      for (const spec of imports) {
        assert.ok(
          spec.startsWith(".") || spec.startsWith("node:") || spec.startsWith("@bufbuild/") || spec.startsWith("@connectrpc/"),
          `${file} imports ${spec}`,
        );
      }
    }
    // The check reads real imports: the adapters do import the client's own modules.
    assert.ok(runtimeImports(join(dir, "adapters/mcp.js")).includes("../tools.js"));
    // The one module loaded on demand is OpenTelemetry's API, and only if it is installed.
    const dynamic = files.flatMap((f) => [...readFileSync(f, "utf8").matchAll(/\bimport\(\s*["']([^"']+)["']\s*\)/g)].map((m) => m[1]));
    assert.deepEqual([...new Set(dynamic)], OPTIONAL);
  });

  test("the reconciler command is the package's bin: compiled, with its shebang", () => {
    assert.deepEqual(Object.keys(pkg.bin), ["idempotency-ledger-reconciler"]);
    const script = readFileSync(join(PACKAGE_ROOT, pkg.bin["idempotency-ledger-reconciler"]), "utf8");
    assert.ok(script.startsWith("#!/usr/bin/env node\n"), "runs as a command");
  });

  test("runtime dependencies are version ranges (within the releases that still run on Node 20), not exact pins", () => {
    assert.deepEqual(Object.keys(pkg.dependencies).sort(), ["@bufbuild/protobuf", "@connectrpc/connect", "@connectrpc/connect-node"]);
    for (const [name, spec] of Object.entries(pkg.dependencies)) {
      assert.match(spec, /^[~^]\d/, `${name}: ${spec} is a pin`);
    }
    // Connect 2.2 needs Node 22: the range stops before it.
    assert.equal(pkg.dependencies["@connectrpc/connect-node"], "~2.1.1");
  });

  test("npm pack: the tarball holds the compiled client, and runs installed without the repository, a framework or OpenTelemetry", async () => {
    const dir = mkdtempSync(join(tmpdir(), "ledger-ts-pack-"));
    const server = await startServer();
    try {
      // The build is test.sh's (prepack runs the same build): only the packing is tested here.
      const { stdout } = await exec("npm", ["pack", "--ignore-scripts", "--pack-destination", dir, "--json"], {
        cwd: PACKAGE_ROOT,
        timeout: 120_000,
      });
      const [packed] = JSON.parse(stdout) as Array<{ filename: string; files: Array<{ path: string }> }>;
      const files = packed.files.map((f) => f.path);
      for (const f of [
        "package.json",
        "README.md",
        "dist/src/index.js",
        "dist/src/index.d.ts",
        "dist/src/adapters/ai-sdk.js",
        "dist/src/adapters/openai-agents.js",
        "dist/src/adapters/mcp.js",
        "dist/src/cli/reconciler.js",
        "dist/src/gen/idempotency/v1/ledger_pb.js",
      ]) {
        assert.ok(files.includes(f), `${f} is packed`);
      }
      assert.deepEqual(files.filter((f) => /^(dist\/test|dist\/examples|test|examples|node_modules)\//.test(f)), []);

      // Installed by hand: the tarball, and its three runtime dependencies; nothing else.
      const installed = join(dir, "node_modules", "idempotency-ledger");
      mkdirSync(installed, { recursive: true });
      await exec("tar", ["xzf", join(dir, packed.filename), "-C", installed, "--strip-components=1"]);
      for (const scope of ["@bufbuild", "@connectrpc"]) symlinkSync(join(PACKAGE_ROOT, "node_modules", scope), join(dir, "node_modules", scope));
      const check = join(dir, "check.mjs");
      writeFileSync(
        check,
        [
          'import { Ledger } from "idempotency-ledger";',
          'for (const sub of ["ai-sdk", "openai-agents", "mcp"]) await import(`idempotency-ledger/${sub}`);',
          "const ledger = new Ledger({ address: process.argv[2] });",
          'const out = await ledger.runTool(`run-${process.pid}`, "t", { a: 1 }, () => ({ ok: 1 }));',
          "console.log(out.toModelText());",
          "ledger.close();",
        ].join("\n"),
      );
      const run = await runScript(check, [server.address], {});
      assert.equal(run.code, 0, run.stderr);
      assert.equal(run.stdout.trim(), '{"ok":1}');
      const bin = await runScript(join(installed, "dist/src/cli/reconciler.js"), ["--help"], {});
      assert.equal(bin.code, 0, bin.stderr);
      assert.match(bin.stdout, /usage: idempotency-ledger-reconciler TOOLS_MODULE/);
    } finally {
      await server.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test(
    "npx idempotency-ledger-reconciler, installed from the tarball: SIGTERM to npx, or SIGINT to its process group (Ctrl-C), stops the reconciler cleanly and leaves no process behind",
    { skip: existsSync("/proc/self/stat") ? false : "reads /proc" },
    async () => {
      const dir = mkdtempSync(join(tmpdir(), "ledger-ts-npx-"));
      const server = await startServer();
      const ledger = server.ledger();
      const started: number[] = [];
      try {
        const { stdout } = await exec("npm", ["pack", "--ignore-scripts", "--pack-destination", dir, "--json"], {
          cwd: PACKAGE_ROOT,
          timeout: 120_000,
        });
        const [packed] = JSON.parse(stdout) as Array<{ filename: string }>;
        // A project of the user's: the tarball installed by npm (its bin linked in node_modules/.bin),
        // its three runtime dependencies from this checkout's node_modules, so that nothing is fetched.
        const project = join(dir, "agent");
        mkdirSync(project);
        writeFileSync(join(project, "package.json"), JSON.stringify({ name: "agent", version: "1.0.0", private: true, type: "module" }));
        const deps = ["@bufbuild/protobuf", "@connectrpc/connect", "@connectrpc/connect-node"].map((d) => join(PACKAGE_ROOT, "node_modules", d));
        await exec("npm", ["install", "--offline", "--no-audit", "--no-fund", ...deps, join(dir, packed.filename)], { cwd: project, timeout: 120_000 });
        assert.ok(existsSync(join(project, "node_modules/.bin/idempotency-ledger-reconciler")));
        // The tools, in plain JavaScript: a paired read that takes a second to answer, and says when it was asked.
        writeFileSync(
          join(project, "tools.js"),
          [
            'import { writeFileSync } from "node:fs";',
            'import { found } from "idempotency-ledger";',
            "export const tools = [{",
            '  name: "issue_credit",',
            "  confirm: async ({ externalRef }) => {",
            "    writeFileSync(process.env.ASKED_FILE, externalRef);",
            "    await new Promise((done) => setTimeout(done, 1_000));",
            "    return found({ credit_id: `cr-${externalRef.slice(-6)}` });",
            "  },",
            "}];",
          ].join("\n"),
        );

        for (const [signal, to] of [["SIGTERM", "npx"], ["SIGINT", "group"]] as const) {
          const claim = await ledger.claim({ runId: uniqueRun("npx"), tool: "issue_credit", args: { n: 1 } });
          await ledger.complete({ key: claim.entry.key, claimToken: claim.claimToken, status: "UNKNOWN", error: "timeout" });
          const asked = join(dir, `asked-${signal}`);
          const principal = `npx-${signal}`;
          // npx as a user starts it: the leader of a process group of its own (npm, its shell, the command).
          const npx = spawn("npx", ["idempotency-ledger-reconciler", "./tools.js", "--older-than", "0s", "--principal", principal], {
            cwd: project,
            detached: true,
            stdio: ["ignore", "pipe", "pipe"],
            env: { ...process.env, LEDGER_ADDRESS: server.address, ASKED_FILE: asked, npm_config_update_notifier: "false" },
          });
          started.push(npx.pid!);
          let log = "";
          npx.stdout!.setEncoding("utf8").on("data", (c: string) => (log += c));
          npx.stderr!.setEncoding("utf8").on("data", (c: string) => (log += c));
          const exited = new Promise<number | string | null>((done) => npx.once("exit", (code, sig) => done(code ?? sig)));
          for (let i = 0; i < 400 && !existsSync(asked); i++) await sleep(50);
          assert.ok(existsSync(asked), `the reconciler never asked confirm:\n${log}`);
          // Its confirm is in flight: npm, the shell npm runs the command with, and the command itself.
          const group = liveInGroup(npx.pid!);
          assert.ok(group.length >= 2 && group.some((p) => p.comm === "node"), JSON.stringify(group));

          process.kill(to === "npx" ? npx.pid! : -npx.pid!, signal);
          const signalled = Date.now();
          let left = liveInGroup(npx.pid!);
          while (left.length > 0 && Date.now() - signalled < 8_000) {
            await sleep(100);
            left = liveInGroup(npx.pid!);
          }
          assert.deepEqual(left, [], `${signal} to ${to}: still running ${Date.now() - signalled} ms later:\n${log}`);
          await exited;
          // Cleanly: the confirm in flight was answered and its finding sent before it stopped.
          const entry = await ledger.lookup({ key: claim.entry.key });
          assert.equal(entry.status, "SUCCEEDED", log);
          assert.equal(entry.resolvedBy, principal);
          assert.match(log, new RegExp(`settled key=${claim.entry.key} tool=issue_credit .* outcome=found status=SUCCEEDED resolved_by=${principal} via=reconciler`));
          assert.match(log, /stopping/);
        }
      } finally {
        for (const pgid of started) for (const p of liveInGroup(pgid)) process.kill(p.pid, "SIGKILL");
        await server.stop();
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );
});
