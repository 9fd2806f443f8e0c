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
