"""``python -m sglang.benchmark.serving`` on a simulated host (gpusim/bench_serving.py)."""
import sys

if __name__ == "__main__":
    from gpusim import bench_serving

    sys.exit(bench_serving.main(sys.argv[1:]))
