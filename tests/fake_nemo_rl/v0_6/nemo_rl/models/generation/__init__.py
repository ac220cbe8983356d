"""Stand-in package (see tests/fake_nemo_rl/__init__.py)."""
