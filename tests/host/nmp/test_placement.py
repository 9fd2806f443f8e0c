"""Bank-coloured placement (host/nmp/placement.py) and the driver's use of it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coda.host.nme.backend import TorchBackend
from coda.host.nmp.driver import NMPDriver
from coda.host.nmp.placement import SCRATCH_XOR, SLOT_COLOUR, BankColouredAllocator
from coda.hw.dram.mapping import AddressMapping
from coda.hw.dram.standards import STANDARDS
from coda.hw.nme.isa import NMEConfig

PRESETS = sorted(STANDARDS)


def _bank(mapping: AddressMapping, burst: int) -> tuple[int, int]:
    bg, ba, _, _ = mapping.map(burst)
    return bg, ba


@settings(max_examples=300, deadline=None)
@given(std=st.sampled_from(PRESETS), log_a=st.integers(0, 20), data=st.data())
def test_an_aligned_stream_sees_its_base_bank_xor_its_offset_bank(std, log_a, data):
    """The mapping is linear over GF(2): at every offset o < A of a base aligned to A, the
    (bank group, bank) is that of the base XOR that of o: two lockstep streams meet in a bank
    at every offset or at none."""
    m = AddressMapping(std)
    a = 1 << log_a
    base = data.draw(st.integers(0, (1 << m.std.burst_addr_bits) // a - 1)) * a
    o = data.draw(st.integers(0, a - 1))
    (g0, b0), (g1, b1), (g2, b2) = _bank(m, base), _bank(m, o), _bank(m, base + o)
    assert (g2, b2) == (g0 ^ g1, b0 ^ b1)


@pytest.mark.parametrize("std", PRESETS)
def test_alloc_honours_alignment_and_colour(std):
    al = BankColouredAllocator(1 << 18, 16, std)
    for n in (1, 5, 12, 3072, 4096, 5000):
        for colour in range(al.colours):
            addr = al.alloc(n, colour)
            align = 1 << (n - 1).bit_length()
            assert addr % align == 0 and al.colour(addr) == colour, (n, colour, addr)
    assert al.misses == 0


def test_colour_is_the_bank_of_the_first_burst():
    al = BankColouredAllocator(1 << 16, 16, "DDR5-4800")
    m = AddressMapping("DDR5-4800")
    for word in (0, 2048, 4096, 6144, 8192, 12345, 65535):
        assert al.colour(word) == m.map(word * 16 // 64)[1]


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 700), st.integers(0, 3)),
                    max_size=60))
def test_alloc_fails_only_when_no_free_range_holds_the_request(ops):
    """Random allocations and frees: ranges never overlap, stay inside the memory, a request
    fails only if no free range is long enough, and freeing everything restores it."""
    words = 4096
    al = BankColouredAllocator(words, 16, "DDR4-3200")
    live: list[tuple[int, int]] = []
    for is_free, n, colour in ops:
        if is_free and live:
            start, length = live.pop(n % len(live))
            al.release(start, length)
            continue
        largest = al.largest()
        addr = al.alloc(n, colour)
        if addr is None:
            assert largest < n
            continue
        assert 0 <= addr and addr + n <= words
        assert all(addr + n <= s or s + k <= addr for s, k in live)
        live.append((addr, n))
        assert al.free_words() == words - sum(k for _, k in live)
    for start, length in live:
        al.release(start, length)
    assert al.starts == [0] and al.lengths == [words]


def test_a_request_that_cannot_get_its_colour_is_placed_and_counted():
    al = BankColouredAllocator(2048, 16, "DDR5-4800")   # one bank field: colour 0 only
    addr = al.alloc(100, 3)
    assert addr == 0 and al.misses == 1
    assert al.alloc(100, 0) == 128 and al.misses == 1


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="words=0"):
        BankColouredAllocator(0, 16)
    with pytest.raises(ValueError, match="DDR9"):
        BankColouredAllocator(1024, 16, "DDR9")


def _driver(ranks=2, mem_words=1 << 17):
    return NMPDriver(TorchBackend(), NMEConfig(lanes=8, mem_words=mem_words), 1, ranks)


def test_a_segment_places_x_y_and_gates_by_the_colour_of_its_slots():
    """Slots of one group share a colour c; a segment on them puts x at c^3 with its gates
    right after it (x's rows), y at c^1; a second group takes the next colour."""
    drv = _driver()
    g = torch.Generator().manual_seed(0)
    for i in range(3):
        drv.store(("a", i), torch.randn(512, 96, generator=g).to(torch.bfloat16), group="a")
    drv.store(("b", 0), torch.randn(512, 96, generator=g).to(torch.bfloat16), group="b")
    al = drv._allocs[0]
    colours = {k: al.colour(drv._slots[k].addrs[0]) for k in drv.keys()}
    c = SLOT_COLOUR % al.colours
    assert [colours[("a", i)] for i in range(3)] == [c] * 3
    assert colours[("b", 0)] == (SLOT_COLOUR + 1) % al.colours
    seen = {}
    submit = drv._submit

    def spy(jobs, layouts):
        seen["layout"] = layouts[0]
        return submit(jobs, layouts)

    drv._submit = spy
    x = torch.randn(512, 96, generator=g).to(torch.bfloat16)
    gates = [torch.randn(96, generator=g).to(torch.bfloat16) for _ in range(3)]
    drv.segment(x, gates, [("a", i) for i in range(3)])
    lay = seen["layout"]
    assert al.colour(lay["x"]) == c ^ SCRATCH_XOR[0] and al.colour(lay["y"]) == c ^ SCRATCH_XOR[1]
    assert lay["g"] == lay["x"] + 3072          # the gates follow x in its range
    assert drv.stats["placement_misses"] == 0


def test_results_do_not_depend_on_the_groups():
    """Placement is only placement: the same segment on differently grouped slots gives the
    same bits."""
    g = torch.Generator().manual_seed(1)
    slots = [torch.randn(300, 64, generator=g).to(torch.bfloat16) for _ in range(4)]
    x = torch.randn(300, 64, generator=g).to(torch.bfloat16)
    gates = [torch.randn(64, generator=g).to(torch.bfloat16) for _ in range(4)]
    out = []
    for groups in ([None] * 4, ["p", "q", "p", "r"]):
        drv = _driver(ranks=3)
        for i, (t, grp) in enumerate(zip(slots, groups)):
            drv.store(i, t, group=grp)
        out.append(drv.segment(x, gates, [0, 1, 2, 3]))
    assert torch.equal(out[0].view(torch.int16), out[1].view(torch.int16))
