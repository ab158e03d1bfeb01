// The MCP gateway over stdio (`idempotency-ledger mcp -- COMMAND`), driven by the official
// TypeScript SDK's clients — v2 on the current revision (2026-07-28: a `server/discover` probe,
// no handshake), v2 and v1 on the session-based handshake — in front of an upstream written with
// the v2 server whose effects are counted (support/gateway-upstream.ts). It proves, with no line
// of ledger code in the client or the upstream: a call repeated with new ids (in the same
// session, and from a new client and gateway process) acts once and the repeat reads the stored
// result marked replayed; a run named in `_meta` is its own intent; a call whose upstream died
// before answering is unknown and never sent again; a read-only tool passes through live; eight
// concurrent identical calls act once.

import assert from "node:assert/strict";
import { afterEach, describe, test } from "node:test";
import { CLIENTS, Gateway, REPLAYED, RUN, STATUS, texts, type GatewayOptions } from "./support/gateway.js";

const EMAIL = { to: "ops@example.com", subject: "the weekly report" };
const REPLAY_NOTE = /already performed/;
const TIMEOUT = { timeout: 60_000 };

describe("MCP gateway over stdio, official TypeScript clients, counted upstream", () => {
  let gateways: Gateway[] = [];
  function gateway(options: GatewayOptions = {}): Gateway {
    const gw = new Gateway(options);
    gateways.push(gw);
    return gw;
  }
  afterEach(async () => {
    for (const gw of gateways.splice(0)) await gw.close();
  });

  for (const kind of CLIENTS) {
    test(`${kind}: a call repeated with new ids acts once, and the repeat reads the stored result`, TIMEOUT, async () => {
      const gw = gateway();
      const client = await gw.connect(kind);
      if (kind === "v2 on 2026-07-28") {
        // Through the gateway, the v2 client's probe found the upstream's 2026-07-28.
        assert.deepEqual([client.era, client.version], ["modern", "2026-07-28"]);
      } else {
        assert.equal(client.era, "legacy");
      }
      const first = await client.call("send_email", EMAIL);
      // The same call again: a new request id, as after a broken stream or a retry.
      const second = await client.call("send_email", EMAIL);
      // And from a client started anew: a new gateway process, a new session, the same ledger.
      const third = await (await gw.connect(kind)).call("send_email", EMAIL);

      assert.equal(gw.effects().length, 1, `acted once:\n${gw.stderr}`);
      assert.equal(gw.calls("send_email").length, 1);
      assert.ok(!first.isError);
      assert.deepEqual(texts(first), ["sent #1 to ops@example.com: the weekly report"]);
      assert.equal(first._meta?.[REPLAYED], undefined, "the first call acted");
      for (const repeat of [second, third]) {
        assert.ok(!repeat.isError);
        assert.equal(texts(repeat)[0], texts(first)[0], "the stored result, as the upstream gave it");
        assert.match(texts(repeat).at(-1)!, REPLAY_NOTE, "the ledger's note, last");
        assert.equal(repeat._meta?.[REPLAYED], true);
        assert.equal(repeat._meta?.[STATUS], "SUCCEEDED");
      }
    });
  }

  test("v2 on 2026-07-28: a run named in _meta is its own intent", TIMEOUT, async () => {
    const gw = gateway();
    const client = await gw.connect("v2 on 2026-07-28");
    const results = [];
    for (const run of ["run-1", "run-1", "run-2"]) results.push(await client.call("send_email", EMAIL, { [RUN]: run }));
    assert.equal(gw.effects().length, 2, "run-1 once, run-2 once");
    assert.deepEqual(
      results.map((r) => [texts(r)[0], r._meta?.[REPLAYED] ?? false]),
      [
        ["sent #1 to ops@example.com: the weekly report", false],
        ["sent #1 to ops@example.com: the weekly report", true],
        ["sent #2 to ops@example.com: the weekly report", false],
      ],
    );
  });

  for (const kind of CLIENTS) {
    test(`${kind}: a call whose upstream died before answering is unknown, and is never sent again`, TIMEOUT, async () => {
      const gw = gateway();
      const client = await gw.connect(kind);
      const lost = await client.call("send_then_die", EMAIL);
      // The client tries again (a new id); the gateway restarted the upstream meanwhile.
      const again = await client.call("send_then_die", EMAIL);
      const other = await client.call("send_email", { to: "b@example.com", subject: "another" });

      assert.equal(gw.calls("send_then_die").length, 1, `the unknown outcome was never sent again:\n${gw.stderr}`);
      assert.equal(gw.effects().length, 2, "the lost call's effect, and the other call's");
      for (const unknown of [lost, again]) {
        assert.equal(unknown.isError, true);
        assert.equal(unknown._meta?.[STATUS], "UNKNOWN");
        assert.equal(unknown._meta?.[REPLAYED], undefined);
      }
      assert.match(texts(lost)[0]!, /outcome of this action is unknown/);
      assert.match(texts(again)[0]!, /may or may not have taken effect/);
      assert.ok(!other.isError, "the restarted upstream serves the next call");
      assert.deepEqual(texts(other), ["sent #2 to b@example.com: another"]);
      assert.equal(new Set(gw.calls().map((c) => c.pid)).size, 2, "the upstream was started again");
    });
  }

  for (const kind of ["v2 on 2026-07-28", "v1, initialize handshake"] as const) {
    test(`${kind}: a tool the upstream annotates readOnlyHint passes through live`, TIMEOUT, async () => {
      const gw = gateway();
      const client = await gw.connect(kind);
      assert.ok((await client.listTools()).includes("find_email"), "the client lists the tools, as a host does");
      const before = await client.call("find_email", { subject: "x" });
      await client.call("send_email", { to: "a@example.com", subject: "x" });
      const after = await client.call("find_email", { subject: "x" });
      assert.deepEqual(before.structuredContent, { found: false });
      assert.deepEqual(after.structuredContent, { found: true }, "read live, never replayed");
      assert.equal(after._meta?.[REPLAYED], undefined);
      assert.equal(gw.calls("find_email").length, 2, "both reads reached the upstream");
    });
  }

  for (const kind of ["v2 on 2026-07-28", "v1, initialize handshake"] as const) {
    test(`${kind}: eight concurrent identical calls act once`, TIMEOUT, async () => {
      const gw = gateway();
      const client = await gw.connect(kind);
      const slow = { to: "ops@example.com", subject: "slow", seconds: 0.5 };
      const results = await Promise.all(Array.from({ length: 8 }, () => client.call("slow_send", slow)));
      assert.equal(gw.effects().length, 1, `acted once:\n${gw.stderr}`);
      assert.equal(gw.calls("slow_send").length, 1);
      assert.ok(results.every((r) => !r.isError && texts(r)[0] === "sent #1 to ops@example.com after 0.5s"));
      assert.equal(results.filter((r) => r._meta?.[REPLAYED] === true).length, 7, "the others read its result");
    });
  }
});
