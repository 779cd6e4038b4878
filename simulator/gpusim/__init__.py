"""A simulated GPU host: per-GPU memory ledger, memory-holding processes, a driver that frees memory late.

Product code never imports this package: it talks to the simulator only through the stand-in ``nvidia-smi``,
``libnvidia-ml.so.1`` and (later) the SGLang-API stand-in server, exactly as it would on a real host.
"""
