// clients/parity.json is the one list of what the Python and the TypeScript clients share: the
// defaults, and the error classes with their parents and the gRPC code and ErrorInfo reason
// each one stands for. This test holds the TypeScript client to it, in both directions: every
// listed class exists under its name and extends exactly its parent, every code and reason is
// turned into that class by the client's error conversion, every error class the client
// exports is listed, the defaults (the reconciler's and who settles too) and the notes are the
// client's own, and every row of the list is in both READMEs' parity tables. (How an unknown
// outcome is settled, the list's `settlement`, is shown against the real server in
// run-once.test.ts.)

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import {
  EntryView as PbEntryView,
  ResolutionOutcome as PbResolutionOutcome,
  ResolutionResultSchema,
  WaitFor as PbWaitFor,
} from "../src/gen/idempotency/v1/ledger_pb.js";
import { COMPLETE_VIEW } from "../src/rpc.js";
import { claimOf } from "../src/run-options.js";
import { resolutionOutcomeName, resolutionResultFrom } from "../src/types.js";
import * as client from "../src/index.js";
import { MissingRunIdError } from "../src/errors.js";
import { missingRunIdResult, render } from "../src/outcome.js";
import { REPO_ROOT } from "./support/server.js";

interface ParityError {
  concept: string;
  python: string;
  typescript: string;
  parent: string | null;
  code: string | null;
  reason: string | null;
}

const parity = JSON.parse(readFileSync(join(REPO_ROOT, "clients/parity.json"), "utf8")) as {
  defaults: {
    wait_seconds: number;
    run_once_wait_for: string;
    renew_every_fraction_of_lease: number;
    canonicalization: string;
    complete_view: string;
    targets: string[];
    retry_budget_seconds: number;
    confirm_delay_seconds: number;
    settling_poll_seconds: number[];
  };
  settlement: {
    principal_order: string[];
    default_principal: { confirm: string; reconciler: string };
  } & Record<string, unknown>;
  reconciler: Record<string, number | string>;
  model_reads: Record<
    "outcome_unknown" | "not_performed" | "missing_run_id" | "awaiting_approval" | "denied",
    { status: string; note: string }
  > &
    Record<string, unknown>;
  approvals: { methods: { python: string[]; typescript: string[] } } & Record<string, unknown>;
  model_types: {
    resolution_outcome: { typescript: string; values: string[] };
    resolution_result: { typescript: string; fields: string[] };
  } & Record<string, unknown>;
  reconciler_tools: { without_confirm: { behaviour: string; python: string; typescript: string } } & Record<string, unknown>;
  confirm: { answers: Record<string, { python: string; typescript: string }> };
  errors: ParityError[];
};

const byConcept = new Map(parity.errors.map((e) => [e.concept, e]));
const exported = client as unknown as Record<string, unknown>;

function classNamed(name: string): Function {
  const cls = exported[name];
  assert.equal(typeof cls, "function", `the client exports no class ${name}`);
  return cls as Function;
}

const CODES: Record<string, Code> = {
  CANCELLED: Code.Canceled,
  UNKNOWN: Code.Unknown,
  INVALID_ARGUMENT: Code.InvalidArgument,
  DEADLINE_EXCEEDED: Code.DeadlineExceeded,
  NOT_FOUND: Code.NotFound,
  ALREADY_EXISTS: Code.AlreadyExists,
  PERMISSION_DENIED: Code.PermissionDenied,
  RESOURCE_EXHAUSTED: Code.ResourceExhausted,
  FAILED_PRECONDITION: Code.FailedPrecondition,
  ABORTED: Code.Aborted,
  OUT_OF_RANGE: Code.OutOfRange,
  UNIMPLEMENTED: Code.Unimplemented,
  INTERNAL: Code.Internal,
  UNAVAILABLE: Code.Unavailable,
  DATA_LOSS: Code.DataLoss,
  UNAUTHENTICATED: Code.Unauthenticated,
};

