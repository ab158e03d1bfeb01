// A throwaway PostgreSQL cluster for the failover tests: initdb into a temp dir, pg_ctl start on
// a free port, stopped and deleted afterwards. PostgreSQL refuses to run as root, and CI runs
// as root: then every command runs as the `postgres` OS user (runuser). The binaries are
// Debian's PostgreSQL 15 (PG_BIN overrides the directory).

import { execFile, spawnSync } from "node:child_process";
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);
const BIN = process.env.PG_BIN ?? "/usr/lib/postgresql/15/bin";
const asRoot = process.getuid?.() === 0;

/** Why the tests of a real PostgreSQL cannot run here, or undefined when they can. */
export function postgresMissing(): string | undefined {
  if (!existsSync(join(BIN, "initdb"))) return `no PostgreSQL binaries in ${BIN} (set PG_BIN)`;
  if (asRoot && spawnSync("id", ["-u", "postgres"]).status !== 0) return "running as root without a postgres OS user";
  return undefined;
}

function command(bin: string, args: string[]): [string, string[]] {
  const path = join(BIN, bin);
  return asRoot ? ["runuser", ["-u", "postgres", "--", path, ...args]] : [path, args];
}

async function pg(bin: string, args: string[]): Promise<string> {
  const [cmd, argv] = command(bin, args);
  try {
    const { stdout } = await run(cmd, argv, { timeout: 90_000 });
    return stdout;
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`${bin} ${args.join(" ")} failed: ${e.stderr || e.message}`);
  }
}

/** A free TCP port on loopback (picked by binding port 0). */
export async function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => done(port));
    });
  });
}

export interface PgCluster {
  /** `postgres://postgres@127.0.0.1:PORT/postgres` */
  url: string;
  port: number;
  /** Kills the server without a checkpoint (`pg_ctl stop -m immediate`), like a crash. */
  crash(): Promise<void>;
  start(): Promise<void>;
  /** Stops the server and deletes its directory. */
  destroy(): Promise<void>;
}

const live = new Set<string>();
process.on("exit", () => {
  for (const data of live) {
    const [cmd, argv] = command("pg_ctl", ["-D", data, "-m", "immediate", "-w", "stop"]);
    spawnSync(cmd, argv, { stdio: "ignore" });
  }
});

/** initdb, then pg_ctl start, on a free port; trust authentication on loopback only. */
export async function startPostgres(): Promise<PgCluster> {
  const dir = mkdtempSync(join(tmpdir(), "ledger-ts-pg-"));
  const data = join(dir, "data");
  const sockets = join(dir, "sockets");
  mkdirSync(data);
  mkdirSync(sockets);
  if (asRoot) {
    const { uid, gid } = pgIds();
    for (const d of [dir, data, sockets]) chownSync(d, uid, gid);
  }
  chmodSync(data, 0o700);
  await pg("initdb", ["-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]);
  const port = await freePort();
  writeFileSync(
    join(data, "postgresql.auto.conf"),
    `listen_addresses = '127.0.0.1'\nport = ${port}\nunix_socket_directories = '${sockets}'\n` +
      `fsync = off\nfull_page_writes = off\nmax_connections = 100\nshared_buffers = 16MB\n`,
  );
  if (asRoot) {
    const { uid, gid } = pgIds();
    chownSync(join(data, "postgresql.auto.conf"), uid, gid);
  }
  const log = join(dir, "postgres.log");
  const start = () => pg("pg_ctl", ["-D", data, "-l", log, "-w", "-t", "60", "start"]).then(() => {});
  await start();
  live.add(data);
  return {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    port,
    crash: () => pg("pg_ctl", ["-D", data, "-m", "immediate", "-w", "-t", "60", "stop"]).then(() => {}),
    start,
    async destroy() {
      await pg("pg_ctl", ["-D", data, "-m", "immediate", "-w", "-t", "60", "stop"]).catch(() => {});
      live.delete(data);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function pgIds(): { uid: number; gid: number } {
  const uid = Number(spawnSync("id", ["-u", "postgres"], { encoding: "utf8" }).stdout.trim());
  const gid = Number(spawnSync("id", ["-g", "postgres"], { encoding: "utf8" }).stdout.trim());
  return { uid, gid };
}
