"""Stand-in for NeMo-RL 0.5.x (see tests/fake_nemo_rl/__init__.py); NeMo-RL is not on PyPI."""

__version__ = "0.5.0"
