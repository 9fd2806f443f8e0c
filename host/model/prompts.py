"""Text prompts of the moving-digit videos: grammar, vocabulary, tokenizer, random draws.

Two prompt forms, both rendered by :func:`coda.host.model.data.prompted_videos`:
- ``"a seven moving up-left fast"``: one digit moving in one of eight directions at one of
  two speeds (:data:`SPEEDS`, pixels per frame along the direction);
- ``"a three and a seven drifting apart"``: two digits, the first on the left moving left,
  the second on the right moving right, so cross attention has to route each digit word's
  tokens to its own side of the frame.

``"a seven"`` (a digit alone) is the prompt of the single frames of image-video joint
training; the empty prompt ``""`` is the unconditional branch of classifier-free guidance.
Tokens are whole words (a direction such as ``up-left`` is one word) followed by ``<eos>``
and padded with ``<pad>`` to :data:`MAX_TOKENS`, as diffusers pipelines pass a T5 encoder's
output: a fixed-length sequence whose padded positions the text encoder zeroes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["DIGIT_WORDS", "DIRECTIONS", "SPEEDS", "VOCABULARY", "PAD", "EOS", "MASK", "MAX_TOKENS",
           "PromptSpec", "parse_prompt", "tokenize", "random_specs", "DEMO_PROMPTS",
           "demo_prompt"]

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Unit (row, col) steps; rows grow downwards as in the frame tensor.
DIRECTIONS: dict[str, tuple[float, float]] = {
    "up": (-1.0, 0.0), "down": (1.0, 0.0), "left": (0.0, -1.0), "right": (0.0, 1.0),
    "up-left": (-math.sqrt(0.5), -math.sqrt(0.5)), "up-right": (-math.sqrt(0.5), math.sqrt(0.5)),
    "down-left": (math.sqrt(0.5), -math.sqrt(0.5)), "down-right": (math.sqrt(0.5), math.sqrt(0.5)),
}
SPEEDS: dict[str, float] = {"slow": 1.0, "fast": 2.0}   # pixels per frame along the direction
PAD, EOS, MASK = "<pad>", "<eos>", "<mask>"   # MASK: the text encoder's pretraining corruption
VOCABULARY: tuple[str, ...] = (PAD, EOS, MASK, "a", "an", "and", "moving", "drifting", "apart",
                               *DIGIT_WORDS, *DIRECTIONS, *SPEEDS)
MAX_TOKENS = 8           # "a three and a seven drifting apart" + <eos>
_INDEX = {w: i for i, w in enumerate(VOCABULARY)}


@dataclass(frozen=True)
class PromptSpec:
    """What a prompt asks for.

    Attributes:
        digits: one or two digits 0..9 (empty for the null prompt).
        direction: a key of :data:`DIRECTIONS` (one digit), ``"apart"`` (two digits) or
            None (a still digit alone: single frames; the null prompt).
        speed: a key of :data:`SPEEDS` for one moving digit, else None.
    """
    digits: tuple[int, ...]
    direction: str | None = None
    speed: str | None = None

    def __post_init__(self):
        ok = (
            (len(self.digits) == 0 and self.direction is None and self.speed is None)
            or (len(self.digits) == 1 and self.direction is None and self.speed is None)
            or (len(self.digits) == 1 and self.direction in DIRECTIONS and self.speed in SPEEDS)
            or (len(self.digits) == 2 and self.direction == "apart" and self.speed is None))
        if not ok or any(not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= 9
                         for d in self.digits):
            raise ValueError(f"{self!r}: expected no digit, one digit (still, or with a direction "
                             f"of {tuple(DIRECTIONS)} and a speed of {tuple(SPEEDS)}), or two "
                             f"digits drifting apart, digits in 0..9")

    @property
    def text(self) -> str:
        """The canonical prompt text ("" for the null prompt)."""
        if not self.digits:
            return ""
        names = [f"{'an' if d == 8 else 'a'} {DIGIT_WORDS[d]}" for d in self.digits]
        if len(self.digits) == 2:
            return f"{names[0]} and {names[1]} drifting apart"
        if self.direction is None:
            return names[0]
        return f"{names[0]} moving {self.direction} {self.speed}"


def parse_prompt(text: str) -> PromptSpec:
    """The :class:`PromptSpec` of a prompt text (case and extra spaces ignored; "a"/"an" both
    accepted before any digit word).

    Raises:
        ValueError: a word outside :data:`VOCABULARY` or a sentence outside the two forms,
            naming the prompt and the forms expected.
    """
    if not isinstance(text, str):
        raise ValueError(f"prompt {text!r}: expected a string")
    words = text.lower().split()
    unknown = [w for w in words if w not in _INDEX or w in (PAD, EOS, MASK)]
    forms = ("expected 'a DIGIT moving DIRECTION SPEED', 'a DIGIT and a DIGIT drifting apart' "
             f"or 'a DIGIT' (DIGIT in {'/'.join(DIGIT_WORDS)}; DIRECTION in "
             f"{'/'.join(DIRECTIONS)}; SPEED in {'/'.join(SPEEDS)})")
    if unknown:
        raise ValueError(f"prompt {text!r}: unknown word(s) {', '.join(map(repr, unknown))}; {forms}")

    def digit(article: str, word: str) -> int:
        if article not in ("a", "an") or word not in DIGIT_WORDS:
            raise ValueError(f"prompt {text!r}: {forms}")
        return DIGIT_WORDS.index(word)

    if not words:
        return PromptSpec(())
    if len(words) == 2:
        return PromptSpec((digit(*words),))
    if len(words) == 5 and words[2] == "moving" and words[3] in DIRECTIONS and words[4] in SPEEDS:
        return PromptSpec((digit(*words[:2]),), words[3], words[4])
    if len(words) == 7 and words[2] == "and" and words[5:] == ["drifting", "apart"]:
        return PromptSpec((digit(*words[:2]), digit(*words[3:5])), "apart")
    raise ValueError(f"prompt {text!r}: {forms}")


def tokenize(specs: list[PromptSpec]) -> torch.Tensor:
    """Token ids int64 [len(specs), MAX_TOKENS]: the canonical words, ``<eos>``, ``<pad>``s."""
    rows = []
    for spec in specs:
        ids = [_INDEX[w] for w in spec.text.split()] + [_INDEX[EOS]]
        rows.append(ids + [_INDEX[PAD]] * (MAX_TOKENS - len(ids)))
    return torch.tensor(rows, dtype=torch.long).reshape(len(specs), MAX_TOKENS)


def random_specs(n: int, gen: torch.Generator, pair_fraction: float = 0.3,
                 still: bool = False) -> list[PromptSpec]:
    """``n`` prompts drawn from ``gen``: digits uniform; with ``still`` one still digit each
    (single frames), else two digits drifting apart with probability ``pair_fraction`` and
    otherwise one digit with a uniform direction and speed."""
    dirs, speeds = list(DIRECTIONS), list(SPEEDS)
    draws = torch.rand(n, 5, generator=gen)
    specs = []
    for u in draws.tolist():
        d1, d2 = int(u[1] * 10), int(u[2] * 10)
        if still:
            specs.append(PromptSpec((d1,)))
        elif u[0] < pair_fraction:
            specs.append(PromptSpec((d1, d2), "apart"))
        else:
            specs.append(PromptSpec((d1,), dirs[int(u[3] * len(dirs))], speeds[int(u[4] * len(speeds))]))
    return specs


# The demo's ten prompts, selected by index (coda run --prompts 0-9): every digit once as the
# first-named digit, every direction, both speeds, two pairs.
DEMO_PROMPTS: tuple[str, ...] = (
    "a zero moving right slow",
    "a one moving up fast",
    "a two moving down-left slow",
    "a three and a seven drifting apart",
    "a four moving left fast",
    "a five moving up-right slow",
    "a six moving down fast",
    "a seven moving up-left fast",
    "an eight and a two drifting apart",
    "a nine moving down-right slow",
)


def demo_prompt(index: int) -> PromptSpec:
    """The spec of demo prompt ``index`` (0..9). Raises ValueError out of range."""
    if hasattr(index, "__index__") and not isinstance(index, bool):
        index = index.__index__()
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(DEMO_PROMPTS):
        raise ValueError(f"prompt index {index!r}: expected 0..{len(DEMO_PROMPTS) - 1}")
    return parse_prompt(DEMO_PROMPTS[index])
