// Bad-input suite for `tessera serve`: each case gets its documented status and error body, and
// the server keeps serving after every one. Started by tests/integration/server_run.sh with
// --http-read-timeout 2 (the slow-client cases rely on it). Also run against the ASan build.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const { hostname: HOST, port: PORT } = new globalThis.URL(URL);
const MODEL = 'qwen3-tiny';
const auth = { 'content-type': 'application/json', authorization: `Bearer ${KEY}` };
const msgs = [{ role: 'user', content: 'hi' }];

// A pooled keep-alive connection that sat idle past the server's 2 s read timeout (the slow
// cases wait that long) is closed by the server; a request that fails on it at the socket,
// before any response, is sent once more on a new connection, as HTTP clients do.
const closedSocket = (e) => e instanceof TypeError && ['UND_ERR_SOCKET', 'ECONNRESET'].includes(e.cause?.code);

async function send(path, body, { method = 'POST', headers = auth, raw = false } = {}) {
  const init = { method, headers, body: raw ? body : body === undefined ? undefined : JSON.stringify(body) };
  let r;
  try {
    r = await fetch(`${URL}${path}`, init);
  } catch (e) {
    if (!closedSocket(e)) throw e;
    r = await fetch(`${URL}${path}`, init);
  }
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

// Raw bytes over TCP; resolves with everything the server sent before closing (or after `waitMs`).
function rawExchange(chunks, { waitMs = 5000, delayMs = 0 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(Number(PORT), HOST);
    let data = '';
    const t0 = Date.now();
    const done = () => { clearTimeout(timer); s.destroy(); resolve({ data, ms: Date.now() - t0 }); };
    const timer = setTimeout(done, waitMs);
    s.on('data', (d) => { data += d.toString('latin1'); });
    s.on('close', done);
    s.on('error', done);
    s.on('connect', async () => {
      for (const c of chunks) {
        if (s.destroyed) break;
        s.write(c);
        if (delayMs) await new Promise((r) => setTimeout(r, delayMs));
      }
    });
  });
}

function assertOpenAIError(res, status, pattern) {
  assert.equal(res.status, status, `status (body: ${res.text.slice(0, 300)})`);
  assert.ok(res.json && res.json.error, `an error object (body: ${res.text.slice(0, 300)})`);
  assert.equal(typeof res.json.error.message, 'string');
  assert.equal(typeof res.json.error.type, 'string');
  assert.ok('param' in res.json.error && 'code' in res.json.error);
  if (pattern) assert.match(res.json.error.message, pattern);
}

// GET /health, retried once like send() when the pooled connection was closed.
async function getHealth() {
  try {
    return await fetch(`${URL}/health`);
  } catch (e) {
    if (!closedSocket(e)) throw e;
    return await fetch(`${URL}/health`);
  }
}

let served = 0;
async function stillServing() {
  const h = await getHealth();
  assert.equal(h.status, 200, 'health after the case');
  if (++served % 8 === 0) {
    const r = await send('/v1/chat/completions', { model: MODEL, messages: msgs, max_tokens: 2 });
    assert.equal(r.status, 200, 'a good request after the case');
    assert.equal(r.json.object, 'chat.completion');
  }
}

const chat = (body) => send('/v1/chat/completions', body);
const base = (extra) => ({ model: MODEL, messages: msgs, max_tokens: 4, ...extra });
// A JSON body with an extra field holding `depth` nested arrays (built as text: JSON.stringify recurses).
const nestedBody = (obj, depth) => JSON.stringify(obj).slice(0, -1) + ',"extra":' + '['.repeat(depth) + ']'.repeat(depth) + '}';
const deepBody = (obj) => nestedBody(obj, 50000);

