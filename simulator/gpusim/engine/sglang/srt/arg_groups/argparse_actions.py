"""The action classes SGLang 0.5.23 registers some flags with (gpusim/srt_args.py)."""
from gpusim.srt_args import DeprecatedStoreConstAction, DeprecatedStoreTrueAction, LoRAPathAction  # noqa: F401
