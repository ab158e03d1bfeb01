// Every ```ts / ```typescript snippet of the docs (docs/*.md at the repository's root, and this
// README) is compiled with `tsc --strict` in a temp project that imports the built package by its
// name ("idempotency-ledger" and its subpaths: dist/) and the real frameworks the snippets use,
// each snippet a module of its own. The names a snippet assumes rather than makes (the agent's
// `ledger`, the person's `approver`, the `runId`, a `model`, the payments API) are declared once,
// for all, in one prelude, each with why (test/support/snippet-prelude.ts); anything else a
// snippet uses it must import or make, as a reader copying it would. The snippets that are cheap
// to run are then run with node against the real server, what they assume defined by a module
// run first (`node --import`), and what they print is checked.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";
import { SNIPPET_PRELUDE, preludeNames } from "./support/snippet-prelude.js";
import { PACKAGE_ROOT, REPO_ROOT, startServer, uniqueRun, type TestServer } from "./support/server.js";

const exec = promisify(execFile);

interface Snippet {
  /** The Markdown file, relative to the repository's root. */
  file: string;
  /** 1-based line of the file where the snippet's code starts. */
  line: number;
  code: string;
}

/** The ```ts and ```typescript blocks of a Markdown text, in order. */
export function tsSnippets(markdown: string, file = "README.md"): Snippet[] {
  const out: Snippet[] = [];
  const lines = markdown.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const fence = /^```(\S*)\s*$/.exec(lines[i]);
    if (!fence) continue;
    const end = lines.findIndex((l, j) => j > i && /^```\s*$/.test(l));
    assert.ok(end > i, `${file} line ${i + 1}: a code block that never ends`);
    if (fence[1] === "ts" || fence[1] === "typescript") out.push({ file, line: i + 2, code: lines.slice(i + 1, end).join("\n") });
    i = end;
  }
  return out;
}

/** The Markdown files whose snippets are checked: every docs/*.md, and this README. */
function markdownFiles(): string[] {
  const docs = join(REPO_ROOT, "docs");
  return [
    ...readdirSync(docs)
      .filter((f) => f.endsWith(".md"))
      .sort()
      .map((f) => join(docs, f)),
    join(PACKAGE_ROOT, "README.md"),
  ];
}

interface Run {
  /** A module run before the snippet (node --import): defines, on globalThis, what the prelude only declares. */
  prelude: string;
  /** Appended to the snippet (type-checked with it) when it is run: prints what the test checks. */
  epilogue: string;
  /** Checks what the snippet printed; `runs` is 1 for the first run, 2 for the second. */
  check(stdout: string, snippet: Snippet, runs: number): void;
  /** How many times to run it (the same run id each time). */
  times?: number;
}

/** The snippets that are run, each found by a line only it has. */
const RUNS: Array<{ find: string; run: Run }> = [
  {
    find: 'ledger.runTool(runId, "issue_credit", args',
    run: {
      prelude: `globalThis.runId = process.env.RUN_ID;
globalThis.payments = { issueCredit: async ({ idempotencyKey }) => ({ credit_id: "cr-" + idempotencyKey.slice(-8) }) };`,
      epilogue: "console.log(toolMessage);\nledger.close();",
      // The first run performs the call; the same run again is a replay, with the server's note.
      check(stdout, _snippet, runs) {
        if (runs === 1) assert.match(stdout.trim(), /^\{"credit_id":"cr-[0-9a-f]{8}"\}$/);
        else assert.match(stdout.trim(), /^This action was already performed in this run; .*No new action was taken\. Result: \{"credit_id":"cr-[0-9a-f]{8}"\}$/);
      },
      times: 2,
    },
  },
  {
    find: "new Reconciler(ledger, tools",
    run: {
      prelude: `import { Ledger, notFound } from "idempotency-ledger";
globalThis.ledger = new Ledger({ address: process.env.LEDGER_ADDRESS });
globalThis.tools = [{ name: "issue_credit", confirm: () => notFound }];`,
      epilogue: 'console.log(`stopped=${reconciler.stopped} tools=${reconciler.tools.map((t) => t.name).join(",")}`);\nledger.close();',
      check: (stdout) => assert.equal(stdout.trim(), "stopped=true tools=issue_credit"),
    },
  },
  {
    find: 'import { deriveKey, fingerprint, canonicalize } from "idempotency-ledger";',
    run: {
      prelude: "",
      epilogue: [
        'console.log(deriveKey("run-1", "issue_credit", \'{"currency":"EUR","amount":2e2}\'));',
        'console.log(deriveKey("run-1", "issue_credit", { amount: 200, currency: "EUR" }));',
        'console.log(canonicalize(\'{"currency":"EUR","amount":2e2}\'));',
      ].join("\n"),
      // The keys the snippet's comments abbreviate ("cec41f2a…1423a", "the same").
      check(stdout, snippet) {
        const [first, second, canonical] = stdout.trim().split("\n");
        const said = /\/\/ "([0-9a-f]+)…([0-9a-f]+)"/.exec(snippet.code);
        assert.ok(said, "the snippet names the key it derives");
        assert.ok(first.startsWith(said[1]) && first.endsWith(said[2]), `${first} is not ${said[1]}…${said[2]}`);
        assert.equal(second, first);
        assert.equal(canonical, '{"amount":200,"currency":"EUR"}');
      },
    },
  },
];

