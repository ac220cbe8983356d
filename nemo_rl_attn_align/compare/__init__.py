"""Comparing two sides: the contract binding (three tiers) and the determinism probe and diff."""
