"""What a sparse layer hands the Recorder about its choice, for the views (``attnlab.explain.selection``).

A layer that gathers each query's keys (``IndexedAttention``, ``CompressedAttention``) runs its attention over
rows of one query each, so the Recorder's "attn_weights" are (B * T, H, 1, R): one weight per key *read*, in the
order the gather read them. While a Recorder is active (and only then) the layer also records, before that
attention call:

* "read_slots" (B, T, R): the column each gathered key came from, on the layer's **dense axis** (its key slots;
  a compressed layer's closed entries after them, at S + entry), -1 where nothing was read: the sparse weights
  spread back onto that axis by :func:`spread`;
* "selected_keys" (B, T, K): the selection's own indices (``Selection.indices``, the kernel's, not recomputed):
  key slots (DSA) or entries (V4's compressed-sparse layers), -1 where fewer were visible;
* "dense_weights" (B, H, T, C): the weights each query would have had over every key it may see on the dense axis,
  the selection taken away (a softmax over all of them; with learned sinks the sink counted as the layer counts
  it): computed here, in the readable eager form, for the views alone; told to no other step.

A block-sparse layer (``MoBAAttention``, ``NSAAttention``'s selected branch) chooses per head (MoBA) or per key
group (NSA), R rows of choices: its gather (``functional.sparse_blocks.gathered_attention``) records
"block_slots" (B, R, T, M), the key slots it read (-1: none), and the layer (:func:`record_blocks`)
"selected_blocks" (B, R, T, K), its block ids, and "dense_weights" (B, H, T, S) over every key it may see; its
"attn_weights" are already on its key slots (B, H, T, S). NSA also records "window_slots" (B, T, S) bool, the
slots its sliding branch read, and "entry_ends" (B, C), the last position of each compressed entry it read (every
one closed by then): its query reads those besides its chosen blocks.

Shapes: B = batch, T = queries, H = heads, S = key slots, C = columns of the dense axis, R = keys read a query,
K = keys chosen a query, D = a key's width.
"""

from __future__ import annotations

import torch

from attnlab.functional.compression import closing_positions
from attnlab.functional.eager import attention_weights, head_weights
from attnlab.functional.visibility import Visibility
from attnlab.observe import Recorder, is_recording, record


def record_selection(
    *,
    read: torch.Tensor,
    chosen: torch.Tensor | None,
    queries: torch.Tensor | None = None,
    keys: torch.Tensor | None = None,
    dense: Visibility | None = None,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
    source: str,
) -> None:
    """Record a sparse layer's choice (see the module docstring); returns at once outside a Recorder.

    Args:
        read: (B, T, R) dense-axis columns of the keys gathered, in gather order (-1: none).
        chosen: (B, T, K) the selection's indices, or None for a layer that selects nothing (it reads every
            closed entry): then no "selected_keys" and no "dense_weights" are recorded.
        queries, keys, dense: (B, H, T, D), (B, Hk, C, D) and the Visibility over the C columns, from which the
            dense weights are formed.
        scale: the layer's softmax scale (None: 1 / sqrt(D), as ``attention`` takes it); sinks: (H,) learned
            sinks, or None.
    """
    if not is_recording():
        return
    record("read_slots", read, source=source)
    if chosen is None:
        return
    assert queries is not None and keys is not None and dense is not None  # a selecting layer gives them
    record("selected_keys", chosen, source=source)
    scale = queries.shape[-1] ** -0.5 if scale is None else scale
    if sinks is None:
        weights = attention_weights(queries, keys, dense, scale=scale)  # (B, H, T, C), told to no Recorder
    else:
        weights = head_weights(queries, keys, dense, scale=scale, heads=range(queries.shape[1]), sinks=sinks)
    record("dense_weights", weights, source=source)


def record_blocks(
    *,
    chosen: torch.Tensor,
    queries: torch.Tensor,
    keys: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    scale: float | None,
    source: str,
    also: dict[str, torch.Tensor] | None = None,
) -> None:
    """Record a block-sparse layer's choice (see the module docstring); returns at once outside a Recorder.

    Args:
        chosen: (B, R, T, K) the kernel's block ids; queries (B, H, T, D), keys (B, Hk, S, D): the selecting
            branch's; q_pos (B, T), k_pos (B, S): the rows' own positions (-1: none); also: further records by name.
    """
    if not is_recording():
        return
    record("selected_blocks", chosen, source=source)
    scale = queries.shape[-1] ** -0.5 if scale is None else scale
    dense = Visibility(q_pos=q_pos, k_pos=k_pos, causal=True)
    record("dense_weights", attention_weights(queries, keys, dense, scale=scale), source=source)  # told to no Recorder
    for name, tensor in (also or {}).items():
        record(name, tensor, source=source)


