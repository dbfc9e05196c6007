"""Digests that pin outputs bit for bit (see tests/envs/test_pinned.py).

XLA:CPU compiles for the host's vector instructions, and float results differ in the last
bits between a CPU with AVX-512 and one with AVX2 only (every pin differed on a 2-core AMD
EPYC without AVX-512, 2026-11-27), so each pin is kept per class of CPU.
"""

import hashlib
import re

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


def cpu_class() -> str:
    """"avx512", "avx2" or "other": the vector instructions XLA:CPU compiles for here."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return "other"
    return "avx512" if re.search(r"\bavx512f\b", flags) else "avx2" if re.search(r"\bavx2\b", flags) else "other"


def pin(pins: dict[str, str], what: str) -> str:
    """This CPU class's pinned digest of `what`; skips where none was recorded."""
    cls = cpu_class()
    if cls not in pins:
        pytest.skip(f"no {what} pin recorded on a CPU of class {cls!r} (pinned: {', '.join(pins)})")
    return pins[cls]
