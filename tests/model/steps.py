"""A one-token decoding step on one device and on a mesh, for the model tests
that compare the two (`test_sharding`, `test_fused_mlp`)."""

import jax
import jax.numpy as jnp
import numpy as np

from spade.model import architecture
from spade.model import layout
from spade.model import sharding
from spade.model import transformer as T


def one_token_step(cfg, rules, mesh, rows=8, text="hlo"):
  """(a one-token step's logits on `rows` rows on one device, on the
  decoding layout over `mesh` under `rules`, the sharded program as text:
  its compiled HLO ("hlo") or its jaxpr ("jaxpr", where a Pallas kernel's
  name shows)), both logits as numpy arrays."""
  if text not in ("hlo", "jaxpr"):
    raise ValueError(f'text={text!r}: "hlo" or "jaxpr"')
  params = layout.to_per_layer_layout(
      T.init_params(cfg, jax.random.key(0)), cfg
  )
  model = T.Transformer(
      architecture.ModelConfig.from_config(cfg), per_layer=True
  )
  tokens = jax.random.randint(jax.random.key(1), (rows, 1), 0, 259)
  positions = jnp.full(tokens.shape, 3)

  def forward(params, tokens, positions):
    return model.apply({"params": params}, tokens, positions, T.Role.AGENT)[0]

  single = jax.jit(forward)(params, tokens, positions)
  where = sharding.fitted_param_shardings(params, mesh, rules)
  placed = jax.device_put(params, where)
  batch = sharding.batch_sharding(mesh, rules, 2)
  with sharding.use_rules(mesh, rules):
    step = jax.jit(forward, in_shardings=(where, batch, batch))
    if text == "hlo":
      out = step.lower(placed, tokens, positions).compile().as_text()
    else:
      out = str(jax.make_jaxpr(forward)(params, tokens, positions))
    sharded = step(placed, tokens, positions)
  return np.asarray(single), np.asarray(sharded), out
