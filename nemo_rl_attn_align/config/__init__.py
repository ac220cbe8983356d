"""Reading a NeMo-RL recipe: the loader (as NeMo-RL reads it), the ``attention_align`` settings, the packaged
examples."""
