"""The agent learns a rewarded reply; sabotaged updates must not.

The project's own pieces, on the tiny byte-level model: the compiled
`Sampler` with the agent head draws replies, a reward scores them, the group
advantages centre them per prompt, `make_batch` pads them, and
`make_update_step` takes the step. The rewarded behaviour needs the right
credit at both ends of a reply: its first byte is a digit (a reward a mask
one token late never trains) and it ends with EOS within a few bytes (a mask
one token early never trains the EOS). Its probability must rise well past
its start; with the advantage negated, or the loss mask (and the sampler's
logprobs with it) shifted one token earlier or later, it must not.

  python tests/learning/test_agent.py   # prints the four runs' figures
"""

from __future__ import annotations

import functools
import time

import jax
import numpy as np
import pytest

from spade import config as config_lib
from spade.model import sharding
from spade.model import transformer
from spade.regret import advantages as advantages_lib
from spade.sampling import sampler as sampler_lib
from spade.selfplay import batching
from spade.train import state as state_lib
from spade.train import update

pytestmark = pytest.mark.slow  # ~1 min of CPU per run

PAD, BOS, EOS = 256, 257, 258
MAX_NEW = 6  # the reply must stop within this many bytes
PROMPTS = 8  # groups per iteration
SAMPLES = 16  # replies per prompt (one group)
ITERATIONS = 20
EVAL_SAMPLES = 512


def _config():
  c = config_lib.base_config()
  c.optim.learning_rate = 3e-3
  c.mesh.data = 1
  # The token mean (ours), not slime's sample mean: the rewarded reply ends
  # early, which a long reply's many negative tokens teach; a row's mean
  # gives each of them 1/length of the push. Measured at c9d61e1 with this
  # test's batches: end rate 0.99 with the token mean, 0.0 with the sample
  # mean at the loop's 1/rows weights. The test checks the loss's sign and
  # mask (the sabotaged runs), which either reduction shows.
  c.optim.loss_reduction = "token_mean"
  return c


def _prompts():
  return [[BOS] + list(f"Q{i}: reply".encode()) for i in range(PROMPTS)]


