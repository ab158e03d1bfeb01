// The MCP gateway's test harness: `idempotency-ledger mcp [FLAGS] -- UPSTREAM…` started by an
// official TypeScript MCP client over stdio, as a desktop client's server list would start it,
// in front of the counted upstream (gateway-upstream.ts) or a reference server; its ledger a
// SQLite file in a temp directory, with the upstream's call log and effects beside it.
//
// Three clients: the v2 client (`@modelcontextprotocol/client`) negotiating 2026-07-28 (its
// `server/discover` probe, then no handshake), the v2 client on the session-based handshake
// (`initialize`, its default), and the v1 client (`@modelcontextprotocol/sdk`, session-based).

import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { Client as ClientV2 } from "@modelcontextprotocol/client";
import { StdioClientTransport as StdioV2 } from "@modelcontextprotocol/client/stdio";
import { Client as ClientV1 } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport as StdioV1 } from "@modelcontextprotocol/sdk/client/stdio.js";
import { PACKAGE_ROOT, serverBinary } from "./server.js";

export const REPLAYED = "idempotency-ledger/replayed";
export const STATUS = "idempotency-ledger/status";
export const RUN = "idempotency-ledger/run";

/** Which client, on which revision. */
export type ClientKind = "v2 on 2026-07-28" | "v2, initialize handshake" | "v1, initialize handshake";
export const CLIENTS: ClientKind[] = ["v2 on 2026-07-28", "v2, initialize handshake", "v1, initialize handshake"];

/** A tool's result as both SDKs give it, read loosely. */
export interface ToolResult {
  content: Array<{ type: string; text?: string }>;
  structuredContent?: unknown;
  isError?: boolean;
  _meta?: Record<string, unknown>;
}

/** One connected client. */
export interface Session {
  /** `modern` (2026-07-28) or `legacy` (session-based), as the client negotiated it. */
  era: string;
  /** The revision it negotiated. */
  version: string | undefined;
  /** Calls a tool (with `_meta`); `signal` cancels the request (`notifications/cancelled`). */
  call(name: string, args: Record<string, unknown>, meta?: Record<string, unknown>, signal?: AbortSignal): Promise<ToolResult>;
  listTools(): Promise<string[]>;
  /**
   * Sends `tools/call` with these params as they are (v2 only), an `input_required` answer
   * handed back rather than fulfilled: what a client that writes its own messages sends.
   */
  raw(params: Record<string, unknown>): Promise<Record<string, unknown>>;
  /** How many times the server asked the user (elicitation), when the client answers them. */
  asked: number;
  close(): Promise<void>;
}

export interface ConnectOptions {
  /** The client answers the server's questions (form elicitation) with this content (v2 only). */
  answer?: Record<string, unknown>;
}

/** A command the client starts over stdio. */
export interface Command {
  command: string;
  args: string[];
  env: Record<string, string>;
}

/** The counted upstream, compiled (dist/test/support/gateway-upstream.js). */
export const COUNTED_UPSTREAM = [process.execPath, join(PACKAGE_ROOT, "dist/test/support/gateway-upstream.js")];

/** The installed entry point of a reference server's package (its package.json's bin). */
export function referenceServer(pkg: string): string[] {
  const manifest = createRequire(import.meta.url).resolve(`${pkg}/package.json`);
  const bin = JSON.parse(readFileSync(manifest, "utf8")).bin as Record<string, string>;
  return [process.execPath, join(dirname(manifest), Object.values(bin)[0]!)];
}

function inherited(): Record<string, string> {
  return Object.fromEntries(Object.entries(process.env).filter((e): e is [string, string] => e[1] !== undefined));
}

export interface GatewayOptions {
  /** More flags of `idempotency-ledger mcp`. */
  flags?: string[];
  /** The policy file's text (`--mcp-policy`). */
  policy?: string;
  /** The upstream's command (default the counted upstream). */
  upstream?: string[];
  /** More environment for the gateway and so its upstream. */
  env?: Record<string, string>;
}

export class Gateway {
  readonly dir: string;
  /** What the gateways this harness started wrote on stderr (their logs and their upstreams'). */
  stderr = "";
  private readonly sessions: Session[] = [];

  constructor(private readonly options: GatewayOptions = {}) {
    this.dir = mkdtempSync(join(tmpdir(), "ledger-gateway-"));
  }

