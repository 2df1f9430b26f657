"""Compiled, model-agnostic sampling (`sampler`) and its text front end (`text`)."""
