"""Launch the inference server (the simulated host's stand-in, gpusim/sglang_server.py)."""
import sys
import warnings

if __name__ == "__main__":
    warnings.warn(
        "'python -m sglang.launch_server' is still supported, but "
        "'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]",
        UserWarning,
        stacklevel=1,
    )
    from gpusim import sglang_server

    sglang_server.main(sys.argv[1:])
