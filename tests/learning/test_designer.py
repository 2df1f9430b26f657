"""The designer learns to write programs the sandbox accepts.

The tiny byte-level model is warm-started (`make_sft_step`) on two short
environment programs that differ in one place: one is valid, the other's
`step()` returns a str reward, which validation refuses. Then, as in
training: the designer head samples programs, the gVisor sandbox validates
them (`SandboxPool.validate`), a valid program earns 1 and an invalid one the
config's invalid penalty, group advantages centre the rewards and
`make_update_step` updates the designer head. The valid share of its designs
must rise well past its start.

  python tests/learning/test_designer.py   # prints the figures
"""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import sharding
from spade.model import tokenizer as tokenizer_lib
from spade.model import transformer
from spade.regret import advantages as advantages_lib
from spade.sampling import sampler as sampler_lib
from spade.sandbox import pool as pool_lib
from spade.selfplay import batching
from spade.train import state as state_lib
from spade.train import update

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

VALID = (
    "class AEnv:\n"
    " def reset(self,seed=None):\n"
    '  return "go",{}\n'
    " def step(self,a):\n"
    '  return "ok",1.0,True,False,{}\n'
)
# The same program with a str reward: validation's "step" reason.
INVALID = VALID.replace("1.0", '"x"')
PROMPT = "Write an environment:\n"
WARM_STEPS = 150
DESIGNS = 32  # per iteration, one group
ITERATIONS = 6


def _config():
  c = config_lib.base_config()
  c.optim.learning_rate = 3e-3
  c.mesh.data = 1
  return c


def run(
    iterations: int = ITERATIONS,
    seed: int = 0,
    learning_rate: float = 3e-4,
    advantage: str | None = None,
) -> dict:
  """Warm start, then designer RL; returns the valid share per iteration.

  The policy update runs at `learning_rate`, below the warm start's: Adam's
  first steps move every parameter by about the learning rate whatever its
  gradient, and at 3e-3 that alone garbles the memorised programs.
  `advantage` is `regret.designer_advantage` ("center", the reference's and
  the default, or "normalize"); None takes the config's.
  """
  c = _config()
  if advantage is not None:
    c.regret.designer_advantage = advantage
  normalize = c.regret.designer_advantage == "normalize"
  tok = tokenizer_lib.ByteTokenizer()
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  model = transformer.build_model(c.model)
  params = transformer.init_params(c.model, jax.random.PRNGKey(seed))
  optimizer = state_lib.make_optimizer(c.optim)
  state = state_lib.create_state(
      params, optimizer, rng=jax.random.PRNGKey(seed), mesh=mesh,
      rules=c.mesh.rules,
  )  # fmt: skip
  prompt = [tok.bos_id] + tok.encode(PROMPT)
  warm = batching.make_batch(
      [
          batching.Row(prompt, tok.encode(p) + [tok.eos_id], [], 0.0)
          for p in (VALID, INVALID)
      ],
      max_len=c.model.max_len,
      pad_id=tok.pad_id,
  )
  sft = update.make_sft_step(model, optimizer, mesh, c)
  keys = ("tokens", "positions", "input_mask", "loss_mask", "weights")
  for _ in range(WARM_STEPS):
    state, m = sft(state, {"designer": {k: warm[k] for k in keys}})
  warm_nll = float(m["train/designer_nll"])

  # The policy update starts from fresh optimizer moments, as after the
  # engine's warm start.
  c.optim.learning_rate = learning_rate
  optimizer = state_lib.make_optimizer(c.optim)
  state = state_lib.create_state(
      state.params, optimizer, rng=jax.random.PRNGKey(seed), mesh=mesh,
      rules=c.mesh.rules,
  )  # fmt: skip
  step = update.make_update_step(model, optimizer, mesh, c)
  sampler = sampler_lib.Sampler(
      *transformer.sampling_fns(c.model, transformer.Role.DESIGNER),
      pad_id=tok.pad_id,
      stop_ids=(tok.eos_id,),
  )
  max_new = len(tok.encode(VALID)) + 8
  valid_share, reasons = [], []
  with pool_lib.SandboxPool(
      "gvisor", 1, preload=(), warm_spare=False, spare_envs=0
  ) as pool:
    for it in range(iterations + 1):
      out = sampler(
          state.params,
          [prompt] * DESIGNS,
          max_new_tokens=max_new,
          rng=jax.random.PRNGKey(1000 * seed + it),
      )
      completions = [
          out.tokens[i, : out.lengths[i]].tolist() for i in range(DESIGNS)
      ]
      verdicts = pool.validate([tok.decode(ids) for ids in completions])
      valid = np.array([v["valid"] for v in verdicts])
      valid_share.append(float(valid.mean()))
      reasons.append(sorted({v["reason"] for v in verdicts}))
      if it == iterations:
        break  # the last draw only measures
      rewards = np.where(valid, 1.0, c.regret.invalid_penalty)
      adv = np.asarray(
          advantages_lib.group_advantages(
              rewards.astype(np.float32),
              np.zeros(DESIGNS, np.int32),
              np.ones(DESIGNS, bool),
              normalize=normalize,
          )
      )
      rows = [
          batching.Row(
              prompt,
              ids,
              out.logprobs[i, : len(ids)].tolist(),
              float(adv[i]),
          )
          for i, ids in enumerate(completions)
      ]
      batch = batching.make_batch(
          rows, max_len=c.model.max_len, pad_id=tok.pad_id
      )
      state, _ = step(state, {"designer": batch})
  return {"warm_nll": warm_nll, "valid_share": valid_share, "reasons": reasons}


def test_designer_valid_share_rises():
  got = run()
  share = got["valid_share"]
  # The warm start learned both programs: the first designs mix the two.
  assert got["warm_nll"] < 0.1, got
  assert 0.1 < share[0] < 0.8, got
  # 32 designs a draw: the mean of the last three, against the noise.
  late = np.mean(share[-3:])
  assert late > share[0] + 0.25, got
  assert late > 0.6, got


if __name__ == "__main__":
  import sys  # pylint: disable=g-import-not-at-top

  t0, cpu0 = time.time(), time.process_time()
  # key=value arguments: iterations, seed, learning_rate, advantage (center
  # or normalize, regret.designer_advantage).
  kwargs = dict(a.split("=") for a in sys.argv[1:])
  types = {"iterations": int, "seed": int, "learning_rate": float}
  res = run(**{k: types.get(k, str)(v) for k, v in kwargs.items()})
  print(
      res,
      f"({time.time() - t0:.0f} s, {time.process_time() - cpu0:.0f} s CPU)",
  )
