"""Is a verify row at the core's compute limit? The integer dot-product peak of one core, what the product's other
arithmetic costs beside it, and the compiled step's products over a GGUF's own weights on one core against that peak.

usage: python scripts/row_limit.py [--model FILE.gguf] [--rows 1,8,16] [--repeats 20]

A verify pass of n rows reads each weight once for all rows, so past a few rows its cost is the rows' arithmetic:
n x (the model's weights) multiply-adds of int8 codes. This script measures, on one core:

1. The peak: independent chains of the instruction the kernel is built on (AVX-512 VNNI's VPDPBUSD on 16 lanes of
   4 products; AVX2's VPMADDUBSW on 16 lanes of 2 products, which needs a widening add beside it), in billions of
   multiply-adds a second (GMAC/s).
2. What else shares its execution ports: 8 dot products beside 4 float FMAs, 4 float multiplies, 4 conversions,
   4 float adds, 4 integer multiplies (VPMULLD) or 4 integer adds, each as a share of a dot product's time. The
   product spends, per row and per block of 32 inputs, 8 dot products (16 columns) and 3 float operations applying
   the block's scales (a multiply and two FMAs) and, for Q6_K, 2 integer multiplies.
3. The engine's product (`ops.blocks_mm`, one thread) over the first layer's weights and the output head of FILE
   (default: the real Qwen2.5-Coder-1.5B from ../shared/models/real-models.sh when present), with each weight warm
   in the cache: GMAC/s at each row count and its share of the peak.

Needs a C++ compiler (as the compiled step does); prints Markdown.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

PEAK_SOURCE = r"""
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#ifdef __AVX512VNNI__
using V = __m512i;
static inline V dot(V a, V b, V c) { return _mm512_dpbusd_epi32(a, b, c); }
static inline V splat(int x) { return _mm512_set1_epi32(x); }
static const int MACS = 64;
static const char* NAME = "VPDPBUSD zmm (AVX-512 VNNI)";
static inline __m512 fsplat(float x) { return _mm512_set1_ps(x); }
using F = __m512;
#define FMA _mm512_fmadd_ps
#define MUL _mm512_mul_ps
#define ADD _mm512_add_ps
#define CVT(x) _mm512_cvtepi32_ps(_mm512_castps_si512(x))
#define IMUL _mm512_mullo_epi32
#define IADD _mm512_add_epi32
static int lanes(V v) { int o[16]; std::memcpy(o, &v, 64); int s = 0; for (int x : o) s += x; return s; }
#else
using V = __m256i;  // AVX2: the kernel's pair of a VPMADDUBSW and the int16 add that gathers its pairs
static inline V dot(V a, V b, V c) { return _mm256_add_epi16(a, _mm256_maddubs_epi16(b, c)); }
static inline V splat(int x) { return _mm256_set1_epi32(x); }
static const int MACS = 32;
static const char* NAME = "VPMADDUBSW ymm + VPADDW (AVX2)";
static inline __m256 fsplat(float x) { return _mm256_set1_ps(x); }
using F = __m256;
#define FMA _mm256_fmadd_ps
#define MUL _mm256_mul_ps
#define ADD _mm256_add_ps
#define CVT(x) _mm256_cvtepi32_ps(_mm256_castps_si256(x))
#define IMUL _mm256_mullo_epi32
#define IADD _mm256_add_epi32
static int lanes(V v) { int o[8]; std::memcpy(o, &v, 32); int s = 0; for (int x : o) s += x; return s; }
#endif
template <int OP>
double run(long iters) {
  V a[8], b = splat(0x01020304), c = splat(0x01010101), x[4];
  F f[4], g = fsplat(1.0001f);
  for (int i = 0; i < 8; ++i) a[i] = splat(i);
  for (int i = 0; i < 4; ++i) f[i] = fsplat(i), x[i] = splat(i);
  auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = dot(a[i], b, c);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      if (OP == 1) f[i] = FMA(f[i], g, g);
      if (OP == 2) f[i] = MUL(f[i], g);
      if (OP == 3) f[i] = CVT(f[i]);
      if (OP == 4) f[i] = ADD(f[i], g);
      if (OP == 5) x[i] = IMUL(x[i], b);
      if (OP == 6) x[i] = IADD(x[i], b);
    }
    asm volatile("" : "+v"(b), "+v"(g));
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int sink = 0;
  for (int i = 0; i < 8; ++i) sink += lanes(a[i]);
  for (int i = 0; i < 4; ++i) sink += lanes(x[i]) + lanes(reinterpret_cast<V&>(f[i]));
  volatile int keep = sink; (void)keep;
  return s / iters;  // seconds per 8 dot products (and 4 of the other operation)
}
int main() {
  const long n = 40000000;
  double alone = 1e9, t[7];
  for (int rep = 0; rep < 3; ++rep) alone = std::min(alone, run<0>(n));
  t[1] = run<1>(n), t[2] = run<2>(n), t[3] = run<3>(n), t[4] = run<4>(n), t[5] = run<5>(n), t[6] = run<6>(n);
  printf("%s\n%.2f\n", NAME, 8.0 * MACS / alone / 1e9);
  const char* names[7] = {"", "float FMA", "float multiply", "int-to-float conversion", "float add",
                          "integer multiply (VPMULLD)", "integer add"};
  for (int i = 1; i <= 6; ++i) printf("%s\t%.2f\n", names[i], (t[i] - alone) / alone * 8.0 / 4.0);
}
"""


def peak() -> tuple[str, float, list[tuple[str, float]]]:
    """(the instruction, one core's GMAC/s, [(an operation, its cost in dot products' time)]) of this CPU."""
    cxx = next((shutil.which(c) for c in (os.environ.get("CXX"), "c++", "g++", "clang++") if c and shutil.which(c)), None)
    if cxx is None:
        sys.exit("no C++ compiler found (set CXX, or install g++)")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "peak.cpp", Path(tmp) / "peak"
        src.write_text(PEAK_SOURCE)
        subprocess.run([cxx, "-O2", "-march=native", str(src), "-o", str(exe)], check=True)
        lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    costs = [(name, float(v)) for name, v in (line.split("\t") for line in lines[2:])]
    return lines[0], float(lines[1]), costs


def cpu_class() -> str:
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    have = set(flags.split())
    if {"amx_int8", "amx_tile"} <= have:
        return "AMX"
    if "avx512_vnni" in have:
        return "AVX-512 VNNI"
    return "AVX2" if "avx2" in have else "no AVX2"


def default_model() -> str | None:
    script = Path(__file__).resolve().parents[1].parent / "shared" / "models" / "real-models.sh"
    cached = Path.home() / ".cache" / "specula-models" / "qwen-coder-1.5b.gguf"
    if cached.is_file():
        return str(cached)
    if script.is_file():
        done = subprocess.run(["bash", str(script), "qwen-coder-1.5b"], capture_output=True, text=True)
        path = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else ""
        return path if Path(path).is_file() else None
    return None


def product_rates(model: str, rows: list[int], repeats: int) -> list[tuple[str, str, tuple[int, int], dict[int, float]]]:
    """[(weight name, format, (out, in), {rows: GMAC/s on one core})] of the first layer's weights and the head."""
    from gguf import GGUFReader

    from specula.engine.cpu import step
    from specula.engine.cpu.products import BLOCK_FORMATS, Blocks, FileBlocks

    step.prepare(wait=True)
    ops = step.ops()
    torch.set_num_threads(1)
    reader = GGUFReader(model)
    names = {t.name for t in reader.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    out = []
    for t in reader.tensors:
        if not (t.name.startswith("blk.0.") or t.name == head) or t.tensor_type.name not in BLOCK_FORMATS:
            continue
        n, k = int(t.shape[1]), int(t.shape[0])
        data = torch.from_numpy(np.array(t.data).view(np.uint8).reshape(n, -1))
        product = Blocks(ops, [FileBlocks(t.tensor_type.name, data, (n, k))], None)
        rates = {}
        for r in rows:
            x = torch.randn(r, k, generator=torch.Generator().manual_seed(r)).to(torch.bfloat16)
            for _ in range(3):
                product(x)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                product(x)
                times.append(time.perf_counter() - t0)
            rates[r] = n * k * r / statistics.median(times) / 1e9
        out.append((t.name, t.tensor_type.name, (n, k), rates))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A verify row's arithmetic against one core's integer peak.")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the real Qwen2.5-Coder-1.5B if present)")
    parser.add_argument("--rows", default="1,8,16", help="comma-separated row counts")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",") if r.strip()]
    name, gmacs, costs = peak()
    print(f"CPU class: {cpu_class()} ({os.cpu_count()} logical CPUs); one core, {name}: "
          f"**{gmacs:.0f} GMAC/s** at peak\n")
    print("| beside 8 dot products | costs, in dot products' time |\n|---|---|")
    for op, cost in costs:
        print(f"| {op} | {max(cost, 0.0):.2f} |")
    model = args.model or default_model()
    if model is None:
        print("\nNo model file: pass --model FILE.gguf for the products.")
        return 0
    print(f"\n{Path(model).name}, one thread, each weight warm in the cache: GMAC/s (share of the peak)\n")
    print("| weight | format | shape | " + " | ".join(f"{r} rows" for r in rows) + " |")
    print("|---|---|---|" + "---|" * len(rows))
    for wname, fmt, shape, rates in product_rates(model, rows, args.repeats):
        cells = " | ".join(f"{rates[r]:.0f} ({rates[r] / gmacs:.0%})" for r in rows)
        print(f"| {wname} | {fmt} | {shape[0]}x{shape[1]} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
