"""The Environment Designer: prompts, code extraction, hints."""
