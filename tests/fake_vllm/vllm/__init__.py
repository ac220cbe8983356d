"""Stand-in for vLLM (see tests/fake_vllm/__init__.py)."""

__version__ = "0.25.1+standin"
