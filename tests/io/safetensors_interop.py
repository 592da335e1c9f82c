"""Python's safetensors and fsdp's reader/writer agree: a file written by Python (every dtype,
metadata) goes through build/bin/safetensors_roundtrip (fsdp reads it and writes it again) and
Python reads back the same names, dtypes, shapes, values and metadata.
  python safetensors_interop.py SAFETENSORS_ROUNDTRIP
"""
import os, subprocess, sys, tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file

tensors = {
    f"t_{str(dt).split('.')[-1]}": (torch.arange(24) % 7).to(dt).reshape(2, 3, 4)
    for dt in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
}
tensors["empty"] = torch.empty(0, 5)
tensors["scalar"] = torch.tensor(2.5)
metadata = {"step": "7", "note": "from python"}
with tempfile.TemporaryDirectory() as tmp:
    src, dst = os.path.join(tmp, "py.safetensors"), os.path.join(tmp, "cpp.safetensors")
    save_file(tensors, src, metadata=metadata)
    subprocess.run([sys.argv[1], src, dst], check=True)
    with safe_open(dst, framework="pt") as f:
        assert f.metadata() == metadata, f.metadata()
        assert sorted(f.keys()) == sorted(tensors), sorted(f.keys())
        for name, want in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape)
            assert torch.equal(got, want), name
print(f"{len(tensors)} tensors and metadata survive Python -> fsdp -> Python")
