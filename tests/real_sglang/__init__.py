"""Helpers for tests/test_real_sglang.py: programs run under the real SGLang interpreter, and their inputs."""
