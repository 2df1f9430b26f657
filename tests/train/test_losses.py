"""Policy and supervised losses on plain arrays, against hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade.train import losses

CLIP = dict(clip_low=0.2, clip_high=0.28)


def test_token_logprobs_are_shifted_by_one():
  logits = np.zeros((1, 3, 4), np.float32)
  logits[0, 0] = [0.0, np.log(3.0), 0.0, 0.0]  # predicts token 1 with p=.5
  logits[0, 1] = [np.log(5.0), 0.0, 0.0, 0.0]  # predicts token 0 with p=5/8
  tokens = np.array([[2, 1, 0]], np.int32)
  out = np.asarray(losses.token_logprobs(logits, tokens))
  np.testing.assert_allclose(out, [[0.0, np.log(0.5), np.log(5 / 8)]], 1e-6)


def test_clipped_surrogate_matches_hand_computation():
  # One row per case: (log ratio, advantage) -> per-token loss.
  log_ratio = np.log(np.array([1.5, 1.5, 0.5, 0.5, 1.1], np.float32))
  adv = np.array([1.0, -1.0, 1.0, -1.0, 2.0], np.float32)
  expected = [
      -1.28,  # A>0, ratio above 1.28: clipped
      1.5,  # A<0, ratio high: unclipped (pessimistic)
      -0.5,  # A>0, ratio low: unclipped
      0.8,  # A<0, ratio below 0.8: clipped
      -2.2,  # inside the band
  ]
  old = np.zeros((5, 2), np.float32)
  new = np.stack([np.zeros(5, np.float32), log_ratio], axis=1)
  mask = np.array([[False, True]] * 5)
  loss, m = losses.policy_loss(new, old, adv, mask, np.ones(5), **CLIP)
  assert float(loss) == pytest.approx(np.mean(expected), rel=1e-5)
  assert float(m["clip_frac"]) == pytest.approx(2 / 5)
  assert float(m["num_tokens"]) == 5
  assert float(m["ratio_mean"]) == pytest.approx(
      np.mean([1.5, 1.5, 0.5, 0.5, 1.1]), rel=1e-5
  )


def test_token_level_mean_and_row_weights():
  # Row 0 has 3 sampled tokens, row 1 one, row 2 is padding (weight 0) with
  # garbage old logprobs that would overflow exp() if they were used.
  new = np.zeros((3, 4), np.float32)
  old = np.zeros((3, 4), np.float32)
  old[2] = -1e4
  mask = np.array([[0, 1, 1, 1], [0, 0, 0, 1], [1, 1, 1, 1]], bool)
  adv = np.array([1.0, -3.0, 100.0], np.float32)
  loss, m = losses.policy_loss(
      new, old, adv, mask, np.array([1, 1, 0.0]), **CLIP
  )
  # Ratios are 1: loss = -(3 * 1 + 1 * -3) / 4 tokens = 0.
  assert float(loss) == pytest.approx(0.0, abs=1e-7)
  assert float(m["num_tokens"]) == 4
  # Position 0 never carries loss even when the mask says so.
  assert float(losses.token_weights(mask, np.ones(3))[:, 0].sum()) == 0


def test_gradient_flows_only_through_sampled_tokens():
  rng = np.random.default_rng(0)
  b, l, v = 3, 6, 7
  logits = jnp.asarray(rng.normal(size=(b, l, v)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, v, size=(b, l)), jnp.int32)
  mask = np.zeros((b, l), bool)
  mask[0, 2:4] = True
  mask[1, 5] = True
  mask[2, 1:] = True
  weights = np.array([1.0, 1.0, 0.0])  # row 2 is padding
  adv = np.array([1.0, -0.5, 2.0], np.float32)
  old = losses.token_logprobs(logits, tokens) + jnp.asarray(
      rng.normal(scale=0.1, size=(b, l)), jnp.float32
  )

  def loss_of(lg):
    lp = losses.token_logprobs(lg, tokens)
    return losses.policy_loss(lp, old, adv, mask, weights, **CLIP)[0]

  grad = np.asarray(jax.jit(jax.grad(loss_of))(logits))
  # Logits at position t feed token t+1: they matter iff token t+1 is
  # sampled in a row with non-zero weight.
  feeds = np.zeros((b, l), bool)
  feeds[:, :-1] = mask[:, 1:] & (weights[:, None] > 0)
  norms = np.abs(grad).sum(-1)
  assert np.all(norms[~feeds] == 0.0)
  assert np.all(norms[feeds] > 0.0)
  # Perturbing every logit that feeds no sampled token leaves the loss as is.
  noise = jnp.asarray(rng.normal(size=(b, l, v)) * 5, jnp.float32)
  perturbed = jnp.where(feeds[..., None], logits, logits + noise)
  assert float(loss_of(perturbed)) == float(loss_of(logits))


def test_delayed_mode_truncates_importance_weights():
  ratio = np.array([0.5, 1.5, 4.0], np.float32)
  adv = np.array([1.0, 1.0, -1.0], np.float32)
  old = np.zeros((3, 2), np.float32)
  mask = np.array([[False, True]] * 3)
  weights = np.ones(3, np.float32)

  def loss_of(lr):
    new = jnp.stack([jnp.zeros(3), lr], axis=1)
    return losses.policy_loss(
        new, old, adv, mask, weights, max_importance_weight=2.0, **CLIP
    )

  (loss, m), grad = jax.value_and_grad(loss_of, has_aux=True)(jnp.log(ratio))
  w = np.minimum(ratio, 2.0)  # [0.5, 1.5, 2.0]
  assert float(loss) == pytest.approx(-np.mean(w * adv), rel=1e-6)
  # d/d logp of -w * A * exp(logp - sg(logp)) is -w * A (per token / 3).
  np.testing.assert_allclose(grad, -w * adv / 3, rtol=1e-6)
  assert float(m["is_truncated_frac"]) == pytest.approx(1 / 3)
  assert float(m["is_weight_mean"]) == pytest.approx(np.mean(w), rel=1e-6)


def test_k3_kl_to_reference():
  new = np.log(np.array([[0.5, 0.5, 0.2]], np.float32))
  ref = np.log(np.array([[0.5, 0.25, 0.4]], np.float32))
  mask = np.array([[False, True, True]])
  adv = np.zeros(1, np.float32)
  loss, m = losses.policy_loss(
      new, new, adv, mask, np.ones(1), ref_logprobs=ref, kl_coef=0.5, **CLIP
  )
  d = np.log([0.5, 2.0])  # ref - new at the two sampled tokens
  k3 = np.mean(np.exp(d) - d - 1)
  assert float(m["kl"]) == pytest.approx(k3, rel=1e-5)
  assert float(loss) == pytest.approx(0.5 * k3, rel=1e-5)
  _, same = losses.policy_loss(
      new, new, adv, mask, np.ones(1), ref_logprobs=new, kl_coef=0.5, **CLIP
  )
  assert float(same["kl"]) == 0.0


def test_low_var_kl_clamps_the_k3_estimate():
  # slime's low_var_kl: k3 clamped to [-10, 10]; a token the reference
  # finds e^13 times likelier gives k3 ~ e^13 - 14 unclamped.
  new = np.array([[0.0, -13.0]], np.float32)
  ref = np.array([[0.0, 0.0]], np.float32)
  mask = np.array([[False, True]])
  adv = np.zeros(1, np.float32)
  kw = dict(CLIP, ref_logprobs=ref, kl_coef=1.0)
  _, clamped = losses.policy_loss(new, new, adv, mask, np.ones(1), **kw)
  assert float(clamped["kl"]) == pytest.approx(10.0)
  _, k3 = losses.policy_loss(
      new, new, adv, mask, np.ones(1), kl_estimator="k3", **kw
  )
  assert float(k3["kl"]) == pytest.approx(np.exp(13.0) - 14.0, rel=1e-5)


def test_sft_loss_is_masked_cross_entropy():
  lp = np.log(np.array([[0.9, 0.5, 0.25], [0.1, 0.1, 0.1]], np.float32))
  mask = np.array([[True, True, True], [True, True, False]])
  weights = np.array([1.0, 0.0])
  loss, m = losses.sft_loss(lp, mask, weights)
  # Position 0 is never a target; row 1 is padding.
  want = -(np.log(0.5) + np.log(0.25)) / 2
  assert float(loss) == pytest.approx(want, rel=1e-6)
  assert float(m["target_prob"]) == pytest.approx(0.375, rel=1e-6)
  assert float(m["num_tokens"]) == 2


def test_all_padding_batch_gives_zero_not_nan():
  z = np.zeros((2, 3), np.float32)
  mask = np.zeros((2, 3), bool)
  loss, m = losses.policy_loss(z, z, np.ones(2), mask, np.zeros(2), **CLIP)
  assert float(loss) == 0.0 and float(m["clip_frac"]) == 0.0
  loss, _ = losses.sft_loss(z, mask, np.zeros(2))
  assert float(loss) == 0.0


def test_sample_mean_reduction_is_slimes_sum_of_row_means():
  # Row 0 has 3 loss tokens, row 1 one: the token mean weighs row 0 three
  # times, slime's sample mean weighs the rows alike.
  old = np.zeros((2, 4), np.float32)
  mask = np.array([[False, True, True, True], [False, True, False, False]])
  adv = np.array([1.0, -2.0], np.float32)
  kw = dict(CLIP, reduction="token_mean")
  token, _ = losses.policy_loss(old, old, adv, mask, np.ones(2), **kw)
  # At ratio 1 each token's loss is -advantage.
  assert float(token) == pytest.approx((3 * -1.0 + 2.0) / 4)
  samples = 5  # the rows there were: 3 more had no signal
  kw["reduction"] = "sample_sum"
  summed, m = losses.policy_loss(
      old, old, adv, mask, np.full(2, 1 / samples), **kw
  )
  assert float(summed) == pytest.approx((-1.0 + 2.0) / samples)
  assert float(m["pg_loss"]) == pytest.approx(float(token))  # a token mean
  with pytest.raises(ValueError, match="reduction"):
    losses.policy_loss(old, old, adv, mask, np.ones(2), **CLIP, reduction="x")
