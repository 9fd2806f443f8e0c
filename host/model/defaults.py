"""The sampler's defaults, in one place every layer reads (no torch import): DDIM steps, CFG
scale and DDIM eta of :func:`coda.host.model.sample.generate` and every command that
generates or models a generation."""

__all__ = ["DEFAULT_STEPS", "DEFAULT_GUIDANCE", "DEFAULT_ETA"]

DEFAULT_STEPS = 50         # the shipped schedules and profiles are for 50 steps
DEFAULT_GUIDANCE = 5.0     # chosen on validation seeds 2,000,000+ (docs/model.md)
DEFAULT_ETA = 0.0          # deterministic DDIM
