#!/usr/bin/env python3
"""GPT-2 built from torch.nn primitives: the reference oobleck's GPT-2 is checked against.

Reads and writes Hugging Face GPT-2 folders (model.safetensors + config.json) with nothing but
torch and the standard library (the safetensors format is parsed by hand), so that Debian's
python3-torch is enough.

  gpt2_reference.py eval  --model DIR --tokens FILE [--dtype uint16] --windows W
      prints {"loss": L, "windows": W}: the mean over windows of each window's mean token
      cross-entropy, window i = inputs tokens[i*T:(i+1)*T], targets shifted by one (T = n_positions)
  gpt2_reference.py write --out DIR --vocab V --d-model D --heads H --blocks N --seq-len T
                          [--untied] [--seed S]
      writes random GPT-2 weights (model.safetensors, F32) and config.json, as transformers would
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2)}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, width = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        count = math.prod(info["shape"]) if info["shape"] else 1
        assert end - begin == count * width, name
        raw = bytearray(data[base + begin:base + end])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(info["shape"]).to(torch.float32)
    return tensors


def write_safetensors(path, tensors):
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in tensors.items():
        t = t.detach().to(torch.float32).contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


class Block(nn.Module):
    def __init__(self, d, heads, eps):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, eps = cfg["n_embd"], cfg.get("layer_norm_epsilon", 1e-5)
        assert cfg.get("activation_function", "gelu_new") == "gelu_new"
        self.wte = nn.Embedding(cfg["vocab_size"], d)
        self.wpe = nn.Embedding(cfg["n_positions"], d)
        self.h = nn.ModuleList(Block(d, cfg["n_head"], eps) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(d, eps=eps)
        self.tied = cfg.get("tie_word_embeddings", True)
        self.lm_head = nn.Linear(d, cfg["vocab_size"], bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        weight = self.wte.weight if self.tied else self.lm_head.weight
        return F.linear(self.ln_f(x), weight)

    def load_hf(self, t):
        """Hugging Face names; Conv1D weights are [in, out]: a Linear holds their transpose."""
        with torch.no_grad():
            self.wte.weight.copy_(t["transformer.wte.weight"])
            self.wpe.weight.copy_(t["transformer.wpe.weight"])
            for i, b in enumerate(self.h):
                p = f"transformer.h.{i}."
                for ln in ("ln_1", "ln_2"):
                    getattr(b, ln).weight.copy_(t[p + ln + ".weight"])
                    getattr(b, ln).bias.copy_(t[p + ln + ".bias"])
                for ours, theirs in (("c_attn", "attn.c_attn"), ("c_proj", "attn.c_proj"), ("c_fc", "mlp.c_fc"),
                                     ("mlp_proj", "mlp.c_proj")):
                    getattr(b, ours).weight.copy_(t[p + theirs + ".weight"].t())
                    getattr(b, ours).bias.copy_(t[p + theirs + ".bias"])
            self.ln_f.weight.copy_(t["transformer.ln_f.weight"])
            self.ln_f.bias.copy_(t["transformer.ln_f.bias"])
            if not self.tied:
                self.lm_head.weight.copy_(t["lm_head.weight"])

    def hf_tensors(self):
        t = {"transformer.wte.weight": self.wte.weight, "transformer.wpe.weight": self.wpe.weight}
        for i, b in enumerate(self.h):
            p = f"transformer.h.{i}."
            for ln in ("ln_1", "ln_2"):
                t[p + ln + ".weight"] = getattr(b, ln).weight
                t[p + ln + ".bias"] = getattr(b, ln).bias
            for ours, theirs in (("c_attn", "attn.c_attn"), ("c_proj", "attn.c_proj"), ("c_fc", "mlp.c_fc"),
                                 ("mlp_proj", "mlp.c_proj")):
                t[p + theirs + ".weight"] = getattr(b, ours).weight.t()
                t[p + theirs + ".bias"] = getattr(b, ours).bias
        t["transformer.ln_f.weight"] = self.ln_f.weight
        t["transformer.ln_f.bias"] = self.ln_f.bias
        if not self.tied:
            t["lm_head.weight"] = self.lm_head.weight
        return t


def evaluate(model_dir, tokens, dtype, windows):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    model = GPT2(cfg)
    model.load_hf(read_safetensors(os.path.join(model_dir, "model.safetensors")))
    model.eval()
    with open(tokens, "rb") as f:
        raw = bytearray(f.read())
    ids = torch.frombuffer(raw, dtype=torch.int16 if dtype == "uint16" else torch.int32).to(torch.int64)
    ids = ids & (0xFFFF if dtype == "uint16" else 0xFFFFFFFF)
    t = cfg["n_positions"]
    if windows * t + 1 > ids.numel():
        sys.exit(f"error: {tokens} holds fewer than {windows} windows of {t} tokens")
    total = 0.0
    with torch.no_grad():
        for i in range(windows):
            x = ids[i * t:(i + 1) * t].unsqueeze(0)
            y = ids[i * t + 1:(i + 1) * t + 1]
            total += F.cross_entropy(model(x)[0], y).double().item()
    return total / windows


def write(out, vocab, d, heads, blocks, seq_len, tied, seed):
    torch.manual_seed(seed)
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": vocab, "n_positions": seq_len,
           "n_ctx": seq_len, "n_embd": d, "n_layer": blocks, "n_head": heads, "n_inner": None,
           "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": tied,
           "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}
    model = GPT2(cfg)
    with torch.no_grad():  # away from LayerNorm's 1/0 so that every tensor matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), model.hf_tensors())
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--model", required=True)
    e.add_argument("--tokens", required=True)
    e.add_argument("--dtype", default="uint16", choices=["uint16", "uint32"])
    e.add_argument("--windows", type=int, required=True)
    w = sub.add_parser("write")
    w.add_argument("--out", required=True)
    for name in ("vocab", "d-model", "heads", "blocks", "seq-len"):
        w.add_argument("--" + name, type=int, required=True)
    w.add_argument("--untied", action="store_true")
    w.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    torch.set_num_threads(1)
    if a.command == "eval":
        print(json.dumps({"loss": evaluate(a.model, a.tokens, a.dtype, a.windows), "windows": a.windows}))
    else:
        write(a.out, a.vocab, a.d_model, a.heads, a.blocks, a.seq_len, not a.untied, a.seed)


if __name__ == "__main__":
    main()
