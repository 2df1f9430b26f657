"""Policy-gradient and supervised losses on sampled tokens.

Alignment: every per-token array is aligned with `tokens`. `old_logprobs[b, t]`
and `loss_mask[b, t]` describe token `tokens[b, t]`, which the model predicts
from the logits at position t - 1 (`token_logprobs` does the shift). Position
0 has no prediction, so it never carries loss whatever the mask says.

Reduction: a token-level mean over the whole (global) batch, each token
weighted by its row's weight (0 for padding rows):

  loss = sum_{b,t} w_b m_bt l_bt / max(sum_{b,t} w_b m_bt, 1)

so long completions count per token, as in DAPO, and a batch of only padding
rows gives 0, not NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def token_logprobs(logits: Array, tokens: Array) -> Array:
  """Log-probability of each token under the previous position's logits.

  Args:
    logits: f32[B, L, V]; position t's logits predict token t + 1.
    tokens: int[B, L].

  Returns:
    f32[B, L], aligned with `tokens`; column 0 is 0.
  """
  logits = logits[:, :-1].astype(jnp.float32)
  # logit[token] - logsumexp: no second [B, L, V] array (log_softmax's),
  # which matters with a 150k-262k vocabulary.
  picked = jnp.take_along_axis(logits, tokens[:, 1:, None], axis=-1)[..., 0]
  picked = picked - jax.nn.logsumexp(logits, axis=-1)
  return jnp.pad(picked, ((0, 0), (1, 0)))


def token_weights(loss_mask: Array, weights: Array) -> Array:
  """f32[B, L]: row weight on loss tokens, 0 elsewhere and at position 0."""
  m = jnp.asarray(loss_mask, jnp.float32).at[:, 0].set(0.0)
  return m * jnp.asarray(weights, jnp.float32)[:, None]


def _denominator(w: Array) -> Array:
  """The token weight's sum, 1 where there is none (an all-padding batch
  gives 0, not NaN); row weights may be small (`sample_weights`), so no
  floor at 1."""
  total = jnp.sum(w)
  return jnp.where(total > 0, total, 1.0)


def _mean(values: Array, w: Array, denom: Array) -> Array:
  return jnp.sum(values * w) / denom


REDUCTIONS = ("token_mean", "sample_sum")


def sample_sum(values: Array, loss_mask: Array, weights: Array) -> Array:
  """sum over rows of weight x (the row's mean of `values` on its loss
  tokens); a row without loss tokens adds 0."""
  m = token_weights(loss_mask, jnp.ones_like(weights, jnp.float32))
  per_row = jnp.sum(values * m, -1) / jnp.maximum(jnp.sum(m, -1), 1.0)
  return jnp.sum(per_row * jnp.asarray(weights, jnp.float32))


def policy_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    loss_mask: Array,
    weights: Array,
    *,
    clip_low: float,
    clip_high: float,
    ref_logprobs: Array | None = None,
    kl_coef: float = 0.0,
    max_importance_weight: float | None = None,
    reduction: str = "token_mean",
    kl_estimator: str = "low_var_kl",
) -> tuple[Array, dict[str, Array]]:
  """GRPO/PPO clipped surrogate over the sampled tokens.

  `reduction`: "token_mean" (ours) divides the weighted token sum by the
  sub-batch's token weight; "sample_sum" (slime without
  `--calculate-per-token-loss`, `cp_utils.get_sum_of_sample_mean`) takes each
  row's token mean and sums the rows times their weights (the caller makes a
  row's weight 1 / the global batch's rows). The metrics are token means
  either way.

  Two modes:

  * on-policy (`max_importance_weight=None`): ratio = exp(logprobs -
    old_logprobs) against the sampler's logprobs, clipped asymmetrically to
    [1 - clip_low, 1 + clip_high] (DAPO's clip-higher), pessimistic max of
    the two surrogates.
  * delayed (`max_importance_weight=c`): the samples come from a policy some
    iterations old, so clipping against it would freeze nearly every token.
    Instead each token's policy gradient is weighted by the truncated
    importance weight min(exp(logprobs - old_logprobs), c), held constant
    (stop-gradient), as the reference's TIS does for its delayed designer.

  Args:
    logprobs: f32[B, L] under the parameters being trained.
    old_logprobs: f32[B, L] from the sampler.
    advantages: f32[B], one per row.
    loss_mask: bool[B, L], True on sampled tokens only.
    weights: f32[B], 0 for padding rows.
    clip_low: lower clip width (0.2).
    clip_high: upper clip width (0.28).
    ref_logprobs: f32[B, L] under the frozen reference, for the KL term.
    kl_coef: weight of the k3 estimate of KL(policy || reference).
    max_importance_weight: truncation of the delayed mode's weights.
    reduction: one of `REDUCTIONS`, see above.
    kl_estimator: "low_var_kl" (slime's, the tool-use recipe's
      `--kl-loss-type`): the k3 estimate clamped to [-10, 10]; "k3": not
      clamped.

  Returns:
    (loss, metrics) with metrics pg_loss, kl, clip_frac, approx_kl,
    ratio_mean, num_tokens (and is_weight_mean, is_truncated_frac in the
    delayed mode).
  """
  w = token_weights(loss_mask, weights)
  denom = _denominator(w)
  adv = jnp.asarray(advantages, jnp.float32)[:, None]
  # Masked positions may hold anything (padding's zeros, stale values); zero
  # the log-ratio there so exp() cannot overflow into a NaN gradient.
  log_ratio = jnp.where(w > 0, logprobs - old_logprobs, 0.0)
  ratio = jnp.exp(log_ratio)
  metrics = {}
  if max_importance_weight is None:
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = jnp.maximum(unclipped, clipped)
    clip_frac = _mean((clipped > unclipped).astype(jnp.float32), w, denom)
  else:
    is_weight = jax.lax.stop_gradient(jnp.minimum(ratio, max_importance_weight))
    # exp(lp - sg(lp)) is 1 in value with the gradient of lp: REINFORCE
    # with the truncated weight, at the current parameters.
    per_token = (
        -adv * is_weight * jnp.exp(logprobs - jax.lax.stop_gradient(logprobs))
    )
    clip_frac = _mean(
        (ratio > max_importance_weight).astype(jnp.float32), w, denom
    )
    metrics["is_weight_mean"] = _mean(is_weight, w, denom)
    metrics["is_truncated_frac"] = clip_frac
  if reduction not in REDUCTIONS:
    raise ValueError(f"reduction {reduction!r} is not one of {REDUCTIONS}")
  pg_loss = _mean(per_token, w, denom)
  kl = jnp.zeros((), jnp.float32)
  kl_token = None
  if ref_logprobs is not None and kl_coef > 0:
    # k3 estimator of KL(pi || ref): exp(d) - d - 1 with d = ref - pi, >= 0.
    d = jnp.where(w > 0, ref_logprobs - logprobs, 0.0)
    kl_token = jnp.exp(d) - d - 1.0
    if kl_estimator == "low_var_kl":
      kl_token = jnp.clip(kl_token, -10.0, 10.0)
    elif kl_estimator != "k3":
      raise ValueError(f"kl_estimator {kl_estimator!r}: low_var_kl or k3")
    kl = _mean(kl_token, w, denom)
  if reduction == "token_mean":
    loss = pg_loss + (kl_coef * kl if kl_token is not None else 0.0)
  else:
    objective = per_token + (
        kl_coef * kl_token if kl_token is not None else 0.0
    )
    loss = sample_sum(objective, loss_mask, weights)
  sg = jax.lax.stop_gradient
  metrics.update(
      pg_loss=pg_loss,
      kl=kl,
      clip_frac=sg(clip_frac),
      approx_kl=sg(_mean(0.5 * log_ratio**2, w, denom)),
      ratio_mean=sg(_mean(ratio, w, denom)),
      num_tokens=jnp.sum(w > 0).astype(jnp.float32),
  )
  return loss, metrics


def sft_loss(
    logprobs: Array, loss_mask: Array, weights: Array
) -> tuple[Array, dict[str, Array]]:
  """Cross-entropy on the masked tokens (the warm-start stage).

  Args:
    logprobs: f32[B, L] of the target tokens (`token_logprobs`).
    loss_mask: bool[B, L], True on the tokens to learn (the completion).
    weights: f32[B], 0 for padding rows.

  Returns:
    (loss, {"nll", "target_prob": mean probability of the targets,
    "num_tokens"}).
  """
  w = token_weights(loss_mask, weights)
  denom = _denominator(w)
  nll = -_mean(jnp.where(w > 0, logprobs, 0.0), w, denom)
  return nll, {
      "nll": nll,
      "target_prob": jax.lax.stop_gradient(
          _mean(jnp.exp(jnp.where(w > 0, logprobs, 0.0)), w, denom)
      ),
      "num_tokens": jnp.sum(w > 0).astype(jnp.float32),
  }