/** Controls that must fail, each with the compiler's error codes it must get. */
const CONTROLS: Array<{ file: string; why: string; code: string; errors: string[] }> = [
  {
    file: "control-types.ts",
    why: "the README's first findCredit as it was (an implicit any: TS7031) and a name the package lacks (TS2724)",
    code: [
      'import { found, notFound, currentAttemptt } from "idempotency-ledger";',
      "const findCredit = async ({ externalRef }) => {",
      "  const credit = await payments.findCredit({ idempotencyKey: externalRef });",
      "  return credit ? found({ credit_id: credit.id }) : notFound;",
      "};",
      "export { findCredit, currentAttemptt };",
    ].join("\n"),
    errors: ["TS2724", "TS7031"],
  },
  {
    file: "control-imports.ts",
    why: "docs/approvals.md's Vercel AI SDK snippet as it was, shortened: z and stepCountIs used, never imported (TS2304)",
    code: [
      'import { generateText, tool, type ModelMessage } from "ai";',
      'import { ledgerTool } from "idempotency-ledger/ai-sdk";',
      "const tools = {",
      "  issue_refund: ledgerTool(",
      "    ledger,",
      '    tool({ description: "Refund an order.", inputSchema: z.object({ order: z.string(), amount: z.number() }),',
      "      execute: async ({ order, amount }) => refundOrder(order, amount) }),",
      '    { name: "issue_refund" },',
      "  ),",
      "};",
      'const messages: ModelMessage[] = [{ role: "user", content: "Refund order o-1." }];',
      "await generateText({ model, tools, messages, experimental_context: { runId }, stopWhen: stepCountIs(5) });",
      "export {};",
    ].join("\n"),
    // Cannot find name 'z' (three times), then 'stepCountIs'.
    errors: ["TS2304", "TS2304", "TS2304", "TS2304"],
  },
];

