// The MCP gateway and the parts of the protocol a v2 client (`@modelcontextprotocol/client`) uses
// beyond a plain call, in front of the counted upstream (support/gateway-upstream.ts, v2 server).
// It proves: a tool that asks the user to confirm, on the session-based revision (an
// `elicitation/create` request inside the call, passed through both ways), acts once and its
// repeat replays without asking again; on 2026-07-28, a tool's `input_required` answer (the
// multi-round trip: the client answers by calling again with `inputResponses`) is not an outcome,
// so the answered call acts once; a call the client cancels after it was sent is never sent
// again; and a tool annotated readOnlyHint passes live even when the client never listed the
// tools through this gateway (the gateway asks tools/list itself).

import assert from "node:assert/strict";
import { afterEach, describe, test } from "node:test";
import { Gateway, REPLAYED, STATUS, texts } from "./support/gateway.js";

const EMAIL = { to: "ops@example.com", subject: "the weekly report" };
const TIMEOUT = { timeout: 60_000 };

describe("MCP gateway and the v2 client's protocol: elicitation, cancellation, hints", () => {
  let gateways: Gateway[] = [];
  function gateway(): Gateway {
    const gw = new Gateway();
    gateways.push(gw);
    return gw;
  }
  afterEach(async () => {
    for (const gw of gateways.splice(0)) await gw.close();
  });

  test("v2, initialize handshake: a tool that asks the user to confirm acts once, and its repeat replays without asking", TIMEOUT, async () => {
    const gw = gateway();
    const client = await gw.connect("v2, initialize handshake", { answer: { confirm: true } });
    const first = await client.call("confirm_send", EMAIL);
    assert.deepEqual(texts(first), ["sent #1 to ops@example.com: the weekly report"], gw.stderr);
    assert.equal(client.asked, 1, "the user was asked once, through the gateway");
    const repeat = await client.call("confirm_send", EMAIL);
    assert.equal(repeat._meta?.[REPLAYED], true);
    assert.equal(texts(repeat)[0], texts(first)[0]);
    assert.equal(client.asked, 1, "the repeat did not ask again");
    assert.equal(gw.effects().length, 1);
    assert.deepEqual(
      gw.calls("confirm_send").map((c) => c.arguments.answered),
      [false, true],
      "one tools/call: the SDK's handler ran again with the answer, inside it",
    );
  });

  test(
    "v2 on 2026-07-28: a tool that asks the user to confirm (input_required) acts once the user answered",
    TIMEOUT,
    async () => {
      const gw = gateway();
      const client = await gw.connect("v2 on 2026-07-28", { answer: { confirm: true } });
      assert.equal(client.era, "modern");
      const first = await client.call("confirm_send", EMAIL);
      assert.deepEqual(texts(first), ["sent #1 to ops@example.com: the weekly report"], gw.stderr);
      assert.equal(client.asked, 1);
      assert.equal(gw.effects().length, 1);
      const repeat = await client.call("confirm_send", EMAIL);
      assert.equal(repeat._meta?.[REPLAYED], true);
      assert.equal(client.asked, 1, "the repeat did not ask again");
      assert.equal(gw.effects().length, 1);
    },
  );

  for (const kind of ["v2 on 2026-07-28", "v2, initialize handshake"] as const) {
    test(`${kind}: a call the client cancels after it was sent is never sent again`, TIMEOUT, async () => {
      const gw = gateway();
      const client = await gw.connect(kind);
      const slow = { to: "ops@example.com", subject: "slow", seconds: 2 };
      const stop = new AbortController();
      const first = client.call("slow_send", slow, undefined, stop.signal);
      // Cancelled once the upstream is at work on it (the client sends notifications/cancelled).
      while (gw.calls("slow_send").length === 0) await new Promise((done) => setTimeout(done, 20));
      stop.abort(new Error("the user stopped it"));
      await assert.rejects(first, /the user stopped it/);
      // The model asks again while the first call is still at work upstream.
      const repeat = await client.call("slow_send", slow);
      assert.equal(gw.calls("slow_send").length, 1, `the repeat was not sent:\n${gw.stderr}`);
      assert.equal(gw.effects().length, 1, "the cancelled call still acted, once");
      assert.ok(
        repeat._meta?.[REPLAYED] === true || (repeat.isError && repeat._meta?.[STATUS] === "UNKNOWN"),
        `the repeat read the outcome, or was told it is unknown: ${JSON.stringify(repeat)}`,
      );
    });
  }

  test(
    "v2 on 2026-07-28: a read-only tool passes through live even when the client never listed the tools",
    TIMEOUT,
    async () => {
      const gw = gateway();
      const client = await gw.connect("v2 on 2026-07-28");
      await client.call("find_email", { subject: "x" });
      await client.call("send_email", { to: "a@example.com", subject: "x" });
      const after = await client.call("find_email", { subject: "x" });
      assert.deepEqual(after.structuredContent, { found: true }, "read live, never replayed");
      assert.equal(gw.calls("find_email").length, 2);
    },
  );
});
