"""The Medusa training objective, named and tested here so that training recipes stay thin.

At position i the base's lm_head predicts token i + 1; head k (counting from 0) predicts token i + 2 + k,
so its labels are the input ids shifted left by k + 2. Heads further ahead are harder and count less:
head k's loss is weighted by `decay ** k` (Medusa uses 0.8).

With large vocabularies the heads' logits dominate training memory and time; prompt tokens and padding
carry no label, so they are skipped before the projection. Depth i (head i) at position t learns token
t + 2 + i:

- Heads that read the drafted tokens (recurrent ones) are teacher-forced with the data's tokens
  t + 1 .. t + 1 + i (`input_ids`, else the labels) and learn at every labelled position: whatever the text,
  their target is what the base does after exactly the tokens they read, so every position is a
  consistent example (EAGLE's recipe).
- Heads that do not (Medusa's) cannot see those tokens, so they learn only where they are the base's own
  choices (`following_tokens`), which is where their guess matters at decoding time.

- Heads that read whole sequences (EAGLE-style) are unrolled over them (`EagleHeads.unroll`, the
  training-time test: depth i drafts from the head's own predictions of depth i - 1, as at decoding time)
  and trained like recurrent heads, plus a regression of their predicted features on the base's
  (smooth L1, weighted by `feature_weight`: EAGLE-1 and 2's feature loss).

Targets are the labels (cross-entropy), or with `soft_targets` the base's whole next-token distribution
there, read off its hidden state one position before the label (the KL divergence from it; its logits
over the draft vocabulary, see `DraftHeads.base_logits`): every position then teaches how likely each
candidate is, not only which one wins, at no extra forward. The hidden states must be the base's on the
data's own tokens (a cache made with or without `--relabel_with_base`, or a live forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional

from hf_specdec.medusa.labels import IGNORE_INDEX, values_after
from hf_specdec.medusa.sequence_heads import SequenceHeads

if TYPE_CHECKING:
    from hf_specdec.medusa.heads import DraftHeads


def head_labels(labels: torch.Tensor, head: int) -> torch.Tensor:
    """Labels of head `head` at every position: the token `head + 2` steps ahead, `IGNORE_INDEX` past the end.

    Args:
        labels (`torch.LongTensor` of shape `(batch, seq)`): token ids, `IGNORE_INDEX` where no loss applies
            (prompt tokens, padding).
        head (`int`): k, from 0.

    Returns:
        `torch.LongTensor` of shape `(batch, seq)`.
    """
    shift = head + 2
    shifted = torch.full_like(labels, IGNORE_INDEX)
    if shift < labels.shape[1]:
        shifted[:, :-shift] = labels[:, shift:]
    return shifted


def head_weights(num_heads: int, decay: float = 0.8) -> torch.Tensor:
    """`decay ** k` for k in `0..num_heads-1`."""
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"decay must be in (0, 1], got {decay}.")
    return decay ** torch.arange(num_heads, dtype=torch.float32)


def following_tokens(
    labels: torch.Tensor, depth: int, input_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """For every position t, the labelled tokens after it, and how many of them follow on the base's own path.

    Depth i (from 0) of a drafter at t reads tokens t + 1 .. t + 1 + i and guesses t + 2 + i; at decoding
    time it only matters when all of those are the base's own choices, so it trains only where they are:
    labelled and, when the labels are the base's predictions on someone else's text (`--relabel_with_base`),
    equal to the data's tokens (where they differ, the labels after that point follow the data, not the
    base's choice).

    Args:
        labels (`torch.LongTensor` of shape `(batch, seq)`): `IGNORE_INDEX` where no loss applies.
        depth (`int`): how many depths.
        input_ids (`torch.LongTensor` of shape `(batch, seq)`, *optional*): the data's tokens, when the labels
            may differ from them.

    Returns:
        `(window, run)`: `window` `(batch, seq, depth + 1)` holds labels t + 1 .. t + 1 + depth (`IGNORE_INDEX`
        past the end); `run` `(batch, seq)` counts the tokens from t + 1 on that are on the base's path, up to
        the first that is not. Depth i trains at t when `run >= i + 1` and label t + 2 + i exists.
    """
    on_path = labels != IGNORE_INDEX
    if input_ids is not None:
        on_path &= input_ids == labels
    window = values_after(labels, depth + 1, IGNORE_INDEX)  # (B, T, depth + 1)
    run = values_after(on_path, depth + 1, False).long().cumprod(dim=-1).sum(dim=-1)
    return window, run


def depth_targets(window: torch.Tensor, run: torch.Tensor, depth: int) -> torch.Tensor:
    """Where depth `depth` (from 0) trains, given [`following_tokens`]: a boolean mask like `run`."""
    return (run >= depth + 1) & (window[..., depth + 1] != IGNORE_INDEX)


@dataclass
class MedusaObjective:
    """What [`medusa_objective`] computes.

    Attributes:
        loss (`torch.Tensor`): the weighted sum over depths (a scalar).
        per_head (`torch.Tensor` of shape `(heads,)`): each depth's mean loss.
        outputs (`list[tuple[torch.Tensor, torch.Tensor]]`): per depth, `(logits (M, head_vocab), targets (M,))`
            at the positions where its guess matters at decoding time (on the base's own path); targets are
            positions in the heads' logits, -1 for labels they cannot propose.
        rows (`list[torch.Tensor]`): per depth, the batch row `(M,)` of each of those positions.
        per_head_feature (`torch.Tensor` of shape `(heads,)`, *optional*): for heads that predict the base's
            features (EAGLE-style), each depth's mean feature regression loss (included in `loss`).
    """

    loss: torch.Tensor
    per_head: torch.Tensor
    outputs: list[tuple[torch.Tensor, torch.Tensor]]
    rows: list[torch.Tensor]
    per_head_feature: torch.Tensor | None = None


def medusa_objective(
    heads: DraftHeads,
    lm_head: nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor | None = None,
    embeddings: nn.Module | None = None,
    input_ids: torch.Tensor | None = None,
    soft_targets: bool = False,
    attention_mask: torch.Tensor | None = None,
    feature_weight: float = 1.0,
) -> MedusaObjective:
    """The weighted per-depth loss of any draft heads, computed only where it has a label: the one training
    objective (`MedusaForCausalLM.forward` computes it, and `MedusaTrainer` trains through that forward).

    What each kind of heads learns where, and from which targets, is in the module's docstring.

    Args:
        heads (`DraftHeads`), lm_head: the heads and the base's output projection.
        hidden (`torch.Tensor` of shape `(batch, seq, hidden)`): the base's last hidden states (EAGLE heads: the
            base's states they read, `SequenceHeads.state_layers`, concatenated).
        labels (`torch.LongTensor` of shape `(batch, seq)`).
        weights (`torch.Tensor` of shape `(heads,)`, *optional*): per-head weights; default `head_weights`.
        embeddings (`nn.Module`, *optional*): the base's input embeddings (needed by recurrent heads).
        input_ids (`torch.LongTensor` of shape `(batch, seq)`, *optional*): the data's tokens, needed when the
            labels are the base's predictions on them (relabelled data).
        soft_targets (`bool`): learn the base's distributions instead of its labels.
        attention_mask (`torch.Tensor` of shape `(batch, seq)`, *optional*): 0 on padding (for heads that read
            whole sequences).
        feature_weight (`float`): the weight of the feature regression, for heads that predict features.

    Labels outside the heads' draft vocabulary (if they have one) add no cross-entropy but count as misses in
    metrics.
    """
    depth = heads.num_heads
    weights = head_weights(depth) if weights is None else weights
    window, labelled_run = following_tokens(labels, depth)
    path_run = labelled_run if input_ids is None else following_tokens(labels, depth, input_ids)[1]
    reads_data = heads.reads_tokens and input_ids is not None
    train_run = labelled_run if reads_data else path_run
    keep = depth_targets(window, train_run, 0)  # depth 0 has its input and its label
    rows, positions = keep.nonzero(as_tuple=True)
    if reads_data:
        assert input_ids is not None
        read = values_after(input_ids, depth, 0)[keep]
    else:
        read = window[keep][:, :depth].clamp_min(0)
    window, train_run, path_run = window[keep], train_run[keep], path_run[keep]  # (M, depth + 1), (M,), (M,)
    logits, features, hidden = _heads_outputs(heads, lm_head, hidden, keep, read, embeddings, input_ids, attention_mask)
    trains = [depth_targets(window, train_run, k) for k in range(depth)]
    if soft_targets:
        teacher, slot = _teacher_logits(heads, lm_head, hidden, rows, positions, trains)
    per_head, per_head_feature, outputs, measured_rows = [], [], [], []
    for k in range(depth):
        trained = trains[k]
        head_logits = logits[k][trained]
        if features is not None:  # the base's feature at t + 1 + k, which depth k predicts
            target = hidden[rows[trained], positions[trained] + 1 + k].float()
            predicted = features[k][trained].float()
            regression = functional.smooth_l1_loss(predicted, target) if target.shape[0] else predicted.sum() * 0.0
            per_head_feature.append(regression)
        if soft_targets:
            targets = teacher[slot[rows[trained], positions[trained] + 1 + k]]
            per_head.append(kl_divergence(targets, head_logits) if head_logits.shape[0] else head_logits.sum() * 0.0)
        else:
            per_head.append(_label_loss(heads, head_logits, window[trained, k + 1]))
        measured = depth_targets(window, path_run, k)
        outputs.append((logits[k][measured].detach(), heads.to_head_index(window[measured, k + 1])))
        measured_rows.append(rows[measured])
    per_head_tensor = torch.stack(per_head)
    weights = weights.to(per_head_tensor.device)
    loss = (weights * per_head_tensor).sum()
    feature_tensor = None
    if features is not None:
        feature_tensor = torch.stack(per_head_feature)
        loss = loss + feature_weight * (weights * feature_tensor).sum()
        feature_tensor = feature_tensor.detach()
    return MedusaObjective(loss, per_head_tensor, outputs, measured_rows, feature_tensor)


def _heads_outputs(
    heads: DraftHeads,
    lm_head: nn.Module,
    hidden: torch.Tensor,
    keep: torch.Tensor,
    read: torch.Tensor,
    embeddings: nn.Module | None,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, torch.Tensor]:
    """Every depth's logits at the kept positions `(M, vocab)`, the features heads that predict them drafted
    (`None` for the others), and the base's last hidden states (EAGLE heads' input split off them)."""
    depth = heads.num_heads
    if not isinstance(heads, SequenceHeads):
        return heads.depth_logits(hidden[keep], read, lm_head, embeddings), None, hidden
    if embeddings is None or input_ids is None:
        raise ValueError("EAGLE heads read the sequences: pass `input_ids` and the base's input embeddings.")
    reads, hidden = heads.split_states(hidden)
    unrolled = heads.unroll(reads, input_ids, embeddings, attention_mask, depth, needed=keep)
    features = [f[keep] for f in unrolled]  # (M, H)
    logits = [heads.project(f, lm_head) for f in features]
    return logits, features if heads.predicts_features else None, hidden


def _label_loss(heads: DraftHeads, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of one depth's logits on its labels; labels outside the heads' draft vocabulary add none."""
    index = heads.to_head_index(labels)  # -1 where the label is outside the vocabulary
    learnable = index >= 0
    if not learnable.any():
        return logits.sum() * 0.0
    return functional.cross_entropy(logits[learnable].float(), index[learnable])