describe("docs and README: every TypeScript snippet compiles under tsc --strict, and the cheap ones run", () => {
  const snippets = markdownFiles().flatMap((path) => tsSnippets(readFileSync(path, "utf8"), relative(REPO_ROOT, path)));
  let dir: string;
  let server: TestServer;
  /** tsc's diagnostics per file of the temp project. */
  let diagnostics: Map<string, string[]>;
  const fileOf = (i: number) => `snippet-${String(i + 1).padStart(2, "0")}.ts`;
  const runsOf = (s: Snippet) => RUNS.filter((r) => s.code.includes(r.find));

  before(async () => {
    server = await startServer();
    dir = mkdtempSync(join(tmpdir(), "ledger-ts-snippets-"));
    // The temp project: the package under its name, and the frameworks and types it was tested with.
    const modules = join(dir, "node_modules");
    mkdirSync(modules);
    for (const name of readdirSync(join(PACKAGE_ROOT, "node_modules"))) {
      if (!name.startsWith(".")) symlinkSync(join(PACKAGE_ROOT, "node_modules", name), join(modules, name));
    }
    symlinkSync(PACKAGE_ROOT, join(modules, "idempotency-ledger"));
    writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "doc-snippets", private: true, type: "module" }));
    writeFileSync(
      join(dir, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          strict: true,
          target: "ES2022",
          lib: ["ES2022"],
          module: "NodeNext",
          moduleResolution: "NodeNext",
          types: ["node"],
          skipLibCheck: true,
          outDir: "out",
        },
        include: ["*.ts"],
      }),
    );
    writeFileSync(join(dir, "prelude.d.ts"), SNIPPET_PRELUDE);
    snippets.forEach((s, i) => {
      const [run] = runsOf(s);
      const parts = [
        `// ${s.file}, the snippet at line ${s.line}`,
        s.code,
        run?.run.epilogue ?? "",
        // A snippet without an import or export would be a script, and top-level await needs a module.
        "export {};",
      ];
      writeFileSync(join(dir, fileOf(i)), `${parts.join("\n")}\n`);
      if (run) writeFileSync(join(dir, `prelude-${i + 1}.mjs`), `${run.run.prelude}\n`);
    });
    for (const control of CONTROLS) writeFileSync(join(dir, control.file), `${control.code}\n`);
    // One tsc run for all (its diagnostics name the file); it emits even when a snippet has errors.
    diagnostics = new Map([...snippets.map((_, i) => fileOf(i)), ...CONTROLS.map((c) => c.file), "prelude.d.ts"].map((f) => [f, []]));
    const tsc = join(PACKAGE_ROOT, "node_modules/.bin/tsc");
    const out = await exec(tsc, ["-p", dir, "--pretty", "false"], { cwd: dir, timeout: 300_000 }).then(
      (r) => r.stdout,
      (err: { stdout?: string; message: string }) => err.stdout || err.message,
    );
    let last: string[] | undefined;
    for (const line of out.split("\n").filter((l) => l.trim())) {
      // An indented line goes on with the diagnostic before it (the chain of why a type does not fit).
      if (/^\s/.test(line) && last) {
        last[last.length - 1] += `\n${line}`;
        continue;
      }
      const file = /^((?:snippet-\d+|control-\w+|prelude)\.(?:d\.)?ts)\(/.exec(line)?.[1];
      assert.ok(file && diagnostics.has(file), `tsc: ${line}`);
      last = diagnostics.get(file)!;
      last.push(line);
    }
  });
  after(async () => {
    await server?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test("the docs have their snippets: the README's, docs/approvals.md's two frameworks and docs/agents.md's", () => {
    const per = (file: string) => snippets.filter((s) => s.file === file).length;
    assert.ok(per("clients/typescript/README.md") >= 9, `${per("clients/typescript/README.md")} README snippets`);
    assert.ok(per("docs/approvals.md") >= 2);
    assert.ok(per("docs/agents.md") >= 1);
    for (const r of RUNS) assert.equal(snippets.filter((s) => s.code.includes(r.find)).length, 1, `the run for ${JSON.stringify(r.find)}`);
  });

  test("the prelude declares only names of the app's own: declarations, no code, nothing a snippet should import, each name used", async () => {
    assert.deepEqual(diagnostics.get("prelude.d.ts"), []);
    for (const l of SNIPPET_PRELUDE.split("\n").filter((x) => /^\S/.test(x))) {
      assert.match(l, /^(\/\/|\/\*\*|declare (const|function) |type \w+ = \{$|\};$)/, l);
    }
    const names = preludeNames();
    assert.ok(names.includes("ledger") && names.includes("approver") && names.includes("refundOrder"));
    const modules = ["idempotency-ledger", "idempotency-ledger/ai-sdk", "idempotency-ledger/openai-agents", "idempotency-ledger/mcp", "ai", "@openai/agents", "zod"];
    for (const spec of modules) {
      const exported = Object.keys((await import(spec)) as object);
      assert.deepEqual(names.filter((n) => exported.includes(n)), [], `the prelude declares what ${spec} exports`);
    }
    const unused = names.filter((n) => !snippets.some((s) => new RegExp(`\\b${n}\\b`).test(s.code)));
    assert.deepEqual(unused, [], "declared, used by no snippet");
  });

  for (const control of CONTROLS) {
    test(`the check fails a snippet that does not compile: ${control.why}`, () => {
      assert.deepEqual(
        diagnostics.get(control.file)!.map((l) => /error (TS\d+)/.exec(l)?.[1]),
        control.errors,
        diagnostics.get(control.file)!.join("\n"),
      );
    });
  }

  snippets.forEach((s, i) => {
    const first = s.code.split("\n").find((l) => l.trim() && !l.startsWith("//")) ?? "";
    test(`${s.file} line ${s.line} compiles under --strict: ${first.slice(0, 70)}`, () => {
      assert.deepEqual(diagnostics.get(fileOf(i)), [], readFileSync(join(dir, fileOf(i)), "utf8"));
    });
    const run = runsOf(s)[0]?.run;
    if (run) {
      test(`${s.file} line ${s.line} runs against the server and prints what it says`, async () => {
        const env = { ...process.env, LEDGER_ADDRESS: server.address, RUN_ID: uniqueRun("readme") };
        // The snippets' ledger is at 127.0.0.1:50051: the test's is wherever it started.
        const js = join(dir, "out", fileOf(i).replace(/\.ts$/, ".js"));
        writeFileSync(js, readFileSync(js, "utf8").replaceAll('"127.0.0.1:50051"', JSON.stringify(server.address)));
        for (let n = 1; n <= (run.times ?? 1); n++) {
          const { stdout } = await exec(process.execPath, ["--import", join(dir, `prelude-${i + 1}.mjs`), js], {
            cwd: dir,
            env,
            timeout: 30_000,
          });
          run.check(stdout, s, n);
        }
      });
    }
  });
});
