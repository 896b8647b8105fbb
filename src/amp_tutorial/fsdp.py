"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the course's transformer: sharding it, and
what a lesson or a training script reads off a sharded model (the weights' hash, the bytes each
process holds, the dtype every op ran in).

FSDP2 turns each parameter into a ``DTensor`` sharded on dim 0 across the process group. Before a
sharded module runs, each process casts its shards to the policy's ``param_dtype`` and the 16-bit
copies are all-gathered; after it, the gathered copy is freed (``reshard_after_forward``; the
root's stays until backward). In backward, gradients are reduce-scattered in ``reduce_dtype`` and
land, sharded, in the fp32 parameters' ``.grad``.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from amp_tutorial.autocast_policy import OpTrace
from amp_tutorial.transformer import DecoderTransformer

# FSDP2 (torch 2.14) warns when a wrapped module returns a view, because an in-place op on it
# would skip its pre-backward hook. The transformer's head returns a view (a Linear on 3-D input,
# ``_unsafe_view``); the course never changes the logits in place.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

# FSDP2's own work in a dtype trace (all-gather buffers, casts of the gathered parameters), and
# view-like ops: what is left is the model's compute.
PLUMBING = frozenset({"_to_copy", "empty", "copy_", "as_strided", "split_with_sizes_copy",
                      "all_gather_into_tensor", "all_gather_into_tensor_", "_allgather_base_",
                      "allgather_", "reduce_scatter_tensor", "_reduce_scatter_base_",
                      "wait_tensor", "chunk_cat", "new_empty", "zeros", "arange", "view",
                      "slice", "_unsafe_view", "lift_fresh"})


def shard(model: DecoderTransformer, policy: MixedPrecisionPolicy,
          root_policy: MixedPrecisionPolicy | None = None) -> DecoderTransformer:
    """``fully_shard`` each block with ``policy``, then the root (embeddings, final norm, head)
    with ``root_policy`` (default: ``policy``): one all-gather per block, and the root last, as
    FSDP2 expects (children are sharded before their parent)."""
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=root_policy or policy)
    return model


def full_parameter_hash(model: nn.Module) -> str:
    """SHA-256 of every parameter gathered whole (``DTensor.full_tensor()`` is a collective: every
    process must call this): equal for the same weights however many processes hold the shards."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        whole = param.full_tensor() if hasattr(param, "full_tensor") else param
        digest.update(name.encode())
        digest.update(whole.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _local_bytes(t: torch.Tensor) -> int:
    # a DTensor's shard on this process, without FSDP2's padding of the last shard
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this process holds for training state, counted from the tensors themselves:
    parameters, gradients and optimizer state (of a sharded model: this process's shards)."""
    params = list(model.parameters())
    return {"parameters": sum(_local_bytes(p) for p in params),
            "gradients": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer state": sum(_local_bytes(v) for s in optimizer.state.values()
                                   for v in s.values()
                                   if isinstance(v, torch.Tensor) and v.dim() > 0)}


def largest_unit_bytes(model: DecoderTransformer, param_dtype: torch.dtype) -> int:
    """Bytes of unsharded parameters a process holds at least while one block computes: the
    largest block plus the root's own parameters (embeddings, final norm, head; the root is not
    resharded after forward), whole and in ``param_dtype``. Computed from the sizes, not measured;
    a lower bound: in backward the next block is prefetched, and gradient buffers come on top."""
    size = torch.empty((), dtype=param_dtype).element_size()
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    root = sum(p.numel() for p in model.parameters()) - sum(blocks)
    return (max(blocks) + root) * size


def op_dtypes(traces: dict[str, list[OpTrace]],
              ops: Iterable[str] | None = None) -> list[dict[str, str]]:
    """One row per compute op, one column per traced setup: the dtype(s) the op's output had.

    ``traces`` maps a setup's name to ``trace_module``'s ops; FSDP2's plumbing is left out.
    """
    seen: dict[str, dict[str, set[str]]] = {}
    for setup, trace in traces.items():
        for op in trace:
            if op.op not in PLUMBING:
                seen.setdefault(op.op, {}).setdefault(setup, set()).add(op.output)
    names = list(ops) if ops is not None else list(seen)
    return [{"op": name, **{setup: ", ".join(sorted(seen.get(name, {}).get(setup, {"-"})))
                            for setup in traces}} for name in names]

