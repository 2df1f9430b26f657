"""Near-duplicate signatures: renamed copies match, different games do not."""

import base64

import numpy as np

from spade import config as config_lib
from spade.designer import examples
from spade.memory import archive as archive_lib
from spade.memory import dedup

import memory_programs as programs

_RENAMES = {
    "secret": "hidden_value",
    "turns": "moves_made",
    "GuessNumberEnv": "HighLowEnv",
    "guess": "attempt",
    "rng": "generator",
    "found": "match",
    "direction": "way",
}


def test_renamed_copy_has_the_same_ast_fingerprint():
  copy = programs.renamed(programs.GUESS, _RENAMES)
  assert "self.hidden_value" in copy and "self.secret" not in copy
  assert copy != programs.GUESS
  assert dedup.ast_fingerprint(copy) == dedup.ast_fingerprint(programs.GUESS)


def test_renaming_only_attributes_keeps_the_fingerprint():
  # `self.max_turns = max_turns` becomes `self.x_max_turns = max_turns`: the
  # coincidence of the two names is gone, the program is the same.
  copy = programs.GUESS.replace("self.", "self.x_")
  assert "self.x_max_turns = max_turns" in copy
  assert dedup.ast_fingerprint(copy) == dedup.ast_fingerprint(programs.GUESS)
  assert dedup.code_tokens("self.limit = limit") == ["v0", ".", "a0", "=", "v1"]


def test_docstring_change_keeps_the_fingerprint_but_a_string_does_not():
  reworded = programs.GUESS.replace(
      "Guess a secret number between 1 and 100;", "A hi-lo guessing game;"
  )
  assert dedup.ast_fingerprint(reworded) == dedup.ast_fingerprint(
      programs.GUESS
  )
  harder = programs.GUESS.replace("randint(1, 100)", "randint(1, 1000)")
  assert dedup.ast_fingerprint(harder) != dedup.ast_fingerprint(programs.GUESS)


def test_different_games_have_different_fingerprints_and_low_similarity():
  prints = {dedup.ast_fingerprint(p) for p in programs.ALL}
  assert len(prints) == len(programs.ALL)
  sigs = np.stack([dedup.minhash(p) for p in programs.ALL])
  for i, sig in enumerate(sigs):
    sims = dedup.similarity(sig, sigs)
    assert sims[i] == 1.0
    # The verbatim tokens share habits (`self.secret`, `rng`): two of these
    # games meet at 0.34 there, far below the 0.85 of a near-duplicate.
    assert np.delete(sims, i).max() < 0.4
    renamed = (sigs[:, : dedup.NUM_PERM] == sig[None, : dedup.NUM_PERM]).mean(1)
    assert np.delete(renamed, i).max() < 0.2


def test_minhash_estimates_jaccard_of_token_shingles():
  # Same names and layout, one constant changed: a near-duplicate whose
  # shingle sets differ only around that constant.
  edited = programs.GUESS.replace("max_turns=7", "max_turns=9")
  sim = float(
      dedup.similarity(
          dedup.minhash(edited), dedup.minhash(programs.GUESS)[None]
      )[0]
  )

  def shingles(code):
    t = dedup.code_tokens(code)
    return {tuple(t[i : i + dedup.SHINGLE]) for i in range(len(t) - 4)}

  a, b = shingles(edited), shingles(programs.GUESS)
  exact = len(a & b) / len(a | b)
  assert 0.85 < exact < 1.0
  assert abs(sim - exact) < 0.1  # 128 hashes: standard error ~0.03


def test_tokens_normalise_names_but_keep_builtins_and_strings():
  toks = dedup.code_tokens("def f(items):\n  return len(items) + 'x'  # hi\n")
  assert toks == [
      "def", "v0", "(", "v1", ")", ":", "<INDENT>", "return", "len", "(",
      "v1", ")", "+", "'x'", "<DEDENT>",
  ]  # fmt: skip
  broken = dedup.code_tokens("def f(:\n  return 'unterminated")
  assert broken[:3] == ["def", "v0", "("]
  assert dedup.ast_fingerprint("def f(:") is None


def test_diversity_of_identical_and_disjoint_programs():
  same = np.stack([dedup.minhash(programs.HANOI)] * 3)
  assert dedup.diversity(same) == 0.0
  different = np.stack([dedup.minhash(p) for p in programs.ALL])
  assert dedup.diversity(different) > 0.85
  assert dedup.diversity(different[:1]) == 0.0
  assert dedup.diversity(list(programs.ALL)) == dedup.diversity(different)


def test_a_copy_with_a_name_added_and_an_attribute_removed_stays_close():
  # What Qwen2.5-Coder-0.5B made of the designer prompt's example
  # (benchmarks/designer_validity.py): two more names imported at the top and
  # one attribute assignment dropped. Numbering names over the whole program
  # renumbered every later name and the similarity fell to 0.09.
  example = examples.CORPUS_GAME
  assert "import random\nimport re\n" in example
  assert "        self.turn_count = 0\n" in example
  copy = example.replace(
      "import random\nimport re\n", "import random, re, math, time\n"
  ).replace("        self.turn_count = 0\n", "")
  sim = float(
      dedup.similarity(dedup.minhash(copy), dedup.minhash(example)[None])[0]
  )
  assert sim >= 0.85, sim
  # The renamed half alone misses it (every later name renumbered); the
  # verbatim half keeps it.
  renamed = dedup.minhash(copy)[: dedup.NUM_PERM]
  assert (renamed == dedup.minhash(example)[: dedup.NUM_PERM]).mean() < 0.5


def test_an_archive_state_of_another_signature_scheme_is_recomputed():
  config = config_lib.base_config().memory
  archive = archive_lib.Archive(config)
  env_id, _ = archive.add(
      examples.CORPUS_GAME, verdict={"valid": True}, iteration=0
  )
  state = archive.state_dict()
  state["signature_scheme"] = "global-names-5"
  for entry_id in state["signatures"]:
    state["signatures"][entry_id][1] = base64.b64encode(
        np.zeros(2 * dedup.NUM_PERM, "<u8").tobytes()
    ).decode()
  restored = archive_lib.Archive.from_state_dict(config, state)
  copy = examples.CORPUS_GAME.replace("import re\n", "import re, math\n")
  assert restored.add(copy, verdict={"valid": True}, iteration=1) == (
      None,
      env_id,
  )
  # The same state with its own scheme keeps the saved (zeroed) values,
  # which match nothing: the check above did recompute them.
  state["signature_scheme"] = dedup.SCHEME
  kept = archive_lib.Archive.from_state_dict(config, state)
  assert kept.add(copy, verdict={"valid": True}, iteration=1)[0] is not None