/** What the client makes of an answer with this code and (optionally) an ErrorInfo reason. */
function converted(code: string, reason: string | null): client.LedgerError {
  const details = reason
    ? [{ desc: ErrorInfoSchema, value: create(ErrorInfoSchema, { reason, domain: client.ERROR_DOMAIN }) }]
    : [];
  const answer = new ConnectError(`a ${code} answer`, CODES[code], undefined, details);
  return client.toLedgerError(answer);
}

describe("parity.json: error classes", () => {
  test("the list is well formed: unique names, known parents, one base", () => {
    assert.equal(byConcept.size, parity.errors.length, "concepts are unique");
    assert.equal(new Set(parity.errors.map((e) => e.typescript)).size, parity.errors.length);
    assert.deepEqual(
      parity.errors.filter((e) => e.parent === null).map((e) => e.typescript),
      ["LedgerError"],
    );
    for (const e of parity.errors) {
      if (e.parent !== null) assert.ok(byConcept.has(e.parent), `${e.concept}: unknown parent ${e.parent}`);
      if (e.code !== null) assert.ok(e.code in CODES, `${e.concept}: unknown code ${e.code}`);
    }
  });

  for (const e of parity.errors) {
    const parent = e.parent === null ? null : byConcept.get(e.parent)!;
    test(`${e.typescript} extends ${parent?.typescript ?? "Error"} (the prototype chain)`, () => {
      const cls = classNamed(e.typescript);
      assert.equal(cls.name, e.typescript);
      const expected = parent === null ? Error : classNamed(parent.typescript);
      assert.equal(Object.getPrototypeOf(cls.prototype), expected.prototype, "the direct parent");
      assert.equal(Object.getPrototypeOf(cls), expected, "static side too");
      assert.ok(cls === client.LedgerError || cls.prototype instanceof client.LedgerError);
    });

    if (e.code !== null) {
      test(`${e.code}${e.reason ? ` / ${e.reason}` : ""} converts to ${e.typescript}`, () => {
        const err = converted(e.code!, e.reason);
        assert.equal(Object.getPrototypeOf(err), classNamed(e.typescript).prototype, err.name);
        assert.equal(err.name, e.typescript);
        assert.equal(err.code, e.code);
        assert.equal(err.reason, e.reason ?? "");
        assert.ok(err instanceof client.LedgerError);
        // The code and reason are fields; the message is the server's text alone.
        assert.equal(err.message, `a ${e.code} answer`);
        if (e.reason === null) {
          // A class that stands for its code takes any reason that names no subclass.
          const other = converted(e.code!, "SOME_OTHER_REASON");
          assert.equal(Object.getPrototypeOf(other), classNamed(e.typescript).prototype);
        }
      });
    }
  }

  test("a reason names its subclass only under its own code", () => {
    for (const e of parity.errors.filter((x) => x.reason !== null && x.code !== null)) {
      const elsewhere = e.code === "INTERNAL" ? "UNAVAILABLE" : "INTERNAL";
      const err = converted(elsewhere, e.reason);
      const expected = parity.errors.find((x) => x.code === elsewhere && x.reason === null)!;
      assert.equal(err.name, expected.typescript, `${e.reason} under ${elsewhere}`);
    }
  });

  test("every error class the client exports is in the list", () => {
    const listed = new Set(parity.errors.map((e) => e.typescript));
    const classes = Object.entries(exported)
      .filter(([, v]) => typeof v === "function" && (v === client.LedgerError || (v as Function).prototype instanceof client.LedgerError))
      .map(([k]) => k);
    assert.ok(classes.length >= parity.errors.length);
    assert.deepEqual(classes.filter((k) => !listed.has(k)), []);
  });

  test("codes the list does not name (CANCELLED, UNKNOWN, …) are LedgerErrors with their code", () => {
    const named = new Set(parity.errors.map((e) => e.code).filter((c) => c !== null));
    for (const code of Object.keys(CODES).filter((c) => !named.has(c))) {
      const err = converted(code, null);
      assert.equal(Object.getPrototypeOf(err), client.LedgerError.prototype, code);
      assert.equal(err.code, code);
    }
  });
});

