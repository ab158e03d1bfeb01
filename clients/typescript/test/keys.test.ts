// Local key derivation against testdata/key-vectors.json (every case), the rules for JS values,
// and agreement with the server on every vector case that uses the default limits.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  canonicalize,
  deriveKey,
  fingerprint,
  InvalidArgumentError,
  toArgumentsJson,
  type Canonicalization,
} from "../src/index.js";
import { REPO_ROOT, startServer, type TestServer } from "./support/server.js";

interface VectorCase {
  name: string;
  run_id: string;
  tool: string;
  canonicalization: Canonicalization;
  arguments_json: string;
  limits?: { max_bytes: number; max_depth: number };
  canonical?: string;
  key?: string;
  fingerprint?: string;
  error?: string;
}

const vectors = JSON.parse(
  readFileSync(join(REPO_ROOT, "testdata/key-vectors.json"), "utf8"),
) as { limits: { max_bytes: number; max_depth: number }; cases: VectorCase[] };

const limitsOf = (c: VectorCase) =>
  c.limits ? { maxBytes: c.limits.max_bytes, maxDepth: c.limits.max_depth } : undefined;

function refusal(fn: () => unknown): InvalidArgumentError {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof InvalidArgumentError, `expected InvalidArgumentError, got ${String(err)}`);
    return err;
  }
  assert.fail("expected a refusal");
}

describe("key vectors, derived locally", () => {
  test("the file has the cases the README promises", () => {
    assert.ok(vectors.cases.length >= 100, `${vectors.cases.length} cases`);
    assert.deepEqual(vectors.limits, { max_bytes: 1_048_576, max_depth: 64 });
  });

  for (const c of vectors.cases) {
    test(c.name, () => {
      const limits = limitsOf(c);
      if (c.error) {
        const err = refusal(() => deriveKey(c.run_id, c.tool, c.arguments_json, c.canonicalization, limits));
        assert.equal(err.reason, c.error);
        assert.equal(err.field, "arguments_json");
        assert.equal(err.code, "INVALID_ARGUMENT");
        assert.equal(err.local, true);
        const fpErr = refusal(() => fingerprint(c.tool, c.arguments_json, c.canonicalization, limits));
        assert.equal(fpErr.reason, c.error);
      } else {
        assert.equal(canonicalize(c.arguments_json, c.canonicalization, limits), c.canonical);
        assert.equal(deriveKey(c.run_id, c.tool, c.arguments_json, c.canonicalization, limits), c.key);
        assert.equal(fingerprint(c.tool, c.arguments_json, c.canonicalization, limits), c.fingerprint);
      }
    });
  }
});

