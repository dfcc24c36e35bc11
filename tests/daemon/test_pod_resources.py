"""The kubelet's pod-resources API (fleetcanary.daemon.pod_resources) against a real gRPC server on a unix
socket serving the responses in tests/fixtures/pod_resources: whole GPUs, MIG slices, time-slicing
replicas, none; a socket that accepts and never answers, one that is absent, a server without the
method, and one that answers garbage."""
from __future__ import annotations

import json
import socket
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from fleetcanary.daemon import podresources_pb2 as pb
from fleetcanary.daemon.pod_resources import Client, PodResourcesError, Watcher, gpu_uuid
from fleetcanary.probes.testing.nvml_fake import FACTS_DIR
from harness.poll import wait_for

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pod_resources"
NVML = FACTS_DIR / "h100_8gpu_healthy.json"
UUIDS = [d["uuid"] for d in json.loads(NVML.read_text())["devices"]]


def recorded(name: str) -> pb.ListPodResourcesResponse:
    return json_format.ParseDict(json.loads((FIXTURES / f"{name}.json").read_text()), pb.ListPodResourcesResponse())


class Kubelet:
    """A gRPC server on a unix socket answering List with `response` (bytes of it when `raw`)."""

    def __init__(self, path: Path, response=None, raw: bytes | None = None, methods=("List",)) -> None:
        self.calls = 0

        def handle(request, context):
            self.calls += 1
            return raw if raw is not None else response.SerializeToString()

        handlers = {m: grpc.unary_unary_rpc_method_handler(handle, request_deserializer=pb.ListPodResourcesRequest
                                                           .FromString, response_serializer=lambda b: b)
                    for m in methods}
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister",
                                                                                   handlers),))
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait()


@pytest.fixture
def sock(tmp_path) -> Path:
    return tmp_path / "kubelet.sock"


def serve(sock: Path, name: str) -> Kubelet:
    return Kubelet(sock, recorded(name))


def listed(sock: Path, name: str):
    """One List call against a kubelet serving the recorded response `name`."""
    k = serve(sock, name)
    try:
        return Client(str(sock), timeout_seconds=5).list()
    finally:
        k.stop()


def test_whole_gpus_held_by_pods_are_listed_by_uuid(sock):
    a = listed(sock, "whole_gpus")
    assert a.gpu_uuids == sorted([UUIDS[3], UUIDS[5], UUIDS[6]])
    assert a.mig_uuids == []
    assert a.pods == ["inference/vllm-llama-7b-6d9f8c7b5-x2k4q", "research/train-gpt-0"]   # the RDMA-only pod: no GPU
    assert a.devices[UUIDS[5]].container == "trainer" and a.devices[UUIDS[5]].resource == "nvidia.com/gpu"
    assert "mlx5_4" not in a.devices


