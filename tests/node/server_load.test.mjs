// Load and lifecycle tests for `tessera serve` on the tiny dummy model: 1,000 concurrent
// streaming requests all complete with well-formed SSE; afterwards no request runs, every KV
// block is free and RSS is back near its baseline; a client that disconnects mid-stream has its
// request aborted at once. Started by tests/integration/server_run.sh.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import fs from 'node:fs';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const PID = process.env.TESSERA_PID;
const { hostname: HOST, port: PORT } = new globalThis.URL(URL);
const CONCURRENCY = Number(process.env.TESSERA_LOAD_REQUESTS || 1000);

function rssKiB() {
  const m = fs.readFileSync(`/proc/${PID}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return Number(m[1]);
}

async function metrics() {
  const t = await (await fetch(`${URL}/metrics`)).text();
  const get = (name) => {
    const m = t.match(new RegExp(`^(?:vllm|tessera):${name}\\{[^}]*\\} ([0-9.e+-]+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return {
    running: get('num_requests_running'), waiting: get('num_requests_waiting'), kv: get('kv_cache_usage_perc'),
    aborted: get('num_requests_aborted_total'), generated: get('generation_tokens_total'),
  };
}

async function waitIdle(ms = 15000) {
  const t0 = Date.now();
  let m;
  while (Date.now() - t0 < ms) {
    m = await metrics();
    if (m.running === 0 && m.waiting === 0 && m.kv === 0) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  return m;
}

// One streaming chat request over its own connection; checks the SSE framing as it goes.
function streamOne(i, agent) {
  return new Promise((resolve) => {
    const body = JSON.stringify({
      model: 'qwen3-tiny', messages: [{ role: 'user', content: `request ${i}` }], max_tokens: 4, ignore_eos: true,
      stream: true, stream_options: { include_usage: true },
    });
    const req = http.request({ host: HOST, port: PORT, path: '/v1/chat/completions', method: 'POST', agent,
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}`, 'content-length': Buffer.byteLength(body) } }, (res) => {
      let buf = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { buf += d; });
      res.on('end', () => {
        const problems = [];
        if (res.statusCode !== 200) problems.push(`status ${res.statusCode}: ${buf.slice(0, 200)}`);
        if (!/^text\/event-stream/.test(res.headers['content-type'] || '')) problems.push('content-type');
        if (res.headers['x-accel-buffering'] !== 'no') problems.push('X-Accel-Buffering');
        const events = buf.split('\n\n');
        if (events.at(-1) !== '') problems.push('trailing bytes after the last event');
        events.pop();
        if (events.at(-1) !== 'data: [DONE]') problems.push('no [DONE] last');
        const chunks = events.slice(0, -1).map((e) => {
          if (!e.startsWith('data: ')) { problems.push(`bad event ${e.slice(0, 50)}`); return {}; }
          try { return JSON.parse(e.slice(6)); } catch { problems.push('bad JSON'); return {}; }
        });
        if (chunks[0]?.choices?.[0]?.delta?.role !== 'assistant') problems.push('role not in the first delta');
        const finish = chunks.flatMap((c) => c.choices || []).filter((c) => c.finish_reason);
        if (finish.length !== 1 || finish[0].finish_reason !== 'length') problems.push('finish_reason');
        if (chunks.at(-1)?.usage?.completion_tokens !== 4) problems.push('usage');
        resolve(problems.length ? `#${i}: ${problems.join('; ')}` : null);
      });
      res.on('error', (e) => resolve(`#${i}: response error ${e.message}`));
    });
    req.on('error', (e) => resolve(`#${i}: request error ${e.message}`));
    req.end(body);
  });
}

test(`${CONCURRENCY} concurrent streaming requests, then every block free and RSS near baseline`, { timeout: 240000 }, async () => {
  const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
  // Warm-up with a full batch (--max-num-seqs 256): the engine keeps its per-step buffers (logits of
  // 256 x 151,936 floats, scratch) at their high-water mark, so the baseline is taken after one.
  const warm = await Promise.all(Array.from({ length: 300 }, (_, i) => streamOne(i, agent)));
  assert.deepEqual(warm.filter(Boolean), []);
  await waitIdle();
  const baseline = rssKiB();
  const t0 = Date.now();
  const results = await Promise.all(Array.from({ length: CONCURRENCY }, (_, i) => streamOne(i, agent)));
  const seconds = (Date.now() - t0) / 1000;
  const failures = results.filter(Boolean);
  assert.deepEqual(failures.slice(0, 10), [], `${failures.length} failures`);
  const peak = rssKiB();
  const m = await waitIdle();
  assert.equal(m.running, 0);
  assert.equal(m.waiting, 0);
  assert.equal(m.kv, 0, 'every KV block is free');
  await new Promise((r) => setTimeout(r, 1500));  // the server trims its heap when idle
  const after = rssKiB();
  console.log(`# load: ${CONCURRENCY} streams in ${seconds.toFixed(2)} s (${(CONCURRENCY / seconds).toFixed(1)} req/s); ` +
    `RSS baseline ${(baseline / 1024).toFixed(1)} MiB, peak ${(peak / 1024).toFixed(1)} MiB, after ${(after / 1024).toFixed(1)} MiB`);
  assert.ok(after <= baseline * 1.1 + 48 * 1024, `RSS after ${after} KiB vs baseline ${baseline} KiB`);
});

test('a client that disconnects mid-stream has its request aborted and its blocks freed', { timeout: 60000 }, async () => {
  const before = await metrics();
  const body = JSON.stringify({ model: 'qwen3-tiny', messages: [{ role: 'user', content: 'long' }], max_tokens: 3000, ignore_eos: true, stream: true });
  await new Promise((resolve, reject) => {
    const req = http.request({ host: HOST, port: PORT, path: '/v1/chat/completions', method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` } }, (res) => {
      let events = 0;
      res.on('data', (d) => {
        events += (d.toString().match(/\n\n/g) || []).length;
        if (events >= 5) { req.destroy(); resolve(); }
      });
    });
    req.on('error', () => {});
    req.setTimeout(30000, () => reject(new Error('no stream')));
    req.end(body);
  });
  const t0 = Date.now();
  let m;
  do {
    m = await metrics();
    if (m.aborted > before.aborted && m.running === 0) break;
    await new Promise((r) => setTimeout(r, 10));
  } while (Date.now() - t0 < 5000);
  const ms = Date.now() - t0;
  assert.equal(m.aborted, before.aborted + 1, 'the aborted counter moved');
  assert.equal(m.running, 0);
  // A step of this model takes well under 50 ms; the abort must land within about one step.
  const extraTokens = m.generated - before.generated;
  console.log(`# disconnect: aborted after ${ms} ms, ${extraTokens} tokens generated in total for the request`);
  // The client read 4 content tokens; what the engine made after the disconnect is a step or two.
  assert.ok(extraTokens <= 10, `${extraTokens} tokens generated`);
  const idle = await waitIdle();
  assert.equal(idle.kv, 0, 'its blocks are free');
});
