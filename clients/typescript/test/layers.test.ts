// The layer order of src/ (README, "Layers"), held by the import graph: every module of src/
// belongs to one layer, imports only from its own layer or those below (type-only imports
// included: a cycle of types is a cycle to whoever changes them), and no imports go round in a
// cycle. So the core never imports an adapter, and the package's entry exports no adapter.

import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { describe, test } from "node:test";
import { PACKAGE_ROOT } from "./support/server.js";

/** The layers, lowest first: a module imports from its own layer and those below only. */
const LAYERS: Array<[name: string, modules: string[]]> = [
  ["codec and keys (and the generated stubs, and the base error keys throws)", ["gen/**", "codec.ts", "keys.ts", "error-base.ts"]],
  ["model and errors", ["types.ts", "errors.ts", "defaults.ts", "confirm.ts", "outcome.ts"]],
  ["the ledger", ["log.ts", "trace.ts", "rpc-types.ts", "rpc.ts", "run-options.ts", "action.ts", "settle.ts", "attempt.ts", "ledger.ts"]],
  ["tools", ["tools.ts", "reconciler.ts"]],
  ["the package's entry", ["index.ts"]],
  ["adapters and commands", ["adapters/*.ts", "cli/*.ts"]],
];

const SRC = join(PACKAGE_ROOT, "src");

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sources(path);
    return name.endsWith(".ts") ? [relative(SRC, path)] : [];
  });
}

function layerOf(module: string): number {
  const i = LAYERS.findIndex(([, patterns]) =>
    patterns.some((p) =>
      p.endsWith("/**")
        ? module.startsWith(p.slice(0, -2))
        : p.includes("*")
          ? dirname(module) === dirname(p) && module.endsWith(".ts")
          : module === p,
    ),
  );
  return i;
}

/** The modules of src/ a module imports (`import`, `import type`, `export … from`, `import()`). */
export function importsOf(source: string, from: string): string[] {
  const specs = [
    ...source.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s*["']([^"']+)["']/gm),
    ...source.matchAll(/^\s*import\s*["']([^"']+)["']/gm),
    ...source.matchAll(/\bimport\(\s*["']([^"']+)["']\s*\)/g),
  ].map((m) => m[1]);
  return specs
    .filter((s) => s.startsWith("."))
    .map((s) => relative(SRC, resolve(SRC, dirname(from), s)).replace(/\.js$/, ".ts"));
}

const modules = sources(SRC).filter((m) => !m.startsWith("gen/"));
const graph = new Map(modules.map((m) => [m, importsOf(readFileSync(join(SRC, m), "utf8"), m)]));

describe("layers of src/", () => {
  test("the import reader sees every form of import, type-only ones included", () => {
    const seen = importsOf(
      [
        'import { a } from "./a.js";',
        'import type { B } from "../b.js";',
        "import {\n  c,\n  type D,\n} from './c.js';",
        'export { e } from "./e.js";',
        'export * from "./f.js";',
        'import "./g.js";',
        'const h = await import("./h.js");',
        'import { z } from "zod";',
      ].join("\n"),
      "adapters/x.ts",
    );
    assert.deepEqual(seen, ["adapters/a.ts", "b.ts", "adapters/c.ts", "adapters/e.ts", "adapters/f.ts", "adapters/g.ts", "adapters/h.ts"]);
  });

  test("every module of src/ is in a layer", () => {
    assert.ok(modules.length >= 20);
    assert.deepEqual(modules.filter((m) => layerOf(m) < 0), []);
  });

  test("every import goes to the module's own layer or one below", () => {
    const upward: string[] = [];
    for (const [module, imports] of graph) {
      for (const target of imports) {
        assert.ok(target.startsWith("gen/") || graph.has(target), `${module} imports ${target}, which does not exist`);
        if (layerOf(target) > layerOf(module)) {
          upward.push(`${module} (${LAYERS[layerOf(module)][0]}) imports ${target} (${LAYERS[layerOf(target)][0]})`);
        }
      }
    }
    assert.deepEqual(upward, []);
  });

  test("no cycle of imports", () => {
    const cycles: string[] = [];
    const state = new Map<string, "visiting" | "done">();
    const visit = (m: string, path: string[]) => {
      if (state.get(m) === "done") return;
      if (state.get(m) === "visiting") {
        cycles.push([...path.slice(path.indexOf(m)), m].join(" -> "));
        return;
      }
      state.set(m, "visiting");
      for (const t of graph.get(m) ?? []) visit(t, [...path, m]);
      state.set(m, "done");
    };
    for (const m of graph.keys()) visit(m, []);
    assert.deepEqual(cycles, []);
  });

  test("the core imports no adapter, and the package's entry exports none", () => {
    const adapters = [...graph.keys()].filter((m) => m.startsWith("adapters/"));
    assert.equal(adapters.length, 3);
    for (const [module, imports] of graph) {
      if (module.startsWith("adapters/")) continue;
      assert.deepEqual(imports.filter((t) => t.startsWith("adapters/")), [], module);
    }
  });
});
