"""Model-agnostic sampling over a `tokens_to_logits` callable.

`sampler`: the lock-step batched sampler; `slot_engine`: the slot engine's
compiled programs (init, prefill-insert, generate); `slot_server`: the host
scheduler over them (and `TextServer`, its text front end); `text`: the
lock-step sampler behind a tokenizer; `shapes`: the bucketing rule.
"""
