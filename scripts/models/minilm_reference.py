#!/usr/bin/env python3
"""Independent reference for the local embedder's test fixture.

Implements the all-MiniLM-L6-v2 forward pass (BERT encoder, mean pooling over the attention
mask, L2 normalisation) by hand in numpy, in float64, from the same safetensors weights the Rust
embedder loads. Only tokenization is shared (the `tokenizers` library reading tokenizer.json).

    python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install numpy safetensors tokenizers
    /tmp/refenv/bin/python scripts/models/minilm_reference.py <models-dir>/all-minilm-l6-v2 \
        > shared/embedded/tests/fixtures/minilm_reference.json
"""
import json
import math
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Assay evaluates the outputs of large language models.",
    "Is Paris the capital of France?",
]


def layer_norm(x, w, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def embed(w, ids):
    g = lambda k: w[k].astype(np.float64)
    n = len(ids)
    x = g("embeddings.word_embeddings.weight")[ids]
    x = x + g("embeddings.position_embeddings.weight")[:n] + g("embeddings.token_type_embeddings.weight")[0]
    x = layer_norm(x, g("embeddings.LayerNorm.weight"), g("embeddings.LayerNorm.bias"))
    heads, d = 12, 384 // 12
    for i in range(6):
        p = f"encoder.layer.{i}."
        lin = lambda name, h: h @ g(p + name + ".weight").T + g(p + name + ".bias")
        q = lin("attention.self.query", x).reshape(n, heads, d).transpose(1, 0, 2)
        k = lin("attention.self.key", x).reshape(n, heads, d).transpose(1, 0, 2)
        v = lin("attention.self.value", x).reshape(n, heads, d).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(n, 384)
        x = layer_norm(lin("attention.output.dense", ctx) + x,
                       g(p + "attention.output.LayerNorm.weight"), g(p + "attention.output.LayerNorm.bias"))
        h = gelu(lin("intermediate.dense", x))
        x = layer_norm(lin("output.dense", h) + x, g(p + "output.LayerNorm.weight"), g(p + "output.LayerNorm.bias"))
    mean = x.mean(0)  # no padding: every token is real
    return mean / np.linalg.norm(mean)


def main():
    d = sys.argv[1]
    w = load_file(f"{d}/model.safetensors")
    tok = Tokenizer.from_file(f"{d}/tokenizer.json")
    tok.no_padding()
    vecs, out = [], []
    for s in SENTENCES:
        ids = tok.encode(s).ids
        v = embed(w, ids)
        vecs.append(v)
        out.append({"text": s, "token_ids": ids, "first8": [float(a) for a in v[:8]],
                    "norm": float(np.linalg.norm(v)), "sum": float(v.sum())})
    cos = [[float(a @ b) for b in vecs] for a in vecs]
    json.dump({"model": "all-MiniLM-L6-v2", "generator": "scripts/models/minilm_reference.py (numpy float64)",
               "sentences": out, "cosine": cos}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
