"""Digests that pin outputs bit for bit (see tests/envs/test_pinned.py).

XLA:CPU compiles for the host's vector instructions, and float results differ in the last
bits between a CPU with AVX-512 and one with AVX2 only (every pin differed on a 2-core AMD
EPYC without AVX-512, 2026-11-27), so each pin is kept per class of CPU. Within AVX-512 the
instruction set matters too: a 2-core AMD EPYC whose AVX-512 has VBMI (and VNNI, BF16, the
Zen 4 set) gave the random-starts pin's outputs different bits from the first AVX-512 machine
and the other pins the same bits (2026-11-28), so a pin may name that finer class, and where
it does not the coarser one applies. A 2-core AMD EPYC of the next generation (Zen 5: CPU
family 26, the same AVX-512 set with VP2INTERSECT) gave the random-starts pin the first AVX-512
machine's bits again and the other pins theirs too (2026-12-02), so it is a class of its own
("zen5"), before "avx512vbmi". Zen 4 (family 25) is named too ("zen4"), so that a pin recorded
only there (the training pin, 2026-12-03) does not bind an Intel CPU with VBMI, which no pin has
been checked on; where a "zen4" pin is absent, the "avx512vbmi" one applies.

The suite compiles with its own options (tests/conftest.py, TEST_XLA_OPTIONS), which give other
bits; a pin holds what a user's process computes. jaxrace's own programs carry their compile
options (`jaxrace.jit`), which XLA_FLAGS do not change, so their outputs are pinned in the test's
process (the training pin); outputs of programs a test jits itself (the env's pins) are computed
in a child process with the XLA_FLAGS the test run started with (`digests_in_child`).
"""

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest


def digest(tree) -> str:
    """A short sha256 of every leaf's dtype, shape and bytes."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        a = np.asarray(leaf)
        h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()[:24]


def cpu_classes() -> tuple[str, ...]:
    """This CPU's classes, the finest first: ("zen5" or "zen4", "avx512vbmi", "avx512"), ("avx512vbmi",
    "avx512"), ("avx512",), ("avx2",) or ("other",), after the vector instructions XLA:CPU compiles for
    here (and, for AMD's AVX-512 CPUs, the generation LLVM tunes for)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return ("other",)
    if re.search(r"\bavx512f\b", flags):
        if not re.search(r"\bavx512vbmi\b", flags):
            return ("avx512",)
        family = re.search(r"^cpu family\s*:\s*(\d+)$", flags, re.MULTILINE)
        generation = {"25": "zen4", "26": "zen5"}.get(family.group(1)) if family and "AuthenticAMD" in flags else None
        return ((generation,) if generation else ()) + ("avx512vbmi", "avx512")
    return ("avx2",) if re.search(r"\bavx2\b", flags) else ("other",)


def cpu_class() -> str:
    """The finest of `cpu_classes`."""
    return cpu_classes()[0]


def pin(pins: dict[str, str], what: str) -> str:
    """The pinned digest of `what` for this CPU's finest class that has one; skips where none was recorded."""
    for cls in cpu_classes():
        if cls in pins:
            return pins[cls]
    pytest.skip(f"no {what} pin recorded on a CPU of class {cpu_class()!r} (pinned: {', '.join(pins)})")


def default_compile_env() -> dict[str, str]:
    """This process's environment with XLA_FLAGS as the test run began (without the tests' compile options)."""
    env = dict(os.environ)
    default = env.pop("JAXRACE_TEST_DEFAULT_XLA_FLAGS", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = default
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    return env


def digests_in_child(script: Path, timeout_s: float = 600) -> dict[str, str]:
    """Runs `script` (a test module whose main prints `NAME = "digest"` lines) in a child with XLA's default
    compile options; returns {NAME: digest}."""
    out = subprocess.run([sys.executable, str(script)], env=default_compile_env(), capture_output=True, text=True,
                         timeout=timeout_s)
    assert out.returncode == 0, out.stderr[-3000:]
    found = dict(re.findall(r'^(\w+) = "([0-9a-f]{24})"$', out.stdout, re.MULTILINE))
    assert found, f"no digests in {script.name}'s output: {out.stdout[-1000:]}"
    return found
