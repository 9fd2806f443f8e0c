"""Random memory images of the NME for the interpreter tests (tests/host/nme/test_interp_ops.py,
test_interp_isa.py; tests/hw/test_nme_cycles.py): uniform 16-bit patterns with about a third
replaced by special values of the format (zeros, infinities, NaNs, subnormals, extremes)."""

import numpy as np


SPECIALS = {
    "bf16": [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFC1, 0x0001, 0x807F, 0x007F,
             0x7F7F, 0xFF7F, 0x3F80, 0xBF80, 0x0080],
    "fp16": [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE01, 0x0001, 0x83FF, 0x03FF,
             0x7BFF, 0xFBFF, 0x3C00, 0xBC00, 0x0400],
}


def random_bits(rng: np.random.Generator, shape, fmt: str) -> np.ndarray:
    """Uniform 16-bit patterns with about a third replaced by zeros/inf/NaN/subnormals/extremes."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    special = rng.random(shape) < 0.3
    bits[special] = rng.choice(np.array(SPECIALS[fmt], np.uint16), size=int(special.sum()))
    return bits


def _image(cfg, seed=1):
    """A random image of the memory of ``cfg`` (seeded), special values included."""
    return random_bits(np.random.default_rng(seed), (cfg.mem_words, cfg.lanes), cfg.fmt)
