// Structured output through `tessera serve` with the official clients, as applications use it: OpenAI's
// response_format (json_object, json_schema, zod through the SDK's helper), the Responses API's text.format,
// vLLM's structured_outputs and guided_* fields, a required or named tool_choice (hermes format) and
// Anthropic's forced tools. Every output is checked here, by Ajv (a JSON Schema validator) or by the
// regex/choice/grammar itself, never by the server. Started by tests/integration/server_run.sh on the demo
// model (real weights: every schema's output must end and validate) or, with TESSERA_TEST_NOISE_MODEL=1, on
// the tiny random Qwen3, whose output is noise: only the constraint shapes it, and inside a string with no
// maxLength noise may not reach a closing quote before max_tokens, so there an output that ends by length is
// allowed (at most a third of them) and every one that ends by stop must validate.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { z } from 'zod';
import { zodResponseFormat } from 'openai/helpers/zod';

const URL = process.env.TESSERA_URL;
const KEY = process.env.TESSERA_API_KEY;
const MODEL = 'qwen3-tiny';
const ROOT = path.resolve(path.dirname(new globalThis.URL(import.meta.url).pathname), '../..');
const openai = new OpenAI({ baseURL: `${URL}/v1`, apiKey: KEY, maxRetries: 0, timeout: 300000 });
const anthropic = new Anthropic({ baseURL: URL, apiKey: KEY, maxRetries: 0, timeout: 300000 });
const hdrs = { 'content-type': 'application/json', authorization: `Bearer ${KEY}` };
const post = async (p, body) => {
  const r = await fetch(`${URL}${p}`, { method: 'POST', headers: hdrs, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
};
// Sampled (a random-weight model's greedy output repeats itself inside a string forever), thinking off (the
// constraint then starts at the first token), room to finish.
const BASE = { model: MODEL, temperature: 1.0, max_tokens: 600, chat_template_kwargs: { enable_thinking: false } };
const ask = (content) => [{ role: 'user', content }];

const NOISE = process.env.TESSERA_TEST_NOISE_MODEL === '1';
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

// Ajv reads draft 2020-12: older drafts' boolean exclusiveMinimum/Maximum and tuple `items` are rewritten
// to it (the server accepts both spellings).
function draft2020(s) {
  if (Array.isArray(s)) return s.map(draft2020);
  if (!s || typeof s !== 'object') return s;
  const o = Object.fromEntries(Object.entries(s).map(([k, v]) => [k, draft2020(v)]));
  for (const [ex, bound] of [['exclusiveMinimum', 'minimum'], ['exclusiveMaximum', 'maximum']])
    if (typeof o[ex] === 'boolean') {
      if (o[ex] && bound in o) o[ex] = o[bound], delete o[bound];
      else delete o[ex];
    }
  if (Array.isArray(o.items)) {
    o.prefixItems = o.items;
    delete o.items;
    if ('additionalItems' in o) o.items = o.additionalItems, delete o.additionalItems;
  }
  return o;
}

function schemas() {
  const dir = path.join(ROOT, 'tests/grammar/schemas');
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.json')).sort();
  const cap = Number(process.env.TESSERA_TEST_STRUCTURED_SCHEMAS || files.length);
  return files.slice(0, cap).map((f) => ({ name: f, schema: JSON.parse(fs.readFileSync(path.join(dir, f))).schema }));
}

function checkJson(text, schema, what) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    assert.fail(`${what}: not JSON (${e.message}): ${JSON.stringify(text.slice(0, 300))}`);
  }
  if (schema !== undefined) {
    const validate = ajv.compile(draft2020(schema));
    assert.ok(validate(value), `${what}: ${ajv.errorsText(validate.errors)} in ${text.slice(0, 300)}`);
  }
  return value;
}

