// What a vLLM user's scripts, dashboards and benchmarks rely on, against the real `tessera serve`
// (tests/integration/server_run.sh with --log-stats-interval 1 --enable-log-requests --max-log-len 5;
// TESSERA_BIN is the binary): vLLM's stop semantics (min_tokens, include_stop_str_in_output), the
// /metrics series vLLM's Grafana dashboard queries, the periodic stats line, the request log, and a
// second server on a port in use failing at once. The model is the tiny dummy Qwen3 (random text).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { spawn } from 'node:child_process';
import path from 'node:path';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const LOG = process.env.TESSERA_LOG;
const BIN = process.env.TESSERA_BIN;
const ROOT = path.resolve(path.dirname(new globalThis.URL(import.meta.url).pathname), '../..');
const hdrs = { 'content-type': 'application/json', authorization: `Bearer ${KEY}` };
const post = async (p, body) => {
  const r = await fetch(`${URL}${p}`, { method: 'POST', headers: hdrs, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
};
const complete = (extra) =>
  post('/v1/completions', { model: 'qwen3-tiny', prompt: 'Once upon a time', temperature: 0, ignore_eos: true, ...extra });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The greedy text of 24 tokens and an ASCII character in it to stop at.
async function probe() {
  const r = await complete({ max_tokens: 24 });
  assert.equal(r.status, 200);
  const text = r.body.choices[0].text;
  const stop = [...text].find((c) => c > ' ' && c < '\x7f');
  assert.ok(stop, `no ASCII character in the greedy text ${JSON.stringify(text)}`);
  return { text, stop };
}

test('include_stop_str_in_output keeps the stop string; by default it is cut', async () => {
  const { text, stop } = await probe();
  const cut = await complete({ max_tokens: 24, stop: [stop] });
  assert.equal(cut.body.choices[0].text, text.slice(0, text.indexOf(stop)));
  assert.equal(cut.body.choices[0].finish_reason, 'stop');
  assert.equal(cut.body.choices[0].stop_reason, stop);
  const kept = await complete({ max_tokens: 24, stop: [stop], include_stop_str_in_output: true });
  assert.equal(kept.body.choices[0].text, text.slice(0, text.indexOf(stop) + stop.length));
  const bad = await complete({ max_tokens: 4, include_stop_str_in_output: 'yes' });
  assert.equal(bad.status, 400);
  assert.match(bad.body.error.message, /include_stop_str_in_output/);
});

test('min_tokens holds back a stop string until min_tokens tokens are out', async () => {
  const { text, stop } = await probe();
  const r = await complete({ max_tokens: 24, stop: [stop], min_tokens: 20 });
  const c = r.body.choices[0];
  assert.ok(r.body.usage.completion_tokens > 20, `stopped after ${r.body.usage.completion_tokens} tokens`);
  assert.ok(text.startsWith(c.text), 'the same greedy text, cut later');
  assert.ok(c.text.length > text.indexOf(stop), 'the early stop string did not end it');
});

test('skip_special_tokens is read and type-checked', async () => {
  assert.equal((await complete({ max_tokens: 2, skip_special_tokens: false })).status, 200);
  const bad = await complete({ max_tokens: 2, skip_special_tokens: 1 });
  assert.equal(bad.status, 400);
  assert.match(bad.body.error.message, /skip_special_tokens/);
});

test('/metrics exports the series vLLM dashboards query, with model_name', async () => {
  await complete({ max_tokens: 3, n: 2 });
  const t = await (await fetch(`${URL}/metrics`)).text();
  const exported = new Set([...t.matchAll(/^# TYPE (vllm:[a-z0-9_]+) /gm)].map((m) => m[1]));
  const wanted = ['vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:gpu_cache_usage_perc',
    'vllm:kv_cache_usage_perc', 'vllm:prompt_tokens_total', 'vllm:generation_tokens_total',
    'vllm:request_success_total', 'vllm:time_to_first_token_seconds', 'vllm:time_per_output_token_seconds',
    'vllm:inter_token_latency_seconds', 'vllm:e2e_request_latency_seconds', 'vllm:request_queue_time_seconds',
    'vllm:request_prefill_time_seconds', 'vllm:request_decode_time_seconds', 'vllm:request_prompt_tokens',
    'vllm:request_generation_tokens', 'vllm:iteration_tokens_total', 'vllm:prefix_cache_queries_total',
    'vllm:prefix_cache_hits_total', 'vllm:num_preemptions_total', 'vllm:spec_decode_num_drafts_total',
    'vllm:spec_decode_num_draft_tokens_total', 'vllm:spec_decode_num_accepted_tokens_total',
    'vllm:request_params_max_tokens', 'vllm:request_params_n',
    // The rest of vLLM's example Grafana dashboard (examples/online_serving/prometheus_grafana/grafana.json).
    'vllm:num_requests_swapped', 'vllm:cpu_cache_usage_perc', 'vllm:request_max_num_generation_tokens',
    'vllm:request_inference_time_seconds'];
  for (const name of wanted) assert.ok(exported.has(name), `missing ${name}`);
  // Every one returns a series for this model: a sample line (a histogram's _count) with its model_name.
  for (const name of wanted) {
    const sample = new RegExp(`^${name}(_count)?\\{model_name="qwen3-tiny"[,}].* [0-9.e+-]+$`, 'm');
    assert.match(t, sample, `no sample of ${name}`);
  }
  // The dashboard's queries on this server's scrape: the histograms it reads as rates have observations.
  for (const name of ['vllm:e2e_request_latency_seconds', 'vllm:time_to_first_token_seconds',
    'vllm:time_per_output_token_seconds', 'vllm:request_prompt_tokens', 'vllm:request_generation_tokens',
    'vllm:request_prefill_time_seconds', 'vllm:request_decode_time_seconds',
    'vllm:request_max_num_generation_tokens']) {
    assert.match(t, new RegExp(`^${name}_count\\{model_name="qwen3-tiny"\\} [1-9]`, 'm'), `${name} observed nothing`);
  }
  assert.match(t, /^vllm:request_success_total\{model_name="qwen3-tiny",finished_reason="length"\} [1-9]/m);
  assert.match(t, /^vllm:request_params_n_bucket\{model_name="qwen3-tiny",le="2"\} [1-9]/m);
  assert.match(t, /^vllm:request_queue_time_seconds_count\{model_name="qwen3-tiny"\} [1-9]/m);
  assert.match(t, /^vllm:inter_token_latency_seconds_count\{model_name="qwen3-tiny"\} [1-9]/m);
  assert.match(t, /^vllm:prefix_cache_queries_total\{model_name="qwen3-tiny"\} [1-9]/m);
  assert.match(t, /^vllm:iteration_tokens_total_count\{model_name="qwen3-tiny"\} [1-9]/m);
  assert.match(t, /^tessera:engine_alive\{model_name="qwen3-tiny"\} 1$/m);
});

test('the stats line is logged while there is work, and each request with --enable-log-requests', async () => {
  await complete({ prompt: 'abcdefghij', max_tokens: 8 });
  let log = '';
  for (let i = 0; i < 50 && !/Avg prompt throughput/.test(log); ++i) {
    await sleep(100);
    log = fs.readFileSync(LOG, 'utf8');
  }
  assert.match(log, /Avg prompt throughput: \d+\.\d tokens\/s, Avg generation throughput: \d+\.\d tokens\/s, Running: \d+ reqs, Waiting: \d+ reqs, GPU KV cache usage: \d+\.\d%, Prefix cache hit rate: \d+\.\d%/);
  // --max-log-len 5: the prompt cut at 5 characters and 5 token ids.
  assert.match(log, /Received request cmpl-[0-9a-f]+: prompt: "abcde", params: n=1, temperature=0,.*max_tokens=8/);
});

test('a second server on the same port fails at once, naming the port', async () => {
  const port = new globalThis.URL(URL).port;
  const t0 = Date.now();
  const child = spawn(BIN, ['serve', `${ROOT}/configs/qwen3-tiny`, '--load-format', 'dummy', '--device', 'cpu',
    '--tokenizer', `${ROOT}/.npm-pkgs/tokenizer-qwen3/package/models`, '--host', '127.0.0.1', '--port', port]);
  let err = '';
  child.stderr.on('data', (d) => { err += d; });
  child.stdout.on('data', (d) => { err += d; });
  const code = await new Promise((resolve) => child.on('exit', resolve));
  const secs = (Date.now() - t0) / 1000;
  assert.equal(code, 1, err);
  assert.match(err, new RegExp(`error: cannot listen on 127\\.0\\.0\\.1:${port}: Address already in use`));
  assert.ok(secs < 1, `took ${secs} s`);
  assert.doesNotMatch(err, /Loading|weights/i, 'nothing was loaded');
});
