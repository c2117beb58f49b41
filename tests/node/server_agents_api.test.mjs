// The request shapes coding agents send, through the official SDKs: the OpenAI Responses API
// (responses.create / responses.stream, as Codex uses it) and Anthropic Messages as Claude Code sends
// them (system messages inside `messages`, adaptive thinking, tools, max_tokens above the context,
// ?beta=true, HEAD /). Started by server_run.sh with --reasoning-parser qwen3
// --enable-auto-tool-choice --tool-call-parser hermes; the dummy model's random text has no </think>,
// so with thinking on all output is reasoning, with thinking off all of it is the answer.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const MODEL = 'qwen3-tiny';
const openai = new OpenAI({ baseURL: `${URL}/v1`, apiKey: KEY, maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: URL, apiKey: KEY, maxRetries: 0 });
const fn = { type: 'function', name: 'get_weather', description: 'weather of a city', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };
const base = { model: MODEL, max_output_tokens: 8, temperature: 0 };
const errorOf = async (p) => { try { await p; } catch (e) { return e; } assert.fail('expected an error'); };

// ---- Responses API ------------------------------------------------------------------------------
test('responses.create: reasoning item, usage with reasoning tokens, incomplete at max_output_tokens', async () => {
  const r = await openai.responses.create({ ...base, input: 'Think, then answer.' });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.model, MODEL);
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.output.length, 1);
  const item = r.output[0];
  assert.equal(item.type, 'reasoning');
  assert.match(item.id, /^rs_/);
  assert.equal(item.content[0].type, 'reasoning_text');
  assert.ok(item.content[0].text.length > 0);
  assert.equal(r.usage.output_tokens, 8);
  assert.ok(r.usage.output_tokens_details.reasoning_tokens >= 1 && r.usage.output_tokens_details.reasoning_tokens <= 8);
  assert.ok(r.usage.input_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(r.store, false);
  assert.equal(r.max_output_tokens, 8);
});

test('responses.create: effort none -> a message item; output_text; items and roles as Codex sends them', async () => {
  const input = [
    { type: 'message', role: 'developer', content: [{ type: 'input_text', text: 'Be brief.' }] },
    { type: 'message', role: 'system', content: 'You are terse.' },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Weather in Paris?' }] },
    { type: 'reasoning', id: 'rs_1', summary: [{ type: 'summary_text', text: 'Need the tool.' }], encrypted_content: null },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
    { type: 'function_call_output', call_id: 'call_1', output: 'sunny, 21 C' },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'It is sunny.' }] },
    { role: 'user', content: 'Thanks.' },
  ];
  const r = await openai.responses.create({
    ...base, input, instructions: 'You are a weather bot.', tools: [fn], tool_choice: 'auto', parallel_tool_calls: true,
    reasoning: { effort: 'none' }, store: false, include: ['reasoning.encrypted_content'], prompt_cache_key: 'k1',
    text: { format: { type: 'text' } }, metadata: { a: 'b' },
  });
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].role, 'assistant');
  assert.equal(r.output[0].content[0].type, 'output_text');
  assert.ok(r.output_text.length > 0);
  assert.equal(r.output_text, r.output[0].content[0].text);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
  assert.equal(r.instructions, 'You are a weather bot.');
  assert.equal(r.tools[0].name, 'get_weather');
  assert.equal(r.reasoning.effort, 'none');
  assert.deepEqual(r.metadata, { a: 'b' });
});

test('responses.stream: the event sequence and the final response agree with responses.create', async () => {
  const params = { ...base, input: 'Hi', reasoning: { effort: 'none' } };
  const ref = await openai.responses.create(params);
  const stream = openai.responses.stream(params);
  const events = [];
  let snapshot = '';
  stream.on('event', (e) => events.push(e));
  stream.on('response.output_text.delta', (e) => { snapshot = e.snapshot; });
  const final = await stream.finalResponse();
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added']);
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
    'response.output_item.done', 'response.incomplete']);
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  const deltas = events.filter((e) => e.type === 'response.output_text.delta');
  assert.ok(deltas.length >= 1);
  assert.equal(deltas.map((e) => e.delta).join(''), ref.output_text);
  assert.equal(snapshot, ref.output_text);
  assert.equal(final.output[0].content[0].text, ref.output_text); // (this SDK adds output_text to create() only)
  assert.equal(events.at(-1).response.usage.output_tokens, 8);
  assert.equal(events.at(-1).response.output[0].content[0].text, ref.output_text);
});

