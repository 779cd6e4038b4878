"""SGLang 0.5.23's ``sglang.srt.server_args`` as far as a simulated host has it: ``ServerArgs`` (``add_cli_args``,
``from_cli_args``, ``resolve_once``, ``resolved_dict``, ``launch_command``) and ``prepare_server_args``, the one
parser the stand-in server uses too (gpusim/srt_args.py)."""
from gpusim.srt_args import ServerArgs, prepare_server_args  # noqa: F401