// [name, request, status, message pattern]
const cases = [
  ['invalid JSON', () => send('/v1/chat/completions', '{"model": ', { raw: true }), 400, /not valid JSON/],
  ['empty body', () => send('/v1/chat/completions', '', { raw: true }), 400, /empty/],
  ['body is a list', () => chat([1, 2]), 400, /JSON object/],
  ['body is a string', () => chat('hello'), 400, /JSON object/],
  ['JSON with NaN', () => send('/v1/chat/completions', '{"messages": NaN}', { raw: true }), 400, /not valid JSON/],
  ['invalid UTF-8', () => send('/v1/chat/completions', Buffer.concat([Buffer.from('{"model":"qwen3-tiny","messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}]}')]), { raw: true }), 400, /not valid JSON/],
  ['deeply nested JSON', () => send('/v1/chat/completions', '['.repeat(100000) + ']'.repeat(100000), { raw: true }), 400, null],
  // One extra field holding 50,000 nested arrays took the whole server down (stack overflow in the
  // recursive copies after parsing); the nesting limit answers 400 before anything walks the body.
  ...['/v1/chat/completions', '/v1/completions', '/tokenize'].map((path) =>
    [`${path}: 50,000 nested arrays in a field`, () => send(path, deepBody({ model: MODEL, messages: msgs, prompt: 'hi', max_tokens: 2 }), { raw: true }), 400, /more than 128 levels/]),
  ['tool call arguments nested 50,000 deep', () => chat(base({ messages: [msgs[0], { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{"a":'.repeat(50000) + '1' + '}'.repeat(50000) } }] }, { role: 'tool', tool_call_id: 'c1', content: 'x' }] })), 400, /more than 128 levels/],
  ['messages missing', () => chat({ model: MODEL }), 400, /messages/],
  ['messages is a string', () => chat({ model: MODEL, messages: 'hi' }), 400, /messages/],
  ['messages empty', () => chat({ model: MODEL, messages: [] }), 400, /at least one/],
  ['message not an object', () => chat({ model: MODEL, messages: [1] }), 400, /messages\[0\]/],
  ['role missing', () => chat({ model: MODEL, messages: [{ content: 'x' }] }), 400, /role/],
  ['unknown role', () => chat({ model: MODEL, messages: [{ role: 'wizard', content: 'x' }] }), 400, /wizard/],
  ['role is a number', () => chat({ model: MODEL, messages: [{ role: 7, content: 'x' }] }), 400, /role/],
  ['content is a number', () => chat({ model: MODEL, messages: [{ role: 'user', content: 5 }] }), 400, /content/],
  ['content part of unknown type', () => chat({ model: MODEL, messages: [{ role: 'user', content: [{ type: 'hologram' }] }] }), 400, null],
  ['1,000 messages', () => chat({ model: MODEL, messages: Array.from({ length: 1000 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: 'hello there' })) }), 400, /maximum context length/],
  ['5,000 messages (over the limit)', () => chat({ model: MODEL, messages: Array.from({ length: 5000 }, () => ({ role: 'user', content: 'x' })) }), 400, /at most/],
  ['max_tokens is a string', () => chat(base({ max_tokens: '10' })), 400, /max_tokens/],
  ['max_tokens negative', () => chat(base({ max_tokens: -5 })), 400, /max_tokens/],
  ['max_tokens zero', () => chat(base({ max_tokens: 0 })), 400, /max_tokens/],
  ['max_tokens huge', () => chat(base({ max_tokens: 1e20 })), 400, /max_tokens/],
  ['max_tokens past the context', () => chat(base({ max_tokens: 4090 })), 400, /maximum context length is 4096/],
  // Logprob entries of one answer are bounded (2^20): 16 choices x 4,000 tokens x (20 + 1), and 16 prompts of
  // 3,500 tokens x (20 + 1) prompt logprobs, would each make a response of about 100 MB.
  ['logprobs over the response budget', () => send('/v1/completions', { model: MODEL, prompt: 'hi', max_tokens: 4000, n: 16, logprobs: 20 }), 400, /logprob entries.*more than the 1048576/],
  ['prompt_logprobs over the response budget', () => send('/v1/completions', { model: MODEL, prompt: Array.from({ length: 16 }, () => Array.from({ length: 3500 }, (_, i) => 100 + (i % 1000))), max_tokens: 1, prompt_logprobs: 20 }), 400, /logprob entries.*fewer prompt_logprobs/],
  // Errors about a Responses request's max_output_tokens name that field, not the max_tokens it becomes inside.
  ...[['a string', 'ten'], ['huge', 1e20]].map(([what, value]) =>
    [`/v1/responses: max_output_tokens ${what}`, () => send('/v1/responses', { model: MODEL, input: 'hi', max_output_tokens: value }), 400, /^(?!.*\bmax_tokens\b).*max_output_tokens/]),
  // A token id above 2^63 - 1 is reported as sent, not wrapped to a negative number.
  ['/detokenize: token id 2^63', () => send('/detokenize', '{"tokens": [9223372036854775808]}', { raw: true }), 400, /token id 9223372036854775808 is outside/],
  ['temperature is a string', () => chat(base({ temperature: 'hot' })), 400, /temperature/],
  ['temperature negative', () => chat(base({ temperature: -1 })), 400, /temperature/],
  ['top_p above 1', () => chat(base({ top_p: 5 })), 400, /top_p/],
  ['n zero', () => chat(base({ n: 0 })), 400, /'n'/],
  ['n huge', () => chat(base({ n: 1000 })), 400, /'n'/],
  ['n is a string', () => chat(base({ n: 'two' })), 400, /n/],
  ['stop is a number', () => chat(base({ stop: 5 })), 400, /stop/],
  ['too many stop strings', () => chat(base({ stop: Array.from({ length: 100 }, (_, i) => `s${i}`) })), 400, /stop/],
  ['logit_bias not an object', () => chat(base({ logit_bias: [1, 2] })), 400, /logit_bias/],
  ['logit_bias too large', () => chat(base({ logit_bias: Object.fromEntries(Array.from({ length: 5000 }, (_, i) => [String(i), 1])) })), 400, /logit_bias/],
  ['logit_bias bad key', () => chat(base({ logit_bias: { abc: 1 } })), 400, /logit_bias/],
  ['seed is a string', () => chat(base({ seed: 'abc' })), 400, /seed/],
  ['stream is a string', () => chat(base({ stream: 'yes' })), 400, /stream/],
  ['stream_options not an object', () => chat(base({ stream: true, stream_options: 3 })), 400, /stream_options/],
  ['tools not a list', () => chat(base({ tools: {} })), 400, /tools/],
  ['tool without function', () => chat(base({ tools: [{ type: 'function' }], tool_choice: 'none' })), 400, /tools\[0\]\.function/],
  ['tool parameters not a schema', () => chat(base({ tools: [{ type: 'function', function: { name: 'f', parameters: 'x' } }], tool_choice: 'none' })), 400, /parameters/],
  ['tool with empty name', () => chat(base({ tools: [{ type: 'function', function: { name: '' } }], tool_choice: 'none' })), 400, /name/],
  ['tool_choice auto without --enable-auto-tool-choice', () => chat(base({ tools: [{ type: 'function', function: { name: 'f' } }] })), 400, /enable-auto-tool-choice/],
  ['tool_choice unknown word', () => chat(base({ tool_choice: 'sometimes' })), 400, /tool_choice/],
  ['response_format json_schema', () => chat(base({ response_format: { type: 'json_schema', json_schema: {} } })), 400, /response_format/],
  ['chat_template_kwargs not an object', () => chat(base({ chat_template_kwargs: 3 })), 400, /chat_template_kwargs/],
  ['model is a number', () => chat(base({ model: 3 })), 400, /model/],
  ['unknown model', () => chat(base({ model: 'gpt-5' })), 404, /does not exist/],
  ['no API key', () => send('/v1/chat/completions', base({}), { headers: { 'content-type': 'application/json' } }), 401, /API key/],
  ['wrong API key', () => send('/v1/chat/completions', base({}), { headers: { ...auth, authorization: 'Bearer nope' } }), 401, /API key/],
  ['GET on a POST endpoint', () => send('/v1/chat/completions', undefined, { method: 'GET' }), 405, /not allowed/],
  ['unknown path', () => send('/v1/engines', {}), 404, /not an endpoint/],
  ['completions: prompt missing', () => send('/v1/completions', { model: MODEL }), 400, /prompt/],
  ['completions: prompt is an object', () => send('/v1/completions', { model: MODEL, prompt: {} }), 400, /prompt/],
  ['completions: empty prompt list', () => send('/v1/completions', { model: MODEL, prompt: [] }), 400, /empty/],
  ['completions: token id out of range', () => send('/v1/completions', { model: MODEL, prompt: [999999999] }), 400, /vocabulary/],
  ['completions: too many prompts', () => send('/v1/completions', { model: MODEL, prompt: Array.from({ length: 1000 }, () => 'x') }), 400, /at most/],
  ['completions: mixed prompt list', () => send('/v1/completions', { model: MODEL, prompt: ['a', 3] }), 400, /prompt/],
  // Integers are range-checked before they are narrowed (each of these wrapped to a valid value before).
  ['logit_bias key past 2^32', () => chat(base({ logit_bias: { 4294967296: 100 } })), 400, /not a token id/],
  ['stop_token_ids entry past 2^32', () => chat(base({ stop_token_ids: [4294967301] })), 400, /not a token id/],
  ['stop_token_ids with 2,000 entries', () => chat(base({ stop_token_ids: Array.from({ length: 2000 }, () => 1) })), 400, /at most 1024/],
  ['completions: logprobs 2^32', () => send('/v1/completions', { model: MODEL, prompt: 'hi', max_tokens: 2, logprobs: 4294967296 }), 400, /logprobs/],
  ['top_logprobs negative', () => chat(base({ logprobs: true, top_logprobs: -5 })), 400, /top_logprobs/],
  ['top_logprobs without logprobs', () => chat(base({ top_logprobs: 3 })), 400, /top_logprobs/],
  ['n past 2^32', () => chat(base({ n: 4294967297 })), 400, /'n'/],
  ['seed past 2^63', () => send('/v1/chat/completions', JSON.stringify(base({})).slice(0, -1) + ',"seed":18446744073709551615}', { raw: true }), 400, /seed/],
  // Inputs vLLM refuses.
  ['tool message without tool_call_id', () => chat(base({ messages: [...msgs, { role: 'tool', content: 'x' }] })), 400, /tool_call_id/],
  ['text part without text', () => chat(base({ messages: [{ role: 'user', content: [{ type: 'text' }] }] })), 400, /needs 'text'/],
  ['completions: best_of', () => send('/v1/completions', { model: MODEL, prompt: 'hi', max_tokens: 2, best_of: 2 }), 400, /best_of/],
  ['chat_template_kwargs sets bos_token', () => chat(base({ chat_template_kwargs: { bos_token: '<evil>' } })), 400, /bos_token/],
  ['chat_template_kwargs replaces raise_exception', () => chat(base({ chat_template_kwargs: { raise_exception: 1 } })), 400, /raise_exception/],
  ['invalid JSON in our words', () => send('/v1/chat/completions', '{"model": ', { raw: true }), 400, /^the request body is not valid JSON: (?![\s\S]*json\.exception)/],
  ['tokenize: nothing to tokenize', () => send('/tokenize', { model: MODEL }), 400, /prompt/],
  ['detokenize: strings as ids', () => send('/detokenize', { model: MODEL, tokens: ['a'] }), 400, /tokens/],
];

for (const [name, run, status, pattern] of cases) {
  test(`bad input: ${name}`, async () => {
    assertOpenAIError(await run(), status, pattern);
    await stillServing();
  });
}

// Anthropic endpoint: Anthropic's error shape.
const anthropicCases = [
  ['messages: max_tokens missing', { model: MODEL, messages: msgs }, 400, /max_tokens/],
  // (system-role messages inside `messages` are accepted: Claude Code sends them)
  ['messages: tool role inside messages', { model: MODEL, max_tokens: 4, messages: [{ role: 'tool', content: 'x' }] }, 400, /not one of user, assistant, system/],
  ['messages: unknown thinking type', { model: MODEL, max_tokens: 4, thinking: { type: 'always' }, messages: msgs }, 400, /thinking.type/],
  ['messages: tool_choice of an unknown type', { model: MODEL, max_tokens: 4, tool_choice: { type: 'some' }, tools: [{ name: 'f' }], messages: msgs }, 400, /tool_choice.type/],
  ['messages: tool_result without id', { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'tool_result' }] }] }, 400, /tool_use_id/],
  ['messages: n', { model: MODEL, max_tokens: 4, n: 2, messages: msgs }, 400, /\bn\b/],
  ['messages: temperature above 1', { model: MODEL, max_tokens: 4, temperature: 1.5, messages: msgs }, 400, /temperature/],
  ['messages: tool_use input not an object', { model: MODEL, max_tokens: 4, messages: [msgs[0], { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'f', input: 'x' }] }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'y' }] }] }, 400, /input must be an object/],
  ['messages: tool_result for no tool_use', { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'nope', content: 'y' }] }] }, 400, /matches no/],
  ['messages: a field of the wrong type, in our words', { model: MODEL, max_tokens: 4, messages: [msgs[0], { role: 'assistant', content: [{ type: 'thinking', thinking: 5 }] }, msgs[0]] }, 400, /^a field of the request has the wrong type(?![\s\S]*json\.exception)/],
  ['messages: tools with a bad schema', { model: MODEL, max_tokens: 4, tools: [{ name: 'f', input_schema: 'x' }], messages: msgs }, 400, /input_schema/],
];
for (const [name, body, status, pattern] of anthropicCases) {
  test(`bad input: ${name}`, async () => {
    const r = await send('/v1/messages', body, { headers: { 'content-type': 'application/json', 'x-api-key': KEY } });
    assert.equal(r.status, status, r.text);
    assert.equal(r.json.type, 'error');
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, pattern);
    await stillServing();
  });
}

