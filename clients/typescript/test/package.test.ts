// The package's shape: the adapters are subpath exports, the frameworks are optional peer
// dependencies, and neither the base client nor an adapter loads a framework at run time (the
// adapters import only its types), so `import "idempotency-ledger"` stays small.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { PACKAGE_ROOT } from "./support/server.js";

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
});
