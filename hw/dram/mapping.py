"""Address mapper of the rank memory controller (:class:`coda.hw.dram.controller.DRAMController`).

:class:`AddressMapping` splits a burst address LSB first into
``[ bank group | column burst | bank | (rank) | row ]``: consecutive bursts rotate through the
bank groups, then walk a row, and the bank index is permuted with the row (Zhang et al.,
MICRO-33 2000, permutation-based page interleaving); its docstring has the fields, the fold and
the rank bits. :func:`map_burst_address` maps one address of a standard.

The mapping is one object with two faces, kept side by side so they cannot drift apart:
:meth:`AddressMapping.map` (Python integers, for models of the memory image and tests) and
:meth:`AddressMapping.fields` (Amaranth expressions, for the controller). Like Ramulator 2's
address mappers it is a plug-in with this small interface.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from amaranth.hdl import Cat
from amaranth.utils import ceil_log2

from coda.hw.dram.standards import DRAMStandard, get_standard

__all__ = ["AddressMapping", "BurstFields", "map_burst_address"]


@dataclass(frozen=True)
class BurstFields:
    """Mapped fields of a burst address (Amaranth values): ``bg`` bank group, ``ba`` bank
    within the group, ``row``, ``col`` column burst (the device column is ``col * BL``),
    and ``bank`` = ``ba * bank_groups + bg``, the bank's index in the rank (with ranks,
    ``+ banks * rank``: its index in the channel), ``rank`` (0 with one rank)."""
    bg: object
    ba: object
    row: object
    col: object
    bank: object
    rank: object = 0


class AddressMapping:
    """The controller's address mapping for ``std``.

    A burst address ``a`` (one burst = ``std.burst_bytes``) is split LSB first into::

        [ bank group | column burst | bank | row ]

    consecutive bursts rotate through the bank groups (so a stream pays tCCD_S, not tCCD_L),
    then walk a row; the bank index is permuted with the row (Zhang et al., MICRO-33 2000,
    permutation-based page interleaving): ``bank = bank_field XOR fold(row)`` where ``fold``
    XORs the row's ``log2(banks_per_group)``-bit chunks. Streams a power-of-two distance apart
    (STREAM's arrays) thus open rows in different banks instead of conflicting in one.

    With ``ranks`` R > 1 (R ranks sharing one channel, ``coda dram replay --ranks``) the rank
    bits sit between the bank and the row::

        [ bank group | column burst | bank | rank | row ]

    so one row-stripe of every bank (DDR4: 2,048 bursts = 128 KiB, DDR5: 1,024 bursts = 64 KiB)
    lies in one rank and the next stripe in the next: a stream changes rank once a stripe (few
    rank switches), random addresses spread over all ranks (their tFAW windows add up). The rank
    is not permuted; the bank permutation folds the row as before. The flat bank index of the
    controller is then ``bank + banks * rank`` (``Cat(bg, ba, rank)``).

    Parameters:
        std: a :class:`DRAMStandard` or preset name.
        ranks: ranks of the channel (1, 2 or 4).
    """

    def __init__(self, std: DRAMStandard | str, ranks: int = 1):
        self.std = std = get_standard(std)
        if ranks not in (1, 2, 4):
            raise ValueError(f"ranks={ranks!r}: expected 1, 2 or 4")
        self.ranks, self.rank_bits = ranks, ceil_log2(ranks)
        self.bg_bits, self.col_bits = ceil_log2(std.bank_groups), ceil_log2(std.bursts_per_row)
        self.ba_bits, self.row_bits = ceil_log2(std.banks_per_group), ceil_log2(std.rows)
        #: burst address bits of the channel (the rank's and the rank bits)
        self.addr_bits = std.burst_addr_bits + self.rank_bits

    def map_rank(self, addr: int) -> tuple[int, int, int, int, int]:
        """``(rank, bankgroup, bank, row, column)`` of channel burst address ``addr``.

        Raises:
            ValueError: ``addr`` outside ``0 .. 2**addr_bits - 1``.
        """
        if not 0 <= addr < (1 << self.addr_bits):
            raise ValueError(f"burst address {addr}: expected 0..{(1 << self.addr_bits) - 1}")
        lo = self.bg_bits + self.col_bits + self.ba_bits
        rank = (addr >> lo) & ((1 << self.rank_bits) - 1)
        rest = (addr & ((1 << lo) - 1)) | (addr >> (lo + self.rank_bits)) << lo
        return (rank, *self._map_rank0(rest))

    def map(self, addr: int) -> tuple[int, int, int, int]:
        """``(bankgroup, bank, row, column)`` of burst address ``addr``, ``column`` the device
        column of the burst's first beat (column burst * BL).

        Raises:
            ValueError: ``addr`` outside ``0 .. 2**std.burst_addr_bits - 1``.
        """
        std = self.std
        if self.ranks > 1:
            raise ValueError(f"map() is the one-rank mapping; with ranks={self.ranks} use "
                             f"map_rank()")
        if not 0 <= addr < (1 << std.burst_addr_bits):
            raise ValueError(f"burst address {addr}: expected "
                             f"0..{(1 << std.burst_addr_bits) - 1}")
        return self._map_rank0(addr)

    def _map_rank0(self, addr: int) -> tuple[int, int, int, int]:
        std = self.std
        gb, cb, bb, rb = self.bg_bits, self.col_bits, self.ba_bits, self.row_bits
        bg = addr & ((1 << gb) - 1)
        col = (addr >> gb) & ((1 << cb) - 1)
        ba = (addr >> (gb + cb)) & ((1 << bb) - 1)
        row = (addr >> (gb + cb + bb)) & ((1 << rb) - 1)
        fold = 0
        for lo in range(0, rb, bb):
            fold ^= (row >> lo) & ((1 << bb) - 1)
        return bg, ba ^ fold, row, col * std.burst_length

    def fields(self, addr) -> BurstFields:
        """The mapped fields of the burst address ``addr`` (an Amaranth value of at least
        :attr:`addr_bits` bits) as Amaranth expressions (``rank``: 0 with one rank; ``bank``
        the flat index ``Cat(bg, ba, rank)``)."""
        gb, cb, bb, rb = self.bg_bits, self.col_bits, self.ba_bits, self.row_bits
        kb = self.rank_bits
        bg = addr[0:gb]
        row = addr[gb + cb + bb + kb:gb + cb + bb + kb + rb]
        fold = addr[gb + cb:gb + cb + bb]
        for lo in range(0, rb, bb):
            fold = fold ^ row[lo:min(lo + bb, rb)]
        ba = fold[:bb]
        if kb == 0:
            return BurstFields(bg=bg, ba=ba, row=row, col=addr[gb:gb + cb], bank=Cat(bg, ba))
        rank = addr[gb + cb + bb:gb + cb + bb + kb]
        return BurstFields(bg=bg, ba=ba, row=row, col=addr[gb:gb + cb], bank=Cat(bg, ba, rank),
                           rank=rank)


def map_burst_address(std: DRAMStandard | str, addr: int) -> tuple[int, int, int, int]:
    """Python model of the controller's address mapping: :meth:`AddressMapping.map`.

    Args:
        std: the DRAM standard; addr: burst address (bytes // std.burst_bytes),
            ``0 <= addr < 2**std.burst_addr_bits``.
    Returns:
        ``(bankgroup, bank, row, column)`` with ``column`` the device column of the burst's
        first beat (column burst * BL).
    Raises:
        ValueError: address out of the rank.
    """
    return _mapping(get_standard(std)).map(addr)


@functools.lru_cache(maxsize=8)
def _mapping(std: DRAMStandard) -> AddressMapping:
    return AddressMapping(std)