// Text only: tessera loads no vision or audio encoder, so image, video and audio content gets one 400 on every
// API, in each API's error shape, before a chat template could render it as a placeholder token.
const textOnly = (kind, type) => new RegExp(`this server serves text only; ${kind} content \\(type '${type}'\\) is not supported`);
const imageUrl = { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } };
const openaiMediaCases = [
  ['image_url part', '/v1/chat/completions', base({ messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, imageUrl] }] }), 'image', 'image_url', /^messages\[0\]\.content\[1\]: /],
  ['input_image part', '/v1/chat/completions', base({ messages: [{ role: 'user', content: [{ type: 'input_image', image_url: 'https://example.com/a.png' }] }] }), 'image', 'input_image', /^messages\[0\]\.content\[0\]: /],
  ['video_url part', '/v1/chat/completions', base({ messages: [{ role: 'user', content: [{ type: 'video_url', video_url: { url: 'https://example.com/v.mp4' } }] }] }), 'video', 'video_url', null],
  ['input_audio part', '/v1/chat/completions', base({ messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }] }] }), 'audio', 'input_audio', null],
  ['image in a tool message', '/v1/chat/completions', base({ messages: [msgs[0], { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] }, { role: 'tool', tool_call_id: 'c1', content: [imageUrl] }] }), 'image', 'image_url', /^messages\[2\]/],
  ['image_url part, streamed', '/v1/chat/completions', base({ stream: true, messages: [{ role: 'user', content: [imageUrl] }] }), 'image', 'image_url', null],
  ['/tokenize with an image part', '/tokenize', { model: MODEL, messages: [{ role: 'user', content: [imageUrl] }] }, 'image', 'image_url', null],
  ['Responses input_image', '/v1/responses', { model: MODEL, max_output_tokens: 4, input: [{ role: 'user', content: [{ type: 'input_text', text: 'What is this?' }, { type: 'input_image', image_url: 'https://example.com/a.png' }] }] }, 'image', 'input_image', null],
];
for (const [name, path, body, kind, type, where] of openaiMediaCases) {
  test(`text only: ${name} gets 400`, async () => {
    const r = await send(path, body);
    assertOpenAIError(r, 400, textOnly(kind, type));
    assert.equal(r.json.error.type, 'BadRequestError');
    assert.match(r.headers.get('content-type'), /application\/json/);
    if (where) assert.match(r.json.error.message, where);
    if (path === '/v1/chat/completions') assert.equal(r.json.error.param, 'messages');
    await stillServing();
  });
}
const anthropicImage = { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } };
const anthropicMediaCases = [
  ['image block', [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, anthropicImage] }], /^messages\.0\.content: /],
  ['image inside a tool_result', [msgs[0], { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'f', input: {} }] }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: [anthropicImage] }] }], /^messages\.2: /],
];
for (const [name, messages, where] of anthropicMediaCases) {
  for (const path of ['/v1/messages', '/v1/messages/count_tokens']) {
    test(`text only: ${path} ${name} gets 400`, async () => {
      const r = await send(path, { model: MODEL, max_tokens: 4, messages }, { headers: { 'content-type': 'application/json', 'x-api-key': KEY } });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.type, 'error');
      assert.equal(r.json.error.type, 'invalid_request_error');
      assert.match(r.json.error.message, textOnly('image', 'image'));
      assert.match(r.json.error.message, where);
      await stillServing();
    });
  }
}

