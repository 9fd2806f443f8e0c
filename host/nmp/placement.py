"""Bank-coloured placement of streams in one rank memory (the NMP driver's allocator).

An NME program streams its operands in lockstep: pass ``p`` reads words ``[p*depth,
(p+1)*depth)`` of x, then of every cached c_k, and writes the same words of y. Whether two of
those streams fight over one DRAM bank (same bank, different rows: a row conflict on every
switch) then depends only on where they lie; with first-fit placement that differs from slot
to slot, so identical segments took different times. :class:`BankColouredAllocator` places
every stream at a power-of-two-aligned base whose bank (its *colour*) is chosen by role, so
the streams a program reads together never share a bank and equal segments cost equal
cycles (why that works, and the colours by role: its docstring; ``docs/dimm-nmp.md``,
"Placement in rank memory").
"""

from __future__ import annotations

import bisect

from coda.hw.dram.mapping import AddressMapping
from coda.hw.dram.standards import DEFAULT_STANDARD, DRAMStandard, get_standard

__all__ = ["BankColouredAllocator", "SCRATCH_XOR", "SLOT_COLOUR", "DEFAULT_STANDARD"]

#: colour of the first slot group; group i takes (SLOT_COLOUR + i) % colours
SLOT_COLOUR = 3

#: colours of an operator's scratch ranges in order, XORed with the colour of its first
#: cached operand (0 if none): a segment on slots of colour c puts x at c^3, y at c^1
SCRATCH_XOR = (3, 1, 2, 0)



class BankColouredAllocator:
    """Word ranges of one rank memory ``[0, words)``, placed by bank colour.

    The controller's address mapping (:class:`coda.hw.dram.mapping.AddressMapping`) is linear
    over GF(2): bank group, bank (``bank field XOR fold(row)``) and row of ``a XOR b`` are those
    of ``a`` and ``b`` XORed. A stream of ``n`` words placed at a base aligned to a power of two
    ``A >= n`` has ``base + o = base XOR o`` for every offset ``o < A``, so its bank at offset
    ``o`` is ``bank(base) XOR bank(o)``. Two such streams walked in lockstep are in the same bank
    at *every* offset iff their bases are, and never otherwise: the bank of the base is the
    stream's **colour** (page colouring by bank, as in PALLOC, Yun et al., RTAS 2014). Giving
    the streams a program reads together different colours, by role, makes equal segments cost
    equal cycles and keeps them off each other's rows:

    - cache slots: one colour per *group* of slots that segments read together (a branch of
      one sample), groups taking the colours in turn (:data:`SLOT_COLOUR` first);
    - an operator's scratch: each tiled stream its own range, colours :data:`SCRATCH_XOR` in
      order XORed with its first cached operand's colour ``c`` (a segment's x at ``c^3``, y at
      ``c^1``); replicated operands (gates, re-read all along) ride in the first range, in x's
      rows. For a 3,072-word tile on DDR5-4800 (2,048 words per bank field) the streams of a
      1-term segment then never meet: x, y, c in banks c^3, c^1, c (second half: c^2, c, c^1)
      and the gates in bank c^2, x's row.

    Only the XOR of colours matters, so every segment of K terms on one group's slots meets
    the same conflicts: cycles no longer depend on where its slots happen to lie.

    A request that cannot get its colour takes another colour, and one that cannot be aligned
    is placed first-fit: placement never fails where first fit would succeed; ``misses`` counts
    both kinds (0 in a sized run).

    Args:
        words: words of the memory (>= 1).
        word_bytes: bytes per word (``2 * lanes``).
        std: the rank's DRAM standard (a :class:`DRAMStandard` or preset name); its address
            mapping defines the colours (``std.banks_per_group`` of them).
    Raises:
        ValueError: words or word_bytes < 1, or an unknown standard.
    """

    def __init__(self, words: int, word_bytes: int, std: DRAMStandard | str = DEFAULT_STANDARD):
        if words < 1 or word_bytes < 1:
            raise ValueError(f"words={words}, word_bytes={word_bytes}: expected >= 1 each")
        self.words, self.word_bytes = int(words), int(word_bytes)
        self.mapping = AddressMapping(get_standard(std))
        self.colours = self.mapping.std.banks_per_group
        m = self.mapping
        # words that share one bank field: the bank-group and column bits below it
        self._bank_step = max(1, ((1 << (m.bg_bits + m.col_bits)) * m.std.burst_bytes)
                              // self.word_bytes)
        self.starts = [0]          # free ranges, sorted by start
        self.lengths = [self.words]
        self.misses = 0

    def colour(self, word: int) -> int:
        """The colour of word address ``word``: the bank (within its group) of its burst."""
        return self.mapping.map((word * self.word_bytes) // self.mapping.std.burst_bytes)[1]

    def alloc(self, n: int, colour: int | None = None) -> int | None:
        """Place ``n`` >= 1 words at a base aligned to the power of two >= n, of colour
        ``colour % colours`` (None: any), lowest such base first; failing that any colour,
        then first fit. Returns the word address, or None if no free range holds ``n``."""
        align = 1 << (int(n) - 1).bit_length()
        want = None if colour is None else colour % self.colours
        fallback = None
        for start, length in zip(self.starts, self.lengths):
            end = start + length
            s = -(-start // align) * align
            while s + n <= end:
                if want is None or self.colour(s) == want:
                    return self._take(s, n)
                if fallback is None:
                    fallback = s
                # the colour changes only at bank-field boundaries
                s = max(s + align, -(-(s + 1) // self._bank_step) * self._bank_step)
                s = -(-s // align) * align
        if fallback is None:
            fallback = next((s for s, length in zip(self.starts, self.lengths) if length >= n),
                            None)
            if fallback is None:
                return None
        self.misses += 1
        return self._take(fallback, n)

    def _take(self, s: int, n: int) -> int:
        i = bisect.bisect_right(self.starts, s) - 1
        start, length = self.starts[i], self.lengths[i]
        del self.starts[i], self.lengths[i]
        if start + length > s + n:        # the part after
            self.starts.insert(i, s + n)
            self.lengths.insert(i, start + length - s - n)
        if s > start:                     # the part before
            self.starts.insert(i, start)
            self.lengths.insert(i, s - start)
        return s

    def release(self, start: int, n: int) -> None:
        """Free the ``n`` words at ``start`` (a range :meth:`alloc` returned)."""
        i = bisect.bisect_left(self.starts, start)
        self.starts.insert(i, start)
        self.lengths.insert(i, n)
        if i + 1 < len(self.starts) and start + n == self.starts[i + 1]:  # merge right
            self.lengths[i] += self.lengths.pop(i + 1)
            self.starts.pop(i + 1)
        if i > 0 and self.starts[i - 1] + self.lengths[i - 1] == start:  # merge left
            self.lengths[i - 1] += self.lengths.pop(i)
            self.starts.pop(i)

    def free_words(self) -> int:
        """Free words in all."""
        return sum(self.lengths)

    def largest(self) -> int:
        """The longest free range, words."""
        return max(self.lengths, default=0)
