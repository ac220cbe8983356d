"""NeMo-RL's train/generation mismatch metrics, computed as its ClippedPGLossFn computes them
(``nemo_rl/algorithms/loss/loss_functions.py``): every token of the batch counts (mask of ones)."""

from __future__ import annotations

from typing import Any


def token_mult_prob_error(generation_logprobs: Any, train_logprobs: Any) -> float:
    """``masked_mean(exp(|gen_lp - train_lp| * mask), mask)``."""
    import torch

    mask = torch.ones_like(train_logprobs)
    lp_error = torch.abs(generation_logprobs - train_logprobs)
    return _masked_mean(torch.exp(lp_error * mask), mask)


def gen_kl_error(generation_logprobs: Any, train_logprobs: Any) -> float:
    """KL(P_gen || P_train), NeMo-RL's default k3 estimate: ``exp(logr) - 1 - logr``, ``logr = train - gen``."""
    import torch

    logr = train_logprobs - generation_logprobs
    return _masked_mean(torch.exp(logr) - 1 - logr, torch.ones_like(logr))


def _masked_mean(values: Any, mask: Any) -> float:
    """NeMo-RL's ``masked_mean`` with no global normalization factor."""
    import torch

    return float(torch.sum(values * mask) / (torch.sum(mask) + 1e-8))
