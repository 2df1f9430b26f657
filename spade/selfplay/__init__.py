"""The self-play host loop: design, validate, play, score, update, remember.

`spade.train` is the pure training core (state, losses, the jitted update,
checkpoints); this package drives it: the typed records of one iteration
(`records`), the policy that samples and updates (`engine`), the environment
executor, the loop state (`state`: grounding, memory, replay, the window),
batching of sampled tokens into update rows, multi-host exchange, metrics and the loop itself.
Submodules are imported where used, so importing the package stays cheap.
"""
