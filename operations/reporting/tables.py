"""The sweep report: results (``sweep.benchmarked``'s JSON files) to a markdown table, CSV, a PNG plot and the
crossover concurrency where speculation stops paying. Runs on the controller; also a command:

    python -m operations.reporting.tables sweep-results/<host>      # rewrite REPORT.md, results.csv, throughput.png
"""
from __future__ import annotations

import csv
import io
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

COLUMNS = (  # (CSV column, header, result key, format)
    ("output_tok_s", "output tok/s", "output_throughput", "{:.0f}"),
    ("mean_ttft_ms", "TTFT ms (mean)", "mean_ttft_ms", "{:.1f}"),
    ("p99_ttft_ms", "TTFT ms (p99)", "p99_ttft_ms", "{:.1f}"),
    ("mean_itl_ms", "ITL ms (mean)", "mean_itl_ms", "{:.2f}"),
    ("p99_itl_ms", "ITL ms (p99)", "p99_itl_ms", "{:.2f}"),
    ("accept_length", "accept length", "accept_length", "{:.2f}"),
)


def describe(result: dict) -> str:
    """One line for a result: throughput, latencies, accept length."""
    accept = result.get("accept_length")
    return (f"{result.get('output_throughput', 0):.0f} output tok/s, TTFT {result.get('mean_ttft_ms', 0):.1f} ms, "
            f"ITL {result.get('mean_itl_ms', 0):.2f} ms" + (f", accept length {accept:.2f}" if accept else ""))


def load(folder: Path) -> list[dict]:
    """Every result under folder (``<config>/c<N>.json``), by config then concurrency; unreadable files skipped."""
    records = []
    for path in sorted(Path(folder).glob("*/c*.json")):
        try:
            doc = json.loads(path.read_text())
            doc["workload"]["concurrency"], doc["config"]["name"], doc["result"]["output_throughput"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        records.append(doc)
    return sorted(records, key=lambda r: (r["config"]["name"], r["workload"]["concurrency"]))


def configs_of(records: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["config"]["name"] for r in records))


def throughput(records: list[dict], name: str) -> dict[int, float]:
    return {r["workload"]["concurrency"]: r["result"]["output_throughput"] for r in records
            if r["config"]["name"] == name}


@dataclass(frozen=True)
class Crossover:
    """Where ``config`` (speculative) stops beating ``baseline`` on output throughput."""

    config: str
    baseline: str
    speedups: dict  # concurrency -> throughput ratio config / baseline
    at: float | None  # interpolated concurrency where the ratio reaches 1 (log2 scale); None: not crossed
    between: tuple | None  # the two measured levels around it

    def text(self) -> str:
        levels = sorted(self.speedups)
        if not levels:
            return f"{self.config} vs {self.baseline}: no common concurrency levels"
        shown = ", ".join(f"c={c}: {self.speedups[c]:.2f}x" for c in levels)
        if self.at is None and self.speedups[levels[0]] > 1:
            verdict = f"speculation helps at every measured level (up to c={levels[-1]})"
        elif self.at is None or self.between is None:
            verdict = f"speculation does not help at any measured level (from c={levels[0]})"
        else:
            verdict = (f"speculation stops paying at concurrency ~{self.at:.1f} "
                       f"(helps at c={self.between[0]}, not at c={self.between[1]})")
        return f"{self.config} vs {self.baseline}: {verdict}; speed-up {shown}"


def crossover(records: list[dict], config: str, baseline: str) -> Crossover:
    spec, base = throughput(records, config), throughput(records, baseline)
    ratios = {c: spec[c] / base[c] for c in sorted(set(spec) & set(base)) if base[c] > 0}
    levels = sorted(ratios)
    for lo, hi in zip(levels, levels[1:]):
        if ratios[lo] > 1 >= ratios[hi]:
            x0, x1, r0, r1 = math.log2(lo), math.log2(hi), ratios[lo], ratios[hi]
            return Crossover(config, baseline, ratios, 2 ** (x0 + (r0 - 1) / (r0 - r1) * (x1 - x0)), (lo, hi))
    return Crossover(config, baseline, ratios, None, None)


def crossovers(records: list[dict]) -> list[Crossover]:
    """Each speculative config against the baseline (a non-speculative config, same model when there is one)."""
    meta = {r["config"]["name"]: r["config"] for r in records}
    model = lambda name: meta[name].get("args", {}).get("model_path")  # noqa: E731
    baselines = [n for n in meta if not meta[n].get("speculative")]
    out = []
    for name in (n for n in meta if meta[n].get("speculative")):
        same = [b for b in baselines if model(b) == model(name)] or baselines
        if same:
            out.append(crossover(records, name, same[0]))
    return out


def _cell(result: dict, key: str, fmt: str) -> str:
    value = result.get(key)
    return fmt.format(value) if isinstance(value, (int, float)) else "-"


def markdown(records: list[dict]) -> str:
    if not records:
        return "No results yet."
    lines = []
    for name in configs_of(records):
        rows = [r for r in records if r["config"]["name"] == name]
        lines += [f"### {name} (config {rows[0]['config']['hash']})", "",
                  "| concurrency | " + " | ".join(c[1] for c in COLUMNS) + " |",
                  "|---:|" + "---:|" * len(COLUMNS)]
        lines += [f"| {r['workload']['concurrency']} | " + " | ".join(_cell(r["result"], c[2], c[3]) for c in COLUMNS)
                  + " |" for r in rows]
        lines.append("")
    found = crossovers(records)
    lines += ["### Crossover", ""] + ([f"- {c.text()}" for c in found] or ["No speculative/baseline pair to compare."])
    return "\n".join(lines).rstrip() + "\n"


def to_csv(records: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["config", "config_hash", "speculative", "concurrency", "num_prompts", "input_len", "output_len",
                     *(c[0] for c in COLUMNS)])
    for r in records:
        w = r["workload"]
        writer.writerow([r["config"]["name"], r["config"]["hash"], r["config"].get("speculative"), w["concurrency"],
                         w["num_prompts"], w["input_len"], w["output_len"],
                         *(r["result"].get(c[2]) if r["result"].get(c[2]) is not None else "" for c in COLUMNS)])
    return buf.getvalue()


def plot(records: list[dict]) -> bytes:
    from operations.reporting.plot import line_chart

    series = {name: sorted(throughput(records, name).items()) for name in configs_of(records)}
    marks = [(c.at, f"{c.config} crossover ~{c.at:.1f}") for c in crossovers(records) if c.at]
    return line_chart(series, title="Output throughput vs concurrency", x_label="max concurrency",
                      y_label="output tok/s", log_x=True, marks=marks)


def render(folder: Path, records: list[dict]) -> dict[str, bytes]:
    """The report files' contents: REPORT.md, results.csv, throughput.png."""
    return {"REPORT.md": f"# Sweep report: {Path(folder).name}\n\n{markdown(records)}".encode(),
            "results.csv": to_csv(records).encode(), "throughput.png": plot(records)}


def unchanged(folder: Path, records: list[dict]) -> bool:
    """The files on disk are what ``write`` would write now."""
    try:
        return all((Path(folder) / leaf).read_bytes() == content for leaf, content in render(folder, records).items())
    except OSError:
        return False


def write(folder: Path, records: list[dict]) -> list[Path]:
    """REPORT.md, results.csv, throughput.png under folder; the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for leaf, content in render(folder, records).items():
        (folder / leaf).write_bytes(content)
    return [folder / leaf for leaf in ("REPORT.md", "results.csv", "throughput.png")]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    records = load(Path(argv[0]))
    for path in write(Path(argv[0]), records):
        print(path)
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
