"""The decoding step compiled: `native/step.cpp` (the lean Llama forward's layer loop with its small
operations fused) built once per machine with the system's C++ compiler against the installed torch.

On the CPU a decoding step of a small model is mostly small operations (norms, rotary, cache writes,
attention over a few rows, SiLU), about a thousand of them, each a few microseconds of dispatch; the
compiled step runs them as a handful of loops between the products, which stay torch's.

How it is used (`ModelChoice.step`):
- "auto" (the default): a library already built for this machine, torch and source is loaded at once;
  otherwise it is built in a background thread and answers started after it is ready use it (the first
  ones run eager). Where no compiler works, it says why once and stays eager.
- "compiled": the build runs (or is found in the cache) before the model is ready; where it cannot be
  built, the same warning, eager.
- "eager": never.
SPECULA_STEP overrides "auto" (the tests run eager unless they ask).

Built libraries live in the cache dir, named by a key of the source, torch's version, the compiler and
the CPU's features, so a new torch, a new compiler or another machine builds its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path

import torch

from ..api.errors import first_line
from ..api.paths import cache_dir

log = logging.getLogger(__name__)

class StepMode(str, Enum):
    """How the lean forward decodes (`ModelChoice.step`, `--step`); compares equal to its name."""

    AUTO = "auto"  # compiled once built (built in the background), eager until then
    COMPILED = "compiled"  # built (or found) before the model is ready, then compiled
    EAGER = "eager"  # never compiled
    # a GPU's step (models/static.py): a static cache and steps of fixed row buckets, without CUDA graphs
    # (which auto and compiled capture on a GPU); on a CPU it runs eagerly, to compare and to test
    STATIC = "static"


STEP_MODES = tuple(mode.value for mode in StepMode)
# a product's form as `prepare` takes it (native/step.cpp's Product::kind), by the form's `kind` in cpu/products.py
PRODUCT_KINDS = {"dense": 0, "prepacked": 1, "int4": 2, "blocks": 3, "tiles": 4, "tiles-plain": 5, "tiles-unpack": 6}
SOURCE = Path(__file__).parent / "native" / "step.cpp"
BUILD_TIMEOUT_S = 600
# what a build takes where this machine has never timed one (two busy cores: 40-120 s; eight: about 20)
FIRST_BUILD_S = 60.0


@dataclass(frozen=True)
class StepLayer:
    """One decoder layer as the compiled step takes it: its four products (q/k/v, o, gate/up, down: cpu.products
    forms) and each per-layer field by name; a norm None where the layer has none there. A new per-layer feature is
    one field here and the line of native/step.cpp's `prepare` that reads it by the same name."""

    products: tuple
    attn_in: torch.Tensor | None = None  # the norm before attention (OLMo 2: none)
    mlp_in: torch.Tensor | None = None  # before the MLP
    q_norm: torch.Tensor | None = None  # of each query head (or all of them: OLMo 2) before rotary
    k_norm: torch.Tensor | None = None
    attn_out: torch.Tensor | None = None  # of attention's output (Gemma, OLMo 2)
    mlp_out: torch.Tensor | None = None  # of the MLP's output
    rotary: bool = True  # false: queries and keys as they are (SmolLM3's every fourth layer)
    window: int = 0  # a sliding window over the last `window` positions; 0: all
    rope_set: int = 0  # which rotary table it reads (Gemma 3's local or global base)


@dataclass(frozen=True)
class StepModel:
    """What every layer shares: the heads, the MLP's width, the norms' epsilon and kind, the scores' scale and cap
    (0: none), the residual multiplier (Granite's) and the gate's activation."""

    n_heads: int
    n_kv: int
    head_dim: int
    inter: int
    eps: float
    scale: float
    wide_norms: bool = False
    gelu: bool = False
    residual: float = 1.0
    softcap: float = 0.0