def behaviour(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """bool[B]: the first byte is a digit and the reply ends with EOS."""
  first = tokens[:, 0]
  ends = tokens[np.arange(len(tokens)), np.maximum(lengths - 1, 0)] == EOS
  return (first >= ord("0")) & (first <= ord("9")) & ends


def reward(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """Half for a leading digit, half for stopping: both ends earn credit."""
  first = tokens[:, 0]
  digit = (first >= ord("0")) & (first <= ord("9"))
  ends = tokens[np.arange(len(tokens)), np.maximum(lengths - 1, 0)] == EOS
  return 0.5 * digit + 0.5 * ends


def _shift(batch: dict, by: int) -> dict:
  """The loss mask and sampler logprobs moved `by` tokens along each row."""
  out = dict(batch)
  for key in ("loss_mask", "old_logprobs"):
    out[key] = np.roll(batch[key], by, axis=1)
  return out


SABOTAGE = {
    None: lambda b: b,
    "negated": lambda b: dict(b, advantages=-b["advantages"]),
    "mask_early": lambda b: _shift(b, -1),
    "mask_late": lambda b: _shift(b, 1),
}


@functools.lru_cache(maxsize=None)
def _compiled(advantage: str | None):
  """(config, mesh, optimizer, update step, sampler), built once per
  `advantage`: the four runs differ only in their host-side batches, so
  they share one compiled update and sampler (~25 s of CPU a build)."""
  c = _config()
  if advantage is not None:
    c.regret.agent_advantage = advantage
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  optimizer = state_lib.make_optimizer(c.optim)
  step = update.make_update_step(
      transformer.build_model(c.model), optimizer, mesh, c
  )
  sampler = sampler_lib.Sampler(
      *transformer.sampling_fns(c.model, transformer.Role.AGENT),
      pad_id=PAD,
      stop_ids=(EOS,),
  )
  return c, mesh, optimizer, step, sampler


def run(
    sabotage: str | None = None,
    iterations: int = ITERATIONS,
    seed=0,
    advantage: str | None = None,
):
  """Trains the agent head; returns the behaviour's rate before and after.

  The rate is measured on `EVAL_SAMPLES` fresh samples over all prompts.
  `advantage` is `regret.agent_advantage` ("normalize", the reference's
  z-score and the default, or "center"); None takes the config's.
  """
  c, mesh, optimizer, step, sampler = _compiled(advantage)
  normalize = c.regret.agent_advantage == "normalize"
  params = transformer.init_params(c.model, jax.random.PRNGKey(seed))
  state = state_lib.create_state(
      params, optimizer, rng=jax.random.PRNGKey(seed), mesh=mesh,
      rules=c.mesh.rules,
  )  # fmt: skip
  prompts = _prompts()
  rng = jax.random.PRNGKey(seed + 1)

  def rate(params, key):
    rows = [prompts[i % PROMPTS] for i in range(EVAL_SAMPLES)]
    out = sampler(params, rows, max_new_tokens=MAX_NEW, rng=key)
    return float(np.mean(behaviour(out.tokens, out.lengths)))

  start = rate(state.params, jax.random.PRNGKey(10_000 + seed))
  history = []
  for it in range(iterations):
    rows_in = [p for p in prompts for _ in range(SAMPLES)]
    out = sampler(
        state.params,
        rows_in,
        max_new_tokens=MAX_NEW,
        rng=jax.random.fold_in(rng, it),
    )
    r = reward(out.tokens, out.lengths)
    history.append(float(np.mean(behaviour(out.tokens, out.lengths))))
    group = np.repeat(np.arange(PROMPTS), SAMPLES)
    adv = np.asarray(
        advantages_lib.group_advantages(
            r.astype(np.float32), group, np.ones(len(r), bool),
            normalize=normalize,
        )  # fmt: skip
    )
    rows = [
        batching.Row(
            prompt_ids=p,
            completion_ids=out.tokens[i, : out.lengths[i]].tolist(),
            logprobs=out.logprobs[i, : out.lengths[i]].tolist(),
            advantage=float(adv[i]),
        )
        for i, p in enumerate(rows_in)
    ]
    batch = batching.make_batch(rows, max_len=c.model.max_len, pad_id=PAD)
    state, _ = step(state, {"agent": SABOTAGE[sabotage](batch)})
  end = rate(state.params, jax.random.PRNGKey(20_000 + seed))
  return {"start": start, "end": end, "history": history}


# The honest run's rate ends above LEARNED; a sabotaged run's under
# SABOTAGED, so at least 0.35 below it. (Each sabotaged test once compared
# with the honest run itself, a module fixture: every xdist worker that drew
# one of these tests ran it again, up to three times a suite.)
LEARNED, SABOTAGED = 0.5, 0.15


def test_agent_learns_the_rewarded_reply():
  honest = run(None)
  assert honest["start"] < 0.05
  assert honest["end"] > LEARNED, honest


@pytest.mark.parametrize("sabotage", ["negated", "mask_early", "mask_late"])
def test_sabotaged_updates_do_not_learn_it(sabotage):
  got = run(sabotage)
  assert got["end"] < SABOTAGED, got


if __name__ == "__main__":
  import sys  # pylint: disable=g-import-not-at-top

  # Arguments: run names (honest, negated, mask_early, mask_late), each
  # optionally with :center or :normalize (regret.agent_advantage).
  for arg in sys.argv[1:] or SABOTAGE:
    name, _, adv = (arg or "honest").partition(":")
    t0, cpu0 = time.time(), time.process_time()
    res = run(None if name == "honest" else name, advantage=adv or None)
    print(
        f"{arg or 'honest'}: start={res['start']:.3f} end={res['end']:.3f}"
        f" ({time.time() - t0:.0f} s, {time.process_time() - cpu0:.0f} s"
        " CPU)",
        " ".join(f"{h:.2f}" for h in res["history"]),
        flush=True,
    )
