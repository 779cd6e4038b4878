"""specops against the REAL SGLang 0.5.23: its own argparse parser, ``--config`` loader and resolver.

The interpreter is ``$SPECOPS_SGLANG_PYTHON``, else ``.venv-sglang/bin/python`` (``sh scripts/sglang_venv.sh``
builds it; ``sh scripts/test.sh`` runs that first). Without one every test here FAILS with the reason (and what
``.venv-sglang.failed`` says). Resolution reads the models' ``config.json`` from an offline cache made in a temp
dir (tests/real_sglang/models.py) and runs with ``--device cpu`` appended (``--device cuda`` for the CUDA-only
algorithms, which resolve without a GPU): only here, never in a rendered command.

All resolutions run in ONE bridge process (tests/real_sglang/bridge.py; importing SGLang takes seconds):

a. the interpreter is SGLang 0.5.23;
b. ``scripts/sglang_table.py --check``: the shipped flag table is SGLang's own parser;
c. every shipped SGLang config (every rank of the multi-node one) as specops launches it: parsed with its engine
   YAML by SGLang's ``--config`` loader (``ConfigArgumentMerger``) and resolved; the same as the flags on one line;
   and a server started from it reports what specops' desired view says;
d. the edge corpus (tests/real_sglang/corpus.yaml): desired view and the simulator's stand-in agree with SGLang's
   resolved values; what SGLang refuses, specops refuses;
e. the stricter rules (tests/real_sglang/stricter.yaml): each rule specops has that SGLang does not is listed in
   README.md under "Where specops is stricter than SGLang";
f. the host-side engine check (operations/remote/engine_check.py) under the real interpreter.
"""
from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
from dataclasses import dataclass, field, replace
import tempfile
from pathlib import Path

import pytest
import yaml

from operations.model import config as configs
from operations.model import engines, validation
from operations.model import topology
from operations.model.config import ServerConfig
from operations.errors import ConfigError

from real_sglang import models

REPO = Path(__file__).resolve().parent.parent
HERE = REPO / "tests" / "real_sglang"
BRIDGE = HERE / "bridge.py"
VENV_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
FAILED_MARKER = REPO / ".venv-sglang.failed"
SGLANG_VERSION = "0.5.23"
ENGINE_FILE = "engine.yaml"  # the bridge writes the engine YAML under this name and puts its path for "@engine.yaml"
DUMMY_SECRET = "specops-test-secret"
CORPUS = yaml.safe_load((HERE / "corpus.yaml").read_text())
STRICTER = yaml.safe_load((HERE / "stricter.yaml").read_text())
README = REPO / "README.md"
STRICTER_HEADING = "Where specops is stricter than SGLang"
# differ between two resolutions of the same flags: the file's path, and a seed SGLang draws when none is given
UNSTABLE_KEYS = ("config", "random_seed")
SIM_KEYS = ("tp_size", "dp_size", "base_gpu_id", "model_path")  # + every speculative_* key


# ---- the interpreter --------------------------------------------------------------------------------------------

def _probe(python: str) -> str | None:
    """None if ``python`` runs and has sglang installed; else why not."""
    try:
        proc = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                              capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return f"{python}: cannot run ({exc.strerror or exc})"
    except subprocess.TimeoutExpired:
        return f"{python}: did not answer within 60 s"
    if proc.returncode:
        return f"{python}: has no sglang ({(proc.stderr.strip().splitlines() or ['exit %d' % proc.returncode])[-1]})"
    return None


def find_sglang_python() -> tuple[str | None, str]:
    """(interpreter, '') or (None, the reason no SGLang interpreter works)."""
    reasons = []
    named = os.environ.get("SPECOPS_SGLANG_PYTHON")
    candidates = ([named] if named else []) + [str(VENV_PYTHON)]
    for python in candidates:
        if python == str(VENV_PYTHON) and not VENV_PYTHON.exists():
            reasons.append(f"{VENV_PYTHON} does not exist (build it: sh scripts/sglang_venv.sh)")
            continue
        problem = _probe(python)
        if problem is None:
            return python, ""
        reasons.append(problem)
    if not named:
        reasons.insert(0, "SPECOPS_SGLANG_PYTHON is not set")
    if FAILED_MARKER.exists():
        reasons.append(f"{FAILED_MARKER.name} says:\n{FAILED_MARKER.read_text().strip()}")
    return None, "no SGLang interpreter: " + "; ".join(reasons)


