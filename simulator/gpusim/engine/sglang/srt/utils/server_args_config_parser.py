"""SGLang 0.5.23's ``--config FILE.yaml`` merger (gpusim/srt_args.py ConfigArgumentMerger)."""
from gpusim.srt_args import ConfigArgumentMerger  # noqa: F401
