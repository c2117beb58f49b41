// Scoring through `tessera serve` as lm-evaluation-harness and vLLM clients do it: /v1/completions with
// echo + logprobs (max_tokens 0 included) returns the prompt tokens' logprobs, and vLLM's prompt_logprobs.
// Started by tests/integration/server_run.sh on the demo model (models/tessera-demo: real weights, its
// own tokenizer; served under the test name qwen3-tiny), with prefix caching on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const MODEL = 'qwen3-tiny';
const openai = new OpenAI({ baseURL: `${URL}/v1`, apiKey: KEY, maxRetries: 0 });
const hdrs = { 'content-type': 'application/json', authorization: `Bearer ${KEY}` };
const post = (path, body) => fetch(`${URL}${path}`, { method: 'POST', headers: hdrs, body: JSON.stringify(body) });
const PROMPT = 'Love is a grave mental disease.';

async function tokenize(prompt) {
  const r = await post('/tokenize', { model: MODEL, prompt, add_special_tokens: false });
  assert.equal(r.status, 200);
  return (await r.json()).tokens;
}

const close = (a, b, tol, what) => assert.ok(Math.abs(a - b) <= tol, `${what}: ${a} vs ${b}`);

test('echo + logprobs + max_tokens 0 (lm-evaluation-harness loglikelihood) with the OpenAI client', async () => {
  const ids = await tokenize(PROMPT);
  assert.ok(ids.length >= 5);
  const r = await openai.completions.create({ model: MODEL, prompt: PROMPT, echo: true, max_tokens: 0, logprobs: 1, temperature: 0 });
  const c = r.choices[0];
  assert.equal(c.text, PROMPT);
  assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 0);
  assert.equal(r.usage.prompt_tokens, ids.length);
  const lp = c.logprobs;
  assert.equal(lp.tokens.length, ids.length);
  assert.equal(lp.tokens.join(''), PROMPT);
  assert.equal(lp.token_logprobs[0], null, 'the first token has no logprob (OpenAI, vLLM)');
  assert.equal(lp.top_logprobs[0], null);
  assert.deepEqual(lp.text_offset.slice(0, 2), [0, lp.tokens[0].length]);
  for (let i = 1; i < ids.length; ++i) {
    assert.equal(typeof lp.token_logprobs[i], 'number');
    assert.ok(lp.token_logprobs[i] <= 0);
    const top = Object.entries(lp.top_logprobs[i]);
    assert.equal(top.length, 1);
    assert.ok(top[0][1] >= lp.token_logprobs[i] - 1e-6, 'the top token is at least as likely as the prompt token');
  }
  assert.equal(c.prompt_logprobs.length, ids.length, 'echo with logprobs reports prompt_logprobs too (vLLM)');
  assert.equal(c.prompt_logprobs[0], null);
  for (let i = 1; i < ids.length; ++i) close(c.prompt_logprobs[i][String(ids[i])].logprob, lp.token_logprobs[i], 1e-6, `token ${i}`);
});

// The logprobs of generated tokens (decode steps) and of the same tokens scored as a prompt (one
// prefill), through prompt token ids so that nothing is retokenized; the same scoring request twice,
// after a plain request put the prompt in the prefix cache, gives the same entries.
test('prompt logprobs equal the generated tokens\' logprobs and ignore the prefix cache', async () => {
  const ids = await tokenize('Love is');  // continued in plain words (" what you've been"), which retokenize alike
  const gen = await (await post('/v1/completions', { model: MODEL, prompt: ids, max_tokens: 4, logprobs: 0, temperature: 0, ignore_eos: true })).json();
  const out = await tokenize(gen.choices[0].text);
  const genLps = gen.choices[0].logprobs.token_logprobs;
  assert.equal(genLps.length, 4);
  const all = [...ids, ...out];
  const score = async () => {
    const r = await post('/v1/completions', { model: MODEL, prompt: all, echo: true, max_tokens: 0, logprobs: 0 });
    assert.equal(r.status, 200);
    return (await r.json()).choices[0].logprobs.token_logprobs;
  };
  assert.equal(out.length, 4, `the continuation ${JSON.stringify(gen.choices[0].text)} retokenizes to 4 tokens`);
  const first = await score();
  assert.equal(first.length, all.length);
  for (let k = 0; k < 4; ++k) close(first[ids.length + k], genLps[k], 2e-3, `generated token ${k}`);
  const second = await score();
  assert.deepEqual(second, first, 'a repeated scoring request (prefix cache warm) must give the same entries');
});

