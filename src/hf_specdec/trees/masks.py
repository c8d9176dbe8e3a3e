"""Custom 4D attention masks for verifying drafted tokens through a stock transformers model.

Transformers passes a 4D mask of shape `(batch, 1, query_length, kv_length)` to the attention layers as-is,
so a chain of drafts, a tree of drafts or a batch with holes in its cache needs no change to the modelling
code: only this mask and explicit `position_ids`.

A cache slot is visible to a new token when the slot holds a real token of that row (`key_valid`), it is
an ancestor of the new token (for the new tokens of this forward: `structure`), and, for sliding-window
layers, it lies within the window counted in logical positions.
"""

from __future__ import annotations

import functools

import torch


def visibility(
    past_valid: torch.Tensor,
    new_valid: torch.Tensor,
    structure: torch.Tensor,
    key_positions: torch.Tensor | None = None,
    query_positions: torch.Tensor | None = None,
    sliding_window: int | None = None,
    recent: torch.Tensor | None = None,
) -> torch.Tensor:
    """Which keys every new query may attend to.

    Args:
        past_valid (`torch.BoolTensor` of shape `(batch, past)`): cache slots holding real tokens.
        new_valid (`torch.BoolTensor` of shape `(batch, q)`): which new tokens are real (not padding/holes).
        structure (`torch.BoolTensor` of shape `(q, q)` or `(batch, q, q)`): `structure[..., i, j]` is True
            when new token j is an ancestor of (or is) new token i. A chain is the lower triangle; a tree, its
            ancestor matrix (one per row when rows verify different trees).
        key_positions (`torch.LongTensor` of shape `(batch, past + q)`, *optional*): logical position of
            every key; needed only with `sliding_window`.
        query_positions (`torch.LongTensor` of shape `(batch, q)`, *optional*): logical position of every
            new token; needed only with `sliding_window`.
        sliding_window (`int`, *optional*): a key is visible when `query_pos - key_pos < sliding_window`.
        recent (`torch.BoolTensor` of shape `(batch, q, S)`, *optional*): which of the last `S` past slots each
            new query may see (a tree fed over several forwards: a node sees the nodes fed before it only when
            they are its ancestors); the earlier past slots follow `past_valid` alone.

    Returns:
        `torch.BoolTensor` of shape `(batch, q, past + q)`. Every query sees its own slot, so even a padding
        query has one visible key and attention never produces NaN.
    """
    batch, past = past_valid.shape
    q = structure.shape[-1]
    past_part = past_valid[:, None, :].expand(batch, q, past)  # (B, q, P)
    if recent is not None and recent.shape[-1]:
        past_part = past_part.clone()
        past_part[..., past - recent.shape[-1] :] &= recent
    new_part = structure.expand(batch, q, q) & new_valid[:, None, :]  # (B, q, q)
    visible = torch.cat([past_part, new_part], dim=2)  # (B, q, P+q)
    if sliding_window is not None:
        if key_positions is None or query_positions is None:
            raise ValueError("A sliding-window mask needs key_positions and query_positions.")
        distance = query_positions[:, :, None] - key_positions[:, None, :]  # (B, q, P+q)
        visible = visible & (distance < sliding_window)
    diagonal = torch.eye(q, dtype=torch.bool, device=visible.device)  # (q, q)
    visible[:, :, past:] |= diagonal
    return visible


def to_additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Turn a `(batch, q, kv)` visibility matrix into the `(batch, 1, q, kv)` additive mask that both the
    eager and the SDPA attention of transformers accept: 0 where visible, the dtype's minimum elsewhere."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)  # (B, q, kv)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]  # (B, 1, q, kv)


def additive_mask(
    past_valid: torch.Tensor,
    new_valid: torch.Tensor | None,
    structure: torch.Tensor,
    dtype: torch.dtype,
    recent: torch.Tensor | None = None,
    kv_length: int | None = None,
) -> torch.Tensor:
    """`to_additive(visibility(past_valid, new_valid, structure, recent=recent), dtype)` without a sliding window,
    written straight into the mask (a handful of operations: this runs before every forward of every model).

    Args:
        past_valid, new_valid, structure, recent: as for `visibility`; `new_valid` `None` when every new token is
            real (the structure is then the new tokens' mask as it is: it holds the diagonal).
        dtype (`torch.dtype`): the mask's.
        kv_length (`int`, *optional*): keys the attention sees, `past + q` or more (a static cache's slots); the
            keys past the new tokens are hidden.

    Returns:
        `torch.Tensor` of shape `(batch, 1, q, kv_length)`: 0 where visible, the dtype's minimum elsewhere.
    """
    batch, past = past_valid.shape
    q = structure.shape[-1]
    kv_length = past + q if kv_length is None else kv_length
    mask = torch.full((batch, 1, q, kv_length), torch.finfo(dtype).min, dtype=dtype, device=past_valid.device)
    seen_past = past_valid.view(batch, 1, 1, past)
    if recent is not None and recent.shape[-1]:
        older = past - recent.shape[-1]
        mask[..., :older].masked_fill_(seen_past[..., :older], 0.0)
        mask[..., older:past].masked_fill_(seen_past[..., older:] & recent[:, None], 0.0)
    else:
        mask[..., :past].masked_fill_(seen_past, 0.0)
    if new_valid is None:
        seen_new = structure
    else:
        seen_new = (structure & new_valid[:, None, :]) | torch.eye(q, dtype=torch.bool, device=new_valid.device)
    mask[..., past : past + q].masked_fill_(seen_new[:, None] if seen_new.dim() == 3 else seen_new, 0.0)
    return mask


def chain_structure(q: int, device: torch.device | str) -> torch.Tensor:
    """The `(q, q)` ancestor matrix of a chain: token i sees tokens 0..i (for the widths decoding steps feed, one
    tensor per width and device, shared: never written to)."""
    if q <= _SHARED_WIDTHS:
        return _chain_structure(q, torch.device(device))
    return torch.ones(q, q, dtype=torch.bool, device=device).tril()


_SHARED_WIDTHS = 64


@functools.lru_cache(maxsize=256)
def _chain_structure(q: int, device: torch.device) -> torch.Tensor:
    return torch.ones(q, q, dtype=torch.bool, device=device).tril()
