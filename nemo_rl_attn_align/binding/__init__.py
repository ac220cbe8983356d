"""Binding two sides: the contract binding (three tiers), the behaviour difference, the determinism
probe and diff, the predicted binding."""
