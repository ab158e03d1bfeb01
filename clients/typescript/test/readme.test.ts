// Every ```ts / ```typescript snippet of the README is compiled with `tsc --strict` in a temp
// project that imports the package by its name ("idempotency-ledger", its subpaths, and the
// frameworks the snippets use), each snippet a module of its own. A snippet that is a fragment
// (it uses a `ledger`, a `runId`, a payments API it does not define) gets the names it uses as
// ambient declarations (`declare const …`, `import type`) before it, and nothing else: what it
// does with them is type-checked. The snippets that are cheap to run are then run with node
// against the real server, their names defined by a prelude (`node --import`), and what they
// print is checked.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { promisify } from "node:util";
import { PACKAGE_ROOT, startServer, uniqueRun, type TestServer } from "./support/server.js";

const exec = promisify(execFile);

interface Snippet {
  /** 1-based line of the README where the snippet's code starts. */
  line: number;
  code: string;
}

/** The README's ```ts and ```typescript blocks, in order. */
export function tsSnippets(markdown: string): Snippet[] {
  const out: Snippet[] = [];
  const lines = markdown.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const fence = /^```(\S*)\s*$/.exec(lines[i]);
    if (!fence) continue;
    const end = lines.findIndex((l, j) => j > i && /^```\s*$/.test(l));
    assert.ok(end > i, `README.md line ${i + 1}: a code block that never ends`);
    if (fence[1] === "ts" || fence[1] === "typescript") out.push({ line: i + 2, code: lines.slice(i + 1, end).join("\n") });
    i = end;
  }
  return out;
}

/** A payments API, as the snippets use it (declared for the compiler). */
const PAYMENTS = `declare const payments: {
  issueCredit(request: { customer: string; amount: number; currency: string; idempotencyKey: string }): Promise<{ credit_id: string }>;
  findCredit(query: { idempotencyKey: string }): Promise<{ id: string } | undefined>;
};`;

/** What the per-framework snippets use from the snippet before them, and the tool's own parts. */
const LEDGER_AND_READ = `import type * as __ledger from "idempotency-ledger";
declare const ledger: __ledger.Ledger;
declare const findCredit: __ledger.Confirm<{ credit_id: string }>;
declare const runId: string;
declare const description: string;
declare const execute: (input: { customer: string; amount: number; currency: string }) => Promise<{ credit_id: string }>;`;

/** What the approval snippets use: the agent's ledger, the person's, the run, the refund tool's parts. */
const APPROVALS = `import type * as __ledger from "idempotency-ledger";
declare const ledger: __ledger.Ledger;
declare const approver: __ledger.Ledger;
declare const runId: string;
declare const description: string;
declare const execute: (input: { order: string; amount: number }) => Promise<{ refund_id: string }>;`;

const REFUND_SHAPE = `{ order: import("zod").ZodString; amount: import("zod").ZodNumber }`;

const CREDIT_SHAPE = `{ customer: import("zod").ZodString; amount: import("zod").ZodNumber; currency: import("zod").ZodString }`;

interface Run {
  /** A module run before the snippet (node --import): defines, on globalThis, what the snippet only declares. */
  prelude: string;
  /** Appended to the snippet (type-checked with it) when it is run: prints what the test checks. */
  epilogue: string;
  /** Checks what the snippet printed; `runs` is 1 for the first run, 2 for the second. */
  check(stdout: string, snippet: Snippet, runs: number): void;
  /** How many times to run it (the same run id each time). */
  times?: number;
}