describe("arguments as JS values", () => {
  const compact = vectors.cases.find((c) => c.name === "compact_arguments")!;

  test("a JS object gives the same key as its JSON text, whatever the member order", () => {
    assert.equal(deriveKey("run-1", "issue_credit", { currency: "EUR", amount: 200 }), compact.key);
    assert.equal(fingerprint("issue_credit", { amount: 200, currency: "EUR" }), compact.fingerprint);
    assert.equal(toArgumentsJson({ currency: "EUR", amount: 200 }), compact.canonical);
  });

  test("members whose value is undefined are left out; toJSON is honoured", () => {
    assert.equal(deriveKey("run-1", "issue_credit", { amount: 200, currency: "EUR", memo: undefined }), compact.key);
    assert.equal(
      toArgumentsJson({ at: new Date(Date.UTC(2026, 0, 2, 3, 4, 5)) }),
      '{"at":"2026-01-02T03:04:05.000Z"}',
    );
    assert.equal(toArgumentsJson({ n: -0, big: 2n ** 60n }), '{"big":1152921504606846976,"n":0}');
    assert.equal(canonicalize({ big: 2n ** 60n }), '{"big":1152921504606847000}');
  });

  test("what JSON.stringify would silently change is refused", () => {
    for (const [value, reason] of [
      [{ n: Number.NaN }, "INVALID_JSON"],
      [{ n: Number.POSITIVE_INFINITY }, "INVALID_JSON"],
      [{ list: [1, undefined] }, "INVALID_JSON"],
      [{ f: () => 1 }, "INVALID_JSON"],
      [{ m: new Map([["a", 1]]) }, "INVALID_JSON"],
      [{ s: new Set([1]) }, "INVALID_JSON"],
      [{ b: new Uint8Array(2) }, "INVALID_JSON"],
      [{ s: "\ud800" }, "LONE_SURROGATE"],
      [{ n: 2n ** 53n + 1n }, "UNSAFE_INTEGER"], // a bigint is an integer literal: all its digits
      [[1, 2] as unknown as Record<string, unknown>, "ARGUMENTS_NOT_OBJECT"],
    ] as const) {
      const err = refusal(() => deriveKey("run-1", "t", value as Record<string, unknown>));
      assert.equal(err.reason, reason, JSON.stringify(String(value)));
    }
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    assert.equal(refusal(() => deriveKey("run-1", "t", cyclic)).reason, "INVALID_JSON");
    // 2^53 and 1e22 are held exactly, so they are accepted as numbers.
    assert.equal(canonicalize({ a: 2 ** 53, b: 1e22 }), '{"a":9007199254740992,"b":1e+22}');
  });

  test("a JS number is a double: one whose shortest spelling is an inexact integer is written with an exponent", () => {
    // JSON.stringify writes 2 ** 60 as 1152921504606847000, an integer literal the ledger refuses
    // (a double cannot hold that integer); the exponent form reads back as the same double.
    assert.equal(toArgumentsJson({ n: 2 ** 60 }), '{"n":1.152921504606847e+18}');
    const exact = vectors.cases.find((c) => c.name === "two_pow_60_is_exact_so_accepted")!;
    assert.equal(canonicalize({ n: 2 ** 60 }), exact.canonical);
    assert.equal(deriveKey(exact.run_id, exact.tool, { n: 2 ** 60 }), exact.key);
    const e23 = vectors.cases.find((c) => c.name === "number_1e23_is_a_double")!;
    assert.equal(deriveKey(e23.run_id, e23.tool, { n: 1e23 }), e23.key);
    assert.equal(toArgumentsJson({ n: -(2 ** 60), m: 2 ** 53 }), '{"m":9007199254740992,"n":-1.152921504606847e+18}');
  });

  test("run_id and tool are checked as the server checks them", () => {
    for (const [runId, tool, field] of [
      ["", "t", "run_id"],
      ["r", "", "tool"],
      ["r\n", "t", "run_id"],
      ["r", "t\u0085", "tool"],
      ["r".repeat(257), "t", "run_id"],
      ["\ud800", "t", "run_id"],
    ] as const) {
      const err = refusal(() => deriveKey(runId, tool, "{}"));
      assert.equal(err.reason, "INVALID_FIELD");
      assert.equal(err.field, field);
    }
    assert.equal(deriveKey("é".repeat(128), "t", "{}").length, 64); // 256 bytes is the limit
  });
});

describe("key vectors, against the server", () => {
  let server: TestServer;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server.stop();
  });

  test("every case with the default limits: the same key, fingerprint or refusal reason", async () => {
    const ledger = server.ledger();
    const cases = vectors.cases.filter((c) => !c.limits);
    assert.ok(cases.length > 90);
    const seen = new Set<string>();
    for (const c of cases) {
      try {
        const out = await ledger.claim({
          runId: c.run_id,
          tool: c.tool,
          args: c.arguments_json,
          canonicalization: c.canonicalization,
        });
        assert.equal(c.error, undefined, `${c.name}: the server accepted what the vectors refuse`);
        assert.equal(out.entry.key, c.key, c.name);
        assert.equal(out.entry.fingerprint, c.fingerprint, c.name);
        // Cases that share a key (same_key_as) replay or find the first attempt in flight.
        assert.equal(out.outcome, seen.has(c.key!) ? "IN_PROGRESS" : "CLAIMED", c.name);
        seen.add(c.key!);
      } catch (err) {
        if (!(err instanceof InvalidArgumentError)) throw err;
        assert.equal(err.reason, c.error, `${c.name}: ${err.message}`);
        assert.equal(err.field, "arguments_json", c.name);
        assert.equal(err.local, false);
      }
    }
  });
});