for (const path of ['/v1/messages', '/v1/messages/count_tokens']) {
  test(`bad input: ${path}: 50,000 nested arrays in a field`, async () => {
    const body = deepBody({ model: MODEL, max_tokens: 4, messages: msgs });
    const r = await send(path, body, { raw: true, headers: { 'content-type': 'application/json', 'x-api-key': KEY } });
    assert.equal(r.status, 400, r.text.slice(0, 300));
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, /more than 128 levels/);
    await stillServing();
  });
}

test('bad input: nesting just inside the limit is served', async () => {
  const r = await send('/v1/chat/completions', nestedBody(base({ max_tokens: 2 }), 120), { raw: true });
  assert.equal(r.status, 200, r.text.slice(0, 300));
  await stillServing();
});

test('auth: the Bearer scheme is case-insensitive', async () => {
  for (const scheme of ['BEARER', 'bearer', 'BeArEr']) {
    const r = await send('/v1/chat/completions', base({ max_tokens: 1 }), { headers: { ...auth, authorization: `${scheme} ${KEY}` } });
    assert.equal(r.status, 200, `${scheme}: ${r.text.slice(0, 200)}`);
  }
  await stillServing();
});

test('auth: routes under /v1 cannot be listed without the key', async () => {
  const noKey = { 'content-type': 'application/json' };
  assertOpenAIError(await send('/v1/engines', {}, { headers: noKey }), 401, /API key/);  // 404 with a key
  assertOpenAIError(await send('/v1/chat/completions', undefined, { method: 'GET', headers: noKey }), 401, /API key/);  // 405
  assertOpenAIError(await send('/v1', undefined, { method: 'GET', headers: noKey }), 401, /API key/);
  assertOpenAIError(await send('/v1/engines', {}), 404, /not an endpoint/);
  await stillServing();
});

