"""The Reasoning Agent: prompts and the batched multi-turn rollout."""
