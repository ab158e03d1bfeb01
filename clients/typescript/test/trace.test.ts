// The caller's OpenTelemetry span reaches the ledger: with the real @opentelemetry/api and
// @opentelemetry/sdk-trace-base (a BasicTracerProvider, the async-hooks context manager), every
// call made inside a span carries its traceparent, and the real server logs each call of the
// tool with that span's trace id as its trace and that span as its parent; a call made outside
// any span carries none.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import type { Ledger } from "../src/index.js";
import { currentTraceparent } from "../src/trace.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

describe("OpenTelemetry: the caller's span as traceparent", () => {
  let server: TestServer;
  let ledger: Ledger;
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const tracer = provider.getTracer("agent");
  before(async () => {
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
    trace.setGlobalTracerProvider(provider);
    // The server logs each finished call, with its trace context, at debug.
    server = await startServer({ rustLog: "info,idempotency_ledger::telemetry=debug" });
    ledger = server.ledger();
  });
  after(async () => {
    await server.stop();
    await provider.shutdown();
    context.disable();
    trace.disable();
  });

  test("outside a span nothing is sent; inside one, its trace id, span id and flags", async () => {
    assert.equal(await currentTraceparent(), undefined);
    await tracer.startActiveSpan("tool call", async (span) => {
      const { traceId, spanId } = span.spanContext();
      assert.deepEqual(await currentTraceparent(), { traceparent: `00-${traceId}-${spanId}-01` });
      span.end();
    });
  });

  test("the ledger logs the tool call's Claim and Complete inside the agent's span", async () => {
    const run = uniqueRun("otel");
    let traceId = "";
    let spanId = "";
    await tracer.startActiveSpan("issue_credit tool call", async (span) => {
      ({ traceId, spanId } = span.spanContext());
      await ledger.runOnce(run, "issue_credit", { customer: "c-1" }, () => ({ credit_id: "cr-1" }));
      span.end();
    });
    // A call outside any span: no trace of its own in the log.
    await ledger.lookup({ runId: run, tool: "issue_credit", args: { customer: "c-1" } });
    assert.equal(exporter.getFinishedSpans().at(-1)?.name, "issue_credit tool call");
    // The server writes a call's line after it answers: give the Lookup's a moment to arrive.
    for (let i = 0; i < 40 && !/rpc="?Lookup/.test(server.log()); i++) await new Promise((r) => setTimeout(r, 50));
    const finished = server
      .log()
      .split("\n")
      .filter((l) => l.includes("call finished"));
    const inSpan = finished.filter((l) => l.includes(traceId));
    assert.deepEqual(
      inSpan.map((l) => /rpc="?(\w+)/.exec(l)?.[1]).sort(),
      ["Claim", "Complete"],
      finished.join("\n"),
    );
    for (const l of inSpan) assert.match(l, new RegExp(`parent_span_id="?${spanId}`));
    const lookup = finished.filter((l) => /rpc="?Lookup/.test(l));
    assert.equal(lookup.length, 1, finished.join("\n"));
    assert.doesNotMatch(lookup[0], /trace_id=/);
  });
});
