"""Environments: the contract, the runtime, validation, seeds, gym adapter.

Submodules are imported by name (``spade.environments.validator``, ...):
this package stays importable with the standard library alone, because the
sandbox worker imports ``runtime`` and ``validator`` inside gVisor.
"""