def _operands(product) -> tuple[torch.Tensor, torch.Tensor]:
    """A product's two tensors as the step reads them, by its form."""
    if product.kind == "int4":
        return product.packed, product.scale_zero
    if product.kind == "blocks":
        return product.packed, product.parts
    if product.kind in ("tiles", "tiles-plain", "tiles-unpack"):
        return product.packed, product.weight
    return product.weight, torch.empty(0)


def register(ops, model: StepModel, layers: list[StepLayer]) -> int:
    """Register a model with the compiled step as one table of named fields: per layer each StepLayer field (its
    products as a, b, bias, kind and min_rows, four a layer), and StepModel's; the handle `forward` takes."""
    empty = torch.empty(0)
    tensors: dict[str, list[torch.Tensor]] = {"a": [], "b": [], "bias": []}
    ints: dict[str, list[int]] = {"kind": [], "min_rows": []}
    for layer in layers:
        for p in layer.products:
            a, b = _operands(p)
            tensors["a"].append(a), tensors["b"].append(b), tensors["bias"].append(empty if p.bias is None else p.bias)
            ints["kind"].append(PRODUCT_KINDS[p.kind]), ints["min_rows"].append(int(p.stable_rows))
        for f in fields(StepLayer)[1:]:
            value = getattr(layer, f.name)
            if isinstance(value, (bool, int)):
                ints.setdefault(f.name, []).append(int(value))
            else:
                tensors.setdefault(f.name, []).append(empty if value is None else value)
    numbers = {f.name: float(getattr(model, f.name)) for f in fields(StepModel)}
    return ops.prepare(tensors, ints, numbers)

class Unavailable(Exception):
    """The compiled step cannot be built or loaded here; the message says why, in one line."""


def step_mode(requested: str) -> StepMode:
    """The mode to use: SPECULA_STEP replaces "auto"."""
    if requested not in STEP_MODES:
        raise ValueError(f"unknown step '{requested}': choose one of {', '.join(STEP_MODES)}")
    env = os.environ.get("SPECULA_STEP", "").strip()
    if requested == StepMode.AUTO and env in STEP_MODES:
        return StepMode(env)
    return StepMode(requested)


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cpu_features() -> str:
    """The CPU's flags line from /proc/cpuinfo ("" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def library_path(cxx: str) -> Path:
    key = hashlib.sha256()
    sources = [f.read_bytes() for f in sorted(SOURCE.parent.iterdir()) if f.suffix in (".cpp", ".h")]
    for part in (*sources, torch.__version__.encode(), _compiler_version(cxx).encode(),
                 cpu_features().encode(), sys.version.encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / "compiled" / f"step-{key.hexdigest()[:20]}.so"


def _command(cxx: str, out: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths, library_paths

    torch_lib = library_paths()[0]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [cxx, "-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-fopenmp", "-std=c++20", "-fPIC", "-shared", "-DNDEBUG",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *(f"-I{p}" for p in include_paths()), str(SOURCE), "-o", str(out),
            f"-L{torch_lib}", "-ltorch", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_lib}"]


def build() -> Path:
    """Build the library (or find it built) and return its path; raises Unavailable with the reason."""
    if sys.platform != "linux":
        raise Unavailable(f"the compiled step is built on Linux only (this is {sys.platform})")
    cxx = _compiler()
    if cxx is None:
        raise Unavailable("no C++ compiler found (set CXX, or install g++)")
    path = library_path(cxx)
    if path.is_file():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Unavailable(f"the cache folder {path.parent} cannot be created: {exc.strerror or exc}") from None
    for stale in path.parent.glob(f"{path.name}.tmp-*"):  # a build killed part-way (not another process's, going on)
        if not _alive(stale.name.rsplit("-", 1)[-1]):
            stale.unlink(missing_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    began = time.monotonic()
    try:
        done = subprocess.run(_command(cxx, tmp), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise Unavailable(f"building the compiled step took over {BUILD_TIMEOUT_S} s") from None
    except OSError as exc:
        raise Unavailable(f"the C++ compiler {cxx} did not run: {exc}") from None
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        lines = done.stderr.splitlines()
        # a full disk first: the compiler then reports it among other errors that only follow from it
        errors = [line for line in lines if "No space left on device" in line] or [
            line for line in lines if "error" in line] or lines[-1:]
        raise Unavailable(f"the C++ compiler {cxx} failed: {errors[0].strip() if errors else 'no message'}")
    os.replace(tmp, path)
    _timing_file().write_text(f"{time.monotonic() - began:.1f}\n")
    return path


def _timing_file() -> Path:
    return cache_dir() / "compiled" / "build-seconds"


def build_estimate() -> float:
    """How long building the step takes here: the last build's time on this machine, or FIRST_BUILD_S."""
    try:
        return max(1.0, float(_timing_file().read_text().strip()))
    except (OSError, ValueError):
        return FIRST_BUILD_S