  /** The command a client's configuration holds: the gateway, the upstream after `--`. */
  command(): Command {
    const args = ["mcp", "--database-url", `sqlite://${join(this.dir, "ledger.db")}`, ...(this.options.flags ?? [])];
    if (this.options.policy !== undefined) {
      writeFileSync(join(this.dir, "policy"), this.options.policy);
      args.push("--mcp-policy", join(this.dir, "policy"));
    }
    args.push("--", ...(this.options.upstream ?? COUNTED_UPSTREAM));
    const env = {
      ...inherited(),
      UPSTREAM_LOG: join(this.dir, "calls"),
      UPSTREAM_EFFECTS: join(this.dir, "effects"),
      RUST_LOG: process.env.RUST_LOG ?? "warn",
      NO_COLOR: "1",
      ...this.options.env,
    };
    return { command: serverBinary(), args, env };
  }

  /** A client connected to a gateway of its own (a new process, the same ledger). */
  async connect(kind: ClientKind, options: ConnectOptions = {}): Promise<Session> {
    const session = await connect(kind, this.command(), (chunk) => (this.stderr += chunk), options);
    this.sessions.push(session);
    return session;
  }

  /** Every call that reached the counted upstream (of `tool`), in order. */
  calls(tool?: string): Array<{ tool: string; arguments: Record<string, unknown>; pid: number }> {
    return jsonLines(join(this.dir, "calls")).filter((c) => tool === undefined || c.tool === tool);
  }

  /** Every email the counted upstream sent. */
  effects(): Array<{ to: string; subject: string }> {
    return jsonLines(join(this.dir, "effects"));
  }

  async close(): Promise<void> {
    for (const s of this.sessions.splice(0)) await s.close();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

function jsonLines(file: string): any[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8")
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l));
}

/** A client of `kind` that starts `cmd` over stdio; what the process writes on stderr goes to `stderr`. */
export async function connect(
  kind: ClientKind,
  cmd: Command,
  stderr: (chunk: string) => void = () => {},
  options: ConnectOptions = {},
): Promise<Session> {
  const info = { name: "gateway-tests", version: "1.0.0" };
  const params = { command: cmd.command, args: cmd.args, env: cmd.env, stderr: "pipe" as const };
  if (kind === "v1, initialize handshake") {
    if (options.answer) throw new Error("the harness answers elicitation with the v2 client only");
    const transport = new StdioV1(params);
    transport.stderr?.on("data", (c: Buffer) => stderr(c.toString()));
    const client = new ClientV1(info);
    await client.connect(transport);
    return {
      era: "legacy",
      version: "(v1's)",
      call: async (name, args, meta, signal) =>
        (await client.callTool({ name, arguments: args, _meta: meta }, undefined, { signal })) as ToolResult,
      listTools: async () => (await client.listTools()).tools.map((t) => t.name),
      raw: () => Promise.reject(new Error("the harness sends raw calls with the v2 client only")),
      asked: 0,
      close: () => client.close(),
    };
  }
  const transport = new StdioV2(params);
  transport.stderr?.on("data", (c: Buffer) => stderr(c.toString()));
  const client = new ClientV2(info, {
    versionNegotiation: { mode: kind === "v2 on 2026-07-28" ? "auto" : "legacy" },
    ...(options.answer && { capabilities: { elicitation: { form: {} } } }),
  });
  const session: Session = {
    era: "none",
    version: undefined,
    call: async (name, args, meta, signal) =>
      (await client.callTool({ name, arguments: args, _meta: meta }, { signal })) as ToolResult,
    listTools: async () => (await client.listTools()).tools.map((t) => t.name),
    raw: async (params) =>
      (await client.callTool(params as Parameters<typeof client.callTool>[0], {
        allowInputRequired: true,
      } as Parameters<typeof client.callTool>[1])) as Record<string, unknown>,
    asked: 0,
    close: () => client.close(),
  };
  const answer = options.answer;
  if (answer) {
    client.setRequestHandler("elicitation/create", async () => {
      session.asked += 1;
      return { action: "accept" as const, content: answer as Record<string, string | number | boolean | string[]> };
    });
  }
  await client.connect(transport);
  session.era = client.getProtocolEra() ?? "none";
  session.version = client.getNegotiatedProtocolVersion();
  return session;
}

/** The text blocks of a result. */
export function texts(result: ToolResult): string[] {
  return result.content.filter((c) => c.type === "text").map((c) => c.text ?? "");
}
