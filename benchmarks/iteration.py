r"""One SPADE iteration on the tiny config: where the seconds go.

  python benchmarks/iteration.py [--config=configs/tiny.py] [--iterations=2]

Runs the real loop (designer sampling, gVisor validation, multi-turn agent
rollouts, the update) in a temporary workdir. The first iteration includes
compilation, so the figures are taken from the last one. Prints per-phase
seconds and how much of the sandbox time was hidden behind sampling (the
rollout steps one half of the episodes while sampling the other);
the last line is key=value pairs: iteration_s, sampling_s, sandbox_s,
rollout_sandbox_s, sandbox_hidden_s, hidden_frac, update_s, the prompt
tokens the slot servers took in (`prefill_tokens`, every prompt whole) and
those taken from a cache instead of prefilled, a turn's carried history or
another slot's shared prefix (`prefill_tokens_saved`), the tokens
the update scores per episode of T = 1, 5 and 25 turns with one row per
episode (`scored_tokens_per_episode_tT`) and with one row per turn
(`per_turn_tokens_per_episode_tT`), measured on episodes played by the real
rollout in the byte chat format (32-token replies, 64-character
observations). `--rows_only` prints only those.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from ml_collections import config_flags

from spade import config as config_lib
from spade import console
from spade.selfplay import loop
from spade.selfplay import metrics as metrics_lib

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tiny.py")
_ITERS = flags.DEFINE_integer("iterations", 2, "Iterations; the last is timed.")
_ROWS_ONLY = flags.DEFINE_bool(
    "rows_only", False, "Only the scored-token figures (no loop run)."
)


def scored_tokens(turns: int) -> tuple[int, int]:
  """Tokens scored for one T-turn episode: (episode row, per-turn rows)."""
  # pylint: disable=g-import-not-at-top
  import types

  from spade.agent import rollout
  from spade.model import tokenizer as tokenizer_lib
  from spade.selfplay import engine as engine_lib

  tok = tokenizer_lib.ByteTokenizer()
  engine = types.SimpleNamespace(tokenizer=tok)

  class Executor:
    """An environment that answers every move with 64 characters."""

    def reset(self, items):
      return [{"ok": True, "obs": "task " * 20, "hint": None} for _ in items]

    def step(self, items):
      obs = "o" * 64
      return [
          {
              "ok": True,
              "obs": obs,
              "reward": 0.0,
              "terminated": False,
              "truncated": False,
              "info": {},
          }
          for _ in items
      ]

    def call(self, items):
      raise AssertionError("no tools here")

    def close(self, ids):
      del ids

  def sampler(prompts, seed, keys=None):
    del seed, keys
    ids = tok.encode("\\boxed{" + "m" * 23 + "}") + [tok.eos_id]
    return [(ids, [-1.0] * len(ids), tok.decode(ids)) for _ in prompts]

  def play(episode_rows):
    (ep,), _ = rollout.run_episodes(
        [rollout.EpisodeSpec(0, "src", 0, None)],
        sampler,
        Executor(),
        lambda m: tok.encode(tok.chat_prompt(m), add_bos=True),
        max_turns=turns,
        max_context=1 << 20,
        seed=0,
        extend=(lambda *a: engine_lib.Engine.extend(engine, *a))
        if episode_rows
        else None,
        stop_ids=tok.stop_ids,
    )
    return ep

  one = play(True)
  assert one.exact and len(one.turns) == turns
  per_turn = play(False)
  return len(one.tokens), sum(
      len(t.prompt(per_turn)) + len(t.completion_ids) for t in per_turn.turns
  )


def _rows_line() -> str:
  parts = []
  for t in (1, 5, 25):
    one, per_turn = scored_tokens(t)
    print(
        f"T={t}: {one} tokens scored with one row per episode, {per_turn}"
        f" with one row per turn ({per_turn / one:.1f}x)"
    )
    parts.append(
        f"scored_tokens_per_episode_t{t}={one}"
        f" per_turn_tokens_per_episode_t{t}={per_turn}"
    )
  return " ".join(parts)


def main(argv):
  console.no_tpu_probe()  # before JAX starts a backend: no libtpu page
  del argv
  token_figures = _rows_line()
  if _ROWS_ONLY.value:
    print(token_figures)
    return
  config = _CONFIG.value
  config.num_iterations = _ITERS.value
  config.train.checkpoint_every = 10_000  # measure the loop, not orbax
  config_lib.validate(config)
  with tempfile.TemporaryDirectory() as workdir:
    loop.train_and_evaluate(config, workdir)
    metrics = metrics_lib.read_metrics(workdir)
  last = metrics[-1]
  for row in metrics:
    print(
        f"iteration {row['step']}: total {row['time/iteration_s']:.2f}s,"
        f" sampling {row['time/sampling_s']:.2f}s, sandbox"
        f" {row['time/sandbox_s']:.2f}s ({row['time/sandbox_hidden_s']:.2f}s"
        f" hidden), update {row['time/update_s']:.2f}s"
    )
  # Validation cannot overlap sampling (the programs come from it); the
  # rollout's environment steps can, and that is what the fraction measures.
  hidden = last["time/sandbox_hidden_s"] / max(
      last["time/rollout_sandbox_s"], 1e-9
  )
  print(
      f"iteration_s={last['time/iteration_s']:.3f}"
      f" sampling_s={last['time/sampling_s']:.3f}"
      f" sandbox_s={last['time/sandbox_s']:.3f}"
      f" rollout_sandbox_s={last['time/rollout_sandbox_s']:.3f}"
      f" sandbox_hidden_s={last['time/sandbox_hidden_s']:.3f}"
      f" hidden_frac={hidden:.3f} update_s={last['time/update_s']:.3f}"
      f" prefill_tokens={last['tokens/prefill']:.0f}"
      f" prefill_tokens_saved={last['tokens/prefill_saved']:.0f}"
      f" {token_figures}"
  )


if __name__ == "__main__":
  app.run(main)