test('response_format json_schema: every schema, batched with free requests, streaming and not', async () => {
  const all = schemas();
  assert.ok(all.length >= 30 || process.env.TESSERA_TEST_STRUCTURED_SCHEMAS, `only ${all.length} schemas`);
  let ended = 0, cut = 0;
  const runs = all.map(async ({ name, schema }, i) => {
    const body = { ...BASE, seed: i, max_tokens: 1500, messages: ask(`Give me ${name} as JSON.`),
                   response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } } };
    let text, finish;
    if (i % 2 === 0) {
      const r = await openai.chat.completions.create(body);
      text = r.choices[0].message.content;
      finish = r.choices[0].finish_reason;
    } else {
      const stream = await openai.chat.completions.create({ ...body, stream: true });
      text = '';
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        if (c?.delta?.content) text += c.delta.content;
        if (c?.finish_reason) finish = c.finish_reason;
      }
    }
    if (NOISE && finish === 'length') return ++cut;
    assert.equal(finish, 'stop', `${name}: ended with ${finish} after ${JSON.stringify(text.slice(-80))}`);
    checkJson(text, schema, name);
    ++ended;
  });
  // Unconstrained requests in the same batches.
  const free = Array.from({ length: 4 }, (_, i) =>
    openai.chat.completions.create({ ...BASE, seed: 100 + i, max_tokens: 16, messages: ask('Say something.') }));
  await Promise.all([...runs, ...free]);
  assert.ok(cut <= all.length / 3, `${cut} of ${all.length} outputs ran to max_tokens`);
  console.log(`# ${ended} outputs ended and validated, ${cut} ran to max_tokens`);
});