test('responses.stream with reasoning.summary: reasoning summary events (Codex asks for summary auto)', async () => {
  const params = { ...base, input: 'Hi', reasoning: { summary: 'auto' } };
  const ref = await openai.responses.create(params);
  assert.equal(ref.output[0].type, 'reasoning');
  assert.equal(ref.output[0].summary[0].type, 'summary_text');
  const stream = openai.responses.stream(params);
  const events = [];
  stream.on('event', (e) => events.push(e));
  await stream.done();
  const types = events.map((e) => e.type);
  assert.equal(types[2], 'response.output_item.added');
  assert.equal(events[2].item.type, 'reasoning');
  assert.equal(types[3], 'response.reasoning_summary_part.added');
  const text = events.filter((e) => e.type === 'response.reasoning_summary_text.delta').map((e) => e.delta).join('');
  assert.equal(text, ref.output[0].summary[0].text);
  assert.ok(types.includes('response.reasoning_summary_text.done'));
  const last = events.at(-1);
  assert.equal(last.type, 'response.incomplete');
  assert.ok(last.response.usage.output_tokens_details.reasoning_tokens > 0);
});

test('responses: hosted tools (web_search, namespace) are ignored, function tools kept; tool_choice named', async () => {
  const tools = [fn, { type: 'web_search', external_web_access: false },
    { type: 'namespace', name: 'multi_agent', description: 'x', tools: [{ type: 'function', name: 'spawn', parameters: {} }] }];
  const r = await openai.responses.create({ ...base, input: 'Paris?', tools, reasoning: { effort: 'none' },
    tool_choice: { type: 'function', name: 'get_weather' } });
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.deepEqual(r.tool_choice, { type: 'function', name: 'get_weather' });
  for (const item of r.output) assert.ok(['message', 'function_call'].includes(item.type));
});

test('responses: what cannot be served gets a 400 that says what to do', async () => {
  const cases = [
    [{ previous_response_id: 'resp_x' }, /stores no responses/],
    [{ tools: [{ type: 'custom', name: 'apply_patch' }] }, /custom .* not supported; declare 'apply_patch' as a function/],
    [{ text: { format: { type: 'grammar', definition: 'x' } } }, /text.format.type 'grammar' is not one of/],
    [{ tools: [fn], tool_choice: { type: 'function', name: 'nope' } }, /names function 'nope'/],
    [{ tool_choice: { type: 'web_search' } }, /tool_choice .* not supported/],
    [{ input: [{ type: 'item_reference', id: 'msg_1' }] }, /stores none/],
    [{ input: [{ type: 'message', role: 'tool', content: 'x' }] }, /not one of user, assistant, system, developer/],
  ];
  for (const [extra, re] of cases) {
    const e = await errorOf(openai.responses.create({ ...base, input: 'Hi', ...extra }));
    assert.equal(e.status, 400, JSON.stringify(extra));
    assert.match(e.error.message, re);
  }
});

test('responses tool round trip: the client sends the tool result back and gets the answer', async () => {
  // The random model does not call tools by itself (server_tool_roundtrip.test.mjs has a model that
  // does); here the client's half: the call and its output go back in `input`, an answer comes.
  const input = [
    { role: 'user', content: 'Weather in Paris?' },
    { type: 'function_call', call_id: 'call_9', name: 'get_weather', arguments: '{"city":"Paris"}' },
    { type: 'function_call_output', call_id: 'call_9', output: [{ type: 'input_text', text: 'sunny' }] },
  ];
  const stream = openai.responses.stream({ ...base, input, tools: [fn], reasoning: { effort: 'none' } });
  const final = await stream.finalResponse();
  assert.ok(final.output.length >= 1);
  assert.equal(final.output[0].type, 'message');
  assert.ok(final.output[0].content[0].text.length > 0);
});

// ---- Anthropic Messages as Claude Code sends them --------------------------------------------------
const claudeLike = {
  model: MODEL,
  max_tokens: 32000, // above the 4096-token context: lowered to what is left, as vLLM does
  system: [{ type: 'text', text: 'You are Claude Code.', cache_control: { type: 'ephemeral' } }],
  messages: [
    { role: 'user', content: [{ type: 'text', text: 'say hi', cache_control: { type: 'ephemeral' } }] },
    { role: 'system', content: 'Available agent types: none.' },
  ],
  tools: [{ name: 'Bash', description: 'run', input_schema: { type: 'object', properties: { command: { type: 'string' } } } }],
  metadata: { user_id: 'u' },
  thinking: { type: 'adaptive' },
  context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
  output_config: { effort: 'high' },
  temperature: 0,
};

