// Hardening of `tessera serve` (issue 24), each a regression test of a finding: HTTP framing that
// could desynchronise a connection (HEAD with a body, unknown transfer codings, no Host), a
// disconnect hidden by one extra byte, and a waiting queue that counted sequences instead of
// requests. Started by tests/integration/server_run.sh with --max-num-seqs 1
// --max-waiting-requests 4, so that the queue fills with a few requests.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const { hostname: HOST, port: PORT } = new globalThis.URL(URL);
const MODEL = 'qwen3-tiny';
const auth = { 'content-type': 'application/json', authorization: `Bearer ${KEY}` };

async function post(path, body) {
  const r = await fetch(`${URL}${path}`, { method: 'POST', headers: auth, body: JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, text, json };
}

// Raw bytes over TCP; resolves with everything the server sent before closing (or after `waitMs`).
function rawExchange(data, { waitMs = 5000 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(Number(PORT), HOST);
    let out = '';
    const done = () => { clearTimeout(timer); s.destroy(); resolve(out); };
    const timer = setTimeout(done, waitMs);
    s.on('data', (d) => { out += d.toString('latin1'); });
    s.on('close', done);
    s.on('error', done);
    s.on('connect', () => s.write(data));
  });
}

async function metrics() {
  const t = await (await fetch(`${URL}/metrics`)).text();
  const get = (name) => {
    const m = t.match(new RegExp(`^(?:vllm|tessera):${name}\\{[^}]*\\} ([0-9.e+-]+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { running: get('num_requests_running'), waiting: get('num_requests_waiting'), aborted: get('num_requests_aborted_total') };
}

async function waitIdle(ms = 30000) {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    const m = await metrics();
    if (m.running === 0 && m.waiting === 0) return;
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function healthy() {
  const h = await fetch(`${URL}/health`);
  assert.equal(h.status, 200, 'health after the case');
}

test('HEAD gets the headers without a body, and keep-alive stays in step', async () => {
  const out = await rawExchange(`HEAD /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n\r\n` +
    'GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  const first = out.indexOf('\r\n\r\n');
  assert.match(out, /^HTTP\/1\.1 200 /);
  assert.match(out.slice(0, first), /Content-Length: [1-9]/i, 'the length a GET would get');
  // The next bytes are the second response, not the first one's JSON body.
  assert.match(out.slice(first + 4), /^HTTP\/1\.1 200 [\s\S]*"version"/);
  await healthy();
});

test('an unknown Transfer-Encoding gets 400 and the connection is closed', async () => {
  // Before: read as an empty body, and the body parsed as the next request.
  const body = 'GET /version HTTP/1.1\r\nHost: x\r\n\r\n';
  const out = await rawExchange(`POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
    `Transfer-Encoding: gzip\r\n\r\n${body}`);
  assert.match(out, /^HTTP\/1\.1 400 [\s\S]*Transfer-Encoding/);
  assert.match(out, /Connection: close/i);
  assert.equal((out.match(/HTTP\/1\.1 \d{3} /g) || []).length, 1, 'one answer, the smuggled request is not served');
  await healthy();
});

test('HTTP/1.1 without Host gets 400 and the connection is closed; HTTP/1.0 needs none', async () => {
  const out = await rawExchange('GET /health HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n');
  assert.match(out, /^HTTP\/1\.1 400 [\s\S]*Host/);
  assert.equal((out.match(/HTTP\/1\.1 \d{3} /g) || []).length, 1);
  const two = await rawExchange('GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n');
  assert.match(two, /^HTTP\/1\.1 400 /);
  const old = await rawExchange('GET /health HTTP/1.0\r\n\r\n');
  assert.match(old, /^HTTP\/1\.1 200 /);
  await healthy();
});

test('a non-streamed request whose client sends one more byte and leaves is aborted', { timeout: 60000 }, async () => {
  await waitIdle();
  const before = await metrics();
  const body = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'long' }], max_tokens: 3000, ignore_eos: true });
  const s = net.connect(Number(PORT), HOST);
  await new Promise((r) => s.on('connect', r));
  s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer ${KEY}\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  await new Promise((r) => setTimeout(r, 300));
  s.write('X');  // one byte of a next request: before, the server stopped watching the connection here
  await new Promise((r) => setTimeout(r, 300));
  s.destroy();
  const t0 = Date.now();
  let m;
  do {
    m = await metrics();
    if (m.aborted > before.aborted && m.running === 0) break;
    await new Promise((r) => setTimeout(r, 20));
  } while (Date.now() - t0 < 5000);
  assert.equal(m.aborted, before.aborted + 1, 'the aborted counter moved');
  assert.equal(m.running, 0);
  await healthy();
});

test('the waiting queue counts requests, not sequences', { timeout: 120000 }, async () => {
  await waitIdle();
  // Two requests of 4 prompts each take two of the 4 places (before: the first took all 4 and the
  // second got 429), and a small request meanwhile is served.
  const many = (tag) => post('/v1/completions', { model: MODEL, prompt: [1, 2, 3, 4].map((i) => `${tag} ${i}`), max_tokens: 8, ignore_eos: true });
  const a = many('a');
  const b = many('b');
  await new Promise((r) => setTimeout(r, 100));
  const small = await post('/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
  assert.equal(small.status, 200, small.text.slice(0, 300));
  const [ra, rb] = await Promise.all([a, b]);
  assert.equal(ra.status, 200, ra.text.slice(0, 300));
  assert.equal(rb.status, 200, rb.text.slice(0, 300));
  assert.equal(ra.json.choices.length, 4);
  await healthy();
});

test('a request whose sequences alone exceed the waiting queue gets 400 saying so', async () => {
  const r = await post('/v1/completions', { model: MODEL, prompt: ['a', 'b', 'c', 'd', 'e'], max_tokens: 2 });
  assert.equal(r.status, 400, r.text.slice(0, 300));
  assert.match(r.json.error.message, /5 sequences .*waiting queue holds \(4, --max-waiting-requests\)/);
  const n = await post('/v1/completions', { model: MODEL, prompt: ['a', 'b', 'c'], n: 2, max_tokens: 2 });
  assert.equal(n.status, 400, n.text.slice(0, 300));
  assert.match(n.json.error.message, /6 sequences/);
  await healthy();
});