test('json_object, the Responses API text.format and the zod helper', async () => {
  const obj = await openai.chat.completions.create({ ...BASE, seed: 1, messages: ask('JSON please'),
                                                     response_format: { type: 'json_object' } });
  // (json_object allows any strings: prose inside one may also run to max_tokens.)
  if (obj.choices[0].finish_reason === 'length') {
    assert.match(obj.choices[0].message.content, /^\s*\{/);
  } else {
    const v = checkJson(obj.choices[0].message.content, undefined, 'json_object');
    assert.ok(v !== null && typeof v === 'object' && !Array.isArray(v), 'json_object gives an object');
  }

  const schema = { type: 'object', properties: { city: { type: 'string', maxLength: 40 }, days: { type: 'integer' } },
                   required: ['city', 'days'], additionalProperties: false };
  const r = await openai.responses.create({ model: MODEL, input: 'Plan a trip', temperature: 1.0, max_output_tokens: 400,
                                            reasoning: { effort: 'none' },
                                            text: { format: { type: 'json_schema', name: 'trip', schema, strict: true } } });
  assert.equal(r.status, 'completed');
  checkJson(r.output_text, schema, 'responses text.format');
  assert.equal(r.text.format.type, 'json_schema');

  const Weather = z.object({ city: z.string().max(30), unit: z.enum(['c', 'f']), temps: z.array(z.number()).max(3) });
  const parsed = await openai.beta.chat.completions.parse({ ...BASE, seed: 2, messages: ask('Weather?'),
                                                           response_format: zodResponseFormat(Weather, 'weather') });
  const w = parsed.choices[0].message.parsed;
  assert.ok(Weather.safeParse(w).success, JSON.stringify(w));
});

test("vLLM's guided_* and structured_outputs fields: regex, choice, grammar, json", async () => {
  const regex = '(\\+|-)?[0-9]{3}-[0-9]{4}( ext\\. [0-9]{2,4})?';
  const choices = ['positive', 'negative', 'neutral'];
  // Arithmetic expressions (GBNF; bounded, so that a noise model's output ends too): the output must be one.
  const grammar = 'root ::= expr\nexpr ::= term (("+" | "-") term){0,3}\nterm ::= factor (("*" | "/") factor){0,2}\n' +
                  'factor ::= num | "(" num (("+" | "-" | "*" | "/") num){0,3} ")"\nnum ::= [0-9]{1,4}\n';
  const arith = /^(?:[0-9]+|\(.*\))(?:[-+*/](?:[0-9]+|\(.*\)))*$/;
  const cases = [
    [{ guided_regex: regex }, (t) => assert.match(t, new RegExp(`^${regex}$`))],
    [{ structured_outputs: { regex } }, (t) => assert.match(t, new RegExp(`^${regex}$`))],
    [{ guided_choice: choices }, (t) => assert.ok(choices.includes(t), t)],
    [{ structured_outputs: { choice: choices } }, (t) => assert.ok(choices.includes(t), t)],
    [{ guided_grammar: grammar, max_tokens: 200 }, (t) => assert.match(t, arith)],
    [{ structured_outputs: { grammar } , max_tokens: 200 }, (t) => assert.match(t, arith)],
    [{ guided_json: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false } },
     (t) => assert.equal(typeof checkJson(t, undefined, 'guided_json').ok, 'boolean')],
    [{ structured_outputs: { json: '{"type": "array", "items": {"type": "integer"}, "maxItems": 4}' } },
     (t) => assert.ok(Array.isArray(checkJson(t, undefined, 'structured_outputs.json')))],
  ];
  await Promise.all(cases.map(async ([extra, check], i) => {
    for (const endpoint of ['chat', 'completions']) {
      const r = endpoint === 'chat'
        ? await post('/v1/chat/completions', { ...BASE, seed: i, messages: ask('Answer.'), ...extra })
        : await post('/v1/completions', { ...BASE, seed: i, prompt: 'Answer:', ...extra });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const c = r.body.choices[0];
      const text = endpoint === 'chat' ? c.message.content : c.text;
      assert.equal(c.finish_reason, 'stop', `${JSON.stringify(extra)} ${endpoint}: ${JSON.stringify(text)}`);
      check(text);
    }
  }));
});

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {
    city: { type: 'string', maxLength: 30 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
    required: ['city', 'unit'], additionalProperties: false } } },
  { type: 'function', function: { name: 'add', parameters: { type: 'object', properties: {
    a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'], additionalProperties: false } } },
];

// (One call each: with parallel calls allowed a model may chain calls until max_tokens cuts the last one.)
test('tool_choice required and a named function always give valid calls', async () => {
  for (const [choice, names] of [['required', ['get_weather', 'add']],
                                 [{ type: 'function', function: { name: 'add' } }, ['add']]]) {
    for (let seed = 0; seed < 3; ++seed) {
      const r = await openai.chat.completions.create({ ...BASE, seed, messages: ask('Use a tool.'), tools: TOOLS,
                                                       tool_choice: choice, parallel_tool_calls: false });
      const m = r.choices[0].message;
      assert.ok(m.tool_calls?.length >= 1, `no tool call: ${JSON.stringify(m)}`);
      assert.equal(r.choices[0].finish_reason, 'tool_calls');
      for (const call of m.tool_calls) {
        assert.ok(names.includes(call.function.name), call.function.name);
        const tool = TOOLS.find((t) => t.function.name === call.function.name);
        checkJson(call.function.arguments, tool.function.parameters, `${call.function.name} arguments`);
      }
    }
  }
});

test("Anthropic's forced tool (tool_choice tool / any) gives a valid tool_use", async () => {
  const tools = TOOLS.map((t) => ({ name: t.function.name, input_schema: t.function.parameters }));
  // (disable_parallel_tool_use: one call, as for OpenAI's parallel_tool_calls false above.)
  for (const tool_choice of [{ type: 'tool', name: 'get_weather', disable_parallel_tool_use: true },
                             { type: 'any', disable_parallel_tool_use: true }]) {
    // (Anthropic forbids forced tools with extended thinking: thinking off, as a client sends it.)
    const r = await anthropic.messages.create({ model: MODEL, max_tokens: 400, temperature: 1.0, tools, tool_choice,
                                                thinking: { type: 'disabled' },
                                                messages: [{ role: 'user', content: 'Weather in Paris?' }] });
    const uses = r.content.filter((b) => b.type === 'tool_use');
    assert.ok(uses.length >= 1, JSON.stringify(r.content));
    assert.equal(r.stop_reason, 'tool_use');
    for (const u of uses) {
      const tool = tools.find((t) => t.name === u.name);
      assert.ok(tool, u.name);
      if (tool_choice.type === 'tool') assert.equal(u.name, 'get_weather');
      const validate = ajv.compile(tool.input_schema);
      assert.ok(validate(u.input), `${u.name}: ${ajv.errorsText(validate.errors)} ${JSON.stringify(u.input)}`);
    }
  }
});

test('structural_tag: free text, and every tagged part validates (response_format and structured_outputs)', async () => {
  const weather = { type: 'object', properties: { n: { type: 'integer' }, ok: { type: 'boolean' } },
                    required: ['n', 'ok'], additionalProperties: false };
  const ping = { type: 'object', properties: { at: { type: 'integer' } }, additionalProperties: false };
  // Hermes-style calls, as a client that parses them itself asks for them (no tools in the request, so the
  // server's tool parser leaves the text as it is).
  const call = (name, schema) => ({ begin: `<tool_call>\n{"name": "${name}", "arguments": `, schema,
                                    end: '}\n</tool_call>' });
  // The trigger is "<", one token in any tokenizer: biased up, it makes even a random-weight model write tags
  // (the grammar then forces the rest of a begin; the schemas leave no room for "<" inside a tag).
  const tag = { structures: [call('get_weather', weather), call('ping', ping)], triggers: ['<'] };
  const schemaOf = { get_weather: weather, ping };
  const tok = await post('/tokenize', { model: MODEL, prompt: '<', add_special_tokens: false });
  assert.equal(tok.body.tokens.length, 1, JSON.stringify(tok.body));
  const logit_bias = { [tok.body.tokens[0]]: 30 };
  const check = (text, finish, what) => {
    const re = /<tool_call>\n\{"name": "(get_weather|ping)", "arguments": ([\s\S]*?)\}\n<\/tool_call>/g;
    let m, tags = 0, last = 0;
    while ((m = re.exec(text))) {
      checkJson(m[2], schemaOf[m[1]], `${what}: ${m[1]}`);
      ++tags, last = re.lastIndex;
    }
    // After the last complete tag: free text, or (cut by max_tokens) free text and the start of one tag.
    const tail = text.slice(last), opened = tail.split('<').length - 1;
    if (finish === 'stop') assert.equal(opened, 0, `${what}: a tag left open or malformed: ${tail}`);
    else assert.ok(finish === 'length' && opened <= 1, `${what}: ${finish} after ${tail}`);
    return tags;
  };
  const body = { ...BASE, seed: 3, max_tokens: 200, logit_bias, messages: ask('Check the weather.') };
  const a = await openai.chat.completions.create({ ...body, response_format: { type: 'structural_tag', ...tag } });
  const tagsA = check(a.choices[0].message.content, a.choices[0].finish_reason, 'response_format');
  // vLLM's client form: structured_outputs.structural_tag as JSON text; streamed.
  const stream = await openai.chat.completions.create({ ...body, seed: 4, stream: true,
                                                        structured_outputs: { structural_tag: JSON.stringify(tag) } });
  let text = '', finish;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (c?.delta?.content) text += c.delta.content;
    if (c?.finish_reason) finish = c.finish_reason;
  }
  const tagsB = check(text, finish, 'structured_outputs.structural_tag');
  assert.ok(tagsA >= 1 && tagsB >= 1, `too few tags: ${JSON.stringify(a.choices[0].message.content)} ${JSON.stringify(text)}`);
  // Without the bias the output is free text (and any tag in it validates).
  const free = await post('/v1/chat/completions', { ...BASE, seed: 5, max_tokens: 40, messages: ask('Hi'),
                                                    response_format: { type: 'structural_tag', ...tag } });
  assert.equal(free.status, 200, JSON.stringify(free.body));
  check(free.body.choices[0].message.content, free.body.choices[0].finish_reason, 'free text');
  console.log(`# structural_tag: ${tagsA} + ${tagsB} tags validated`);
});

test('what cannot be served is a 400 that names the field', async () => {
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', not: {} } } } },
     /response_format.*not/],
    [{ guided_regex: '(a' }, /guided_regex/],
    [{ guided_regex: '(?<=a)b' }, /guided_regex/],
    [{ guided_grammar: 'root ::= undefined_rule' }, /guided_grammar/],
    [{ guided_json: { type: 'object' }, guided_regex: 'a' }, /guided_json.*guided_regex/],
    [{ response_format: { type: 'json_object' }, structured_outputs: { regex: 'a' } }, /both constrain/],
    [{ structured_outputs: { regex: 'a', choice: ['b'] } }, /exactly one/],
    [{ structured_outputs: { structural_tag: '{}' } }, /structured_outputs.structural_tag.structures/],
    [{ response_format: { type: 'structural_tag', triggers: ['<f'],
                          structures: [{ begin: '<g>', schema: {}, end: '</g>' }] } }, /none of the triggers/],
    [{ response_format: { type: 'structural_tag', triggers: ['<f'],
                          structures: [{ begin: '<f>', schema: { type: 'object', not: {} }, end: '</f>' }] } },
     /response_format.*structures\[0\]\.schema.*not/],
    [{ structured_outputs: { jsn: {} } }, /structured_outputs.jsn/],
    [{ guided_whitespace_pattern: ' *' }, /guided_whitespace_pattern/],
    [{ thinking_token_budget: 10 }, /thinking_token_budget/],
    [{ chat_template: '{{ messages }}' }, /chat_template/],
    [{ return_tokens_as_token_ids: true }, /return_tokens_as_token_ids/],
    [{ allowed_token_ids: [] }, /allowed_token_ids/],
    [{ bad_words: [3] }, /bad_words/],
    [{ truncate_prompt_tokens: 0 }, /truncate_prompt_tokens/],
  ];
  for (const [extra, re] of cases) {
    const r = await post('/v1/chat/completions', { ...BASE, max_tokens: 4, messages: ask('Hi'), ...extra });
    assert.equal(r.status, 400, `${JSON.stringify(extra)} -> ${JSON.stringify(r.body)}`);
    assert.match(r.body.error.message, re, JSON.stringify(extra));
  }
  // A schema the model cannot finish in max_tokens ends with "length", not a hang.
  const r = await post('/v1/chat/completions', { ...BASE, max_tokens: 5, messages: ask('Hi'),
                                                 guided_json: { type: 'array', items: { type: 'integer' }, minItems: 50 } });
  assert.equal(r.status, 200);
  assert.equal(r.body.choices[0].finish_reason, 'length');
});

