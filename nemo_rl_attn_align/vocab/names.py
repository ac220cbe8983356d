"""Names every layer uses: the plugin's block in the recipe, and the drift metrics (what each measures)."""

from __future__ import annotations

#: The recipe's top-level block of the plugin's settings; also the prefix of what it logs and writes.
BLOCK = "attention_align"

#: NeMo-RL's drift metrics as its train loops log them (``nemo_rl/algorithms/loss/loss_functions.py``), in that order.
NEMO_RL_DRIFT_METRICS = {
    "token_mult_prob_error": "NeMo-RL: masked mean of exp(|generation_logprobs - train_logprobs|); 1.0 = no drift",
    "gen_kl_error": "NeMo-RL: masked mean KL of generation against training logprobs",
    "policy_kl_error": "NeMo-RL: masked mean KL of training against generation logprobs",
    "js_divergence_error": "NeMo-RL: masked mean Jensen-Shannon divergence",
}
#: verl's, logged as ``training/rollout_probs_diff_*`` (the prefix is accepted and dropped).
VERL_DRIFT_METRICS = {
    "rollout_probs_diff_max": "verl training/rollout_probs_diff_max: max |p_rollout - p_train| over tokens",
    "rollout_probs_diff_mean": "verl training/rollout_probs_diff_mean: mean |p_rollout - p_train|",
    "rollout_probs_diff_std": "verl training/rollout_probs_diff_std: std of |p_rollout - p_train|",
}
#: Every drift metric the report has room for.
DRIFT_METRICS = {**NEMO_RL_DRIFT_METRICS, **VERL_DRIFT_METRICS}
