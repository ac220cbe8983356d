"""Stand-in package (see tests/fake_vllm/__init__.py)."""
