// The MCP gateway in front of the reference servers, unchanged (`@modelcontextprotocol/server-memory`
// and `@modelcontextprotocol/server-filesystem`, SDK 1.x, session-based), started by the gateway
// from their installed entry points, driven by the official v2 client (whose 2026-07-28 probe
// falls back to the handshake through the gateway). Each story runs twice, through the gateway
// and straight to the server, so the test tells the two apart. It proves: a repeated side effect
// acts once through the gateway and its repeat replays the first result, where the same repeat
// straight to the server acts again (a retracted memory observation comes back; an appended line
// is appended twice; a move's repeat fails); the servers' reads (read_graph, read_text_file,
// list_directory, annotated readOnlyHint) pass through live.

import assert from "node:assert/strict";
import { appendFileSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, test } from "node:test";
import { Gateway, REPLAYED, connect, referenceServer, texts, type Command, type Session } from "./support/gateway.js";

const TIMEOUT = { timeout: 60_000 };
const CLIENT = "v2 on 2026-07-28";

describe("MCP gateway in front of the reference servers (memory, filesystem)", () => {
  let gateways: Gateway[] = [];
  let direct: Session[] = [];
  let dirs: string[] = [];
  afterEach(async () => {
    for (const s of direct.splice(0)) await s.close();
    for (const gw of gateways.splice(0)) await gw.close();
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });

  /**
   * The same server twice, each with files of its own (`setup` makes them in a directory and
   * says the server's arguments and environment): through a gateway, and straight.
   */
  async function both(server: string[], setup: (dir: string) => { args: string[]; env: Record<string, string> }) {
    const files = realpathSync(mkdtempSync(join(tmpdir(), "ledger-reference-")));
    dirs.push(files);
    const [viaDir, straightDir] = [join(files, "via-gateway"), join(files, "straight")];
    mkdirSync(viaDir);
    mkdirSync(straightDir);
    const viaGateway = setup(viaDir);
    const straight = setup(straightDir);
    const gateway = new Gateway({ upstream: [...server, ...viaGateway.args], env: viaGateway.env });
    gateways.push(gateway);
    const through = await gateway.connect(CLIENT);
    const cmd: Command = { command: server[0]!, args: [...server.slice(1), ...straight.args], env: { ...straight.env } };
    const alone = await connect(CLIENT, cmd);
    direct.push(alone);
    return { gateway, through, alone, viaDir, straightDir };
  }

  test("memory server: a repeated add_observations acts once; straight to the server, its retry re-adds what was retracted", TIMEOUT, async () => {
    const memory = referenceServer("@modelcontextprotocol/server-memory");
    const { gateway, through, alone } = await both(memory, (dir) => ({
      args: [],
      env: { MEMORY_FILE_PATH: join(dir, "memory.jsonl") },
    }));
    assert.equal(through.era, "legacy", "the v2 client fell back to the handshake of the SDK 1.x server, through the gateway");

    const add = { observations: [{ entityName: "alice", contents: ["prefers email"] }] };
    const observations = async (client: Session) => {
      const graph = (await client.call("read_graph", {})) as { structuredContent?: any; _meta?: Record<string, unknown> };
      assert.equal(graph._meta?.[REPLAYED], undefined, "read_graph is read live");
      return graph.structuredContent.entities.find((e: any) => e.name === "alice").observations as string[];
    };
    /** The agent's story: the observation added, the call repeated; the user retracts it; the model re-issues the call from its history. */
    async function story(client: Session) {
      assert.ok((await client.listTools()).includes("read_graph"));
      await client.call("create_entities", { entities: [{ name: "alice", entityType: "person", observations: [] }] });
      const first = await client.call("add_observations", add);
      const repeat = await client.call("add_observations", add);
      const afterRepeat = await observations(client);
      await client.call("delete_observations", { deletions: [{ entityName: "alice", observations: ["prefers email"] }] });
      const retry = await client.call("add_observations", add);
      return { first, repeat, afterRepeat, retry, afterRetry: await observations(client) };
    }

    const via = await story(through);
    const added = { results: [{ entityName: "alice", addedObservations: ["prefers email"] }] };
    assert.deepEqual(via.first.structuredContent, added);
    assert.ok(!via.first.isError);
    for (const replay of [via.repeat, via.retry]) {
      assert.equal(replay._meta?.[REPLAYED], true, `the repeat was not sent:\n${gateway.stderr}`);
      assert.deepEqual(replay.structuredContent, added, "the first result, replayed");
      assert.match(texts(replay).at(-1)!, /already performed/);
    }
    assert.deepEqual(via.afterRepeat, ["prefers email"], "the effect, once");
    assert.deepEqual(via.afterRetry, [], "the retraction stands: the retry did not act again");

    const straight = await story(alone);
    assert.deepEqual(straight.first.structuredContent, added);
    assert.deepEqual(
      straight.repeat.structuredContent,
      { results: [{ entityName: "alice", addedObservations: [] }] },
      "straight to the server, the repeat acted again (and found nothing new to add)",
    );
    assert.deepEqual(straight.afterRepeat, ["prefers email"]);
    assert.deepEqual(straight.afterRetry, ["prefers email"], "straight to the server, the retry re-added what was retracted");
  });

  test("filesystem server: a repeated edit_file or move_file acts once and replays its result; straight to the server it appends twice, and the move's repeat fails", TIMEOUT, async () => {
    const fsServer = referenceServer("@modelcontextprotocol/server-filesystem");
    const { gateway, through, alone, viaDir, straightDir } = await both(fsServer, (root) => {
      writeFileSync(join(root, "notes.md"), "# Release log\n");
      writeFileSync(join(root, "draft.txt"), "draft\n");
      mkdirSync(join(root, "archive"));
      return { args: [root], env: {} };
    });

    async function story(client: Session, root: string) {
      assert.ok((await client.listTools()).includes("read_text_file"));
      const notes = join(root, "notes.md");
      const edit = { path: notes, edits: [{ oldText: "# Release log", newText: "# Release log\n- shipped v1.2" }] };
      const firstEdit = await client.call("edit_file", edit);
      const repeatEdit = await client.call("edit_file", edit);
      // Someone else changes the file: a read sees it.
      appendFileSync(notes, "- (edited by hand)\n");
      const read = await client.call("read_text_file", { path: notes });
      const move = { source: join(root, "draft.txt"), destination: join(root, "archive", "draft.txt") };
      const listedBefore = await client.call("list_directory", { path: join(root, "archive") });
      const firstMove = await client.call("move_file", move);
      const repeatMove = await client.call("move_file", move);
      const listedAfter = await client.call("list_directory", { path: join(root, "archive") });
      return { firstEdit, repeatEdit, read, firstMove, repeatMove, listedBefore, listedAfter, notes: readFileSync(notes, "utf8") };
    }

    const via = await story(through, viaDir);
    const shipped = (text: string) => text.split("\n").filter((l) => l === "- shipped v1.2").length;
    assert.equal(shipped(via.notes), 1, `the line appended once:\n${via.notes}\n${gateway.stderr}`);
    assert.ok(!via.firstEdit.isError);
    assert.equal(via.repeatEdit._meta?.[REPLAYED], true);
    assert.equal(texts(via.repeatEdit)[0], texts(via.firstEdit)[0], "the first edit's diff, replayed");
    assert.match(texts(via.read)[0]!, /- \(edited by hand\)/, "read_text_file is read live");
    assert.equal(via.read._meta?.[REPLAYED], undefined);
    assert.ok(!via.firstMove.isError && !via.repeatMove.isError, texts(via.repeatMove).join("\n"));
    assert.equal(via.repeatMove._meta?.[REPLAYED], true);
    assert.equal(texts(via.repeatMove)[0], texts(via.firstMove)[0], "the first move's answer, replayed");
    assert.equal(texts(via.listedBefore)[0], "", "list_directory: nothing archived yet");
    assert.equal(texts(via.listedAfter)[0], "[FILE] draft.txt", "list_directory is read live");

    const straight = await story(alone, straightDir);
    assert.equal(shipped(straight.notes), 2, `straight to the server, the repeat appended again:\n${straight.notes}`);
    assert.ok(!straight.firstMove.isError);
    assert.equal(straight.repeatMove.isError, true, "straight to the server, the repeated move fails (its source is gone)");
  });
});
