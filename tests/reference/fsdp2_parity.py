"""Parity with PyTorch FSDP2 itself: the C++ trainer and bench/reference/py_minillm.py train MiniLLM
from the same initial weights (a safetensors file written here) on the same batches (the C++
trainer's synthetic data), FSDP2 with torch.distributed.fsdp.fully_shard over gloo on CPU, the
C++ trainer with fsdp::fully_shard over MPI (or Gloo). Per-step losses, averaged over ranks, must
agree within the tolerance.

  python fsdp2_parity.py --cpp build/bin/train_minillm --world 2 --dtype fp32 \
      [--replicas R] [--launcher mpi|gloo] [--mpiexec mpiexec --allow-run-as-root ...] [--steps 10]

--replicas R compares hybrid sharding: FSDP2 over a (R, world / R) device mesh against
train_minillm --replicas R. --float8: torchao's Float8Linear on the feed-forward Linears against
train_minillm --float8. --fused-loss: train_minillm --fused-loss against FSDP2's unfused loss.

Tolerances (relative, worst step): fp32 1e-5; bf16 parameters with fp32 reduction 1e-2.
"""
import argparse, json, os, sys, tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REFERENCE = os.path.join(ROOT, "bench", "reference", "py_minillm.py")
sys.path.insert(0, os.path.dirname(REFERENCE))
from py_minillm import MiniLLM  # noqa: E402
from run_checked import free_port, run  # noqa: E402

# vocab 510 does not divide by 4: the embedding and head shards are uneven at world 4.
SIZES = dict(vocab=510, dim=64, layers=2, heads=4, seq=32)
GLOBAL_BATCH = 8
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2}


def size_flags():
    return [f"--{k}={v}" for k, v in SIZES.items()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cpp", required=True, help="the train_minillm binary")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default="fp32")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--fused-loss", action="store_true",
                   help="train_minillm --fused-loss (the head and the loss fused) against FSDP2's "
                        "unfused loss")
    p.add_argument("--float8", action="store_true",
                   help="float8 feed-forward Linears on both sides (torchao's Float8Linear "
                        "against train_minillm --float8)")
    p.add_argument("--float8-recipe", choices=["tensorwise", "rowwise"], default="tensorwise",
                   help="with --float8: torchao's recipe on both sides")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--launcher", choices=["mpi", "gloo"], default="mpi")
    p.add_argument("--mpiexec", nargs=argparse.REMAINDER, default=["mpiexec"],
                   help="mpiexec and its flags (last option)")
    a = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init.safetensors")
        torch.manual_seed(1234)
        model = MiniLLM(SIZES["vocab"], SIZES["dim"], SIZES["layers"], SIZES["heads"])
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, init)

        # Both programs step with the fused AdamW kernel (torch.optim.AdamW(fused=True) and
        # fsdp::FusedAdamW): the same arithmetic, so the losses agree to float rounding.
        common = size_flags() + [f"--steps={a.steps}", f"--lr={a.lr}", f"--init-from={init}",
                                 "--optimizer=fused-adamw"]
        common += ["--float8", f"--float8-recipe={a.float8_recipe}"] if a.float8 else []
        py = run([sys.executable, REFERENCE, "--mode", "fsdp2", f"--world={a.world}",
                  f"--batch={GLOBAL_BATCH // a.world}", f"--dtype={a.dtype}", "--data=synthetic",
                  f"--port={free_port()}", f"--replicas={a.replicas}", "--start-method=fork"] + common,
                 env, "RESULT ")
        py_losses = [float(line.split()[3]) for line in py.splitlines() if line.startswith("step ")]

        metrics = os.path.join(tmp, "cpp.jsonl")
        cpp = [a.cpp, f"--batch={GLOBAL_BATCH}", f"--dtype={a.dtype}", "--data=synthetic",
               "--threads=1", f"--metrics-out={metrics}", f"--replicas={a.replicas}"] + common
        cpp += ["--fused-loss", "--loss-chunk=7"] if a.fused_loss else []
        if a.world > 1 and a.launcher == "mpi":
            cpp = a.mpiexec + ["-n", str(a.world)] + cpp
        elif a.world > 1:
            cpp = [os.path.join(ROOT, "scripts", "launch.sh"), "--nproc", str(a.world)] + cpp
        run(cpp, env)
        with open(metrics) as f:
            cpp_losses = [json.loads(line)["loss"] for line in f]

    if len(py_losses) != a.steps or len(cpp_losses) != a.steps:
        sys.exit(f"expected {a.steps} losses, got {len(py_losses)} (FSDP2), {len(cpp_losses)} (C++)")
    layout = f" as {a.replicas} replicas" if a.replicas > 1 else ""
    float8 = f", float8 feed-forward ({a.float8_recipe})" if a.float8 else ""
    print(f"world {a.world}{layout}, {a.dtype}{float8}"
          f"{', C++ fused loss (chunks of 7 tokens)' if a.fused_loss else ''}, "
          f"C++ over {a.launcher}, FSDP2 over gloo")
    print(f"{'step':>4} {'FSDP2 (PyTorch)':>16} {'fsdp-cpp':>16} {'rel err':>10}")
    worst = 0.0
    for step, (want, got) in enumerate(zip(py_losses, cpp_losses)):
        err = abs(got - want) / abs(want)
        worst = max(worst, err)
        print(f"{step:>4} {want:>16.9g} {got:>16.9g} {err:>10.2e}")
    ok = worst <= TOLERANCE[a.dtype]
    # A run whose loss never moves would agree trivially: the training must change it.
    moved = abs(py_losses[-1] - py_losses[0]) > 5 * TOLERANCE[a.dtype] * abs(py_losses[0])
    print(f"worst relative error {worst:.3g} (tolerance {TOLERANCE[a.dtype]:g}); "
          f"loss {py_losses[0]:.5f} -> {py_losses[-1]:.5f}")
    if not moved:
        print("the loss barely moved: the comparison would prove nothing")
    sys.exit(0 if ok and moved else 1)


if __name__ == "__main__":
    main()