def spread(weights: torch.Tensor, read: torch.Tensor, columns: int) -> torch.Tensor:
    """Gathered weights (B * T, H, 1, R) back on the dense axis: (B, H, T, columns), 0 on every key not read.

    Args:
        read: (B, T, R), the layer's recorded "read_slots" (-1: nothing read there, its weight 0 dropped).
    """
    b, t, r = read.shape
    if weights.shape[0] != b * t or weights.shape[2:] != (1, r):
        raise ValueError(
            f"gathered weights {tuple(weights.shape)} do not match read_slots {tuple(read.shape)}: "
            "pass the same layer's last call of each"
        )
    h = weights.shape[1]
    rows = weights[:, :, 0].reshape(b, t, h, r).transpose(1, 2)  # (B * T, H, R) -> (B, H, T, R)
    out = rows.new_zeros(b, h, t, columns + 1)  # column C: where -1 lands, dropped
    where = torch.where(read >= 0, read, columns)[:, None].expand(b, h, t, r)  # (B, H, T, R)
    out.scatter_add_(3, where, rows)
    return out[..., :columns]


def record_compressed(
    *,
    q: torch.Tensor,
    keys: torch.Tensor,
    key_pos: torch.Tensor,
    entries: torch.Tensor,
    window: torch.Tensor,
    near: torch.Tensor,
    chosen: torch.Tensor | None,
    selecting: bool,
    positions: torch.Tensor,
    block: int,
    scale: float,
    sinks: torch.Tensor,
) -> None:
    """A V4 compressed layer's call (``CompressedAttention.forward``): its dense axis is its S token slots, then its
    n entries; it read each query's window slots ``near`` (B, T, W), then the entries ``chosen`` (B, T, K) (None:
    none closed yet). ``selecting``: a compressed-sparse layer (its indexer chose the entries), whose dense weights
    are over the window and every closed entry; a heavily compressed one records only what it read.

    Args:
        q: (B, H, T, D); keys: (B, 1, S, D); key_pos: (S,) or (B, S); entries: (B, n, D); window: (B, T, S) bool,
        the slots each query's window lets it see; positions: the queries' (T,) or (B, T); block: m.
    """
    if not is_recording():
        return
    b, t, s = window.shape
    n = entries.shape[1]
    picked = near.new_full((b, t, 0), -1) if chosen is None else chosen
    read = torch.cat((near, torch.where(picked >= 0, s + picked, -1)), dim=-1)  # (B, T, W + K) in gather order
    if not selecting:
        record_selection(read=read, chosen=None, source="CompressedAttention")
        return
    closing = closing_positions(0, n, block, q.device)  # (n,): where each entry becomes visible
    closed = (closing <= positions.reshape(-1, t, 1)).expand(b, t, n)  # (B|1, T, n) -> (B, T, n)
    mask = torch.cat((window, closed), dim=-1)[:, None]  # (B, 1, T, S + n)
    k_pos = torch.cat((key_pos.expand(b, s), closing.expand(b, n)), dim=-1)  # (B, S + n)
    dense = Visibility(q_pos=positions, k_pos=k_pos, causal=True, mask=mask)
    every = torch.cat((keys, entries[:, None]), dim=2)  # (B, 1, S + n, D)
    record_selection(
        read=read, chosen=picked, queries=q, keys=every, dense=dense, scale=scale, sinks=sinks,
        source="CompressedAttention",
    )  # fmt: skip


def token_weights(recorder: Recorder, module: str, tokens: int) -> torch.Tensor:
    """``module``'s last recorded "attn_weights" over the call's keys: a gathering layer's (B * T, H, 1, R) spread
    back onto its first ``tokens`` columns (B, H, T, tokens) by its "read_slots" (a compressed layer's entries,
    after its tokens, left out: its rows then sum to less than 1); any other layer's as recorded."""
    weights = recorder.get("attn_weights", module=module)
    read = recorder.all("read_slots").get(module)
    if read is None:
        return weights
    return spread(weights, read, max(tokens, int(read.max()) + 1))[..., :tokens]
