"""The reset gate (`environments.reset_gate`): the reference's
`criteria_throw_at_reset`, in-process and through the gVisor sandbox."""

import random
import textwrap

import pytest

from spade import config as config_lib
from spade.environments import contract
from spade.environments import validator
from spade.sandbox import SandboxPool

# A multi-turn tool-use task in the reference's template form: criteria over
# self._state, advanced by the tools. CRITERION is the second criterion.
TASK = textwrap.dedent('''
    import random


    class OrderFlowEnv(ToolUseBaseEnv):
      """Look up an order, then ship it."""

      def reset(self, seed=None):
        self.turn_count = 0
        rng = random.Random(seed)
        self._state = {"order": f"A{rng.randint(100, 999)}", "looked": False,
                       "status": "new"}
        self._tools = {
            "lookup": {"description": "Look the order up",
                       "parameters": {"type": "object", "properties": {}}},
            "ship": {"description": "Ship the order",
                     "parameters": {"type": "object", "properties": {}}},
        }
        self._user_messages = ["Look up the order.", "Ship it."]
        self._message_criteria = [
            lambda s: s["looked"],
            CRITERION,
        ]
        self._current_msg = 0
        self._expected_answer = "done"
        return self._user_messages[0], {}

      def _advance_if_done(self):
        if self._current_msg >= len(self._user_messages):
          return ""
        if self._message_criteria[self._current_msg](self._state):
          self._current_msg += 1
          if self._current_msg >= len(self._user_messages):
            return " [ALL STEPS COMPLETE] Submit <answer>done</answer>."
          return " [NEXT] " + self._user_messages[self._current_msg]
        return ""

      def _check_answer(self, answer):
        return (answer.strip() == "done"
                and self._current_msg >= len(self._user_messages))

      def tool_lookup(self):
        self._state["looked"] = True
        return self._state["order"] + self._advance_if_done()

      def tool_ship(self):
        self._state["status"] = "shipped"
        return "shipped" + self._advance_if_done()

      def solution(self):
        return "call lookup, then ship, then answer done"
''')

SOUND = 'lambda s: s["status"] == "shipped"'
# Reads a key that neither reset() nor any tool sets: raises at every seed.
BROKEN = 'lambda s: s["shipment"]["status"] == "shipped"'
# Raises only where the seed draws an even order number.
SEED_DEPENDENT = 'lambda s: 1 / (int(s["order"][1:]) % 2) > 0'


def _task(criterion: str) -> str:
  return TASK.replace("CRITERION", criterion)


def _parity(seed: int) -> int:
  return random.Random(seed).randint(100, 999) % 2


def test_criteria_that_throw_at_reset_are_refused_only_under_the_gate():
  source = _task(BROKEN)
  without = validator.validate_program(source)
  assert without["valid"], without
  gated = validator.validate_program(source, reset_gate=True)
  assert not gated["valid"]
  assert gated["reason"] == "criteria_throw_at_reset" in contract.REASONS
  assert "KeyError" in gated["message"]
  assert "_message_criteria[1]" in gated["message"]


def test_sound_criteria_pass_the_gate():
  verdict = validator.validate_program(_task(SOUND), reset_gate=True)
  assert verdict["valid"], verdict
  assert verdict["reason"] == "ok"


def test_a_throw_at_some_seeds_only_is_kept():
  # The fixture only means something if the seeds disagree.
  parities = {_parity(s) for s in contract.RESET_GATE_SEEDS}
  assert parities == {0, 1}, parities
  verdict = validator.validate_program(_task(SEED_DEPENDENT), reset_gate=True)
  assert verdict["valid"], verdict


def test_programs_without_criteria_pass_the_gate():
  game = textwrap.dedent('''
      class GuessEnv:
        """Guess 42."""

        def reset(self, seed=None):
          return "Guess a number in \\\\boxed{}.", {}

        def step(self, action):
          won = "42" in action
          return "ok", 1.0 if won else 0.0, won, False, {}
  ''')
  assert validator.validate_program(game, reset_gate=True)["valid"]


def test_a_reset_that_fails_at_every_gate_seed_is_not_a_gate_refusal():
  # reset() works at the validated seeds (10, 11) but not at 0, 1, 2: the
  # reference skips a seed whose reset fails, and refuses nothing.
  source = _task(BROKEN).replace(
      "    self.turn_count = 0\n",
      "    self.turn_count = 0\n    assert seed is None or seed >= 10\n",
      1,
  )
  verdict = validator.validate_program(source, seed=10, reset_gate=True)
  assert verdict["valid"], verdict


def test_options_from_config():
  base = config_lib.base_config()
  assert base.environments.reset_gate is False
  assert "reset_gate" not in validator.options_from_config(base)
  base.environments.reset_gate = True
  assert validator.options_from_config(base)["reset_gate"] is True


@pytest.mark.sandbox
def test_the_gate_runs_inside_the_gvisor_sandbox():
  # Our pool validates programs in gVisor (spade.sandbox); the option
  # travels there with the others.
  with SandboxPool(
      "gvisor", 1, call_timeout_s=0.5, validate_timeout_s=20.0
  ) as pool:
    broken, sound = pool.validate(
        [_task(BROKEN), _task(SOUND)], reset_gate=True
    )
    (ungated,) = pool.validate([_task(BROKEN)])
  assert broken["reason"] == "criteria_throw_at_reset", broken
  assert sound["valid"], sound
  assert ungated["valid"], ungated
