"""The runbooks' first steps work against deploy/ as shipped: every kubectl and curl command of docs/runbooks.md is
checked against the rendered manifests (namespace, pod labels, ports, the config file's mount, what the container
has) and against the exporter itself (its HTTP paths, its command line)."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from fleetcanary.cli import build_parser
from fleetcanary.probes import PROBES
from tests.test_deploy import kustomize, one

ROOT = Path(__file__).resolve().parent.parent
RUNBOOKS = (ROOT / "docs" / "runbooks.md").read_text()
PATHS = set(re.findall(r'path [!=]= "(/[a-z]*)"', (ROOT / "exporter/daemon/http.py").read_text()))


def commands() -> list[str]:
    """Every kubectl and curl command: inline spans and the lines of sh blocks (comments dropped)."""
    spans = re.findall(r"`([^`\n]+)`", RUNBOOKS)
    blocks = [ln.split("  #", 1)[0].strip() for b in re.findall(r"```sh\n(.*?)```", RUNBOOKS, re.DOTALL)
              for ln in b.splitlines()]
    return [c.rstrip(" &") for c in spans + blocks
            if re.match(r"(POD=\$\()?(kubectl|curl) ", c) and not c.startswith("curl -w")]


def claim_labels() -> dict:
    """The labels of the claim pod the exporter creates (scheduled runs) on the same node."""
    from fleetcanary.core import config as configmod
    from fleetcanary.daemon.claim import claim_pod

    cfg = configmod.settings_model()(kubernetes={"claim": {"enabled": True, "image": "x"}}).kubernetes.claim
    return claim_pod(cfg, "NODE", NAMESPACE_SHIPPED, {"jobs": []}, 8)["metadata"]["labels"]


NAMESPACE_SHIPPED = "fleetcanary"


@pytest.fixture(scope="module")
def shipped():
    docs = kustomize("deploy")
    ds = one(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    config_map = next(d for d in docs if d["kind"] == "ConfigMap"
                      and d["metadata"]["name"].startswith("fleetcanary-config"))
    return {"namespace": one(docs, "Namespace")["metadata"]["name"],
            "labels": ds["spec"]["template"]["metadata"]["labels"],
            "ports": {p["containerPort"] for p in c["ports"]}, "spec": spec, "container": c,
            "config_mounts": {m["mountPath"] for m in c["volumeMounts"]
                              if next(v for v in spec["volumes"] if v["name"] == m["name"]).get("configMap")},
            "config_keys": set(config_map["data"])}


def test_the_runbooks_reach_the_exporter_only_through_what_deploy_ships():
    assert not re.search(r"NODE:\d+", RUNBOOKS), "the pod has no host port: reach it with kubectl port-forward"
    assert "wget" not in RUNBOOKS  # the image has no wget
    assert len(commands()) >= 20


def test_every_kubectl_and_curl_command_matches_the_rendered_manifests(shipped):
    checked = set()
    for cmd in commands():
        if cmd.startswith("POD=$("):
            args = shlex.split(cmd[len("POD=$("):-1])
            label = args[args.index("-l") + 1]
            key, value = label.split("=", 1)
            assert shipped["labels"].get(key) == value, cmd
            assert claim_labels().get(key) != value, f"{cmd} would find the node's claim pod too"
            assert args[args.index("--field-selector") + 1] == "spec.nodeName=NODE", cmd
        else:
            args = shlex.split(cmd.split(" | ")[0])
        if args[0] == "curl":
            url = args[-1]
            m = re.fullmatch(r"localhost:(\d+)(/\w*)(/ID)?", url)
            assert m and int(m.group(1)) in shipped["ports"] and m.group(2) in PATHS, cmd
            if "-X" in args:  # a requested run: POST /confirm with a probe the exporter has
                assert args[args.index("-X") + 1] == "POST" and m.group(2) == "/confirm", cmd
                probe = json.loads(args[args.index("-d") + 1])["probe"]
                assert probe == "NAME" or probe in PROBES, cmd
                checked.add("confirm")
            checked.add("curl")
            continue
        assert args[0] == "kubectl"
        if args[1] == "debug":  # host tools: a debug pod on the node, any image
            assert args[2] == "node/NODE", cmd
            continue
        if args[1] in ("drain", "uncordon"):  # before and after DCGM's stress levels
            assert args[2] == "NODE" and (args[1] == "uncordon" or "--ignore-daemonsets" in args), cmd
            checked.add("drain")
            continue
        assert args[1:3] == ["-n", shipped["namespace"]], cmd
        verb = args[3]
        assert verb in ("get", "logs", "port-forward", "exec"), cmd
        if verb in ("logs", "port-forward", "exec"):
            assert args[4] == "$POD", cmd
        if verb == "port-forward":
            assert int(args[5].split(":")[-1]) in shipped["ports"], cmd
        if verb == "exec":
            prog = args[args.index("--") + 1:]
            if prog[0] == "fleetcanary":
                parsed = build_parser(prog[1]).parse_args(prog[1:])  # a bad option exits here
                assert str(Path(parsed.config).parent) in shipped["config_mounts"], cmd
                assert Path(parsed.config).name in shipped["config_keys"], cmd
                assert all(p == "NAME" or p in PROBES for p in parsed.probe), cmd
            else:
                assert prog[0] == "nvidia-smi", cmd  # what else the image and the NVIDIA runtime give
                env = {e["name"]: e.get("value") for e in shipped["container"]["env"]}
                assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
                assert shipped["spec"]["runtimeClassName"] == "nvidia"
        checked.add(verb)
    assert checked >= {"curl", "confirm", "drain", "exec", "logs", "port-forward", "get"}, checked
