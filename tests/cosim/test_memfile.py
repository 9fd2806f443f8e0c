"""Memory images and their hex files (coda.cosim.memfile): the changed-word search the RTL
backends use to send only what the simulator does not hold, and the hex round trip."""

import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from coda.cosim import memfile


@seed(77)
@settings(max_examples=60, deadline=None, database=None)
@given(lanes=st.integers(1, 17), words=st.integers(1, 300), data=st.data())
def test_changed_words_are_the_words_that_differ(lanes, words, data):
    """Every word width (the 64-, 32- and 16-bit comparison paths), changes anywhere in a
    word, several in one word, none: the words where ``(a != b).any(axis=1)``."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    a = rng.integers(0, 1 << 16, (words, lanes), dtype=np.uint16)
    b = a.copy()
    for _ in range(data.draw(st.integers(0, 2 * words))):
        w, j = data.draw(st.integers(0, words - 1)), data.draw(st.integers(0, lanes - 1))
        b[w, j] ^= data.draw(st.integers(1, 0xFFFF))
    got = memfile.changed_words(a, b)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.flatnonzero((a != b).any(axis=1)))


def test_changed_words_of_non_contiguous_images_and_bad_shapes():
    a = np.arange(64, dtype=np.uint16).reshape(8, 8)
    b = a.copy()
    b[5, 7] = 0
    np.testing.assert_array_equal(memfile.changed_words(a[::2], b[::2]), [])
    np.testing.assert_array_equal(memfile.changed_words(a[1::2], b[1::2]), [2])
    with pytest.raises(ValueError, match=r"shapes \(8, 8\) and \(8, 4\): expected the same"):
        memfile.changed_words(a, b[:, :4])


@pytest.mark.parametrize("lanes", [1, 3, 8])
def test_hex_round_trip_element_order(lanes):
    """Element ``lanes-1`` is the first hex digit group; hex_to_words inverts words_to_hex."""
    words = np.random.default_rng(lanes).integers(0, 1 << 16, (5, lanes), dtype=np.uint16)
    hexes = memfile.words_to_hex(words)
    assert hexes[0] == "".join(f"{v:04x}" for v in words[0, ::-1])
    np.testing.assert_array_equal(memfile.hex_to_words(hexes, lanes), words)


@seed(78)
@settings(max_examples=40, deadline=None, database=None)
@given(lanes=st.integers(1, 17), words=st.integers(1, 5000), data=st.data())
def test_sparse_and_full_files_round_trip(tmp_path_factory, lanes, words, data):
    """write_sparse / read_sparse give back the same addresses
    and words, whatever the address width; each line is ``@addr word`` with the word's
    elements last-first, as ``$readmemh`` reads it."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    mem = rng.integers(0, 1 << 16, (words, lanes), dtype=np.uint16)
    addrs = np.unique(rng.integers(0, words, data.draw(st.integers(1, 40))))
    path = tmp_path_factory.mktemp("mem") / "sparse.hex"
    memfile.write_sparse(path, mem, addrs)
    lines = path.read_text().splitlines()
    assert [int(line.split()[0][1:], 16) for line in lines] == addrs.tolist()
    assert lines[0].split()[1] == "".join(f"{v:04x}" for v in mem[addrs[0], ::-1])
    got_addrs, got_words = memfile.read_sparse(path, lanes)
    np.testing.assert_array_equal(got_addrs, addrs)
    np.testing.assert_array_equal(got_words, mem[addrs])


def test_read_sparse_general_path_and_errors(tmp_path):
    """Addresses of unequal width, upper-case and short words (zero-extended) are read one by
    one; a missing ``@``, a word that is not hex or too long, an odd token count are refused."""
    path = tmp_path / "s.hex"
    path.write_text("@3 00010002\n@1A 0003\n@000b FFFF0000\n")
    addrs, words = memfile.read_sparse(path, 2)
    assert addrs.tolist() == [3, 26, 11]
    assert words.tolist() == [[2, 1], [3, 0], [0, 0xFFFF]]
    for text, match in (("3 00010002\n", "expected '@addr word' pairs"),
                        ("@3 0001000g\n", "non-hexadecimal|not hexadecimal"),
                        ("@3 000100020\n", "has 9 digits: expected <= 8"),
                        ("@3 00010002 @4\n", "odd number of tokens")):
        path.write_text(text)
        with pytest.raises(ValueError, match=match):
            memfile.read_sparse(path, 2)