def building_note() -> str:
    """The line a user reads while the step is built at a start (where it was not built at set-up); the wait
    first, so that a status bar too narrow for the whole line still shows it."""
    return (f"about {round(build_estimate())} s: building the compiled step for this CPU, once "
            "(`specula build-step` builds it ahead)")


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _load(path: Path):
    """Load a built library into this process; its operations."""
    torch.ops.load_library(str(path))
    return torch.ops.specula_step


class StepLibrary:
    """The compiled step of this process: loaded once (torch's operator registry is the process's), or
    the reason it cannot be, with the background build in between."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ops = None  # torch.ops.specula_step once loaded
        self.error: str | None = None  # why it cannot be built here
        self._thread: threading.Thread | None = None

    def _fail(self, reason: str) -> None:
        if self.error is None:
            log.warning("the decoding step stays eager: %s", reason)
        self.error = reason

    def _build_and_load(self) -> None:
        for attempt in range(2):
            try:
                path = build()
                with self._lock:
                    if self.ops is None:
                        self.ops = _load(path)
                return
            except Unavailable as exc:
                self._fail(str(exc))
                return
            except (OSError, RuntimeError) as exc:  # a library that does not load: a damaged file in the cache
                reason = first_line(exc)
                if attempt == 0:
                    log.info("the cached compiled step did not load (%s): building it again", reason)
                    path.unlink(missing_ok=True)
                    continue
                self._fail(f"the compiled step did not load: {reason}")

    def prepare(self, wait: bool) -> None:
        """Load it now if built; otherwise build it, in the background unless `wait`."""
        if self.ops is not None or self.error is not None:
            return
        cxx = _compiler()
        if cxx is not None and sys.platform == "linux" and library_path(cxx).is_file():
            self._build_and_load()
            return
        if wait:
            self._build_and_load()
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._build_and_load, name="specula-compile-step", daemon=True)
                self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def status(self) -> str:
        if self.ops is not None:
            return "compiled"
        if self.error is not None:
            return f"eager: {self.error}"
        if self._thread is not None and self._thread.is_alive():
            return "compiling"
        return "eager"


LIBRARY = StepLibrary()


def built() -> bool:
    """Whether the library is loaded, or built for this machine and only needs loading."""
    if LIBRARY.ops is not None:
        return True
    cxx = _compiler()
    return cxx is not None and sys.platform == "linux" and library_path(cxx).is_file()


def ops():
    """The loaded library's operations, or None."""
    return LIBRARY.ops


def error() -> str | None:
    """Why the compiled step is not available here, once a build failed."""
    return LIBRARY.error


def prepare(wait: bool) -> None:
    """Make the compiled step available: load it now if built; otherwise build it, in the background
    unless `wait`."""
    LIBRARY.prepare(wait)


def wait(timeout: float | None = None) -> None:
    """Wait for a background build (tests, the bench)."""
    LIBRARY.wait(timeout)


def status() -> str:
    """"compiled", "compiling" or "eager: <why>" (for status lines and the server's status)."""
    return LIBRARY.status()