// Without a valid key the answer comes as soon as the headers are in: the body (never sent here) is not
// awaited, where before the server waited for it until the read timeout closed the connection unanswered.
test('auth: a request without a key is answered 401 before its body', async () => {
  const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}:${PORT}\r\nContent-Type: application/json\r\n` +
    'Content-Length: 1000000\r\n\r\n{"model":';
  const { data, ms } = await rawExchange([head], { waitMs: 1500 });
  assert.match(data, /^HTTP\/1\.1 401 /, data.slice(0, 200));
  assert.match(data, /Connection: close/i);
  assert.ok(ms < 1500, `answered after ${ms} ms`);
  await stillServing();
});

test('bad input: body over --max-request-body-bytes gets 413', async () => {
  const big = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'x'.repeat(11 << 20) }] });
  const r = await send('/v1/chat/completions', big, { raw: true });
  assertOpenAIError(r, 413, /larger than the server allows/);
  await stillServing();
});

test('bad input: 413 by Content-Length before the body is sent', async () => {
  const r = await rawExchange([`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${64 << 20}\r\nExpect: 100-continue\r\n\r\n`]);
  assert.match(r.data, /^HTTP\/1\.1 413 /);
  assert.doesNotMatch(r.data, /100 Continue/);
  await stillServing();
});

test('bad input: header flood gets 431', async () => {
  let head = 'GET /health HTTP/1.1\r\nHost: x\r\n';
  for (let i = 0; i < 2000; i++) head += `X-Flood-${i}: ${'a'.repeat(40)}\r\n`;
  const r = await rawExchange([head + '\r\n']);
  assert.match(r.data, /^HTTP\/1\.1 431 /);
  assert.match(r.data, /"error"/);
  await stillServing();
});

test('bad input: HTTP garbage gets 400', async () => {
  const r = await rawExchange(['\x00\x01GARBAGE \xff\xfe\r\n\r\n']);
  assert.match(r.data, /^HTTP\/1\.1 400 /);
  await stillServing();
});

test('bad input: bad HTTP version gets 400', async () => {
  const r = await rawExchange(['GET /health HTTP/9.9.9\r\n\r\n']);
  assert.match(r.data, /^HTTP\/1\.1 400 /);
  await stillServing();
});

test('bad input: unsupported Expect gets 417', async () => {
  // With the key: a request without one is answered 401 from its headers, before the Expect is looked at.
  const r = await rawExchange([`POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nExpect: magic\r\nContent-Length: 2\r\n\r\n{}`]);
  assert.match(r.data, /^HTTP\/1\.1 417 /);
  await stillServing();
});

test('bad input: slowloris headers are cut by the read timeout', async () => {
  // One header byte every 300 ms: the 2 s read timeout closes the connection long before it ends.
  const bytes = 'GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'a'.repeat(200) + '\r\n\r\n';
  const slow = rawExchange(bytes.split(''), { delayMs: 300, waitMs: 15000 });
  // Meanwhile others are served.
  for (let i = 0; i < 3; i++) assert.equal((await getHealth()).status, 200);
  const r = await slow;
  assert.equal(r.data, '', 'no answer to an incomplete request');
  assert.ok(r.ms < 6000, `closed after ${r.ms} ms`);
  await stillServing();
});

test('bad input: a body that never completes is cut by the read timeout', async () => {
  const r = await rawExchange([`POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: 100\r\n\r\n{"pro`], { waitMs: 15000 });
  assert.equal(r.data, '');
  assert.ok(r.ms < 6000, `closed after ${r.ms} ms`);
  await stillServing();
});

test('bad input: an idle keep-alive connection is closed by the read timeout', async () => {
  const r = await rawExchange(['GET /health HTTP/1.1\r\nHost: x\r\n\r\n'], { waitMs: 15000 });
  assert.match(r.data, /^HTTP\/1\.1 200 /);
  assert.ok(r.ms < 6000, `closed after ${r.ms} ms`);
  await stillServing();
});

test('bad input: a client that disconnects mid-body', async () => {
  await rawExchange(['POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"mod'], { waitMs: 100 });
  await stillServing();
});

test('bad input: keep-alive serves several requests, and pipelined ones, on one connection', async () => {
  const req = 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n';
  const r = await rawExchange([req + req + 'GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n']);
  assert.equal((r.data.match(/HTTP\/1\.1 200 /g) || []).length, 3);
  assert.match(r.data, /"version"/);
});