def test_mig_slices_are_listed_for_the_worker_to_map_to_their_parent_gpu(sock):
    a = listed(sock, "mig_mixed")
    assert a.gpu_uuids == []
    assert len(a.mig_uuids) == 3 and all(m.startswith("MIG-") for m in a.mig_uuids)
    assert {h.resource for h in a.devices.values()} == {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"}


def test_time_slicing_replicas_name_their_gpu(sock):
    a = listed(sock, "time_slicing")
    assert a.gpu_uuids == [UUIDS[0]] and a.pods == ["notebooks/jupyter-alice", "notebooks/jupyter-bob"]


def test_no_pod_holding_a_device_is_an_empty_allocation(sock):
    k = serve(sock, "none")
    try:
        client = Client(str(sock), timeout_seconds=5)
        a = client.list()
        b = client.list()          # the channel is kept: a second call on it
    finally:
        k.stop()
    assert a.devices == {} and b.devices == {} and k.calls == 2


def test_older_mig_device_ids_name_the_parent_gpu():
    assert gpu_uuid("MIG-GPU-5a7c1e00-3f2b-4c1d-9e8a-0b1c2d3e4f50/1/0") == "GPU-5a7c1e00-3f2b-4c1d-9e8a-0b1c2d3e4f50"
    assert gpu_uuid("GPU-5a7c1e00-3f2b-4c1d-9e8a-0b1c2d3e4f50::7") == "GPU-5a7c1e00-3f2b-4c1d-9e8a-0b1c2d3e4f50"
    assert gpu_uuid("MIG-9f1a2b3c-0d4e-5f60-8172-93a4b5c6d7e8") == ""


def test_an_absent_socket_is_absent_at_once(sock):
    with pytest.raises(PodResourcesError) as e:
        Client(str(sock), timeout_seconds=5).list()
    assert e.value.reason == "absent"


def test_a_socket_that_never_answers_times_out_within_the_deadline(sock):
    """A listener that accepts and never speaks: the call ends at its deadline, not later."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        client = Client(str(sock), timeout_seconds=0.5)
        started = time.monotonic()
        with pytest.raises(PodResourcesError) as e:
            client.list()
        took = time.monotonic() - started
    finally:
        stop.set()
        t.join(timeout=5)
        for c in held:
            c.close()
        listener.close()
    assert e.value.reason == "timeout", e.value
    assert took < 0.5 + 10, took   # bounded by the deadline (generous margin for a busy machine), never a hang


def test_a_kubelet_without_the_method_is_unimplemented(sock):
    k = Kubelet(sock, recorded("none"), methods=("GetAllocatableResources",))
    try:
        with pytest.raises(PodResourcesError) as e:
            Client(str(sock), timeout_seconds=5).list()
    finally:
        k.stop()
    assert e.value.reason == "unimplemented"


def test_garbage_from_the_socket_is_a_bad_response(sock):
    k = Kubelet(sock, raw=b"\xff\xff\xff\xff not a protobuf")
    try:
        with pytest.raises(PodResourcesError) as e:
            Client(str(sock), timeout_seconds=5).list()
    finally:
        k.stop()
    assert e.value.reason == "bad_response", e.value


# --- the daemon: the kubelet's view in the job a probe gets -------------------------------------------------
def daemon(tmp_path, sock: Path, refresh: float = 5.0):
    import yaml

    from fleetcanary.core import config as configmod
    from fleetcanary.daemon.service import Daemon
    from tests.support.helpers import free_port

    cfg = {"state_dir": str(tmp_path / "state"), "server": {"listen_address": f"127.0.0.1:{free_port()}"},
           "kubernetes": {"pod_resources_socket": str(sock), "pod_resources_refresh_seconds": refresh},
           "probes": {"gpu_bandwidth": {"params": {"d2d_bytes": 4 << 20, "host_bytes": 2 << 20, "repeats": 2}}}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return Daemon(configmod.load(p, env={}), config_path=str(p))


def test_a_daemon_with_three_gpus_held_runs_the_invasive_probe_on_the_other_five(tmp_path, sock, monkeypatch):
    """The recorded 8-GPU node (fake NVML in the worker), the kubelet listing 3 of its GPUs held by pods: the
    worker's gate leaves GPUs 3, 5 and 6 alone and measures 0, 1, 2, 4 and 7 (here torch has no CUDA, so the run
    ends there, saying which GPUs it would have measured)."""
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(NVML))
    k = serve(sock, "whole_gpus")
    d = daemon(tmp_path, sock)
    try:
        d.pod_resources.refresh()
        ctx = d.gpu_allocation()
        assert ctx["allocation_source"] == "pod_resources"
        assert sorted(ctx["allocated_gpu_uuids"]) == sorted([UUIDS[3], UUIDS[5], UUIDS[6]])
        out = d.run_probe("gpu_bandwidth")
    finally:
        d.server.stop()
        k.stop()
    assert (out.outcome, out.reason) == ("skipped", "dependency_missing"), out  # past the gate: a CPU torch
    assert ("the gate left GPUs [0, 1, 2, 4, 7] (skipped: {'3': 'gpu_allocated', '5': 'gpu_allocated', "
            "'6': 'gpu_allocated'})") in out.detail


def test_without_the_socket_the_daemon_keeps_the_node_wide_view(tmp_path, sock, monkeypatch):
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(NVML))
    d = daemon(tmp_path, sock)
    try:
        d.pod_resources.refresh()
        assert d.gpu_allocation() is None and d.pod_resources.errors == {"absent": 1}
        out = d.run_probe("gpu_bandwidth")
    finally:
        d.server.stop()
    assert out.reason == "dependency_missing" and "the gate left GPUs [0, 1, 2, 3, 4, 5, 6, 7]" in out.detail


def test_a_view_older_than_three_refreshes_is_dropped_and_a_freed_gpu_is_reported(sock):
    """The watcher on an injected clock: fresh for three refreshes; a pod that ends calls on_change."""
    now = [1000.0]
    changes = []
    k = serve(sock, "whole_gpus")
    try:
        w = Watcher(Client(str(sock), timeout_seconds=5), refresh_seconds=5.0, clock=lambda: now[0],
                    on_change=lambda before, after: changes.append((before, after)))
        w.refresh()
        assert w.context()["allocated_gpu_uuids"] == sorted([UUIDS[3], UUIDS[5], UUIDS[6]])
        now[0] += 15.0
        assert w.context() is not None
        now[0] += 0.1
        assert w.context() is None                       # three refreshes missed: the node-wide check again
    finally:
        k.stop()
    k = serve(sock, "none")                              # the pods ended
    try:
        # the client's channel reconnects to the restarted kubelet on its own time: a refresh before that fails
        # (UNAVAILABLE, logged) and the next one tries again, as the daemon's refresh loop does (once beside two
        # CPU burners)
        wait_for(lambda: (w.refresh(), w.context())[1] is not None, timeout=30,
                 what="a refresh against the restarted kubelet")
    finally:
        k.stop()
        w.client.close()
    assert w.context()["allocated_gpu_uuids"] == []
    assert len(changes) == 2 and changes[0][0] is None and changes[1][1].devices == {}


def test_a_pod_that_ends_queues_the_due_invasive_probes_shortest_first(tmp_path, sock, monkeypatch):
    """Three GPUs held, the invasive probes' last runs skipped for a tenant (or never run): when the kubelet no
    longer lists the pods, the daemon queues one run of each due invasive probe, the cheapest in GPU seconds
    first; a probe that succeeded within its interval is not due."""
    import yaml

    from fleetcanary.core import config as configmod
    from fleetcanary.core.record import RunRecord
    from fleetcanary.daemon.service import Daemon
    from tests.support.helpers import free_port

    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(NVML))
    cfg = {"state_dir": str(tmp_path / "state"), "server": {"listen_address": f"127.0.0.1:{free_port()}"},
           "kubernetes": {"pod_resources_socket": str(sock)},
           "probes": {name: {"enabled": True} for name in ("gpu_bandwidth", "gpu_compute", "gpu_sustained")}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    d = Daemon(configmod.load(p, env={}), config_path=str(p))
    queued: list[tuple[str, float, str]] = []
    monkeypatch.setattr(d.scheduler, "run_once", lambda name, delay, trigger: queued.append((name, delay, trigger))
                        or True)
    now = time.time()
    d.store.apply(RunRecord(probe="gpu_bandwidth", outcome="skipped", reason="gpu_allocated", started_at=now - 5,
                            wall_seconds=1.0))
    d.store.apply(RunRecord(probe="gpu_compute", outcome="success", started_at=now - 5, wall_seconds=1.0,
                            result={"gpu_seconds": {str(g): 1.0 for g in range(8)}}))  # every GPU, just now
    k = serve(sock, "whole_gpus")
    try:
        d.pod_resources.refresh()
        assert queued == []                              # the first view frees nothing
    finally:
        k.stop()
    k = serve(sock, "none")
    try:
        d.pod_resources.refresh()
    finally:
        k.stop()
        d.server.stop()
    entries = d.settings.probe_entries()
    invasive = [n for n, e in entries.items() if e.enabled and d.probe_map[n].exclusive == "gpu"]
    assert {"gpu_bandwidth", "gpu_compute", "gpu_sustained"} <= set(invasive)
    expected = sorted((entries[n].params.expected_gpu_seconds, n) for n in invasive if n != "gpu_compute")
    assert [q[0] for q in queued] == [n for _, n in expected]            # gpu_compute succeeded just now
    assert queued[-1][0] == "gpu_sustained"                              # the 20-second burn last
    assert all(t == "opportunistic" for _, _, t in queued)
    assert [q[1] for q in queued] == sorted(q[1] for q in queued) and len({q[1] for q in queued}) == len(queued)


def test_a_freed_gpu_the_probe_has_not_measured_within_its_interval_makes_it_due(tmp_path, sock, monkeypatch):
    """gpu_compute succeeded just now, on the 5 GPUs the tenants left free: it is not due, but once the pods
    holding GPUs 3, 5 and 6 end, those three have not been measured within its interval, and it is."""
    import yaml

    from fleetcanary.core import config as configmod
    from fleetcanary.core.record import RunRecord
    from fleetcanary.daemon.service import Daemon
    from tests.support.helpers import free_port

    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(NVML))
    cfg = {"state_dir": str(tmp_path / "state"), "server": {"listen_address": f"127.0.0.1:{free_port()}"}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    d = Daemon(configmod.load(p, env={}), config_path=str(p))
    d.server.stop()
    d.store.set_environment({**d.store.node_environment,
                             "gpus": [{"index": i, "uuid": u} for i, u in enumerate(UUIDS)]})
    now = time.time()
    d.store.apply(RunRecord(probe="gpu_compute", outcome="success", started_at=now - 5, wall_seconds=1.0,
                            result={"gpu_seconds": {str(g): 1.0 for g in (0, 1, 2, 4, 7)}}))
    assert "gpu_compute" not in d.due_invasive()
    assert d._gpu_indices([UUIDS[3], UUIDS[5] + "::2", "MIG-unknown"]) == {"3", "5"}
    assert "gpu_compute" in d.due_invasive(freed={"3", "5"})
    assert "gpu_compute" not in d.due_invasive(freed={"1"})  # measured just now
