// TLS: the server serves with a self-signed certificate; the client trusts it as its root.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Ledger, LedgerError } from "../src/index.js";
import { startServer, uniqueRun, type TestServer } from "./support/server.js";

function haveOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

describe("TLS", { skip: haveOpenssl() ? false : "openssl is not installed" }, () => {
  let server: TestServer;
  let certDir: string;
  let cert: string;
  before(async () => {
    certDir = mkdtempSync(join(tmpdir(), "ledger-ts-tls-"));
    const certPath = join(certDir, "cert.pem");
    const keyPath = join(certDir, "key.pem");
    execFileSync(
      "openssl",
      [
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", keyPath, "-out", certPath, "-days", "1", "-subj", "/CN=localhost",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
      ],
      { stdio: "ignore" },
    );
    cert = readFileSync(certPath, "utf8");
    server = await startServer({ args: ["--tls-cert", certPath, "--tls-key", keyPath] });
  });
  after(async () => {
    await server?.stop();
    rmSync(certDir, { recursive: true, force: true });
  });

  test("a client with the root certificate talks TLS to the ledger", async () => {
    assert.match(server.log(), /tls=true/);
    const port = server.address.split(":").pop();
    const ledger = server.ledger({ address: `localhost:${port}`, tls: { rootCert: cert } });
    const out = await ledger.runOnce(uniqueRun("tls"), "send_reply", { ticket: "T-1" }, () => "sent");
    assert.equal(out.value, "sent");
  });

  test("without the root certificate the server is not trusted", async () => {
    const ledger = new Ledger({ address: `https://${server.address}`, deadlineMs: 3_000 });
    try {
      const err = await ledger.lookup({ key: "k" }).catch((e: unknown) => e);
      assert.ok(err instanceof LedgerError, String(err));
      assert.match(err.message, /certificate/);
    } finally {
      ledger.close();
    }
  });
});
