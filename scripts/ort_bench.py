#!/usr/bin/env python3
"""Times onnxruntime on an exported model.onnx over the very images `qdarts bench runtime`
timed, so that the two figures compare like for like (same model, same images, same threads).

usage: ort_bench.py MODEL_ONNX --images RAW_F32 --shape N,C,H,W [--threads 1,2] [--reps 5]
                    [--batch 200] [--limit N]
RAW_F32 holds the normalized images as little-endian float32, N·C·H·W of them (--limit: time
only the first N).
Prints one CSV row per optimization level and thread count:
    level,threads,images_per_s,min,max,passes
(median, slowest and fastest of REPS passes after one warm-up pass; passes: each pass's
images/s, separated by ';').
Exit status 0 on success, 2 on bad input, 3 when onnxruntime is not installed.
Needs: onnxruntime, numpy (pip install onnxruntime numpy).
"""
import argparse
import os
import sys
import time

try:
    import numpy as np
    import onnxruntime as ort
except ImportError as e:  # the caller reports the missing package
    print(f"onnxruntime unavailable: {e}", file=sys.stderr)
    sys.exit(3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--images", required=True)
    ap.add_argument("--shape", required=True, help="N,C,H,W")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()
    try:
        shape = tuple(int(v) for v in args.shape.split(","))
        threads = [int(v) for v in args.threads.split(",")]
    except ValueError:
        print(f"--shape {args.shape!r} / --threads {args.threads!r}: integers separated by commas", file=sys.stderr)
        return 2
    if len(shape) != 4 or min(shape) < 1 or min(threads) < 1 or args.reps < 1 or args.batch < 1 or args.limit < 0:
        print("--shape needs four positive sizes; --threads, --reps and --batch must be positive, --limit not negative", file=sys.stderr)
        return 2
    for p in (args.model, args.images):
        if not os.path.exists(p):
            print(f"{p}: missing", file=sys.stderr)
            return 2
    x = np.fromfile(args.images, dtype="<f4")
    if x.size != np.prod(shape):
        print(f"{args.images}: {x.size} floats for shape {shape}", file=sys.stderr)
        return 2
    x = x.reshape(shape)
    if args.limit:
        x = x[:args.limit]
        shape = x.shape
    batches = [x[i:i + args.batch] for i in range(0, shape[0], args.batch)]
    print("level,threads,images_per_s,min,max,passes")
    for name, level in (("all", ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
                        ("none", ort.GraphOptimizationLevel.ORT_DISABLE_ALL)):
        for t in threads:
            opts = ort.SessionOptions()
            opts.graph_optimization_level = level
            opts.intra_op_num_threads = t
            opts.inter_op_num_threads = 1
            opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            sess = ort.InferenceSession(args.model, opts, providers=["CPUExecutionProvider"])
            run = lambda: [sess.run(["logits"], {"input": b}) for b in batches]
            run()
            rates = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                run()
                rates.append(shape[0] / (time.perf_counter() - t0))
            passes = ";".join(f"{r:.3f}" for r in rates)
            rates.sort()
            print(f"{name},{t},{rates[len(rates) // 2]:.3f},{rates[0]:.3f},{rates[-1]:.3f},{passes}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