test('Claude Code request shape: system messages inside messages, adaptive thinking, ignored fields, big max_tokens', async () => {
  const r = await fetch(`${URL}/v1/messages?beta=true`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01',
      'anthropic-beta': 'claude-code-20250219,interleaved-thinking-2025-05-14' },
    body: JSON.stringify({ ...claudeLike, max_tokens: 16 }),
  });
  assert.equal(r.status, 200, await r.clone().text());
  const m = await r.json();
  assert.equal(m.type, 'message');
  assert.equal(m.content[0].type, 'thinking');
});

test('max_tokens above the context is lowered to the room left (as vLLM does), not refused', async () => {
  // A prompt that leaves about 20 tokens of the 4096-token context; Claude Code asks for 32000.
  const body = { model: MODEL, thinking: { type: 'disabled' }, messages: [{ role: 'user', content: 'x' }] };
  const one = await anthropic.messages.countTokens(body);
  const filler = ' a'.repeat(4096 - 20 - one.input_tokens);
  const padded = { ...body, messages: [{ role: 'user', content: `x${filler}` }] };
  const n = (await anthropic.messages.countTokens(padded)).input_tokens;
  assert.ok(n > 4000 && n < 4096, `prompt of ${n} tokens`);
  const big = await anthropic.beta.messages.stream({ ...padded, max_tokens: 32000, temperature: 0 }).finalMessage();
  assert.equal(big.usage.input_tokens, n);
  assert.ok(big.usage.output_tokens >= 1 && big.usage.input_tokens + big.usage.output_tokens <= 4096);
});

test('thinking types map onto the reasoning switch: enabled, adaptive -> thinking block; disabled -> text', async () => {
  for (const [thinking, first] of [[{ type: 'enabled', budget_tokens: 1024 }, 'thinking'], [{ type: 'adaptive' }, 'thinking'],
    [{ type: 'disabled' }, 'text']]) {
    const m = await anthropic.messages.create({ model: MODEL, max_tokens: 6, temperature: 0, thinking,
      messages: [{ role: 'user', content: 'Hi' }] });
    assert.equal(m.content[0].type, first, JSON.stringify(thinking));
  }
  const e = await errorOf(anthropic.messages.create({ model: MODEL, max_tokens: 6, thinking: { type: 'sometimes' },
    messages: [{ role: 'user', content: 'Hi' }] }));
  assert.equal(e.status, 400);
  assert.match(e.error.error.message, /thinking.type: must be one of enabled, adaptive, disabled/);
});

test('messages.stream with thinking and tools: typed events, tool_choice any / tool accepted', async () => {
  for (const tool_choice of [{ type: 'auto' }, { type: 'any' }, { type: 'tool', name: 'Bash' }]) {
    const stream = anthropic.messages.stream({ ...claudeLike, max_tokens: 10, tool_choice });
    const events = [];
    stream.on('streamEvent', (e) => events.push(e));
    const final = await stream.finalMessage();
    assert.equal(events[0].type, 'message_start');
    assert.equal(events.at(-1).type, 'message_stop');
    assert.equal(final.content[0].type, 'thinking');
    assert.ok(final.content[0].thinking.length > 0);
    assert.ok(['max_tokens', 'end_turn', 'tool_use'].includes(final.stop_reason));
    assert.equal(final.usage.output_tokens, 10);
  }
  const e = await errorOf(anthropic.messages.create({ ...claudeLike, max_tokens: 6, tool_choice: { type: 'tool' } }));
  assert.equal(e.status, 400);
});

test('Anthropic tool round trip: tool_use -> tool_result -> the answer, streamed', async () => {
  const stream = anthropic.messages.stream({
    model: MODEL, max_tokens: 6, temperature: 0, thinking: { type: 'disabled' }, tools: claudeLike.tools,
    messages: [
      { role: 'user', content: 'List files.' },
      { role: 'assistant', content: [{ type: 'thinking', thinking: 'use Bash', signature: '' },
        { type: 'tool_use', id: 'toolu_1', name: 'Bash', input: { command: 'ls' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: [{ type: 'text', text: 'a.txt' }] }] },
    ],
  });
  const final = await stream.finalMessage();
  assert.equal(final.content[0].type, 'text');
  assert.ok(final.content[0].text.length > 0);
});

test('HEAD / and GET / answer 200 without a key (Claude Code probes the base URL)', async () => {
  const h = await fetch(`${URL}/`, { method: 'HEAD' });
  assert.equal(h.status, 200);
  const g = await fetch(`${URL}/`);
  assert.equal(g.status, 200);
  assert.equal((await g.json()).status, 'ok');
});
