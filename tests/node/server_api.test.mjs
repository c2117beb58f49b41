// Protocol tests of `tessera serve` with the official OpenAI and Anthropic SDKs and plain fetch.
// Started by tests/integration/server_run.sh (TESSERA_URL, TESSERA_API_KEY). The model is the
// tiny dummy Qwen3: random weights, so the text is random; the tests check shapes, counts,
// determinism and error answers, never the words.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const MODEL = 'qwen3-tiny';
const openai = new OpenAI({ baseURL: `${URL}/v1`, apiKey: KEY, maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: URL, apiKey: KEY, maxRetries: 0 });
const hdrs = { 'content-type': 'application/json', authorization: `Bearer ${KEY}` };
const post = (path, body, headers = hdrs) =>
  fetch(`${URL}${path}`, { method: 'POST', headers, body: JSON.stringify(body) });
const msgs = [{ role: 'user', content: 'Say hello.' }];

test('/v1/models lists the served names', async () => {
  const list = await openai.models.list();
  const ids = list.data.map((m) => m.id);
  assert.deepEqual(ids, ['qwen3-tiny', 'tiny-alias']);
  assert.equal(list.data[0].max_model_len, 4096);
});

test('chat completion, non-streaming, usage', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 5);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('the alias name is accepted too', async () => {
  const r = await openai.chat.completions.create({ model: 'tiny-alias', messages: msgs, max_tokens: 2 });
  assert.equal(r.model, 'tiny-alias');
});

test('chat completion, streaming with usage', async () => {
  const stream = await openai.chat.completions.create({
    model: MODEL, messages: msgs, max_tokens: 12, temperature: 0, ignore_eos: true,
    stream: true, stream_options: { include_usage: true },
  });
  let text = '', first = null, finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (first === null) first = c.delta;
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(first.role, 'assistant');
  assert.equal(finish, 'length');
  assert.ok(usage, 'a usage chunk came last');
  assert.equal(usage.completion_tokens, 12);
  assert.ok(chunks >= 3);
  // Same request without streaming gives the same text (greedy).
  const r = await openai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 12, temperature: 0, ignore_eos: true });
  assert.equal(r.choices[0].message.content, text);
});

test('stop strings end the text before the stop string', async () => {
  const base = await openai.completions.create({ model: MODEL, prompt: 'The numbers:', max_tokens: 24, temperature: 0, ignore_eos: true });
  const full = base.choices[0].text;
  // Pick a stop string from the middle of the greedy text.
  const cut = Math.floor(full.length / 2);
  const stop = full.slice(cut, cut + 2);
  if (stop.trim().length === 0) return;  // whitespace-only fragments are not worth a flaky test
  const r = await openai.completions.create({ model: MODEL, prompt: 'The numbers:', max_tokens: 24, temperature: 0, ignore_eos: true, stop: [stop] });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].stop_reason, stop);
  assert.equal(r.choices[0].text, full.slice(0, full.indexOf(stop)));
});

test('n=2 gives two indexed choices', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 4, n: 2, seed: 7 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  const s = await openai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 4, n: 2, stream: true });
  const seen = new Set();
  for await (const chunk of s) for (const c of chunk.choices) seen.add(c.index);
  assert.deepEqual([...seen].sort(), [0, 1]);
});

test('seed: same seed, same text', async () => {
  const ask = (seed) => openai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 16, temperature: 1.0, seed, ignore_eos: true });
  const [a, b, c] = await Promise.all([ask(1234), ask(1234), ask(99)]);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);
});

test('logprobs and top_logprobs', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 3, logprobs: true, top_logprobs: 2, ignore_eos: true });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 3);
  for (const t of lp) {
    assert.equal(typeof t.token, 'string');
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 2);
  }
});

test('/v1/completions: string, list, token ids, echo, streaming', async () => {
  const one = await openai.completions.create({ model: MODEL, prompt: 'Hello', max_tokens: 5, ignore_eos: true });
  assert.equal(one.object, 'text_completion');
  assert.equal(one.usage.completion_tokens, 5);
  const many = await openai.completions.create({ model: MODEL, prompt: ['a', 'b', 'c'], max_tokens: 2 });
  assert.deepEqual(many.choices.map((c) => c.index), [0, 1, 2]);
  const ids = await openai.completions.create({ model: MODEL, prompt: [9707, 11, 1879], max_tokens: 2 });
  assert.equal(ids.usage.prompt_tokens, 3);
  const idlists = await openai.completions.create({ model: MODEL, prompt: [[9707], [1879, 0]], max_tokens: 2 });
  assert.equal(idlists.choices.length, 2);
  const echo = await openai.completions.create({ model: MODEL, prompt: 'Echo me', max_tokens: 2, echo: true });
  assert.ok(echo.choices[0].text.startsWith('Echo me'));
  const s = await openai.completions.create({ model: MODEL, prompt: 'Hi', max_tokens: 6, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
  let n = 0, usage;
  for await (const c of s) { if (c.usage) usage = c.usage; n += c.choices.length; }
  assert.ok(n >= 1);
  assert.equal(usage.completion_tokens, 6);
});

test('/v1/messages (Anthropic SDK), plain', async () => {
  const m = await anthropic.messages.create({
    model: MODEL, max_tokens: 8, system: 'You are terse.',
    messages: [{ role: 'user', content: 'Hi' }],
  });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.content[0].type, 'text');
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
  assert.ok(m.usage.input_tokens > 3);
  assert.ok(m.usage.output_tokens >= 1);
});

test('/v1/messages (Anthropic SDK), streaming events', async () => {
  const stream = anthropic.messages.stream({
    model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: [{ type: 'text', text: 'Hi' }] }],
  });
  const types = [];
  stream.on('streamEvent', (e) => types.push(e.type));
  const final = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.equal(types[1], 'content_block_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.ok(types.includes('message_delta'));
  assert.ok(types.includes('content_block_stop'));
  assert.equal(final.content[0].type, 'text');
});