test('echo with generation: the prompt\'s entries, then the completion\'s', async () => {
  const ids = await tokenize(PROMPT);
  const r = await (await post('/v1/completions', { model: MODEL, prompt: PROMPT, echo: true, max_tokens: 3, logprobs: 2, temperature: 0, ignore_eos: true })).json();
  const c = r.choices[0];
  assert.ok(c.text.startsWith(PROMPT));
  assert.equal(c.logprobs.tokens.length, ids.length + 3);
  assert.equal(c.logprobs.token_logprobs[0], null);
  assert.equal(r.usage.completion_tokens, 3);
  for (let i = 1; i < ids.length + 3; ++i) assert.equal(Object.keys(c.logprobs.top_logprobs[i]).length, 2);
  const offs = c.logprobs.text_offset;
  for (let i = 1; i < offs.length; ++i) assert.equal(offs[i], offs[i - 1] + c.logprobs.tokens[i - 1].length);
});

test('streamed echo + logprobs: the first chunk carries the prompt and its logprobs', async () => {
  const ids = await tokenize(PROMPT);
  const stream = await openai.completions.create({ model: MODEL, prompt: PROMPT, echo: true, max_tokens: 2, logprobs: 1, temperature: 0, ignore_eos: true, stream: true });
  const chunks = [];
  for await (const ch of stream) chunks.push(ch);
  const first = chunks[0].choices[0];
  assert.ok(first.text.startsWith(PROMPT));
  assert.equal(first.logprobs.token_logprobs[0], null);
  assert.equal(first.logprobs.tokens.length, ids.length + 1);
  const text = chunks.map((ch) => ch.choices[0]?.text ?? '').join('');
  assert.ok(text.startsWith(PROMPT) && text.length > PROMPT.length);
});

test('vLLM prompt_logprobs on completions (no echo) and on chat', async () => {
  const ids = await tokenize(PROMPT);
  const r = await (await post('/v1/completions', { model: MODEL, prompt: PROMPT, max_tokens: 1, prompt_logprobs: 2 })).json();
  const pl = r.choices[0].prompt_logprobs;
  assert.equal(pl.length, ids.length);
  assert.equal(pl[0], null);
  assert.equal(r.choices[0].logprobs, null);
  for (let i = 1; i < ids.length; ++i) {
    const e = pl[i][String(ids[i])];
    assert.ok(e, `entry ${i} has the prompt token ${ids[i]}`);
    assert.ok(e.logprob <= 0 && e.rank >= 1 && typeof e.decoded_token === 'string');
    const ranks = Object.values(pl[i]).map((v) => v.rank).sort((a, b) => a - b);
    assert.ok(ranks.includes(1) && ranks.includes(2), `top 2 at ${i}: ${JSON.stringify(pl[i])}`);
    if (e.rank === 1) assert.equal(Math.max(...Object.values(pl[i]).map((v) => v.logprob)), e.logprob);
  }
  const chat = await (await post('/v1/chat/completions', { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, prompt_logprobs: 0 })).json();
  assert.equal(chat.prompt_logprobs[0], null);
  assert.equal(chat.prompt_logprobs.length, chat.usage.prompt_tokens);
  assert.equal(Object.keys(chat.prompt_logprobs[1]).length, 1);
  const plain = await (await post('/v1/completions', { model: MODEL, prompt: PROMPT, max_tokens: 1 })).json();
  assert.equal(plain.choices[0].prompt_logprobs, undefined, 'no prompt_logprobs unless asked');
});

test('bad scoring requests answer 400 with an OpenAI error body', async () => {
  const cases = [
    [{ prompt: 'a', prompt_logprobs: 1, stream: true }, /prompt_logprobs.*stream/],
    [{ prompt: 'a', prompt_logprobs: -1 }, /prompt_logprobs/],
    [{ prompt: 'a', prompt_logprobs: 21 }, /^Requested prompt logprobs of 21, which is greater than max allowed: 20$/],
    [{ prompt: 'a', prompt_logprobs: 'x' }, /prompt_logprobs/],
    [{ prompt: 'a', prompt_logprobs: 1.5 }, /prompt_logprobs/],
    [{ prompt: 'a', max_tokens: 0 }, /max_tokens must be at least 1/],
    [{ prompt: 'a', max_tokens: -1 }, /max_tokens/],
    [{ prompt: 'a b', echo: true, max_tokens: 0, logprobs: 21 }, /^Requested sample logprobs of 21, which is greater than max allowed: 20$/],
    [{ prompt: 'a', echo: 'yes', max_tokens: 0 }, /echo/],
  ];
  for (const [body, re] of cases) {
    const r = await post('/v1/completions', { model: MODEL, ...body });
    assert.equal(r.status, 400, JSON.stringify(body));
    const j = await r.json();
    assert.equal(j.error.code, 400);
    assert.equal(j.error.type, 'BadRequestError');
    assert.match(j.error.message, re, JSON.stringify(body));
  }
  const h = await fetch(`${URL}/health`);
  assert.equal(h.status, 200, 'the server is still healthy');
});
