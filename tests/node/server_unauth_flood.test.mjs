// Unauthenticated flood (issue 50): 1,000 connections, each a POST with a 10 MiB body and no API key,
// 200 at a time. Every one must get its 401 (from the headers, before the body) and the server's
// resident memory must end within 50 MiB of what it held idle: a client without a key must not make
// the server buffer its body. Started by tests/integration/server_run.sh (TESSERA_URL, TESSERA_PID).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';

const { hostname: HOST, port: PORT } = new globalThis.URL(process.env.TESSERA_URL);
const PID = process.env.TESSERA_PID;
const CONNECTIONS = 1000;
const AT_ONCE = 200;
const BODY_BYTES = 10 << 20;
const CHUNK = Buffer.alloc(1 << 20, 0x61);  // the body, 1 MiB at a time

function rssMiB() {
  const m = fs.readFileSync(`/proc/${PID}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB/m);
  return Number(m[1]) / 1024;
}

// One connection: the headers, then the body until it is all written or the server has closed.
// Resolves with the status line the server sent.
function flood() {
  return new Promise((resolve) => {
    const s = net.connect(Number(PORT), HOST);
    let data = '';
    let closed = false;
    const done = () => { closed = true; clearTimeout(timer); s.destroy(); resolve(data.split('\r\n')[0]); };
    const timer = setTimeout(done, 30000);
    s.on('data', (d) => { data += d.toString('latin1'); });
    s.on('close', done);
    s.on('error', done);
    s.on('connect', async () => {
      s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nContent-Type: application/json\r\n` +
              `Content-Length: ${BODY_BYTES}\r\n\r\n`);
      for (let sent = 0; sent < BODY_BYTES && !closed; sent += CHUNK.length) {
        if (!s.write(CHUNK)) await new Promise((r) => { s.once('drain', r); s.once('close', r); });
      }
    });
  });
}

test('unauthenticated flood: 1,000 x 10 MiB bodies without a key all get 401 and leave RSS near idle', async () => {
  const idle = rssMiB();
  const statuses = [];
  let peak = idle;
  for (let i = 0; i < CONNECTIONS; i += AT_ONCE) {
    const batch = [];
    for (let j = i; j < Math.min(i + AT_ONCE, CONNECTIONS); j++) batch.push(flood());
    const sampler = setInterval(() => { peak = Math.max(peak, rssMiB()); }, 50);
    statuses.push(...(await Promise.all(batch)));
    clearInterval(sampler);
  }
  const after = rssMiB();
  const not401 = statuses.filter((s) => !/^HTTP\/1\.1 401 /.test(s));
  assert.equal(not401.length, 0, `${not401.length} of ${CONNECTIONS} got no 401 (e.g. ${JSON.stringify(not401[0])})`);
  console.log(`RSS idle ${idle.toFixed(1)} MiB, peak ${peak.toFixed(1)} MiB, after ${after.toFixed(1)} MiB`);
  assert.ok(after - idle < 50, `RSS grew from ${idle.toFixed(1)} to ${after.toFixed(1)} MiB`);
  assert.ok(peak - idle < 50, `RSS peaked at ${peak.toFixed(1)} MiB (idle ${idle.toFixed(1)} MiB)`);
  const health = await fetch(`${process.env.TESSERA_URL}/health`);
  assert.equal(health.status, 200);
});
