"""Deprecated shim for ``python -m sglang.benchmark.serving`` (the simulated host's client, gpusim/bench_serving.py)."""
import sys
import warnings

if __name__ == "__main__":
    warnings.warn("'python -m sglang.bench_serving' is deprecated; use 'python -m sglang.benchmark.serving'.",
                  FutureWarning, stacklevel=1)
    from gpusim import bench_serving

    sys.exit(bench_serving.main(sys.argv[1:]))
