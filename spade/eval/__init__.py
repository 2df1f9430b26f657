"""Held-out evaluation of the Reasoning Agent.

Suites (`registry.SUITES`): `reasoning_gym` (procedural reasoning generated
offline by the `reasoning-gym` package), `humaneval` (code, executed in the
sandbox), `tool_use` (BFCL v4 function calling, or SPADE's own held-out set
when the BFCL data cannot be obtained) and `seed_heldout` (seed environments
kept out of training, played multi-turn in the sandbox).

Every suite talks to the model through a `Responder` (chat messages in,
assistant replies out), so scorers are tested with scripted responders and
the CLI (`python -m spade.eval`) and the training loop (`runner.run_suites`)
plug in the model-backed one.
"""
