"""Training: the train state, losses, the jitted update step, the modes.

Submodules are imported where used (`from spade.train import update`), so
importing the package stays cheap.
"""