test('/v1/messages: tool_use and tool_result blocks reach the template', async () => {
  const m = await anthropic.messages.create({
    model: MODEL, max_tokens: 4,
    tools: [{ name: 'get_weather', description: 'weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
    tool_choice: { type: 'none' },
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny' }] },
    ],
  });
  assert.equal(m.type, 'message');
  const t = await post('/v1/messages/count_tokens', {
    model: MODEL,
    messages: [{ role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny' }] }],
  });
  assert.equal(t.status, 200);
  assert.ok((await t.json()).input_tokens > 10);
});

test('/tokenize and /detokenize', async () => {
  const r = await post('/tokenize', { model: MODEL, prompt: 'Hello, world' });
  assert.equal(r.status, 200);
  const j = await r.json();
  assert.deepEqual(j.tokens, [9707, 11, 1879]);
  assert.equal(j.count, 3);
  assert.equal(j.max_model_len, 4096);
  const c = await (await post('/tokenize', { model: MODEL, messages: msgs })).json();
  assert.ok(c.count > 5);
  const d = await (await post('/detokenize', { model: MODEL, tokens: [9707, 11, 1879] })).json();
  assert.equal(d.prompt, 'Hello, world');
});

test('401 without or with a wrong key; /health, /metrics, /version stay open', async () => {
  const noKey = new OpenAI({ baseURL: `${URL}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(noKey.models.list(), (e) => e.status === 401);
  const r = await fetch(`${URL}/v1/models`);
  assert.equal(r.status, 401);
  const body = await r.json();
  assert.equal(typeof body.error.message, 'string');
  const badAnthropic = new Anthropic({ baseURL: URL, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(badAnthropic.messages.create({ model: MODEL, max_tokens: 2, messages: msgs }), (e) => e.status === 401);
  const xkey = await post('/v1/messages', { model: MODEL, max_tokens: 2, messages: msgs }, { 'content-type': 'application/json', 'x-api-key': KEY });
  assert.equal(xkey.status, 200);
  for (const p of ['/health', '/metrics', '/version']) assert.equal((await fetch(`${URL}${p}`)).status, 200, p);
});

test('404 for an unknown model', async () => {
  await assert.rejects(openai.chat.completions.create({ model: 'gpt-4o', messages: msgs }), (e) => {
    assert.equal(e.status, 404);
    assert.match(e.message, /The model `gpt-4o` does not exist/);
    return true;
  });
});

test('context length: 400 with the numbers', async () => {
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 5000 }), (e) => {
    assert.equal(e.status, 400);
    assert.match(e.message, /maximum context length is 4096 tokens/);
    assert.match(e.message, /5000/);
    return true;
  });
  await assert.rejects(openai.completions.create({ model: MODEL, prompt: 'hi '.repeat(5000), max_tokens: 1 }), (e) => e.status === 400);
});

test('default max_tokens fills the context (vLLM): a request without max_tokens is accepted', async () => {
  const r = await post('/v1/chat/completions', { model: MODEL, messages: msgs, stop: [' ', 'e', 'a', 'o', 'n', 't', 's', 'i'], temperature: 0 });
  assert.equal(r.status, 200);
});

test('response_format json_object holds the output to JSON; an unknown type is refused clearly', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 8, temperature: 1,
                                                   response_format: { type: 'json_object' } });
  assert.match(r.choices[0].message.content, /^\s*\{/);
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: msgs, response_format: { type: 'xml' } }),
    (e) => e.status === 400 && /response_format/.test(e.message));
});

test('/metrics has vLLM names under vllm:, tessera\'s own under tessera:', async () => {
  const t = await (await fetch(`${URL}/metrics`)).text();
  for (const name of ['vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc',
    'vllm:prompt_tokens_total', 'vllm:generation_tokens_total', 'vllm:num_preemptions_total',
    'vllm:request_success_total', 'vllm:time_to_first_token_seconds_bucket',
    'vllm:time_per_output_token_seconds_bucket', 'vllm:e2e_request_latency_seconds_bucket',
    'tessera:num_requests_aborted_total']) assert.ok(t.includes(name), name);
  assert.match(t, /request_success_total\{model_name="qwen3-tiny",finished_reason="length"\} [1-9]/);
});
