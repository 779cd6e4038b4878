"""A simulated GPU cluster on one machine: K hosts, each a network namespace behind a bridge, with its own PID and
mount namespaces, its own simulated GPUs and OpenSSH's sshd (key auth on port 22, like real nodes).

    cluster = SimCluster.up(Path("/tmp/c"), hosts=3, gpus=4)   # needs root, ip, unshare, nsenter, sshd
    ...  pyinfra inventory/cluster_sim.py deploy.py  (SPECOPS_CLUSTER=/tmp/c/cluster.json)
    cluster.down()

Layout under DIR: ``cluster.json`` (what inventory/cluster_sim.py reads, and every PID ``down`` stops),
``ssh/`` (client key, authorized_keys, known_hosts), ``hosts/hN/`` (host N's simulator root: ledger, bin, lib,
servers, timeline.jsonl, sshd.log) and ``node/``, the mount point where every host sees its own ``hosts/hN``.

Addresses: a free private /24 (10.77.X.0/24), the bridge takes .1 and host N takes .(10+N); nothing is
addressed outside the links created here. Teardown (``down``, also after a failed ``up``) SIGKILLs each host's
namespace init by PID (checked against its /proc start time), which ends every process in that host's PID
namespace, then deletes the namespaces and the bridge.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import ledger
from .hostenv import host_python, own_home
from .tools import STANDARD_PATH, host_data, install_tools

SSH_PORT = 22
NEEDS = ("ip", "unshare", "nsenter", "ssh-keygen")
SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/bin/sshd")


class ClusterError(RuntimeError):
    """The cluster could not be brought up (what is missing or what failed, and how to fix it)."""


@dataclass
class Node:
    index: int
    address: str
    netns: str
    veth: str
    root: str  # this host's simulator directory on the machine (seen as the cluster's node/ inside the host)
    pid: int | None = None  # the `unshare` parent, our child; its death ends the host's PID namespace
    start: int | None = None  # its /proc start time, so a recycled PID is never signalled

    @property
    def name(self) -> str:
        return self.address


@dataclass
class SimCluster:
    directory: str
    tag: str
    subnet: str  # e.g. "10.77.3" (the /24's first three octets)
    bridge: str
    gpus: int
    nodes: list[Node] = field(default_factory=list)

    # --- paths -------------------------------------------------------------------------------------
    @property
    def node_root(self) -> str:
        """The path at which every host sees its own simulator directory."""
        return os.path.join(self.directory, "node")

    @property
    def host_python(self) -> str:
        """The hosts' interpreter for specops's host programs: this Python with pynvml and nothing else, as a
        GPU host's (not the controller's venv, whose editable installs cost every interpreter start ~15 ms)."""
        return os.path.join(self.directory, "hostpy", "bin", "python")

    @property
    def ssh_dir(self) -> str:
        return os.path.join(self.directory, "ssh")

    def save(self) -> None:
        path = Path(self.directory, "cluster.json")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**asdict(self), "hosts": self.inventory_hosts()}, indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, directory) -> "SimCluster":
        doc = json.loads(Path(directory, "cluster.json").read_text())
        doc.pop("hosts", None)
        return cls(**{**doc, "nodes": [Node(**n) for n in doc["nodes"]]})

    # --- bring up -----------------------------------------------------------------------------------
    @classmethod
    def up(cls, directory: Path, hosts: int = 3, gpus: int = 4, *, release_delay_s: float = 0.5,
           server_start_s: float = 1.0, subnet: str | None = None, ready_s: float = 30.0) -> "SimCluster":
        sshd = _preflight()
        directory = Path(directory).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        tag = _free_tag()
        subnet = subnet or _free_subnet()
        cluster = cls(str(directory), tag, subnet, f"sobr{tag}", gpus)
        try:
            cluster._build(hosts, sshd, release_delay_s, server_start_s, ready_s)
        except BaseException:
            cluster.down()
            raise
        return cluster

    def _build(self, hosts, sshd, release_delay_s, server_start_s, ready_s) -> None:
        Path(self.node_root).mkdir(exist_ok=True)
        self._keys()
        _ip("link", "add", self.bridge, "type", "bridge")
        self.save()  # from here on, down() knows what to remove
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        lib = self._nvml_lib()
        host_python(Path(self.host_python).parent.parent)
        for i in range(hosts):
            node = Node(i, f"{self.subnet}.{10 + i}", f"specops-{self.tag}-{i}", f"so{self.tag}v{i}",
                        os.path.join(self.directory, "hosts", f"h{i}"))
            self.nodes.append(node)
            self._host_files(node, lib, release_delay_s, server_start_s)
            self._network(node)
            self.save()
            self._start(node, sshd)
            self.save()
        known = []
        for node in self.nodes:
            self._await_sshd(node, ready_s)
            key = Path(node.root, "ssh", "ssh_host_ed25519_key.pub").read_text().split()[:2]
            known.append(f"{node.address} {' '.join(key)}")
        Path(self.ssh_dir, "known_hosts").write_text("\n".join(known) + "\n")

    def _keys(self) -> None:
        ssh = Path(self.ssh_dir)
        ssh.mkdir(mode=0o700, exist_ok=True)
        key = ssh / "id_ed25519"
        if not key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "specops-sim-cluster", "-f", str(key)])
        shutil.copyfile(f"{key}.pub", ssh / "authorized_keys")
        (ssh / "authorized_keys").chmod(0o600)

    def _nvml_lib(self) -> Path:
        from .nvml_build import build_nvml  # built once, copied to every host
        lib = Path(self.directory, "lib")
        build_nvml(lib)
        return lib

    def _host_files(self, node: Node, lib: Path, release_delay_s: float, server_start_s: float) -> None:
        root = Path(node.root)
        ledger.init_host(root, self.gpus, release_delay_s=release_delay_s)
        host = ledger.load_host(root)
        ledger.save_host(root, {**host, "server_start_s": server_start_s})
        install_tools(root, nvml=False, seen_as=Path(self.node_root))
        shutil.copytree(lib, root / "lib", dirs_exist_ok=True)
        own_home(root, Path(self.node_root, "home"))
        ssh = root / "ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        if not (ssh / "ssh_host_ed25519_key").exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "ssh_host_ed25519_key")])
        (ssh / "sshd_config").write_text(SSHD_CONFIG.format(
            address=node.address, port=SSH_PORT, host_key=ssh / "ssh_host_ed25519_key",
            authorized_keys=Path(self.ssh_dir, "authorized_keys")))

    def _network(self, node: Node) -> None:
        _ip("netns", "add", node.netns)
        _ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
        _ip("link", "set", node.veth, "master", self.bridge, "up")
        _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        _ip("-n", node.netns, "link", "set", "eth0", "up")
        _ip("-n", node.netns, "link", "set", "lo", "up")

    def _start(self, node: Node, sshd: str) -> None:
        argv = ["ip", "netns", "exec", node.netns,
                "unshare", "--pid", "--mount", "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
                sys.executable, "-m", "gpusim.nsinit", "--bind", node.root, self.node_root,
                "--bind", os.path.join(node.root, "etc", "passwd"), "/etc/passwd",
                "--log", os.path.join(node.root, "sshd.log"),
                "--", sshd, "-D", "-e", "-f", os.path.join(node.root, "ssh", "sshd_config")]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(node.root, "init.log"), "ab"), env=env,
                                start_new_session=True)
        node.pid, node.start = proc.pid, ledger.proc_start_time(proc.pid)

    def _await_sshd(self, node: Node, ready_s: float) -> None:
        end = time.monotonic() + ready_s
        while time.monotonic() < end:
            if not self._alive(node):
                raise ClusterError(f"host {node.address}: its namespace init exited; "
                                   f"{_tail(node.root, 'init.log')} {_tail(node.root, 'sshd.log')}")
            with contextlib.suppress(OSError), socket.create_connection((node.address, SSH_PORT), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
            time.sleep(0.05)
        raise ClusterError(f"host {node.address}: sshd not answering after {ready_s}s; {_tail(node.root, 'sshd.log')}")

    # --- the hosts, from outside ---------------------------------------------------------------------------
    def _alive(self, node: Node) -> bool:
        return node.pid is not None and ledger.proc_start_time(node.pid) == node.start

    def init_pid(self, i: int) -> int:
        """Outer PID of host ``i``'s PID 1 (the namespace init)."""
        node = self.nodes[i]
        children = Path(f"/proc/{node.pid}/task/{node.pid}/children").read_text().split()
        if not children:
            raise ClusterError(f"host {node.address} has no running init")
        return int(children[0])

    def exec(self, i: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` inside host ``i`` (its network, mount and PID namespaces)."""
        base = ["nsenter", "-t", str(self.init_pid(i)), "-n", "-m", "-p", "--"]
        return subprocess.run(base + argv, capture_output=True, text=True, **kwargs)

    def processes(self, i: int) -> dict[int, tuple[int, str]]:
        """Host ``i``'s processes: outer PID -> (PID inside the host, command line)."""
        init = self.init_pid(i)
        ns = os.readlink(f"/proc/{init}/ns/pid")
        out = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/ns/pid") != ns:
                    continue
                status = Path(f"/proc/{pid}/status").read_text()
                inner = int(next(l for l in status.splitlines() if l.startswith("NSpid:")).split()[-1])
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out[int(pid)] = (inner, cmd.strip())
        return out

    def kill(self, i: int, inner_pid: int, sig: int = signal.SIGKILL) -> None:
        """Signal the process that host ``i`` knows as ``inner_pid``."""
        outer = [o for o, (inner, _) in self.processes(i).items() if inner == inner_pid]
        if not outer:
            raise ProcessLookupError(f"no pid {inner_pid} on host {self.nodes[i].address}")
        os.kill(outer[0], sig)

    def stop_sshd(self, i: int) -> list[int]:
        """An sshd outage on host ``i``: SIGKILL its sshd listener and every SSH session (the host's other
        processes keep running). Returns the outer PIDs signalled."""
        victims = [o for o, (_, cmd) in self.processes(i).items() if cmd.split(" ")[0].rsplit("/", 1)[-1] == "sshd"
                   or cmd.startswith("sshd:")]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return victims

    def server_state(self, i: int, server: str = "llm") -> dict:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(Path(self.nodes[i].root, "servers", server, "state.json").read_text())
        return {}

    def timeline(self, i: int) -> list[dict]:
        """The stand-in server's events on host ``i`` (launch, ready, term, exit), oldest first."""
        path = Path(self.nodes[i].root, "timeline.jsonl")
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines if line.strip()]

    def configure(self, **settings) -> None:
        """Update every host's simulator settings (server_start_s, release_delay_s, accept_length, ...)."""
        for node in self.nodes:
            host = json.loads(Path(node.root, "host.json").read_text())
            ledger.save_host(node.root, {**host, **settings})

    def inventory_hosts(self) -> list[list]:
        """(name, host data) for each host, as inventory/cluster_sim.py passes them to pyinfra."""
        data = {
            "ssh_user": "root", "ssh_port": SSH_PORT, "ssh_key": os.path.join(self.ssh_dir, "id_ed25519"),
            "ssh_known_hosts_file": os.path.join(self.ssh_dir, "known_hosts"),
            "ssh_strict_host_key_checking": "yes", "ssh_look_for_keys": False, "ssh_allow_agent": False,
            **host_data(self.node_root, path=STANDARD_PATH),  # the simulated GPUs, SGLang, device files (tools.py)
            "specops_python": self.host_python,
            "gpu_count": self.gpus,
        }
        return [[n.address, dict(data)] for n in self.nodes]

    # --- tear down -----------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Stop every host (by PID) and remove the namespaces and the bridge; returns what it could not do."""
        problems = []
        for node in self.nodes:
            if self._alive(node):
                inside = {}
                with contextlib.suppress(OSError, ClusterError):
                    inside = {pid: ledger.proc_start_time(pid) for pid in self.processes(node.index)}
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGKILL)  # --kill-child: the host's init, so its PID namespace, dies
                _reap(node.pid)
                left = _await_gone(inside)
                if left:
                    problems.append(f"host {node.address}: pids {left} still running")
            if _ip_ok("netns", "del", node.netns) is False and _netns_exists(node.netns):
                problems.append(f"netns {node.netns} not removed")
        if _link_exists(self.bridge) and _ip_ok("link", "del", self.bridge) is False:
            problems.append(f"bridge {self.bridge} not removed")
        with contextlib.suppress(OSError):
            Path(self.directory, "cluster.json").unlink()
        return problems


SSHD_CONFIG = """# sshd of one simulated cluster host (written by gpusim.cluster)
ListenAddress {address}
Port {port}
HostKey {host_key}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
LogLevel VERBOSE
MaxStartups 200
MaxSessions 200
Subsystem sftp internal-sftp
"""


def _preflight() -> str:
    if os.geteuid() != 0:
        raise ClusterError("the simulated cluster needs root (network and PID namespaces, a bridge)")
    missing = [tool for tool in NEEDS if shutil.which(tool) is None]
    sshd = next((p for p in SSHD_CANDIDATES if os.access(p, os.X_OK)), None)
    if sshd is None:
        missing.append("sshd (apt-get install -y openssh-server)")
    if missing:
        raise ClusterError(f"missing: {', '.join(missing)} (iproute2, util-linux, openssh-server)")
    return sshd


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        raise ClusterError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


_SEQ = itertools.count()


def _free_tag() -> str:
    """Four digits naming this cluster's links and namespaces: from the pid, and never one whose links still
    exist (a cluster just taken down: the kernel destroys a dead namespace's veth peers asynchronously)."""
    for _ in range(10000):
        tag = f"{(os.getpid() + 389 * next(_SEQ)) % 10000:04d}"
        if not any(n.startswith((f"sobr{tag}", f"so{tag}v")) for n in os.listdir("/sys/class/net")):
            return tag
    raise ClusterError("no free cluster tag: too many simulated clusters' links exist")


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def _ip_ok(*args: str) -> bool:
    return subprocess.run(["ip", *args], capture_output=True).returncode == 0


def _netns_exists(name: str) -> bool:
    return name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


def _link_exists(name: str) -> bool:
    return _ip_ok("link", "show", name)


def _free_subnet(base: str = "10.77") -> str:
    """The first 10.77.X.0/24 with no address and no route on this machine."""
    used = _run(["ip", "-o", "-4", "addr"]) + _run(["ip", "-4", "route"])
    for x in range(256):
        if f" {base}.{x}." not in used and f"\n{base}.{x}." not in "\n" + used:
            return f"{base}.{x}"
    raise ClusterError(f"no free /24 under {base}.0.0/16")


def _reap(pid: int, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (down() from another process): watch /proc instead
            if not os.path.exists(f"/proc/{pid}"):
                return
            done = 0
        if done:
            return
        time.sleep(0.02)


def _await_gone(pids: dict[int, int | None], timeout_s: float = 10.0) -> list[int]:
    """Wait until these processes (pid -> start time) are gone; the ones still there after the timeout."""
    end = time.monotonic() + timeout_s
    while True:
        left = [p for p, start in pids.items() if start is not None and ledger.proc_start_time(p) == start]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.02)


def _tail(root: str, leaf: str, n: int = 5) -> str:
    path = Path(root, leaf)
    lines = path.read_text(errors="replace").splitlines()[-n:] if path.exists() else []
    return f"{leaf}: " + (" | ".join(lines) if lines else "(empty)")
