"""Near-duplicate signatures: renamed copies match, different games do not."""

import numpy as np

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
    assert np.delete(sims, i).max() < 0.2


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
  assert dedup.diversity(different) > 0.9
  assert dedup.diversity(different[:1]) == 0.0
  assert dedup.diversity(list(programs.ALL)) == dedup.diversity(different)
