// The MCP gateway asks the person at the client about a gated call (`--approvals-at-client`),
// on 2026-07-28's input-required round trip, in front of the counted upstream: the official v2
// client shows the gateway's form (its elicitation handler stands for the person) and calls
// again with the answer. It proves: an approved call acts once, and its repeat replays without
// asking; a denied one never acts; and a "yes" the gateway did not ask for (none asked, a
// changed seal, another call's question, an earlier request's answer kept for a new intent)
// decides nothing and nothing is sent: the person is asked again.

import assert from "node:assert/strict";
import { afterEach, describe, test } from "node:test";
import { Gateway, REPLAYED, RUN, STATUS, texts, type ToolResult } from "./support/gateway.js";

const EMAIL = { to: "ops@example.com", subject: "the quarterly numbers" };
const OTHER = { to: "all@example.com", subject: "the quarterly numbers" };
const APPROVAL = "idempotency-ledger/approval";
const TIMEOUT = { timeout: 60_000 };
const YES = { action: "accept", content: { approve: true, reason: "forged" } };

describe("MCP gateway: a gated call decided by the person at the client", () => {
  let gateways: Gateway[] = [];
  function gateway(): Gateway {
    const gw = new Gateway({
      flags: ["--approvals-at-client"],
      policy: "send_email gate\n",
      env: { RUST_LOG: "info" },
    });
    gateways.push(gw);
    return gw;
  }
  afterEach(async () => {
    for (const gw of gateways.splice(0)) await gw.close();
  });

  test("approved at the client: the call acts once, the decision is recorded as the person's, and the repeat replays without asking", TIMEOUT, async () => {
    const gw = gateway();
    const client = await gw.connect("v2 on 2026-07-28", { answer: { approve: true, reason: "numbers checked" } });
    const first = await client.call("send_email", EMAIL);
    assert.deepEqual(texts(first), ["sent #1 to ops@example.com: the quarterly numbers"], gw.stderr);
    assert.equal(client.asked, 1, "the person was asked once");
    assert.match(gw.stderr, /a person decided about a call.*principal=person at mcp:gateway-tests outcome="approved"/);
    const repeat = await client.call("send_email", EMAIL);
    assert.equal(repeat._meta?.[REPLAYED], true, gw.stderr);
    assert.equal(texts(repeat)[0], texts(first)[0]);
    assert.equal(client.asked, 1, "the repeat did not ask again");
    assert.equal(gw.effects().length, 1, "one email");
    assert.equal(gw.calls("send_email").length, 1);
    // A log line per call, with its answer.
    for (const answer of ["acted", "replayed"]) {
      assert.match(gw.stderr, new RegExp(`a tools/call answered tool="counted-upstream/send_email" answer="${answer}"`));
    }
  });

  test("denied at the client: the call never acts, and its repeat is told so without asking", TIMEOUT, async () => {
    const gw = gateway();
    const client = await gw.connect("v2 on 2026-07-28", { answer: { approve: false, reason: "wrong list" } });
    const denied = await client.call("send_email", EMAIL);
    assert.equal(denied.isError, true, JSON.stringify(denied));
    assert.equal(denied._meta?.[STATUS], "DENIED", gw.stderr);
    assert.match(texts(denied).join("\n"), /wrong list/, "the person's reason reaches the model");
    const repeat = await client.call("send_email", EMAIL);
    assert.equal(repeat._meta?.[STATUS], "DENIED");
    assert.equal(client.asked, 1, "asked once");
    assert.equal(gw.calls("send_email").length, 0, "nothing reached the upstream");
  });

  test("a yes the gateway did not ask for never acts: none asked, a changed seal, another call's question, an earlier request's answer", TIMEOUT, async () => {
    const gw = gateway();
    // A client that can be asked (it declares the form capability) but writes its own answers.
    const client = await gw.connect("v2 on 2026-07-28", { answer: { approve: true } });
    const asksAgain = (answer: Record<string, unknown>, why: string, sentBefore = 0) => {
      assert.equal(answer.resultType, "input_required", `${why}: ${JSON.stringify(answer)}\n${gw.stderr}`);
      assert.equal(gw.calls("send_email").length, sentBefore, `${why}: nothing was sent`);
    };
    const yes = (args: Record<string, unknown>, state?: unknown, meta?: Record<string, unknown>) =>
      client.raw({
        name: "send_email",
        arguments: args,
        inputResponses: { [APPROVAL]: YES },
        ...(state !== undefined && { requestState: state }),
        ...(meta && { _meta: meta }),
      });

    asksAgain(await yes(EMAIL), "a yes with no question");
    const question = await client.raw({ name: "send_email", arguments: EMAIL });
    asksAgain(question, "the question");
    const state = question.requestState as string;
    const inputs = question.inputRequests as Record<string, { method: string; params: { message: string } }>;
    assert.equal(inputs[APPROVAL]?.method, "elicitation/create");
    assert.match(inputs[APPROVAL]!.params.message, /ops@example\.com/, "the person is shown the arguments");
    const flipped = state.slice(0, -2) + (state.endsWith("AA") ? "BB" : "AA");
    asksAgain(await yes(EMAIL, flipped), "a changed seal");
    const otherQuestion = await client.raw({ name: "send_email", arguments: OTHER });
    asksAgain(await yes(EMAIL, otherQuestion.requestState), "another call's question");
    asksAgain(await yes(EMAIL, "idempotency-ledger.approval.e30.AAAA"), "a made-up question");

    // The person's real answer to this very question acts, once.
    const acted = (await yes(EMAIL, state)) as unknown as ToolResult;
    assert.deepEqual(texts(acted), ["sent #1 to ops@example.com: the quarterly numbers"], gw.stderr);
    // That answer kept and sent again for a new intent (another run) decides nothing there.
    asksAgain(await yes(EMAIL, state, { [RUN]: "run-2" }), "an earlier request's answer", 1);
    assert.equal(gw.effects().length, 1, "one email in all");
  });
});