test('allowed_token_ids, bad_words and truncate_prompt_tokens act', async () => {
  const tok = await post('/tokenize', { model: MODEL, prompt: ' the the the', add_special_tokens: false });
  const the = tok.body.tokens[0];
  const a = await post('/v1/completions', { ...BASE, prompt: 'x', max_tokens: 6, ignore_eos: true,
                                            allowed_token_ids: [the], logprobs: 0 });
  assert.equal(a.status, 200);
  assert.equal(a.body.choices[0].text, ' the'.repeat(6));
  const b = await post('/v1/completions', { ...BASE, prompt: 'x', max_tokens: 6, ignore_eos: true,
                                            allowed_token_ids: [the, the + 1], bad_words: ['the'] });
  assert.equal(b.status, 200);
  assert.ok(!b.body.choices[0].text.includes(' the'), b.body.choices[0].text);
  const long = 'word '.repeat(200);
  const t = await post('/v1/completions', { ...BASE, prompt: long, max_tokens: 1, truncate_prompt_tokens: 10 });
  assert.equal(t.status, 200);
  assert.equal(t.body.usage.prompt_tokens, 10);
});

test('with thinking on, the constraint starts after the reasoning ends', async (t) => {
  const tok = await post('/tokenize', { model: MODEL, prompt: '</think>', add_special_tokens: false });
  if (tok.body.tokens?.length !== 1) return t.skip('this model has no </think> token');
  const end = tok.body.tokens[0];
  const schema = { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'], additionalProperties: false };
  // The bias makes the first token the end of the reasoning; from there the schema holds (the bias cannot
  // bring </think> back: the grammar does not allow it).
  const r = await post('/v1/chat/completions', { ...BASE, chat_template_kwargs: { enable_thinking: true },
                                                 logit_bias: { [end]: 100 }, messages: ask('Think, then answer.'),
                                                 response_format: { type: 'json_schema', json_schema: { name: 'n', schema } } });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  const m = r.body.choices[0].message;
  assert.equal(r.body.choices[0].finish_reason, 'stop');
  checkJson(m.content, schema, 'content after the reasoning');
});
