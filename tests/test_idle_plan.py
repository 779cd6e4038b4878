"""Planning gpu.idle: who may be stopped, what is protected, when GPUs count as idle."""
from operations.model.gpus import GroupMember
from operations.model.idle_plan import Selection, is_idle, plan_idle

from factories import proc, state


def test_idle_when_no_process_and_under_threshold():
    assert is_idle(state((0, 4)), Selection())
    assert not is_idle(state((0, 300)), Selection())  # 300 MiB with no process: driver still releasing
    assert is_idle(state((0, 300)), Selection(threshold_mib=512))


def test_plan_targets_own_processes_with_group_and_mib():
    s = state((70000, 70000), proc(10, 0, 70000), proc(10, 1, 70000))
    plan = plan_idle(s, Selection())
    assert not plan.idle
    (t,) = plan.targets
    assert (t.pid, t.gpus, t.mib, t.pgid, t.spec) == (10, (0, 1), 140000, 10, "10:100:10")
    assert "stop pid 10 (process group 10), user root, GPU 0,1, 140000 MiB" in plan.describe()[0]


def test_protected_daemon_is_left_and_its_memory_tolerated():
    s = state((500, 0), proc(5, 0, 500, name="nvidia-persistenced", cmdline="/usr/bin/nvidia-persistenced"))
    plan = plan_idle(s, Selection())
    assert plan.idle and plan.targets == () and [p.pid for p in plan.protected] == [5]
    assert plan.held_mib == {0: 0, 1: 0}


def test_extra_protected_pattern_matches_cmdline_basename():
    s = state((900,), proc(6, 0, 900, name="python3", cmdline="/opt/mon/bin/gpu-monitor --port 9400"))
    assert plan_idle(s, Selection()).targets
    assert plan_idle(s, Selection(protected=("gpu-mon*",))).idle
    dcgm = state((900,), proc(6, 0, 900, name="python3", cmdline="/opt/dcgm/bin/dcgm-exporter --port 9400"))
    assert plan_idle(dcgm, Selection()).idle  # protected by default


def test_other_users_process_is_refused_not_targeted():
    s = state((1000, 2000), proc(7, 0, 1000, user="alice", uid=1000), proc(8, 1, 2000))
    plan = plan_idle(s, Selection())
    assert [t.pid for t in plan.targets] == [8]
    assert [(p.pid, why) for p, why in plan.foreign] == [(7, "user alice not in users=['root']")]
    assert plan_idle(s, Selection(users=("root", "al*"))).foreign == ()


def test_restricting_gpus_ignores_other_gpus():
    s = state((1000, 2000), proc(7, 0, 1000, user="alice", uid=1000), proc(8, 1, 2000))
    plan = plan_idle(s, Selection(gpus=frozenset({1})))
    assert plan.gpus == (1,) and plan.foreign == () and [t.pid for t in plan.targets] == [8]


def test_name_patterns_restrict_targets():
    s = state((10, 20), proc(1, 0, 10, cmdline="python3 -m sglang.launch_server"), proc(2, 1, 20, cmdline="jupyter"))
    plan = plan_idle(s, Selection(names=("*sglang*",)))
    assert [t.pid for t in plan.targets] == [1]
    assert [p.pid for p, _ in plan.foreign] == [2]


def test_group_signalled_only_when_every_member_is_ours():
    mixed = (GroupMember(20, 0, "python3"), GroupMember(21, 1000, "bash"))
    s = state((10,), proc(20, 0, 10, group=mixed))
    assert plan_idle(s, Selection()).targets[0].pgid == 0  # pid only
    daemon = (GroupMember(20, 0, "python3"), GroupMember(22, 0, "nv-hostengine"))
    assert plan_idle(state((10,), proc(20, 0, 10, group=daemon)), Selection()).targets[0].pgid == 0
    same_session_as_probe = proc(20, 0, 10, sid=1)
    assert plan_idle(state((10,), same_session_as_probe), Selection()).targets[0].pgid == 0
    assert plan_idle(state((10,), proc(20, 0, 10)), Selection()).targets[0].pgid == 20


def test_process_not_visible_here_is_refused_never_targeted():
    plan = plan_idle(state((10,), proc(30, 0, 10, start=None)), Selection())
    assert plan.targets == ()
    ((p, why),) = plan.foreign
    assert p.pid == 30 and "not visible in this PID namespace" in why


def test_pid_without_a_gpu_device_is_refused():
    """A container without the host PID namespace: the driver's pid 1 is this namespace's init."""
    plan = plan_idle(state((70000,), proc(1, 0, 70000, name="init", gpu_fds=False)), Selection())
    assert plan.targets == () and "holds no GPU device open" in plan.foreign[0][1]
    unknown = plan_idle(state((70000,), proc(7, 0, 70000, gpu_fds=None)), Selection())
    assert unknown.targets == () and "cannot confirm" in unknown.foreign[0][1]


def test_protected_name_above_the_cap_is_refused_and_its_memory_counts():
    s = state((100000,), proc(5, 0, 100000, name="nvidia-persistenced"))
    plan = plan_idle(s, Selection())
    assert plan.targets == () and plan.protected == () and not plan.idle
    assert "above protected_max_mib=1024" in plan.foreign[0][1] and plan.held_mib == {0: 100000}
    small = plan_idle(state((300,), proc(5, 0, 300, name="nvidia-persistenced")), Selection())
    assert small.idle and small.protected


def test_unreadable_memory_is_never_idle():
    s = state((0,))
    s = type(s)(s.source, (type(s.gpus[0])(0, "GPU-0", "NVIDIA GB10", None, None, "nvidia-smi reports memory.used "
                                                                            "as [N/A]"),), (), s.probe_uid,
                s.probe_user, s.probe_sid)
    plan = plan_idle(s, Selection())
    assert not plan.idle and plan.unreadable == ((0, "nvidia-smi reports memory.used as [N/A]"),)


def test_na_memory_under_mig():
    s = state((5000,), proc(40, 0, None))
    (t,) = plan_idle(s, Selection()).targets
    assert t.mib is None and "? MiB" in t.describe()


def test_protected_matches_truncated_comm_alone():
    s = state((300,), proc(5, 0, 300, name="nvidia-persiste", cmdline=""))
    assert plan_idle(s, Selection()).idle


def test_group_with_names_only_when_every_member_matches():
    group = (GroupMember(20, 0, "python3"), GroupMember(21, 0, "bench.sh"), GroupMember(22, 0, "tee"))
    s = state((10,), proc(20, 0, 10, cmdline="python3 -m sglang.launch_server", group=group))
    assert plan_idle(s, Selection(names=("*sglang*",))).targets[0].pgid == 0  # bench.sh and tee are not ours
    assert plan_idle(s, Selection()).targets[0].pgid == 20  # no names: the whole job of this user


def test_protected_name_does_not_protect_a_users_job():
    s = state((70000,), proc(8, 0, 70000, user="alice", uid=1000, name="dcgm-exporter"), user="alice")
    plan = plan_idle(s, Selection(users=("alice",)))
    assert not plan.idle and [t.pid for t in plan.targets] == [8]
