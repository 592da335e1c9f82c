"""The inputs of the Llama benchmarks (bench/llama_speed.sh, bench/tp_speed.sh): a config.json of
the 56.9M-parameter preset (hidden 512, 8 layers, 8 heads, 2 KV heads, intermediate 1536, vocab
32000, untied) and 2M uniform random uint16 token ids, written into DIR.
  python llama_bench_inputs.py DIR
"""
import json
import sys

import numpy as np

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
          "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
          "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "hidden_act": "silu", "initializer_range": 0.02}

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    json.dump(CONFIG, open(f"{out}/config.json", "w"))
    np.random.default_rng(0).integers(0, 32000, 2_000_000).astype("<u2").tofile(f"{out}/tokens.bin")
