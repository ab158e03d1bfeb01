// A TCP proxy on loopback for the failover tests: forwards every connection to a target, and
// can cut them all (and refuse new ones, accepting and closing at once, as a load balancer does
// while its backend is down) for a while.

import { createServer, connect, type Server, type Socket } from "node:net";

export interface TcpProxy {
  /** `127.0.0.1:PORT` */
  address: string;
  /** Destroys every connection, and closes each new one at once until restore(). */
  cut(): void;
  restore(): void;
  close(): Promise<void>;
}

export async function startProxy(target: string): Promise<TcpProxy> {
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  const sockets = new Set<Socket>();
  let refusing = false;
  const track = (s: Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
    s.on("error", () => s.destroy());
  };
  const server: Server = createServer((client) => {
    track(client);
    if (refusing) {
      client.destroy();
      return;
    }
    const upstream = connect(port, host);
    track(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  const address = `127.0.0.1:${(server.address() as { port: number }).port}`;
  return {
    address,
    cut() {
      refusing = true;
      for (const s of sockets) s.destroy();
    },
    restore() {
      refusing = false;
    },
    async close() {
      refusing = true;
      for (const s of sockets) s.destroy();
      await new Promise((done) => server.close(done));
    },
  };
}
