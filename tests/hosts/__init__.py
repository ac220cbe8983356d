"""Tests of the host adapters: bootstrap, Megatron worker, TE read-back, vLLM worker, Ray."""
