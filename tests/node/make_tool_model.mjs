// Writes a Qwen3-architecture model (real Qwen3 vocabulary, 2 layers, hidden 64, f32 safetensors) whose
// weights are set by hand so that, greedy or sampled, it answers
//   - a conversation without a tool result:   <tool_call>{"name":"get_weather","arguments":{"days":3}}</tool_call>
//   - a conversation with a tool result:       Warm
// With thinking on it first closes the (empty) think block: </think><tool_call>... or </think>Warm.
// so tool round trips (the model's call -> the client's result -> the model's answer) can be tested
// on CPU through the real chat template, tokenizer and parsers.
//   node make_tool_model.mjs OUT_DIR [MAX_POSITIONS]
// How: every token of the call has its own one-hot embedding dimension and lm_head maps it to the
// next token (a bigram chain that starts at the prompt's last token: "\n\n" after "</think>" with
// thinking off, "\n" after "assistant" with thinking on, which leads to "</think>"). One attention
// head of layer 0 looks for <tool_response> (query from "\n\n" and "</think>", key on
// <tool_response>, in the lowest-frequency rotary pair so position does not matter) and writes a
// "tool result seen" dimension that makes "Warm" win over <tool_call>. Everything else is zero.
import fs from 'node:fs';
import path from 'node:path';

const out = process.argv[2];
if (!out) throw new Error('usage: node make_tool_model.mjs OUT_DIR [MAX_POSITIONS]');
const MAX_POSITIONS = Number(process.argv[3] || 4096);
const V = 151936, H = 64, HEADS = 4, KV = 2, HD = 16, I = 128, LAYERS = 2;

// Qwen3 token ids (tokenizer-qwen3): "\n\n" <tool_call> {" name ":" get _weather "," arguments ":{" days ": 3 }} </tool_call>
const NN = 271, N = 198, END_THINK = 151668;
const call = [151657, 4913, 606, 3252, 455, 69364, 2198, 16370, 22317, 13778, 788, 18, 3417, 151658];
const IM_END = 151645, TOOL_RESPONSE = 151665, WARM = 95275;
const chain = [NN, ...call, IM_END]; // each token -> the next
const dimOf = new Map();
for (const t of [...chain.slice(0, -1), N, END_THINK, WARM, TOOL_RESPONSE]) dimOf.set(t, dimOf.size);
const SEEN = dimOf.size; // the "tool result seen" dimension
const Q_DIM = 7; // rotary pair (7, 15) turns by at most 1e6^(-14/16) rad per position: ~constant

const tensors = [];
const add = (name, shape, fill) => {
  const a = new Float32Array(shape.reduce((x, y) => x * y, 1));
  if (fill) fill(a);
  tensors.push({ name, shape, a });
};
const ones = (a) => a.fill(1);
add('model.embed_tokens.weight', [V, H], (a) => { for (const [t, d] of dimOf) a[t * H + d] = 1; });
add('lm_head.weight', [V, H], (a) => {
  for (let i = 0; i + 1 < chain.length; i++) a[chain[i + 1] * H + dimOf.get(chain[i])] = 10;
  a[END_THINK * H + dimOf.get(N)] = 100; // "\n" -> </think> (above Warm's 80 when a result was seen)
  a[call[0] * H + dimOf.get(END_THINK)] = 10; // </think> -> <tool_call>
  a[WARM * H + SEEN] = 10; // "\n\n" or </think> + seen: 10 * 8 (attention output) beats <tool_call>'s 10
  a[IM_END * H + dimOf.get(WARM)] = 1000; // Warm -> end, whatever else the context adds
});
add('model.norm.weight', [H], ones);
for (let l = 0; l < LAYERS; l++) {
  const p = `model.layers.${l}.`;
  add(p + 'input_layernorm.weight', [H], ones);
  add(p + 'post_attention_layernorm.weight', [H], ones);
  add(p + 'self_attn.q_norm.weight', [HD], ones);
  add(p + 'self_attn.k_norm.weight', [HD], (a) => { a.fill(1); if (l === 0) a[Q_DIM] = 100; });
  add(p + 'self_attn.q_proj.weight', [HEADS * HD, H], (a) => {
    if (l === 0) for (const t of [NN, END_THINK]) a[Q_DIM * H + dimOf.get(t)] = 1;
  });
  add(p + 'self_attn.k_proj.weight', [KV * HD, H], (a) => { if (l === 0) a[Q_DIM * H + dimOf.get(TOOL_RESPONSE)] = 1; });
  add(p + 'self_attn.v_proj.weight', [KV * HD, H], (a) => { if (l === 0) a[0 * H + dimOf.get(TOOL_RESPONSE)] = 1; });
  add(p + 'self_attn.o_proj.weight', [H, HEADS * HD], (a) => { if (l === 0) a[SEEN * HEADS * HD + 0] = 1; });
  add(p + 'mlp.gate_proj.weight', [I, H]);
  add(p + 'mlp.up_proj.weight', [I, H]);
  add(p + 'mlp.down_proj.weight', [H, I]);
}

const header = {};
let offset = 0;
for (const t of tensors) {
  header[t.name] = { dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + t.a.byteLength] };
  offset += t.a.byteLength;
}
let hjson = JSON.stringify(header);
hjson += ' '.repeat((8 - (hjson.length % 8)) % 8);
const len = Buffer.alloc(8);
len.writeBigUInt64LE(BigInt(hjson.length));
fs.mkdirSync(out, { recursive: true });
const fd = fs.openSync(path.join(out, 'model.safetensors'), 'w');
fs.writeSync(fd, len);
fs.writeSync(fd, Buffer.from(hjson));
for (const t of tensors) fs.writeSync(fd, new Uint8Array(t.a.buffer));
fs.closeSync(fd);
fs.writeFileSync(path.join(out, 'config.json'), JSON.stringify({
  architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', attention_bias: false, head_dim: HD, hidden_act: 'silu',
  hidden_size: H, intermediate_size: I, max_position_embeddings: MAX_POSITIONS, num_attention_heads: HEADS,
  num_hidden_layers: LAYERS, num_key_value_heads: KV, rms_norm_eps: 1e-6, rope_theta: 1000000,
  tie_word_embeddings: false, torch_dtype: 'float32', vocab_size: V, bos_token_id: 151643, eos_token_id: IM_END,
}, null, 1));