describe("parity.json: defaults", () => {
  const d = parity.defaults;

  test("wait for a duplicate in flight", () => {
    assert.equal(client.DEFAULT_WAIT_MS, d.wait_seconds * 1000);
    assert.equal(client.DEFAULTS.waitMs, d.wait_seconds * 1000);
  });

  test("runOnce's wait is for an attempt in flight only: the Claim it sends says so", () => {
    assert.equal(`WAIT_FOR_${client.RUN_ONCE_WAIT_FOR}`, d.run_once_wait_for);
    assert.equal(client.DEFAULTS.runOnceWaitFor, client.RUN_ONCE_WAIT_FOR);
    assert.ok(client.RUN_ONCE_WAIT_FOR in PbWaitFor, "a value of the proto's WaitFor");
    const claim = claimOf("run", "t", { a: 1 }, {}, 10_000);
    assert.equal(claim.waitFor, client.RUN_ONCE_WAIT_FOR);
  });

  test("renew the lease every fraction of it", () => {
    assert.equal(client.RENEW_EVERY_FRACTION_OF_LEASE, d.renew_every_fraction_of_lease);
    assert.equal(client.DEFAULTS.renewEveryFractionOfLease, d.renew_every_fraction_of_lease);
  });

  test("canonicalization", () => {
    assert.equal(`CANONICALIZATION_${client.DEFAULT_CANONICALIZATION}`, d.canonicalization);
    // Unset, a key is derived as with the default.
    const args = { amount: 200, currency: "EUR" };
    assert.equal(
      client.deriveKey("run-1", "t", args),
      client.deriveKey("run-1", "t", args, client.DEFAULT_CANONICALIZATION),
    );
  });

  test("every Complete asks for the view of the list", () => {
    assert.equal(`ENTRY_VIEW_${PbEntryView[COMPLETE_VIEW]}`, d.complete_view);
  });

  test("the address forms are the client's, and each is accepted", () => {
    assert.deepEqual([...client.ADDRESS_FORMS], d.targets);
    const concrete = (form: string) => form.replace("host", "ledger.internal").replace("port", "50051");
    assert.equal(client.ledgerUrl(concrete(d.targets[0]), false).href, "http://ledger.internal:50051/");
    assert.equal(client.ledgerUrl(concrete(d.targets[0]), true).href, "https://ledger.internal:50051/");
    for (const form of d.targets.slice(1)) {
      assert.equal(client.ledgerUrl(concrete(form), false).href, `${concrete(form)}/`);
      assert.doesNotThrow(() => new client.Ledger({ address: concrete(form) }).close());
    }
  });

  test("other addresses are refused with a clear error", () => {
    for (const bad of ["ledger.internal", "grpc://ledger:1", "http://ledger:1/api", "ledger:0", "ledger:70000", ""]) {
      assert.throws(
        () => client.ledgerUrl(bad, false),
        (err: unknown) =>
          err instanceof client.InvalidArgumentError &&
          err.field === "address" &&
          err.local &&
          err.message.includes("host:port"),
        bad,
      );
    }
    assert.throws(
      () => new client.Ledger({ address: "http://ledger:1", tls: true }),
      /TLS options were given for an http:\/\/ address/,
    );
  });
});

