"""Kernel prediction: the selectors' inputs and answers, their tables, the GPUs, the live selectors,
the pairs and the choice."""
