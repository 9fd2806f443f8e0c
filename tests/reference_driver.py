"""A reference for the cache engine's tests: cache slots in a dict and segments by the torch
reference :func:`coda.host.nme.ops.segment` (plain torch in the NME format), with the counters
the engine reads. Not a test module (no ``test_`` prefix); tests import it by name."""

import torch

from coda.host.nme import ops


class TorchSegmentDriver:
    """Reference: slots in a dict, segments by coda.host.nme.ops.segment (plain torch, NME format)."""

    def __init__(self):
        self.slots = {}
        self.stats = dict.fromkeys(("bytes_written", "bytes_read", "cmd_bytes", "nme_cycles",
                                    "programs"), 0)

    def store(self, key, tensor, group=None):
        self.slots[key] = tensor.clone()

    def store_int8(self, key, q, scale, qgroup, group=None):
        self.slots[key] = (q.clone(), scale.clone(), int(qgroup))

    def free(self, key):
        del self.slots[key]

    def swap(self, a, b):
        sa, sb = self.slots.pop(a, None), self.slots.pop(b, None)
        if sa is not None:
            self.slots[b] = sa
        if sb is not None:
            self.slots[a] = sb

    def __contains__(self, key):
        return key in self.slots

    def segment(self, x, gates, keys):
        entries = [self.slots[k] for k in keys]
        if isinstance(entries[0], tuple):     # int8 entries: (q, scale, G)
            return ops.segment(x, torch.stack(gates), torch.stack([e[0] for e in entries]),
                               torch.stack([e[1] for e in entries]), entries[0][2])
        return ops.segment(x, torch.stack(gates), torch.stack(entries))