describe("parity.json: what the model reads, and the paired read", () => {
  test("an unknown outcome reads the ledger's note; one the paired read found did not happen reads not_performed", () => {
    assert.deepEqual(parity.model_reads.outcome_unknown, { status: "outcome_unknown", note: client.UNKNOWN_NOTE });
    assert.deepEqual(parity.model_reads.not_performed, { status: "not_executed", note: client.NOT_PERFORMED_NOTE });
  });

  test("the retry budget on UNAVAILABLE is the clients'", () => {
    assert.equal(client.DEFAULT_RETRY_BUDGET_MS, parity.defaults.retry_budget_seconds * 1000);
    assert.equal(client.DEFAULTS.retryBudgetMs, parity.defaults.retry_budget_seconds * 1000);
    const ledger = new client.Ledger({ address: "127.0.0.1:1" });
    assert.equal(ledger.retryBudgetMs, parity.defaults.retry_budget_seconds * 1000);
    ledger.close();
  });

  test("the confirm delay is the clients'", () => {
    assert.equal(client.DEFAULT_CONFIRM_DELAY_MS, parity.defaults.confirm_delay_seconds * 1000);
    assert.equal(client.DEFAULTS.confirmDelayMs, parity.defaults.confirm_delay_seconds * 1000);
    const ledger = new client.Ledger({ address: "127.0.0.1:1" });
    assert.equal(ledger.confirmDelayMs, parity.defaults.confirm_delay_seconds * 1000);
    ledger.close();
  });

  test("a repeat looks up an entry someone else is settling as the clients do", () => {
    assert.deepEqual(
      [...client.SETTLING_POLL_MS],
      parity.defaults.settling_poll_seconds.map((s) => s * 1000),
    );
  });

  test("who settles by default is the clients'", () => {
    const here = (template: string) => template.replace("{host}", hostname()).replace("{pid}", String(process.pid));
    assert.equal(client.defaultPrincipal("confirm"), here(parity.settlement.default_principal.confirm));
    assert.deepEqual(parity.settlement.principal_order, ["call", "client", "default"]);
    const ledger = new client.Ledger({ address: "127.0.0.1:1" });
    const tools = [{ name: "t", confirm: () => client.cannotTell }];
    const reconciler = here(parity.settlement.default_principal.reconciler);
    assert.equal(new client.Reconciler(ledger, tools).principal, reconciler);
    assert.equal(new client.Reconciler(ledger, tools, { principal: "" }).principal, reconciler);
    assert.equal(new client.Reconciler(ledger, tools, { principal: "night-shift" }).principal, "night-shift");
    ledger.close();
  });

  test("the reconciler's defaults are the clients'", () => {
    const r = parity.reconciler;
    const names: Record<string, [keyof typeof client.RECONCILER_DEFAULTS, number]> = {
      older_than_seconds: ["olderThanMs", 1000],
      batch: ["limit", 1],
      interval_seconds: ["intervalMs", 1000],
      rate_per_second: ["maxConfirmsPerSecond", 1],
      backoff_seconds: ["backoffMs", 1000],
      max_backoff_seconds: ["maxBackoffMs", 1000],
    };
    assert.deepEqual(Object.keys(r).filter((k) => k !== "about").sort(), Object.keys(names).sort());
    for (const [key, [option, scale]] of Object.entries(names)) {
      assert.equal(client.RECONCILER_DEFAULTS[option], (r[key] as number) * scale, key);
    }
  });

  test("a gated call reads awaiting_approval and a declined one denied, each with the server's note", () => {
    const entry = { key: "k", fingerprint: "f" } as client.LedgerEntry;
    const cases: Array<["awaiting_approval" | "denied", client.LedgerError]> = [
      ["awaiting_approval", new client.AwaitingApprovalError("A person has been asked (server's words).", entry)],
      ["denied", new client.DeniedError("A person declined this: no (server's words).", entry)],
    ];
    for (const [row, error] of cases) {
      const expected = parity.model_reads[row];
      assert.equal(expected.note, "the server's note (ClaimResponse.note)");
      const out = render({ kind: "thrown", error, actionRan: false });
      assert.equal(out.outcome, expected.status);
      assert.equal(out.toModelText(), (error as client.AwaitingApprovalError).note, "the server's note, as is");
      assert.equal(out.toJSON().outcome, expected.status);
    }
  });

  test("the approval methods are the Ledger's, under the list's names", () => {
    assert.deepEqual(parity.approvals.methods.typescript, ["decide", "extendRun", "watchApprovals"]);
    for (const name of parity.approvals.methods.typescript) {
      assert.equal(typeof (client.Ledger.prototype as unknown as Record<string, unknown>)[name], "function", name);
    }
    // watchApprovals is an async iterator (resumable from the last event's cursor).
    const ledger = new client.Ledger({ address: "127.0.0.1:1" });
    const events = ledger.watchApprovals({ cursor: "c" });
    assert.equal(typeof events[Symbol.asyncIterator], "function");
    ledger.close();
  });

  test("a call without a run id reads the list's note", () => {
    const expected = parity.model_reads.missing_run_id;
    const out = missingRunIdResult(new MissingRunIdError("issue_credit", "pass experimental_context: { runId }"));
    assert.equal(out.outcome, expected.status);
    assert.equal(out.toModelText(), expected.note.replace("{tool}", "issue_credit"));
  });

  test("every row of the list is documented in both READMEs' parity tables", () => {
    const p = parity as unknown as Record<string, Record<string, unknown>>;
    const rows = [
      ...Object.keys(p.defaults).map((k) => `defaults.${k}`),
      ...["settlement", "reconciler", "reconciler_tools", "model_reads", "model_types", "confirm", "approvals"].flatMap((section) =>
        Object.keys(p[section]).filter((k) => k !== "about").map((k) => `${section}.${k}`),
      ),
      "errors",
    ];
    assert.ok(rows.includes("confirm.answers") && rows.includes("reconciler_tools.without_confirm"));
    assert.ok(rows.includes("approvals.methods") && rows.includes("model_reads.denied"));
    for (const readme of ["python", "typescript"]) {
      const lines = readFileSync(join(REPO_ROOT, "clients", readme, "README.md"), "utf8")
        .split("\n")
        .filter((l) => l.startsWith("| `"));
      const missing = rows.filter((row) => !lines.some((l) => l.includes(`| \`${row}\``)));
      assert.deepEqual(missing, [], `clients/${readme}/README.md has no parity row for ${missing.join(", ")}`);
    }
  });

  test("a tool without a paired read handed to a Reconciler is refused at construction with the list's error, naming the tool", () => {
    const row = parity.reconciler_tools.without_confirm;
    assert.equal(row.behaviour, "refused_at_construction");
    assert.equal(row.typescript, "TypeError");
    const ledger = new client.Ledger({ address: "127.0.0.1:1" });
    try {
      ledger.register({ name: "open_ticket" });
      for (const tools of [["open_ticket"], [{ name: "open_ticket" }], [{ name: "issue_credit", confirm: () => client.notFound }, "open_ticket"]]) {
        assert.throws(
          () => new client.Reconciler(ledger, tools),
          (err: unknown) =>
            err instanceof Error &&
            err.constructor.name === row.typescript &&
            err.message.includes("the tool open_ticket has no paired read") &&
            /Register the tool with confirm/.test(err.message),
          JSON.stringify(tools),
        );
      }
    } finally {
      ledger.close();
    }
  });

  test("the model types of Reconcile's answers: every outcome of the proto by the list's name, and the result's fields", () => {
    const { resolution_outcome: outcome, resolution_result: result } = parity.model_types;
    assert.deepEqual([outcome.typescript, result.typescript], ["ResolutionOutcome", "ResolutionResult"]);
    // Each value of the generated enum converts to the list's name, and the list names no other.
    const numbers = Object.values(PbResolutionOutcome).filter((v): v is number => typeof v === "number");
    assert.deepEqual(numbers.map((n) => resolutionOutcomeName(n)), outcome.values);
    // The exported types (checked by the compiler): the list's names, with the list's fields.
    const answer: client.ResolutionResult = { key: "k", result: "STALE" satisfies client.ResolutionOutcome, entry: undefined, note: "" };
    assert.deepEqual(Object.keys(answer), result.fields);
    assert.deepEqual(
      Object.keys(resolutionResultFrom(create(ResolutionResultSchema, { key: "k", result: PbResolutionOutcome.RESOLUTION_NOT_FOUND }))),
      result.fields,
    );
  });

  test("confirm's answers exist under their TypeScript names, each of its kind", () => {
    const kinds: Record<string, string> = {};
    for (const [kind, names] of Object.entries(parity.confirm.answers)) {
      const name = names.typescript.split("(")[0];
      const value = exported[name];
      const answer = typeof value === "function" ? (value as (r: unknown) => unknown)({ id: 1 }) : value;
      kinds[kind] = (answer as { kind: string }).kind;
    }
    assert.deepEqual(kinds, { found: "found", not_found: "not_found", cannot_tell: "cannot_tell" });
  });
});
