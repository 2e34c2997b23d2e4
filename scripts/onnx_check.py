#!/usr/bin/env python3
"""Runs a run's exported model.onnx in onnxruntime on the test images and compares its top-1
predictions with those of qdarts' integer runtime (written by `qdarts eval` to
<run>/frozen/predictions.csv).

usage: onnx_check.py RUN_DIR [--images IDX_GZ] [--min-agreement 0.99] [--min-fused 0.99]
Exit status 0 when both agreements reach their minimum, 1 otherwise, 2 on bad input.
Needs: onnxruntime, numpy (pip install onnxruntime numpy).
"""
import argparse
import csv
import gzip
import json
import os
import struct
import sys

import numpy as np
import onnxruntime as ort


def read_idx_images(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 16:
        sys.exit(f"{path}: too short for an IDX image file")
    magic, n, h, w = struct.unpack(">IIII", data[:16])
    if magic != 0x00000803:
        sys.exit(f"{path}: not an IDX3 unsigned-byte file (magic {magic:#x})")
    pixels = np.frombuffer(data, dtype=np.uint8, offset=16)
    if pixels.size != n * h * w:
        sys.exit(f"{path}: {pixels.size} pixels for {n}x{h}x{w}")
    return pixels.reshape(n, 1, h, w)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--images", default=os.path.join(os.path.dirname(__file__), "..", "data", "fashion-mnist", "t10k-images-idx3-ubyte.gz"))
    ap.add_argument("--min-agreement", type=float, default=0.99, help="for the graph as written")
    ap.add_argument("--min-fused", type=float, default=0.99, help="with onnxruntime's QLinear fusions")
    args = ap.parse_args()
    model = os.path.join(args.run, "frozen", "model.onnx")
    preds = os.path.join(args.run, "frozen", "predictions.csv")
    for p in (model, preds):
        if not os.path.exists(p):
            print(f"{p}: missing (run qdarts freeze, export and eval first)", file=sys.stderr)
            return 2
    with open(preds) as f:
        rows = list(csv.DictReader(f))
    n = len(rows)
    int_pred = np.array([int(r["integer"]) for r in rows])
    labels = np.array([int(r["label"]) for r in rows])
    ok = True
    # As written: the QDQ graph's own semantics. Fused: onnxruntime's fusions into its QLinear*
    # integer kernels, with their own requantization, and exact integer products: on x86 CPUs
    # without VNNI (AVX2, AVX-512 before VNNI) onnxruntime's default u8*s8 kernels add pairs of
    # products in 16 bits with saturation (VPMADDUBSW), and `session.x64quantprecision` is its
    # documented switch to the non-saturating u8*u8 kernels. The default kernels' agreement is
    # printed too, for the record, without a minimum (on a VNNI CPU both rows are the same).
    full = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for name, level, precise, need in (
            ("as written", ort.GraphOptimizationLevel.ORT_DISABLE_ALL, False, args.min_agreement),
            ("fused, x64quantprecision=1", full, True, args.min_fused),
            ("fused, default kernels", full, False, None)):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = level
        if precise:
            opts.add_session_config_entry("session.x64quantprecision", "1")
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        meta = sess.get_modelmeta().custom_metadata_map
        mean = np.array(json.loads(meta["mean"]), dtype=np.float32).reshape(1, -1, 1, 1)
        std = np.array(json.loads(meta["std"]), dtype=np.float32).reshape(1, -1, 1, 1)
        images = read_idx_images(args.images)[:n]
        x = ((images.astype(np.float32) / np.float32(255.0)) - mean) / std
        logits = np.concatenate([sess.run(["logits"], {"input": x[i:i + 100]})[0] for i in range(0, n, 100)])
        ort_pred = logits.argmax(axis=1)
        agree = float((ort_pred == int_pred).mean())
        print(f"onnxruntime {ort.__version__} ({name}): {n} images, top-1 {100 * (ort_pred == labels).mean():.2f} %, "
              f"qdarts integer top-1 {100 * (int_pred == labels).mean():.2f} %, agreement {100 * agree:.2f} % "
              f"({int((ort_pred == int_pred).sum())}/{n}" + (f"; need {100 * need:.1f} %)" if need is not None else "; no minimum)"))
        if need is not None:
            ok &= agree >= need
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
