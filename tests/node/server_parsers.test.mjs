// Reasoning and tool-call parsers through `tessera serve` (started by server_run.sh with
// --reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes). The dummy model's
// random text has no </think>, so with thinking on everything is reasoning_content (vLLM's rule
// for output cut off while thinking) and with enable_thinking=false everything is content.
// tool_choice modes are checked for their answers; the random text calls no tool.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const MODEL = 'qwen3-tiny';
const openai = new OpenAI({ baseURL: `${URL}/v1`, apiKey: KEY, maxRetries: 0 });
const msgs = [{ role: 'user', content: 'Think, then answer.' }];
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const greedy = { model: MODEL, messages: msgs, max_tokens: 12, temperature: 0, ignore_eos: true };

test('reasoning split, non-streaming and streaming agree', async () => {
  const r = await openai.chat.completions.create(greedy);
  const m = r.choices[0].message;
  assert.equal(typeof m.reasoning_content, 'string');
  assert.ok(m.reasoning_content.length > 0);
  assert.equal(m.content, '');
  const s = await openai.chat.completions.create({ ...greedy, stream: true });
  let reasoning = '', content = '';
  for await (const c of s) for (const ch of c.choices) {
    reasoning += ch.delta.reasoning_content || '';
    content += ch.delta.content || '';
  }
  assert.equal(reasoning, m.reasoning_content);
  assert.equal(content, '');
});

test('enable_thinking=false: all content', async () => {
  const r = await openai.chat.completions.create({ ...greedy, chat_template_kwargs: { enable_thinking: false } });
  assert.equal(r.choices[0].message.reasoning_content, null);
  assert.ok(r.choices[0].message.content.length > 0);
});

test('tools with tool_choice auto, required, named, none', async () => {
  for (const tool_choice of [undefined, 'auto', 'required', 'none', { type: 'function', function: { name: 'get_weather' } }]) {
    const r = await openai.chat.completions.create({ ...greedy, tools, tool_choice, chat_template_kwargs: { enable_thinking: false } });
    assert.ok(Array.isArray(r.choices[0].message.tool_calls), JSON.stringify(tool_choice));
    assert.ok(['length', 'stop', 'tool_calls'].includes(r.choices[0].finish_reason));
  }
  await assert.rejects(openai.chat.completions.create({ ...greedy, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }),
    (e) => e.status === 400);
});

test('tools, streamed', async () => {
  const s = await openai.chat.completions.create({ ...greedy, tools, stream: true, stream_options: { include_usage: true } });
  let finish = null, usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.ok(finish);
  assert.equal(usage.completion_tokens, 12);
});

test('Anthropic: thinking block from the reasoning parser', async () => {
  const anthropic = new Anthropic({ baseURL: URL, apiKey: KEY, maxRetries: 0 });
  const m = await anthropic.messages.create({ model: MODEL, max_tokens: 8, messages: [{ role: 'user', content: 'Hi' }], thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.equal(m.content[0].type, 'thinking');
});

test('Anthropic: streamed thinking block (thinking_delta events)', async () => {
  const anthropic = new Anthropic({ baseURL: URL, apiKey: KEY, maxRetries: 0 });
  const stream = anthropic.messages.stream({ model: MODEL, max_tokens: 8, messages: [{ role: 'user', content: 'Hi' }], thinking: { type: 'enabled', budget_tokens: 1024 } });
  const events = [];
  stream.on('streamEvent', (e) => events.push(e));
  const final = await stream.finalMessage();
  assert.equal(events[0].type, 'message_start');
  assert.equal(events[1].type, 'content_block_start');
  assert.equal(events[1].content_block.type, 'thinking');
  assert.ok(events.some((e) => e.type === 'content_block_delta' && e.delta.type === 'thinking_delta'));
  assert.equal(events.at(-1).type, 'message_stop');
  assert.equal(final.content[0].type, 'thinking');
  assert.ok(final.content[0].thinking.length > 0);
});