def label_rank_counts(objective: MedusaObjective, batch_size: int, top_k: int) -> torch.Tensor:
    """Per example and depth, how often the label was the heads' rank-r candidate, for r < `top_k`, and how often
    it was not among the first `top_k` (or outside the draft vocabulary): `(batch, heads, top_k + 1)`, summing to
    the number of positions measured. Per example, so that a distributed evaluation can gather and sum them."""
    device = objective.per_head.device
    counts = torch.zeros(batch_size, len(objective.outputs), top_k + 1, dtype=torch.long, device=device)
    for k, ((logits, targets), rows) in enumerate(zip(objective.outputs, objective.rows, strict=True)):
        if not targets.numel():
            continue
        top = logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices  # (M, <= top_k)
        hit = top == targets[:, None]
        rank = torch.where(hit.any(dim=-1), hit.long().argmax(dim=-1), top_k)
        counts[:, k].index_put_((rows, rank), torch.ones_like(rank), accumulate=True)
    return counts


@torch.no_grad()
def _teacher_logits(
    heads: DraftHeads,
    lm_head: nn.Module,
    hidden: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    trains: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The base's logits over the draft vocabulary at every position some depth learns from, each computed once
    (depth k at t reads position t + 1 + k; several depths share positions): `(logits (P, head_vocab), slot)`
    where `slot` `(batch, seq)` gives a position's row in `logits`."""
    needed = torch.zeros(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
    for k, trained in enumerate(trains):
        needed[rows[trained], positions[trained] + 1 + k] = True
    slot = torch.full(hidden.shape[:2], -1, dtype=torch.long, device=hidden.device)
    slot[needed] = torch.arange(int(needed.sum()), device=hidden.device)
    return heads.base_logits(hidden[needed], lm_head), slot


def kl_divergence(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean KL(teacher || student) over rows of logits (in float32): the soft targets' loss, and Medusa-2's
    term that keeps the base's own distribution where it was."""
    return functional.kl_div(
        functional.log_softmax(student_logits.float(), dim=-1),
        functional.log_softmax(teacher_logits.float(), dim=-1),
        log_target=True,
        reduction="batchmean",
    )


@torch.no_grad()
def head_accuracy(
    head_logits: torch.Tensor,
    labels: torch.Tensor,
    top_k: int = 1,
    heads: DraftHeads | None = None,
    input_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Share of the positions where each head trains (see [`following_tokens`]) at which its top-`top_k` holds
    its label `(heads,)`; pass `heads` when they have a draft vocabulary (their logits are then positions in
    it; labels outside it count as misses)."""
    window, run = following_tokens(labels, head_logits.shape[0], input_ids)
    accuracies = []
    for k in range(head_logits.shape[0]):
        keep = depth_targets(window, run, k)
        if not keep.any():
            accuracies.append(torch.tensor(float("nan")))
            continue
        target = window[..., k + 1]  # (B, T)
        if heads is not None:
            target = heads.to_head_index(target)
        top = head_logits[k].topk(top_k, dim=-1).indices  # (B, T, top_k)
        hit = (top == target[..., None]).any(dim=-1)
        accuracies.append(hit[keep].float().mean().cpu())
    return torch.stack(accuracies)