@pytest.fixture(scope="module")
def sglang_python() -> str:
    python, reason = find_sglang_python()
    if python is None:
        pytest.fail(reason, pytrace=False)
    return python


@pytest.fixture(scope="module")
def hf_env(tmp_path_factory) -> dict:
    """An offline Hugging Face cache with the config.json of every model the cases name."""
    return models.make_cache(tmp_path_factory.mktemp("hf"))


def run_python(python: str, argv: list[str], env: dict | None = None, stdin: str | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([python, *argv], input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=REPO)


# ---- rendering what specops launches ----------------------------------------------------------------------------

ENGINE = engines.engine_for("sglang")
NEW_RENDERING = hasattr(ENGINE, "engine_yaml") and hasattr(ENGINE, "launch_argv")


def _secret(cfg: ServerConfig, item):
    if isinstance(item, engines.SecretRef):  # rendered as --flag=VALUE, one argv element
        value = cfg.args.get(item.key)
        return item.prefix + (value if isinstance(value, str) and value else DUMMY_SECRET)
    return str(item)


@dataclass
class Rendered:
    flags: list  # the command line after the launcher; "@engine.yaml" where the engine file's path goes
    engine_yaml: str | None  # None: the old renderer, every flag on the line
    flat: list = field(default_factory=list)  # every flag on the line (no engine file)

    shipped: dict = field(default_factory=dict)  # leaf -> content of the files the config ships beside it

    def files(self) -> dict:
        return {**({ENGINE_FILE: self.engine_yaml} if self.engine_yaml is not None else {}), **self.shipped}


def render(cfg: ServerConfig) -> Rendered:
    """What specops starts: ``launcher --config engine.yaml <flags the file cannot carry>`` (secrets substituted);
    the old single-line renderer until ``engine_yaml`` / ``launch_argv`` exist."""
    launcher = list(cfg.launcher)
    shipped = {f.leaf: f.content for f in getattr(cfg, "shipped", ())}
    if shipped:  # the bridge's directory, as the server's own directory on a host
        cfg = cfg.placed("@DIR")
    if NEW_RENDERING:
        argv = ENGINE.launch_argv(cfg, "@" + ENGINE_FILE)
        flat = ENGINE.launch_argv(cfg, None)
        text = ENGINE.engine_yaml(cfg)
    else:
        argv = flat = ENGINE.argv(cfg)
        text = None
    assert [str(a) for a in argv[:len(launcher)]] == launcher, (argv, launcher)
    return Rendered([_secret(cfg, a) for a in argv[len(launcher):]], text,
                    [_secret(cfg, a) for a in flat[len(launcher):]], shipped)


def render_any(cfg: ServerConfig) -> Rendered:
    """``render``, for a config specops refuses too: flags SGLang's table does not have (specops renders none)
    are appended as ``--flag value``, the way an operator would type them."""
    from operations.model.engines import sglang_args

    table = sglang_args.flags()
    unknown = {k: v for k, v in cfg.args.items() if k not in table}
    r = render(replace(cfg, args={k: v for k, v in cfg.args.items() if k in table}))
    extra = [a for k, v in unknown.items() for a in ("--" + k.replace("_", "-"), str(v))]
    return Rendered(r.flags + extra, r.engine_yaml, r.flat + extra, r.shipped)


def unvalidated(data: dict, name: str) -> ServerConfig:
    """A ServerConfig for ``data`` without specops' validation (to show SGLang a config specops refuses)."""
    meta = data.get("specops") or {}
    args = {ENGINE.dest(str(k)): v for k, v in data.items() if k != "specops"}
    return ServerConfig(name=name, args=args, env={str(k): str(v) for k, v in (meta.get("env") or {}).items()},
                        gpus=tuple(meta["gpus"]) if isinstance(meta.get("gpus"), list) else None)


def with_files(cfg: ServerConfig, files: dict | None) -> ServerConfig:
    """``cfg`` shipping the case's ``files`` its arguments name (unchecked: SGLang is to see them as they are)."""
    from operations.model.server_config import ShippedFile
    from operations.model.shipped import SHIPPABLE

    shipped = tuple(ShippedFile(dest, SHIPPABLE[dest][0], files[cfg.args[dest]]) for dest in SHIPPABLE
                    if files and cfg.args.get(dest) in files)
    return replace(cfg, shipped=shipped) if shipped else cfg


def specops_issues(data: dict, name: str, environ=None, host: dict | None = None, files: dict | None = None) -> list:
    """What specops refuses ``data`` for: from_mapping's ConfigError, else the engine's validation (with the host
    context when given), as check_inventory runs it before anything is started. ``files``: name -> text beside the
    config (the files it names by relative path)."""
    with tempfile.TemporaryDirectory(prefix="specops-stricter-") as tmp:  # read by from_mapping, then gone
        for leaf, text in (files or {}).items():
            (Path(tmp) / leaf).write_text(text)
        try:
            cfg = configs.from_mapping(data, name, environ=environ or {}, base=Path(tmp) if files else None)
        except ConfigError as exc:
            return exc.issues
    return validation.validate(cfg, validation.HostContext(**(host or {})))


# ---- the shipped configs ----------------------------------------------------------------------------------------

@dataclass
class H:  # an inventory host, as operations.model.topology reads it
    name: str
    data: dict


def example_group() -> list[H]:
    """The multi-node group of the example inventory (inventory/real_example.py, group ``llama70b``)."""
    inventory = runpy.run_path(str(REPO / "inventory" / "real_example.py"))
    return [H(name, dict(data)) for name, data in inventory["llama70b"]]


def shipped_sglang_configs() -> list[tuple[str, ServerConfig]]:
    """(id, config as one host runs it) for every shipped SGLang config; a multi-node one once per rank of the
    example inventory's group (ranks from operations.model.topology)."""
    out = []
    names = (configs.known_configs(REPO / "configs") if hasattr(configs, "known_configs")
             else sorted(p.stem for p in (REPO / "configs").glob("*.yaml")))
    for name in names:
        cfg = configs.load(str(REPO / "configs" / f"{name}.yaml"))
        if cfg.engine != "sglang":
            continue
        hosts = example_group()
        per_host = hosts[0].data["gpu_count"]
        if cfg.gpu_count() <= per_host and cfg.args.get("nnodes", 1) == 1:
            out.append((name, cfg))
            continue
        from operations import server

        server.check_inventory(cfg, hosts)  # raises ConfigError listing every rank's problem
        for h in hosts:
            out.append((f"{name}@rank{topology.rank_of(h, hosts).rank}",
                        topology.for_rank(cfg, topology.rank_of(h, hosts))))
    return out


SHIPPED = shipped_sglang_configs()


def _device(case: dict) -> list[str]:
    return ["--device", case.get("device", "cpu")]


# ---- one bridge run for everything ------------------------------------------------------------------------------

def _cases() -> list[dict]:
    cases = [{"id": "algorithms", "mode": "algorithms"}]
    for cid, cfg in SHIPPED:
        r = render(cfg)
        cases.append({"id": f"shipped:{cid}", "argv": r.flags + ["--device", "cpu"], "files": r.files()})
        cases.append({"id": f"flat:{cid}", "argv": r.flat + ["--device", "cpu"], "files": r.shipped})
        if r.engine_yaml is not None:
            cases.append({"id": f"merge:{cid}", "mode": "merge", "argv": ["--config", "@" + ENGINE_FILE],
                          "files": r.files()})
    for case in CORPUS:
        r = render_any(unvalidated(case["config"], case["id"]) if "environ" not in case
                   else configs.from_mapping(case["config"], case["id"], environ=case["environ"]))
        cases.append({"id": f"corpus:{case['id']}", "argv": r.flags + _device(case), "files": r.files()})
    for i, case in enumerate(STRICTER):
        r = render_any(with_files(unvalidated(case["config"], f"stricter{i}"), case.get("files")))
        cases.append({"id": f"stricter:{i}", "argv": r.flags + _device(case), "files": r.files()})
    return cases


@pytest.fixture(scope="module")
def real(sglang_python, hf_env) -> dict:
    """id -> the bridge's result (SGLang's resolved_dict, merged argv or error)."""
    proc = run_python(sglang_python, [str(BRIDGE)], env=hf_env, stdin=json.dumps({"cases": _cases()}))
    if proc.returncode:
        pytest.fail(f"the bridge failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}", pytrace=False)
    doc = json.loads(proc.stdout)
    assert doc["version"] == SGLANG_VERSION, doc["version"]
    return {r["id"]: r for r in doc["results"]}


def _ok(result: dict) -> dict:
    assert result["ok"], f"SGLang refused it at {result['stage']}: {result.get('error')}"
    return result


# ---- comparisons ------------------------------------------------------------------------------------------------

_AUTO = getattr(engines, "AUTO", object())


def matches(desired, reported) -> bool:
    return desired is _AUTO or desired == reported


def desired(cfg: ServerConfig) -> dict:
    keys = list(dict.fromkeys([*ENGINE.compared(cfg), "tp_size", "dp_size", "base_gpu_id"]))
    try:
        return ENGINE.desired_view(cfg, keys=keys)
    except TypeError:  # a desired_view without keys=
        return ENGINE.desired_view(cfg)


def diff_table(want: dict, got: dict) -> list[str]:
    return [f"{k}: specops {want[k]!r} / SGLang {got.get(k, '<absent>')!r}" for k in want
            if not matches(want[k], got.get(k))]


# ==== a. the interpreter =========================================================================================

def test_the_sglang_interpreter_is_sglang_0_5_23(sglang_python):
    proc = run_python(sglang_python, ["-c", "import sglang; print(sglang.__version__)"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == SGLANG_VERSION


# ==== b. the flag table ==========================================================================================

def test_shipped_flag_table_is_sglangs_own_parser(sglang_python):
    proc = run_python(sglang_python, [str(REPO / "scripts" / "sglang_table.py"), "--check"], timeout=300)
    assert proc.returncode == 0, f"operations/model/engines/data table differs from SGLang's parser:\n{proc.stdout}{proc.stderr}"
    assert "matches SGLang 0.5.23" in proc.stdout


# ==== c. shipped configs, as launched ============================================================================

def test_every_shipped_sglang_config_is_checked_and_multi_node_per_rank():
    ids = [cid for cid, _ in SHIPPED]
    names = {cid.split("@")[0] for cid in ids}
    sglang_names = {n for n in configs.known_configs(REPO / "configs")
                    if configs.load(str(REPO / "configs" / f"{n}.yaml")).engine == "sglang"}
    assert names == sglang_names, (names, sglang_names)
    multi = {cid.split("@")[0] for cid in ids if "@rank" in cid}
    assert multi, f"no multi-node config among {ids}"
    group = len(example_group())
    for name in multi:
        ranks = [dict(SHIPPED)[cid].args for cid in ids if cid.startswith(name + "@")]
        assert [a["node_rank"] for a in ranks] == list(range(group)), ranks
        assert {a["nnodes"] for a in ranks} == {group} and len({a["dist_init_addr"] for a in ranks}) == 1, ranks


def test_shipped_configs_models_are_in_the_offline_cache():
    named = {cfg.args.get(k) for _, cfg in SHIPPED for k in ("model_path", "speculative_draft_model_path")}
    missing = sorted(m for m in named - {None} if m not in models.MODELS)
    assert not missing, f"add these to tests/real_sglang/models.py MODELS: {missing}"


def test_launch_form_is_the_engine_yaml_plus_cli_only_flags():
    assert NEW_RENDERING, ("engines.SGLang has no engine_yaml(cfg) / launch_argv(cfg, config_path) yet: the shipped "
                           "configs were checked with the old single-line argv(cfg)")
    for cid, cfg in SHIPPED:
        r = render(cfg)
        assert r.flags[:2] == ["--config", "@" + ENGINE_FILE], (cid, r.flags)


@pytest.mark.parametrize("cid", [cid for cid, _ in SHIPPED])
def test_sglang_parses_and_resolves_what_specops_launches(real, cid):
    _ok(real[f"shipped:{cid}"])


@pytest.mark.parametrize("cid", [cid for cid, _ in SHIPPED])
def test_sglangs_config_loader_takes_the_engine_yaml(real, cid):
    assert NEW_RENDERING, "no engine_yaml(cfg) yet: nothing for SGLang's ConfigArgumentMerger to read"
    merged = _ok(real[f"merge:{cid}"])["merged"]
    cfg = dict(SHIPPED)[cid]
    assert "--model-path" in merged and merged[merged.index("--model-path") + 1] == cfg.args["model_path"], merged


@pytest.mark.parametrize("cid", [cid for cid, _ in SHIPPED])
def test_engine_yaml_launch_resolves_like_all_flags_on_the_line(real, cid):
    """The engine file carries exactly what the flags would: SGLang resolves both to the same server."""
    via_file = _ok(real[f"shipped:{cid}"])["resolved"]
    flat = _ok(real[f"flat:{cid}"])["resolved"]
    for f in getattr(dict(SHIPPED)[cid], "shipped", ()):  # each case has its own directory: the file is the same
        assert os.path.basename(via_file[f.dest]) == os.path.basename(flat[f.dest]) == f.leaf
        via_file, flat = {**via_file, f.dest: f.leaf}, {**flat, f.dest: f.leaf}
    differ = sorted(k for k in set(via_file) | set(flat)
                    if k not in UNSTABLE_KEYS and via_file.get(k) != flat.get(k))
    assert not differ, {k: (via_file.get(k), flat.get(k)) for k in differ}


@pytest.mark.parametrize("cid", [cid for cid, _ in SHIPPED])
def test_desired_view_of_shipped_config_is_what_sglang_reports(real, cid):
    cfg = dict(SHIPPED)[cid]
    mismatches = diff_table(desired(cfg), _ok(real[f"shipped:{cid}"])["resolved"])
    assert not mismatches, "\n".join(mismatches)


# ==== d. the edge corpus =========================================================================================

CORPUS_IDS = [c["id"] for c in CORPUS]
BY_ID = {c["id"]: c for c in CORPUS}


def test_corpus_covers_every_algorithm_sglang_knows(real):
    algorithms = _ok(real["algorithms"])["algorithms"]
    assert {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"} <= set(algorithms), algorithms
    assert len(CORPUS) >= 20
    resolved = {}
    for case in CORPUS:
        result = real[f"corpus:{case['id']}"]
        name = str(case["config"].get("speculative-algorithm", "")).upper()
        if result["ok"]:
            resolved.setdefault(name, []).append(case["id"])
    missing = [a for a in algorithms if a not in resolved]
    assert not missing, f"no corpus case that SGLang resolves for {missing} (resolved: {resolved})"
    assert any(c["config"].get("speculative-adaptive") for c in CORPUS)
    assert any(str(c["config"].get("speculative-algorithm", "")).islower() for c in CORPUS)


@pytest.mark.parametrize("cid", CORPUS_IDS)
def test_corpus_specops_refuses_what_sglang_refuses(real, cid):
    case, result = BY_ID[cid], real[f"corpus:{cid}"]
    issues = specops_issues(case["config"], cid, case.get("environ"))
    if not result["ok"]:
        assert issues, (f"SGLang refuses it ({result['stage']}: {result['error']}) but specops accepts it: "
                        f"a config certain to fail on the host")
    else:
        stricter = readme_stricter_fields() or set()
        unlisted = sorted({i.field for i in issues} - stricter)
        assert not unlisted, (f"SGLang resolves it but specops refuses it ({[str(i) for i in issues]}); fields "
                              f"{unlisted} are not in README's '{STRICTER_HEADING}' table")


@pytest.mark.parametrize("cid", CORPUS_IDS)
def test_corpus_desired_view_is_what_sglang_resolves(real, cid):
    case, result = BY_ID[cid], real[f"corpus:{cid}"]
    if not result["ok"]:
        return  # nothing to compare: test_corpus_specops_refuses_what_sglang_refuses covers it
    if specops_issues(case["config"], cid, case.get("environ")):
        return  # refused by specops: no desired view (listed by the test above)
    cfg = configs.from_mapping(case["config"], cid, environ=case.get("environ") or {})
    mismatches = diff_table(desired(cfg), result["resolved"])
    assert not mismatches, "desired_view differs from SGLang's resolution:\n" + "\n".join(mismatches)


def _sim_resolved_args():
    from gpusim import sglang_server

    fn = getattr(sglang_server, "resolved_args", None)
    assert fn is not None, "gpusim.sglang_server has no resolved_args(argv) yet (the simulator's stand-in)"
    return fn


def _sim_argv(rendered: Rendered, extra: list, tmp_path: Path) -> list:
    path = tmp_path / ENGINE_FILE
    if rendered.engine_yaml is not None:
        path.write_text(rendered.engine_yaml)
    return [str(path) if a == "@" + ENGINE_FILE else a for a in rendered.flags] + extra


@pytest.mark.parametrize("cid", CORPUS_IDS)
def test_corpus_simulator_resolves_like_sglang(real, cid, hf_env, tmp_path, monkeypatch):
    resolved_args = _sim_resolved_args()
    case, result = BY_ID[cid], real[f"corpus:{cid}"]
    for key, value in hf_env.items():
        monkeypatch.setenv(key, value)  # the simulator reads the same model configs
    cfg = (configs.from_mapping(case["config"], cid, environ=case["environ"]) if "environ" in case
           else unvalidated(case["config"], cid))
    argv = _sim_argv(render_any(cfg), _device(case), tmp_path)
    if not result["ok"]:
        real_type = result["error"].split(":", 1)[0]
        with pytest.raises(BaseException) as err:
            resolved_args(argv)
        got = type(err.value).__name__
        assert got == real_type or (real_type.startswith("sglang serve") and got == "SystemExit"), (
            f"SGLang: {result['error']}; simulator: {got}: {err.value}")
        return
    sim = resolved_args(argv)
    want = result["resolved"]
    keys = [k for k in want if k.startswith("speculative_")] + list(SIM_KEYS)
    mismatches = [f"{k}: simulator {sim.get(k, '<absent>')!r} / SGLang {want.get(k)!r}" for k in keys
                  if sim.get(k, "<absent>") != want.get(k)]
    assert not mismatches, "\n".join(mismatches)


# ==== e. where specops is stricter ===============================================================================

def readme_stricter_fields() -> set | None:
    """First-column values of the table under README's heading 'Where specops is stricter than SGLang'."""
    text = README.read_text()
    heading = re.search(rf"^#+\s*{re.escape(STRICTER_HEADING)}\s*$", text, re.M)
    if not heading:
        return None
    section = re.split(r"^#+\s", text[heading.end():], maxsplit=1, flags=re.M)[0]
    rows = [line.strip() for line in section.splitlines() if line.strip().startswith("|")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    body = [c for c in cells[1:] if not re.fullmatch(r":?-{3,}:?", c[0])]  # after the header, minus the rule
    return {c[0].strip("`").strip() for c in body if c and c[0]}


STRICTER_IDS = [f"{i}:{c['field']}:{c['rule']}" for i, c in enumerate(STRICTER)]


@pytest.mark.parametrize("i", range(len(STRICTER)), ids=STRICTER_IDS)
def test_specops_refuses_each_stricter_case_for_its_rule(i):
    case = STRICTER[i]
    issues = specops_issues(case["config"], f"stricter{i}", host=case.get("host"), files=case.get("files"))
    assert case["field"] in {x.field for x in issues}, [str(x) for x in issues]


def _accepted_stricter(real) -> dict:
    """field -> rules, for the stricter cases the real SGLang parses and resolves."""
    out = {}
    for i, case in enumerate(STRICTER):
        if real[f"stricter:{i}"]["ok"]:
            out.setdefault(case["field"], []).append(case["rule"])
    return out


def test_readme_lists_every_rule_where_specops_is_stricter_than_sglang(real):
    accepted = _accepted_stricter(real)
    listed = readme_stricter_fields()
    assert listed is not None, (f"README.md has no '{STRICTER_HEADING}' heading with a table; SGLang accepts "
                                f"what these rules refuse: {accepted}")
    missing = {f: rules for f, rules in accepted.items() if f not in listed}
    assert not missing, f"SGLang accepts these but README's table has no row for them: {missing}"


def test_readme_stricter_table_lists_only_rules_sglang_does_not_have(real):
    listed = readme_stricter_fields() or set()
    accepted = _accepted_stricter(real)
    stale = sorted(listed - set(accepted))
    assert not stale, (f"README rows {stale} have no case in tests/real_sglang/stricter.yaml that SGLang accepts "
                       f"(SGLang refuses it too, or the rule is gone: drop the row, or add the case)")


# ==== f. the host-side engine check ==============================================================================

def _engine_check_program(python: str, flags: str, text: str) -> list[str]:
    """How specops runs it on a host: the host-program bundle's ``engine_check FLAGS_JSON ENGINE_YAML``."""
    from factories import host_program

    return host_program("engine_check.py", flags, text, python=python)


def _engine_check_input(cfg: ServerConfig) -> tuple[str, str]:
    from operations.model import engine_check as enginecheck

    if hasattr(enginecheck, "check_input"):
        return enginecheck.check_input(cfg, "/etc/specops/engine.yaml")
    r = render(cfg)
    return json.dumps(r.flags), r.engine_yaml or ""


def _run_engine_checks(python: str, inputs: list[tuple[str, str]]) -> list[dict]:
    """Every check at once (each imports SGLang, seconds apiece): one JSON document each."""
    procs = [subprocess.Popen(_engine_check_program(python, flags, text), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd="/") for flags, text in inputs]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        lines = stdout.strip().splitlines()
        assert lines, f"no output; stderr: {stderr[-3000:]}"
        out.append(json.loads(lines[-1]))
    return out


@pytest.fixture(scope="module")
def engine_checks(sglang_python) -> dict:
    cases = {cid: _engine_check_input(cfg) for cid, cfg in SHIPPED}
    flags, text = cases[SHIPPED[0][0]]
    cases["unknown-flag"] = (json.dumps(json.loads(flags) + ["--speculative-bogus-flag", "3"]), text)
    # an API key starting with "-" (1 in 64 token_urlsafe keys): specops renders --api-key=VALUE, which parses
    dashed = ServerConfig(name="dashed", args={"model_path": "m", "api_key": "-Zq9xW2abc"})
    cases["dash-key"] = (json.dumps([_secret(dashed, a) for a in ENGINE.launch_argv(dashed, None)[3:]]), "")
    cases["dash-key-split"] = (json.dumps(["--model-path", "m", "--api-key", "-Zq9xW2abc"]), "")
    results = _run_engine_checks(sglang_python, list(cases.values()))
    return dict(zip(cases, results))


def test_engine_check_accepts_every_shipped_config_and_reports_the_version(engine_checks):
    for cid, _ in SHIPPED:
        doc = engine_checks[cid]
        assert doc["version"] == SGLANG_VERSION, (cid, doc)
        assert doc["ok"] is True and not doc.get("error"), (cid, doc)


def test_an_api_key_starting_with_a_dash_parses_as_specops_renders_it(engine_checks):
    assert engine_checks["dash-key"]["ok"] is True, engine_checks["dash-key"]
    # the two-element form SGLang refuses, which is why specops does not render it
    assert "expected one argument" in engine_checks["dash-key-split"]["error"], engine_checks["dash-key-split"]


def test_engine_check_rejects_an_unknown_flag_with_sglangs_argparse_message(engine_checks):
    doc = engine_checks["unknown-flag"]
    assert doc["ok"] is False and doc["version"] == SGLANG_VERSION, doc
    assert "unrecognized arguments: --speculative-bogus-flag 3" in doc["error"], doc


# ==== e. the adaptive table ======================================================================================

# (table, why specops refuses what SGLang's loader takes, or None where both decide alike)
ADAPTIVE_TABLES = [
    ({"1": {"candidate_steps": [1, 3, 5, 7]}, "8": {"candidate_steps": [0, 1, 3]}}, None),
    ({"ema_alpha": 0.3, "1": {"candidate_steps": [1, 3]}, "32": {"candidate_steps": [0]}}, None),
    ({"ema_alpha": 0.2}, None),                                 # no batch-size key
    ({"1": {"candidate_steps": []}}, None),
    ({"1": {"candidate_steps": [1, -1]}}, None),
    ({"1": {"candidate_steps": [1, 2.5]}}, None),
    ({"1": {"candidate_steps": "1,3"}}, None),
    ({"1": {}}, None),
    ({"1": {"candidate_steps": [True, 3]}}, "a boolean is an int to SGLang: true would be 1 draft step"),
    ({"1": {"candidate_steps": [1]}, "l6": {"candidate_steps": [0]}}, "SGLang ignores a key that is not digits"),
    ({"1": {"candidate_steps": [1]}, "update_interval": 0}, "SGLang divides by it at the first decode batches"),
    ({"1": {"candidate_steps": [1]}, "ema_alpha": 2}, "an EMA weight outside (0, 1] never settles"),
    ({"1": {"candidate_steps": [1], "warmup": 3}}, "SGLang ignores an unknown slot setting"),
]

_ADAPTIVE_BRIDGE = """
import json, sys, tempfile
from sglang.srt.speculative.adaptive_spec_params import resolve_candidate_steps_from_config
out = []
for table in json.load(sys.stdin):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        json.dump(table, fh)
        fh.flush()
        try:
            out.append({"steps": resolve_candidate_steps_from_config(fh.name)})
        except Exception as exc:
            out.append({"error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""


def test_adaptive_table_rules_are_sglangs(sglang_python):
    """specops' check of an adaptive table against SGLang 0.5.23's own loader: whatever SGLang refuses, specops
    refuses; where specops refuses more, the table says why; candidate steps are SGLang's."""
    from operations.model.engines import adaptive

    proc = run_python(sglang_python, ["-c", _ADAPTIVE_BRIDGE], stdin=json.dumps([t for t, _ in ADAPTIVE_TABLES]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for (table, stricter), real_side in zip(ADAPTIVE_TABLES, json.loads(proc.stdout)):
        ours = adaptive.problems(table)
        if "error" in real_side:
            assert ours, (table, real_side)
        elif stricter:
            assert ours, (table, stricter)
        else:
            assert not ours, (table, ours)
            assert list(adaptive.candidate_steps(table)) == real_side["steps"], (table, real_side)
    builtin = run_python(sglang_python, ["-c", "import json; from sglang.srt.speculative.adaptive_spec_params import "
                                         "resolve_candidate_steps_from_config as r; print(json.dumps(r(None)))"])
    assert json.loads(builtin.stdout) == list(adaptive.DEFAULT_STEPS), builtin.stderr[-2000:]
