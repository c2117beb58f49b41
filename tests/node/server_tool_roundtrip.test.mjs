// Tool round trips through the official SDKs on the hand-set model of make_tool_model.mjs (started by
// tests/integration/tool_model_run.sh): the request names the function in tool_choice, the model calls
// get_weather({"days":3}) (through the hermes tool parser), the client sends the tool's result back,
// and the model answers "Warm". Thinking is off (the model's call starts after "</think>\n\n").
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const MODEL = 'qwen3-tiny';
const openai = new OpenAI({ baseURL: `${URL}/v1`, apiKey: KEY, maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: URL, apiKey: KEY, maxRetries: 0 });
const params = { type: 'object', properties: { days: { type: 'integer' } }, required: ['days'] };

test('Responses API: forced function call -> function_call_output -> answer (create, then stream)', async () => {
  const tools = [{ type: 'function', name: 'get_weather', description: 'forecast', parameters: params, strict: false },
    { type: 'web_search' }];
  const base = { model: MODEL, tools, reasoning: { effort: 'none' }, max_output_tokens: 40 };
  const input = [{ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Weather for 3 days?' }] }];
  const first = await openai.responses.create({ ...base, input, tool_choice: { type: 'function', name: 'get_weather' } });
  assert.equal(first.status, 'completed');
  assert.equal(first.output.length, 1);
  const call = first.output[0];
  assert.equal(call.type, 'function_call');
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.arguments), { days: 3 });
  assert.match(call.id, /^fc_/);
  assert.ok(call.call_id.length > 0);

  // Streamed, the same call arrives as output_item.added + function_call_arguments.delta events.
  const stream = openai.responses.stream({ ...base, input, tool_choice: { type: 'function', name: 'get_weather' } });
  const events = [];
  stream.on('event', (e) => events.push(e));
  const streamed = await stream.finalResponse();
  const added = events.find((e) => e.type === 'response.output_item.added');
  assert.equal(added.item.type, 'function_call');
  assert.equal(added.item.name, 'get_weather');
  const args = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  assert.deepEqual(JSON.parse(args), { days: 3 });
  assert.equal(events.find((e) => e.type === 'response.function_call_arguments.done').arguments, args);
  assert.equal(events.at(-1).type, 'response.completed');
  assert.equal(streamed.output[0].arguments, args);

  // The client runs the tool and sends the whole conversation back (store: false, as Codex does).
  const next = [...input, { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
    { type: 'function_call_output', call_id: call.call_id, output: '{"forecast":"warm"}' }];
  const answer = await openai.responses.create({ ...base, input: next, store: false });
  assert.equal(answer.status, 'completed');
  assert.equal(answer.output[0].type, 'message');
  assert.equal(answer.output_text, 'Warm');
  const s2 = openai.responses.stream({ ...base, input: next });
  let text = '';
  s2.on('response.output_text.delta', (e) => { text += e.delta; });
  await s2.done();
  assert.equal(text, 'Warm');
});

test('Anthropic Messages: tool_choice tool -> tool_use (input_json_delta) -> tool_result -> answer', async () => {
  const tools = [{ name: 'get_weather', description: 'forecast', input_schema: params }];
  const base = { model: MODEL, max_tokens: 40, tools, thinking: { type: 'disabled' } };
  const messages = [{ role: 'user', content: 'Weather for 3 days?' }];
  const stream = anthropic.messages.stream({ ...base, messages, tool_choice: { type: 'tool', name: 'get_weather' } });
  const events = [];
  stream.on('streamEvent', (e) => events.push(e));
  const m = await stream.finalMessage();
  assert.equal(m.stop_reason, 'tool_use');
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, { days: 3 });
  const start = events.find((e) => e.type === 'content_block_start' && e.content_block.type === 'tool_use');
  assert.equal(start.content_block.name, 'get_weather');
  const partial = events.filter((e) => e.type === 'content_block_delta' && e.delta.type === 'input_json_delta')
    .map((e) => e.delta.partial_json).join('');
  assert.deepEqual(JSON.parse(partial), { days: 3 });

  const answer = await anthropic.messages.create({
    ...base,
    messages: [...messages, { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'warm' }] }],
  });
  assert.equal(answer.stop_reason, 'end_turn');
  assert.deepEqual(answer.content, [{ type: 'text', text: 'Warm' }]);
});
