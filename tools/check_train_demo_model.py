#!/usr/bin/env python3
"""Local check of tools/train_demo_model.py's own torch code, without transformers (which cannot be
installed here): runs with Debian's python3-torch (1.13, CPU) and python3-jinja2:

    apt-get install -y python3-torch python3-jinja2 && /usr/bin/python3 tools/check_train_demo_model.py

It builds a small mock of transformers' Qwen3.5-MoE module tree (same attribute names, a router
returning (logits, weights, indices), fused 3-D experts, zero-centred RMSNorm, decoder layers called
with position_embeddings/attention_mask/position_ids keywords), then checks: the MTP head's
structure and tensor names; that joint training lowers both losses on data whose token t+2 is a
function of token t (x[t+2] = x[t] + 3); the load-balancing loss; save_model's per-expert layout
of the MTP experts and mtp_num_hidden_layers; the load_mtp round trip; the quatrain counter; and
that the Jinja chat template (rendered as transformers does) equals the Python rendering the
training uses on the corpus. The device's --smoke run checks the rest against real transformers.
"""
import json, os, sys, types, tempfile, random
import torch
from torch import nn
import torch.nn.functional as F

# fake safetensors.torch (torch.save underneath)
st = types.ModuleType("safetensors"); stt = types.ModuleType("safetensors.torch")
stt.load_file = lambda p: torch.load(p)
stt.save_file = lambda t, p, metadata=None: torch.save({k: v.clone() for k, v in t.items()}, p)
st.torch = stt; sys.modules["safetensors"] = st; sys.modules["safetensors.torch"] = stt
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_demo_model as T
_orig_pre = nn.Module.register_forward_pre_hook
def _pre(self, hook, with_kwargs=False):  # torch 1.13 has no with_kwargs (torch >= 2.0 has): emulate it
    if not with_kwargs:
        return _orig_pre(self, hook)
    orig = self.forward
    def f(*a, **kw):
        hook(self, a, kw)
        return orig(*a, **kw)
    self.forward = f
nn.Module.register_forward_pre_hook = _pre

class Norm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__(); self.eps = eps; self.weight = nn.Parameter(torch.zeros(dim))
    def forward(self, x):
        o = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (o * (1 + self.weight.float())).type_as(x)

class Router(nn.Module):
    def __init__(s, c):
        super().__init__(); s.k = c.num_experts_per_tok; s.weight = nn.Parameter(torch.zeros(c.num_experts, c.hidden_size))
    def forward(s, x):
        lg = F.linear(x.reshape(-1, x.shape[-1]), s.weight); p = lg.float().softmax(-1)
        v, i = p.topk(s.k, -1); v = v / v.sum(-1, keepdim=True)
        return lg, v.to(lg.dtype), i

class Experts(nn.Module):
    def __init__(s, c):
        super().__init__(); E, H, I = c.num_experts, c.hidden_size, c.moe_intermediate_size
        s.gate_up_proj = nn.Parameter(torch.randn(E, 2 * I, H) * .02); s.down_proj = nn.Parameter(torch.randn(E, H, I) * .02)
    def forward(s, x, idx, w):
        out = torch.zeros_like(x)
        for e in range(s.gate_up_proj.shape[0]):
            pos, tok = torch.where((idx == e).T)
            if len(tok) == 0: continue
            g, u = F.linear(x[tok], s.gate_up_proj[e]).chunk(2, -1)
            out.index_add_(0, tok, (F.linear(F.silu(g) * u, s.down_proj[e]) * w[tok, pos, None]).to(out.dtype))
        return out

class MoE(nn.Module):
    def __init__(s, c):
        super().__init__(); s.gate = Router(c); s.experts = Experts(c)
    def forward(s, x):
        B, T, H = x.shape; f = x.reshape(-1, H); _, w, i = s.gate(f); return s.experts(f, i, w).reshape(B, T, H)

