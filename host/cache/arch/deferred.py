"""Deferred block outputs: how a segment spans blocks while the model's own loop runs.

A hooked block does not compute when the model's forward calls it: the engine records the
call and returns a :class:`Deferred` tensor per residual stream, a stand-in with the output's
shape, dtype and device but no data. When the model passes it straight to the next hooked
block, that block joins the same recorded *program*, so consecutive reused operators of both
blocks can form one segment and each CFG branch can run the whole program as one trunk.
Anything else that touches a deferred tensor (the model's own arithmetic between blocks, such
as Latte's temporal position embedding, a norm, a projection, printing it) reaches
:meth:`Deferred.__torch_dispatch__`, which first runs the program (every pending segment
included) and hands the operation the real tensor: an operation outside the engine's
knowledge always sees exact values, never a stand-in.

Pure layout operations between blocks are recorded and replayed on the real tensor; a
segment spans them when :func:`continues` shows they take the previous block's output
exactly onto the next block's canonical token order (:class:`Deferred`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_any, tree_map

__all__ = ["Deferred", "materialized", "continues", "LAYOUT_OPS"]

_aten = torch.ops.aten
#: operations recorded on a deferred tensor instead of computing it
LAYOUT_OPS = frozenset({_aten.view.default, _aten._unsafe_view.default, _aten.permute.default,
                        _aten.clone.default})


class Deferred(torch.Tensor):
    """A residual stream a recorded block call will produce (a wrapper tensor, no storage).

    Attributes (engine side): ``_owner`` the call's run (``node_value(node, stream)``,
    ``fail(exc)``),
    ``_node`` the recorded call, ``_stream`` the stream name, ``_chain`` the layout operations
    applied since, ``_value`` the real tensor once computed.

    Pure layout operations (``view``, ``_unsafe_view``, ``permute``, ``clone``: what
    ``reshape``, ``permute`` and ``contiguous`` dispatch to) are recorded instead and replayed on
    the real tensor when it is needed. A block that receives such a moved tensor continues the
    program only if a token-index probe shows the moves take the previous block's output exactly
    onto its own canonical token order (:func:`continues`); e.g. Latte's
    ``reshape(B, -1, N, C).permute(0, 2, 1, 3).reshape(-1, F, C)`` between its spatial and
    temporal blocks, so a segment spans them as it does in the Latte paper's pipeline.
    """
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, owner, node, stream: str, shape, dtype, device,
                stride=None, offset: int = 0, chain: tuple = ()):
        if stride is None:
            stride = torch.empty(shape, device="meta").stride()
        t = torch.Tensor._make_wrapper_subclass(cls, shape, strides=stride, storage_offset=offset,
                                                dtype=dtype, device=device, requires_grad=False)
        t._owner, t._node, t._stream, t._chain, t._value = owner, node, stream, chain, None
        node.lazies.add(t)
        return t

    def __init__(self, *args, **kwargs):
        pass

    def __repr__(self):
        state = "computed" if self._value is not None else "pending"
        return f"Deferred({tuple(self.shape)}, {self.dtype}, stream={self._stream!r}, {state})"

    def _meta(self) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta")

    @torch.compiler.disable     # runs the engine (decisions, segments): never traced
    def materialize(self) -> torch.Tensor:
        """The real tensor (runs the recorded program first if it has not run). An exception
        on the way is recorded as the step's failure (``_owner.fail``) before it propagates:
        the model's code that asked for the value may catch or replace it."""
        if self._value is None:
            try:
                value = self._owner.node_value(self._node, self._stream)
                for func, args, kwargs in self._chain:
                    value = func(value, *args, **kwargs)
            except BaseException as exc:
                self._owner.fail(exc)
                raise
            self._value = value
        return self._value

    @classmethod
    @torch.compiler.disable     # a compiled module given a deferred output: see materialize
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        src = args[0] if args else None
        if (func in LAYOUT_OPS and isinstance(src, Deferred) and src._value is None
                and not tree_any(lambda a: isinstance(a, Deferred), (args[1:], kwargs))):
            meta = func(src._meta(), *args[1:], **kwargs)
            return Deferred(src._owner, src._node, src._stream, meta.shape, src.dtype, src.device,
                            meta.stride(), meta.storage_offset(),
                            src._chain + ((func, args[1:], kwargs),))
        args, kwargs = tree_map(materialized, (args, kwargs))
        return func(*args, **kwargs)


def materialized(x: Any) -> Any:
    """``x`` with a :class:`Deferred` replaced by its real tensor (anything else as is)."""
    return x.materialize() if isinstance(x, Deferred) else x


def _probe_args(func, x: torch.Tensor, args: tuple, channels: int) -> tuple | None:
    """The layout operation's arguments for the [..., 1] probe standing for a [..., C]
    tensor; None if the operation does not keep channels as the last, unit-stride dim."""
    if func in (_aten.view.default, _aten._unsafe_view.default):
        size = list(args[0])
        if size[-1] not in (channels, -1):
            return None
        size[-1] = 1 if size[-1] == channels else -1
        return (size,) + tuple(args[1:])
    if func is _aten.permute.default:
        dims = list(args[0])
        return args if dims and dims[-1] in (-1, x.dim() - 1) else None
    return args


def continues(x: Deferred, prev_spec, next_spec, stream: str, canon_shape, batch: int) -> bool:
    """Whether the block ``next_spec`` receiving ``x`` (the ``stream`` output of a block of
    ``prev_spec``, moved by ``x._chain``) sees exactly that block's canonical tokens
    (``canon_shape`` [B, ..., C]), i.e. ``to_canonical(chain(from_canonical(h))) == h``.
    Checked on a token-index probe of shape [B, ..., 1]."""
    channels = canon_shape[-1]
    probe = torch.arange(int(torch.Size(canon_shape[:-1]).numel())).reshape(*canon_shape[:-1], 1)
    t = prev_spec.from_canonical(stream, probe)
    for func, args, kwargs in x._chain:
        args = _probe_args(func, t, args, channels)
        if args is None:
            return False
        try:
            t = func(t, *args, **kwargs)
        except RuntimeError:
            return False
        if t.shape[-1] != 1:
            return False
    try:
        got = next_spec.to_canonical(stream, t, batch)
    except RuntimeError:
        return False
    return got.shape == probe.shape and torch.equal(got, probe)
