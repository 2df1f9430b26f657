"""The shared decoder, its sharding, tokenizers and checkpoint loaders."""
