"""Aligning a recipe: the preset (``attention_align.preset``) and ``check --fix``."""
