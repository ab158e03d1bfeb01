// Sizes a reader can hold (issue 29, item 7): no module of src/ over 600 lines and no function
// over 100, the generated stubs aside. A function counts from its first line to its last, its
// doc comment aside; a nested function counts on its own, and within the one around it.

import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, test } from "node:test";
import ts from "typescript";
import { PACKAGE_ROOT } from "./support/server.js";

const MAX_FILE_LINES = 600;
const MAX_FUNCTION_LINES = 100;

const SRC = join(PACKAGE_ROOT, "src");

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === "gen" && dir === SRC ? [] : sources(path);
    return name.endsWith(".ts") ? [path] : [];
  });
}

/** `name:first-last (n lines)` of each function of `text` longer than `max` lines. */
export function longFunctions(file: string, text: string, max: number): string[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const long: string[] = [];
  const visit = (node: ts.Node) => {
    if (ts.isFunctionLike(node) && "body" in node && node.body) {
      const first = source.getLineAndCharacterOfPosition(node.getStart(source)).line + 1;
      const last = source.getLineAndCharacterOfPosition(node.end).line + 1;
      const named = node.name ?? (ts.isVariableDeclaration(node.parent) ? node.parent.name : undefined);
      if (last - first + 1 > max) long.push(`${named ? named.getText(source) : "(anonymous)"}:${first}-${last} (${last - first + 1} lines)`);
    }
    ts.forEachChild(node, visit);
  };
  visit(source);
  return long;
}

const files = sources(SRC).map((path) => ({ module: relative(SRC, path), text: readFileSync(path, "utf8") }));

describe("sizes of src/", () => {
  test("the function reader sees methods, arrows and nested functions, each on its own", () => {
    const body = (n: number) => Array.from({ length: n }, (_, i) => `  const v${i} = ${i};`).join("\n");
    const text = [
      `function outer() {\n${body(3)}\n  const inner = () => {\n${body(4)}\n  };\n}`,
      `class C {\n  m() {\n${body(5)}\n  }\n}`,
    ].join("\n");
    assert.deepEqual(longFunctions("x.ts", text, 4), ["outer:1-11 (11 lines)", "inner:5-10 (6 lines)", "m:13-19 (7 lines)"]);
  });

  test(`no module over ${MAX_FILE_LINES} lines`, () => {
    assert.ok(files.length >= 20);
    const long = files
      .map(({ module, text }) => ({ module, lines: text.split("\n").length - (text.endsWith("\n") ? 1 : 0) }))
      .filter(({ lines }) => lines > MAX_FILE_LINES)
      .map(({ module, lines }) => `${module}: ${lines} lines`);
    assert.deepEqual(long, []);
  });

  test(`no function over ${MAX_FUNCTION_LINES} lines`, () => {
    const long = files.flatMap(({ module, text }) => longFunctions(module, text, MAX_FUNCTION_LINES).map((f) => `${module} ${f}`));
    assert.deepEqual(long, []);
  });
});
