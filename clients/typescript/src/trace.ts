// The caller's OpenTelemetry span, sent with every call as W3C `traceparent` (and `tracestate`)
// metadata, so that the ledger's spans and logs sit inside the agent's tool-call span.
// `@opentelemetry/api` is an optional peer dependency: loaded once, at the first call, if it is
// installed; without it, or without a span in the current context, nothing is sent.

import type { Interceptor } from "@connectrpc/connect";

/** The part of `@opentelemetry/api` this module uses. */
interface OtelApi {
  context: { active(): unknown };
  trace: {
    getSpanContext(context: unknown):
      | { traceId: string; spanId: string; traceFlags: number; traceState?: { serialize(): string } }
      | undefined;
    isSpanContextValid(spanContext: { traceId: string; spanId: string }): boolean;
  };
}

let api: Promise<OtelApi | undefined> | undefined;

/** `@opentelemetry/api`, or undefined when it is not installed (looked up once). */
function otel(): Promise<OtelApi | undefined> {
  api ??= import("@opentelemetry/api").then(
    (m) => (m as unknown as { default?: OtelApi }).default ?? (m as unknown as OtelApi),
    () => undefined,
  );
  return api;
}

/** The `traceparent` of the current span: `00-<trace id>-<span id>-<flags>`, or undefined. */
export async function currentTraceparent(): Promise<{ traceparent: string; tracestate?: string } | undefined> {
  const otelApi = await otel();
  if (!otelApi) return undefined;
  const span = otelApi.trace.getSpanContext(otelApi.context.active());
  if (!span || !otelApi.trace.isSpanContextValid(span)) return undefined;
  const flags = (span.traceFlags & 0xff).toString(16).padStart(2, "0");
  const tracestate = span.traceState?.serialize();
  return { traceparent: `00-${span.traceId}-${span.spanId}-${flags}`, ...(tracestate ? { tracestate } : {}) };
}

/** Adds the current span's trace context to each call. */
export const traceInterceptor: Interceptor = (next) => async (req) => {
  const trace = await currentTraceparent();
  if (trace) {
    req.header.set("traceparent", trace.traceparent);
    if (trace.tracestate) req.header.set("tracestate", trace.tracestate);
  }
  return next(req);
};