class Attn(nn.Module):
    def __init__(s, c):
        super().__init__(); H = c.hidden_size; s.q_proj = nn.Linear(H, H, bias=False); s.k_proj = nn.Linear(H, H, bias=False)
        s.v_proj = nn.Linear(H, H, bias=False); s.o_proj = nn.Linear(H, H, bias=False); s.q_norm = Norm(H)
    def forward(s, x, position_embeddings, attention_mask=None, position_ids=None):
        cos, sin = position_embeddings
        q = s.q_norm(s.q_proj(x)) * cos + sin; k = s.k_proj(x) * cos; v = s.v_proj(x)
        T_ = x.shape[1]
        a = (q @ k.transpose(1, 2)) / q.shape[-1] ** 0.5
        a = a.masked_fill(torch.ones(T_, T_, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return s.o_proj(a @ v)

class Layer(nn.Module):
    def __init__(s, c, idx):
        super().__init__(); s.t = c.layer_types[idx]
        if s.t == "full_attention": s.self_attn = Attn(c)
        else: s.linear_attn = nn.Linear(c.hidden_size, c.hidden_size, bias=False)
        s.mlp = MoE(c); s.input_layernorm = Norm(c.hidden_size); s.post_attention_layernorm = Norm(c.hidden_size)
    def forward(s, x, position_embeddings, attention_mask=None, position_ids=None, past_key_values=None):
        r = x; h = s.input_layernorm(x)
        h = s.self_attn(h, position_embeddings, attention_mask, position_ids) if s.t == "full_attention" else s.linear_attn(h)
        x = r + h; return x + s.mlp(s.post_attention_layernorm(x))

class Inner(nn.Module):
    def __init__(s, c):
        super().__init__(); s.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        s.layers = nn.ModuleList([Layer(c, i) for i in range(c.num_hidden_layers)]); s.norm = Norm(c.hidden_size)
    def forward(s, input_ids, use_cache=False):
        x = s.embed_tokens(input_ids); T_ = x.shape[1]
        pos = torch.arange(T_)[None].expand(x.shape[0], -1)
        pe = (torch.cos(pos[..., None] * 0.01).to(x.dtype), torch.sin(pos[..., None] * 0.01).to(x.dtype))
        for l in s.layers: x = l(x, position_embeddings=pe, attention_mask=None, position_ids=pos, past_key_values=None)
        return types.SimpleNamespace(last_hidden_state=s.norm(x))

class Model(nn.Module):
    def __init__(s, c):
        super().__init__(); s.config = c; s.model = Inner(c); s.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        s.lm_head.weight = s.model.embed_tokens.weight

c = types.SimpleNamespace(hidden_size=32, num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, vocab_size=50, rms_norm_eps=1e-6,
                          initializer_range=0.02)
torch.manual_seed(0)
m = Model(c)
mtp, full_idx = T.make_mtp(m)
assert full_idx == 3
names = sorted(mtp.state_dict())
print(names)
for must in ["pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "fc.weight", "norm.weight",
             "layers.0.self_attn.q_proj.weight", "layers.0.mlp.experts.gate_up_proj", "layers.0.mlp.gate.weight"]:
    assert must in names, must
assert mtp.fc.weight.shape == (32, 64)
assert not torch.equal(mtp.layers[0].self_attn.q_proj.weight, m.model.layers[3].self_attn.q_proj.weight)
lkw = T.LayerKwargs(m.model.layers[full_idx])
routers = T.RouterLogits([l.mlp.gate for l in m.model.layers] + [mtp.layers[0].mlp.gate])
params = list(m.parameters()) + list(mtp.parameters())
opt = torch.optim.AdamW(params, lr=3e-3)
# learnable data: x[t+2] = (x[t] + 3) % 50 so the MTP head can learn it; check both losses fall
g = torch.Generator().manual_seed(1)
first = None
for step in range(150):
    x = torch.zeros(8, 24, dtype=torch.long); x[:, 0] = torch.randint(0, 50, (8,), generator=g); x[:, 1] = torch.randint(0, 50, (8,), generator=g)
    for t in range(2, 24): x[:, t] = (x[:, t - 2] + 3) % 50
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = T.forward_losses(m, mtp, lkw, x, 0.3)
        aux = routers.balance_loss(4, 2)
    assert len(routers.logits) == 0 and aux is not None and aux.item() > 0.9, aux
    loss = a + 0.3 * b + 0.01 * aux
    opt.zero_grad(); loss.backward(); opt.step()
    if first is None: first = (a.item(), b.item())
# the MTP loss is, by definition, mean over t of CE(lm_head(mtp(embed(x[t+1]), hidden[t])), x[t+2]), per position
with torch.no_grad():
    x = torch.randint(0, 50, (2, 10), generator=g)
    a2, b2 = T.forward_losses(m, mtp, lkw, x, 0.3)
    h = m.model(x).last_hidden_state
    ce = []
    for bi in range(2):
        for t in range(8):
            emb = m.model.embed_tokens(x[bi:bi + 1]).clone()
            emb_next = torch.cat([emb[:, 1:], emb[:, -1:]], 1)
            assert torch.equal(emb_next[0, t], m.model.embed_tokens(x[bi, t + 1]))
            hm = mtp(emb_next, h[bi:bi + 1], lkw.kw)
            ce.append(F.cross_entropy(m.lm_head(hm)[0, t][None].float(), x[bi, t + 2][None]))
    routers.logits = []
    assert abs(torch.stack(ce).mean().item() - b2.item()) < 1e-4, (torch.stack(ce).mean().item(), b2.item())
    main_ref = F.cross_entropy(m.lm_head(h)[:, :-1].reshape(-1, 50).float(), x[:, 1:].reshape(-1))
    assert abs(main_ref.item() - a2.item()) < 1e-4
print("loss definitions ok")
print("losses first", first, "last", a.item(), b.item(), "aux", aux.item())
assert b.item() < first[1] * 0.5 and a.item() < first[0] * 0.8

# save_model with a mock save_pretrained writing per-expert tensors as transformers 5.17 does
def save_pretrained(out, safe_serialization=True):
    sd = {k: v.detach().clone() for k, v in m.state_dict().items() if k != "lm_head.weight"}
    for k in [k for k in sd if k.endswith("mlp.experts.gate_up_proj")]:
        T.to_per_expert(sd, k[:-len("gate_up_proj")], c.num_experts, c.moe_intermediate_size)
    torch.save(sd, os.path.join(out, "model.safetensors"))
    json.dump({"model_type": "qwen3_5_moe_text"}, open(os.path.join(out, "config.json"), "w"))
m.save_pretrained = save_pretrained
d = tempfile.mkdtemp()
ref_mtp = {k: v.detach().to(torch.bfloat16).clone() for k, v in mtp.state_dict().items()}
nbytes, per_expert = T.save_model(m, mtp, full_idx, d)
assert per_expert
saved = torch.load(os.path.join(d, "model.safetensors"))
mk = sorted(k for k in saved if k.startswith("mtp."))
print(len(mk), mk[:6])
assert "mtp.layers.0.mlp.experts.3.up_proj.weight" in saved and "mtp.layers.0.mlp.experts.gate_up_proj" not in saved
assert json.load(open(os.path.join(d, "config.json")))["mtp_num_hidden_layers"] == 1
# round trip: load_mtp on a fresh model rebuilds identical weights
m2 = Model(c)
mtp2, _ = T.load_mtp(m2, os.path.join(d, "model.safetensors"))
for k, v in mtp2.state_dict().items():
    assert torch.equal(v.to(torch.bfloat16), ref_mtp[k]), k
print("save/load round trip ok")
# quatrain check
assert T.is_quatrain("床前明月光，\n疑是地上霜。\n举头望明月，\n低头思故乡。")
assert not T.is_quatrain("床前明月光，\n疑是地上霜。\n举头望明月，")
assert not T.is_quatrain("床前明月光a，\n疑是地上霜。\n举头望明月，\n低头思故乡。")
assert T.is_quatrain("春眠不觉晓，处处闻啼鸟。\n夜来风雨声，花落知多少。\n" * 1, 5) is False

# chat template: Jinja as transformers renders it (sandbox, trim_blocks, lstrip_blocks) == render_chat
from jinja2.sandbox import ImmutableSandboxedEnvironment
tpl = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(T.CHAT_TEMPLATE)
data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_data", "train.jsonl")
n = 0
with open(data, encoding="utf-8") as f:
    for line in f:
        r = json.loads(line)
        if r["kind"] != "chat":
            continue
        assert tpl.render(messages=r["messages"]) == T.render_chat(r["messages"]), r["id"]
        for think in (True, False):
            assert tpl.render(messages=r["messages"][:1], add_generation_prompt=True, enable_thinking=think) == \
                T.render_chat(r["messages"][:1], True, think), r["id"]
        n += 1
        if n == 2000:
            break
print("chat template ok on", n, "conversations")
print("ALL OK")
