"""What one benchmark level sends: ``sglang.bench_serving``'s random dataset at fixed lengths."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from operations.model import hostdata


@dataclass(frozen=True)
class Workload:
    """What one benchmark level sends (``sglang.bench_serving``'s random dataset, fixed lengths)."""

    concurrency: int
    num_prompts: int
    input_len: int = 1024
    output_len: int = 512

    @classmethod
    def at(cls, concurrency, num_prompts=None, input_len=1024, output_len=512, on_host=None) -> "Workload":
        """The workload at ``concurrency``, or one ConfigError naming every field that is not an integer >= 1
        (strings that spell one, as ``--data`` gives, are taken)."""
        fields = {"concurrency": concurrency, "num_prompts": num_prompts, "input_len": input_len,
                  "output_len": output_len}
        c, n, i, o = hostdata.gather(*(partial(hostdata.as_integer, on_host, k, v, low=1) if v is not None
                                       else (lambda: None) for k, v in fields.items()))
        return cls(c, n or max(8, 4 * c), i, o)

    def runner_args(self, port: int, model: str, tokenizer: str, backend: str = "sglang") -> list[str]:
        return ["--backend", backend, "--host", "127.0.0.1", "--port", str(port), "--model", model,
                "--tokenizer", tokenizer,
                "--dataset-name", "random", "--random-input-len", str(self.input_len),
                "--random-output-len", str(self.output_len), "--random-range-ratio", "1.0",
                "--num-prompts", str(self.num_prompts), "--max-concurrency", str(self.concurrency),
                "--disable-tqdm", "--seed", "1", "--warmup-requests", "1"]

    def as_dict(self) -> dict:
        return {"concurrency": self.concurrency, "num_prompts": self.num_prompts, "input_len": self.input_len,
                "output_len": self.output_len}