/** Each snippet is found by a line only it has. */
const CONTEXTS: Array<{ find: string; declare: string; run?: Run }> = [
  {
    find: 'ledger.runTool(runId, "issue_credit", args',
    declare: `declare const runId: string;\n${PAYMENTS}`,
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
  { find: "const findCredit: Confirm<{ credit_id: string }> = async ({ externalRef })", declare: PAYMENTS },
  {
    find: 'import { ledgerTool } from "idempotency-ledger/ai-sdk";',
    declare: `${LEDGER_AND_READ}
declare const inputSchema: import("zod").ZodType<{ customer: string; amount: number; currency: string }>;
declare const model: import("ai").LanguageModel;
declare const prompt: string;`,
  },
  {
    find: 'import { ledgerTool } from "idempotency-ledger/openai-agents";',
    declare: `${LEDGER_AND_READ}
declare const parameters: import("zod").ZodObject<${CREDIT_SHAPE}>;
declare const instructions: string;
declare const input: string;`,
  },
  {
    find: 'import { registerLedgerTool } from "idempotency-ledger/mcp";',
    declare: `${LEDGER_AND_READ}
declare const server: import("@modelcontextprotocol/sdk/server/mcp.js").McpServer;
declare const inputSchema: ${CREDIT_SHAPE};
declare const callback: import("@modelcontextprotocol/sdk/server/mcp.js").ToolCallback<typeof inputSchema>;`,
  },
  {
    find: "decideInterruption(approver, state, interruption",
    declare: `${APPROVALS}
declare const parameters: import("zod").ZodObject<${REFUND_SHAPE}>;
declare const instructions: string;
declare const input: string;`,
  },
  {
    find: "decideApproval(approver, part",
    declare: `${APPROVALS}
declare const inputSchema: import("zod").ZodType<{ order: string; amount: number }>;
declare const model: import("ai").LanguageModel;
declare const prompt: string;`,
  },
  {
    find: "approver.watchApprovals({ cursor })",
    declare: `import type * as __ledger from "idempotency-ledger";
declare const ledger: __ledger.Ledger;
declare const runId: string;
declare const key: string;
declare const fingerprint: string;
declare const args: Record<string, unknown>;
declare const act: () => Promise<{ refund_id: string }>;
declare const loadCursor: () => string;
declare const postToChat: (entry: __ledger.LedgerEntry) => Promise<void>;`,
  },
  { find: "const confirm: Confirm<{ credit_id: string }> = async ({ externalRef })", declare: PAYMENTS },
  {
    find: "new Reconciler(ledger, tools",
    declare: `import type * as __ledger from "idempotency-ledger";
declare const ledger: __ledger.Ledger;
declare const tools: __ledger.ReconcilerTools;`,
    run: {
      prelude: `import { Ledger, notFound } from "idempotency-ledger";
globalThis.ledger = new Ledger({ address: process.env.LEDGER_ADDRESS });
globalThis.tools = [{ name: "issue_credit", confirm: () => notFound }];`,
      epilogue: 'console.log(`stopped=${reconciler.stopped} tools=${reconciler.tools.map((t) => t.name).join(",")}`);\nledger.close();',
      check: (stdout) => assert.equal(stdout.trim(), "stopped=true tools=issue_credit"),
    },
  },
  {
    find: "retryBudgetMs: 30_000,",
    declare: `declare const runId: string;
declare const args: Record<string, unknown>;
declare const result: Uint8Array;`,
  },
  {
    find: 'import { deriveKey, fingerprint, canonicalize } from "idempotency-ledger";',
    declare: "",
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

describe("README: every TypeScript snippet compiles under tsc --strict, and the cheap ones run", () => {
  const readme = readFileSync(join(PACKAGE_ROOT, "README.md"), "utf8");
  const snippets = tsSnippets(readme);
  let dir: string;
  let server: TestServer;
  /** tsc's diagnostics per snippet file. */
  let diagnostics: Map<string, string[]>;
  const CONTROL = "control.ts";
  const fileOf = (i: number) => `snippet-${String(i + 1).padStart(2, "0")}.ts`;
  const contextOf = (s: Snippet) => CONTEXTS.filter((c) => s.code.includes(c.find));

  before(async () => {
    server = await startServer();
    dir = mkdtempSync(join(tmpdir(), "ledger-ts-readme-"));
    // The temp project: the package under its name, and the frameworks and types it was tested with.
    const modules = join(dir, "node_modules");
    mkdirSync(modules);
    for (const name of readdirSync(join(PACKAGE_ROOT, "node_modules"))) {
      if (!name.startsWith(".")) symlinkSync(join(PACKAGE_ROOT, "node_modules", name), join(modules, name));
    }
    symlinkSync(PACKAGE_ROOT, join(modules, "idempotency-ledger"));
    writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "readme-snippets", private: true, type: "module" }));
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
    snippets.forEach((s, i) => {
      const [context] = contextOf(s);
      const parts = [
        `// README.md, the snippet at line ${s.line}${context?.declare ? ", after what it uses, declared" : ""}`,
        context?.declare ?? "",
        s.code,
        context?.run?.epilogue ?? "",
        // A snippet without an import or export would be a script, and top-level await needs a module.
        "export {};",
      ];
      writeFileSync(join(dir, fileOf(i)), `${parts.join("\n")}\n`);
      if (context?.run) writeFileSync(join(dir, `prelude-${i + 1}.mjs`), `${context.run.prelude}\n`);
    });
    // A control that must fail: the README's first findCredit as it was, and a name the package lacks.
    writeFileSync(
      join(dir, CONTROL),
      [
        'import { found, notFound, currentAttemptt } from "idempotency-ledger";',
        PAYMENTS,
        "const findCredit = async ({ externalRef }) => {",
        "  const credit = await payments.findCredit({ idempotencyKey: externalRef });",
        "  return credit ? found({ credit_id: credit.id }) : notFound;",
        "};",
        "export { findCredit, currentAttemptt };",
      ].join("\n"),
    );
    // One tsc run for all (its diagnostics name the file); it emits even when a snippet has errors.
    diagnostics = new Map([...snippets.map((_, i): [string, string[]] => [fileOf(i), []]), [CONTROL, []]]);
    const tsc = join(PACKAGE_ROOT, "node_modules/.bin/tsc");
    const out = await exec(tsc, ["-p", dir, "--pretty", "false"], { cwd: dir, timeout: 300_000 }).then(
      (r) => r.stdout,
      (err: { stdout?: string; message: string }) => err.stdout || err.message,
    );
    for (const line of out.split("\n").filter((l) => l.trim())) {
      const file = /^((?:snippet-\d+|control)\.ts)\(/.exec(line)?.[1];
      assert.ok(file && diagnostics.has(file), `tsc: ${line}`);
      diagnostics.get(file)!.push(line);
    }
  });
  after(async () => {
    await server?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test("the README has its snippets, and each is found by exactly one context (none is left over)", () => {
    assert.ok(snippets.length >= 9, `${snippets.length} snippets`);
    for (const s of snippets) assert.equal(contextOf(s).length, 1, `README.md line ${s.line}: ${contextOf(s).length} contexts`);
    for (const c of CONTEXTS) {
      assert.equal(snippets.filter((s) => s.code.includes(c.find)).length, 1, `the context for ${JSON.stringify(c.find)}`);
    }
    // Declared context only: declarations, never code that would do the snippet's work.
    for (const c of CONTEXTS) {
      for (const l of c.declare.split("\n").filter((x) => /^\S/.test(x))) {
        assert.match(l, /^(declare const |import type |\};$)/, l);
      }
    }
  });

  test("the harness fails a snippet that does not type-check: the README's old findCredit (TS7031), a wrong import", () => {
    assert.deepEqual(
      diagnostics.get(CONTROL)!.map((l) => /error (TS\d+)/.exec(l)?.[1]),
      ["TS2724", "TS7031"],
      diagnostics.get(CONTROL)!.join("\n"),
    );
  });

  snippets.forEach((s, i) => {
    const first = s.code.split("\n").find((l) => l.trim() && !l.startsWith("//")) ?? "";
    test(`README.md line ${s.line} compiles under --strict: ${first.slice(0, 70)}`, () => {
      assert.deepEqual(diagnostics.get(fileOf(i)), [], readFileSync(join(dir, fileOf(i)), "utf8"));
    });
    const run = contextOf(s)[0]?.run;
    if (run) {
      test(`README.md line ${s.line} runs against the server and prints what it says`, async () => {
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
