"""The scheduled-runs admission policy (deploy/components/scheduled-runs/admission-policy.yaml, and the chart's):
its CEL, evaluated with cel-python, admits the claim pod fleetcanary.daemon.claim builds from the rendered config
and refuses what a stolen exporter token would create instead; pods of anyone else are not matched."""
from __future__ import annotations

import copy

import celpy
import pytest

from tests.test_deploy import claim_pod_of, kustomize, one

PATH = "deploy/overlays/scheduled-runs"
EXPORTER = "system:serviceaccount:fleetcanary:fleetcanary"


@pytest.fixture(scope="module")
def rendered():
    docs = kustomize(PATH)
    return one(docs, "ValidatingAdmissionPolicy"), claim_pod_of(docs), docs


def _eval(expression: str, activation: dict):
    env = celpy.Environment()
    try:
        result = env.program(env.compile(expression)).evaluate(activation)
    except celpy.CELEvalError as e:  # an error is a refusal: the policy's failurePolicy is Fail
        return e
    return result


def refusals(policy: dict, pod: dict, user: str = EXPORTER, operation: str = "CREATE") -> list[str] | None:
    """None when the policy does not match the request; else the messages of the validations that fail."""
    namespace = pod["metadata"]["namespace"]
    request = {"operation": operation, "namespace": namespace, "userInfo": {"username": user}}
    activation = {"object": celpy.json_to_cel(pod), "request": celpy.json_to_cel(request)}
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert any("pods" in r["resources"] and operation in r["operations"] for r in rules)
    if not all(_true(_eval(c["expression"], activation)) for c in policy["spec"].get("matchConditions", [])):
        return None
    return [v["message"] for v in policy["spec"]["validations"] if not _true(_eval(v["expression"], activation))]


def _true(result) -> bool:
    return isinstance(result, celpy.celtypes.BoolType) and bool(result)


def test_the_policy_is_bound_and_denies(rendered):
    policy, _, docs = rendered
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_the_claim_pod_the_exporter_builds_is_admitted(rendered):
    policy, pod, _ = rendered
    assert refusals(policy, pod) == []


def privileged(p):
    p["spec"]["containers"][0]["securityContext"]["privileged"] = True


def node_root(p):
    p["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    p["spec"]["containers"][0]["volumeMounts"].append({"name": "root", "mountPath": "/host"})


def affinity(key):
    def change(p):
        terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        if key == "two-nodes":
            terms["nodeSelectorTerms"][0]["matchFields"][0]["values"].append("gpu-b")
        elif key == "none":
            del p["spec"]["affinity"]
        else:
            terms["nodeSelectorTerms"].append({"matchExpressions": [{"key": "x", "operator": "Exists"}]})
    return change


BAD = {
    "privileged": privileged,
    "hostNetwork": lambda p: p["spec"].update(hostNetwork=True),
    "hostPID": lambda p: p["spec"].update(hostPID=True),
    "a hostPath of the node's root": node_root,
    "a secret volume": lambda p: p["spec"]["volumes"].append({"name": "s",
                                                              "secret": {"secretName": "fleetcanary-fabric"}}),
    "another image": lambda p: p["spec"]["containers"][0].update(image="docker.io/library/busybox:1.36"),
    "a shell command": lambda p: p["spec"]["containers"][0].update(command=["sh", "-c", "cat /etc/shadow"]),
    "other args": lambda p: p["spec"]["containers"][0].update(args=["run", "--config", "/x"]),
    "a second container": lambda p: p["spec"]["containers"].append(copy.deepcopy(p["spec"]["containers"][0])),
    "an init container": lambda p: p["spec"].update(initContainers=[copy.deepcopy(p["spec"]["containers"][0])]),
    "root": lambda p: p["spec"]["securityContext"].update(runAsUser=0, runAsNonRoot=False),
    "a capability": lambda p: p["spec"]["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
    "privilege escalation": lambda p: p["spec"]["containers"][0]["securityContext"].update(
        allowPrivilegeEscalation=True),
    "a writable root": lambda p: p["spec"]["containers"][0]["securityContext"].update(readOnlyRootFilesystem=False),
    "the exporter's service account": lambda p: p["spec"].update(serviceAccountName="fleetcanary"),
    "a mounted token": lambda p: p["spec"].update(automountServiceAccountToken=True),
    "any node": affinity("none"),
    "two nodes": affinity("two-nodes"),
    "a second node term": affinity("term"),
    "a node name": lambda p: p["spec"].update(nodeName="gpu-b"),
    "the DaemonSet's label": lambda p: p["metadata"]["labels"].update({"app.kubernetes.io/name": "fleetcanary"}),
    "a controller reference": lambda p: p["metadata"]["ownerReferences"][0].update(controller=True),
    "another name": lambda p: p["metadata"].update(name="miner"),
    "a secret in the environment": lambda p: p["spec"]["containers"][0]["env"].append(
        {"name": "S", "valueFrom": {"secretKeyRef": {"name": "fleetcanary-fabric", "key": "secret"}}}),
    "a host port": lambda p: p["spec"]["containers"][0].update(ports=[{"containerPort": 22, "hostPort": 22}]),
}


@pytest.mark.parametrize("what", list(BAD))
def test_a_pod_the_claim_never_is_refused(rendered, what):
    policy, pod, _ = rendered
    bad = copy.deepcopy(pod)
    BAD[what](bad)
    assert refusals(policy, bad), what


def test_an_update_by_the_exporter_is_refused(rendered):
    policy, pod, _ = rendered
    assert refusals(policy, pod, operation="UPDATE") == ["the exporter only creates claim pods"]


def test_pods_of_anyone_else_are_not_matched(rendered):
    policy, pod, _ = rendered
    bad = copy.deepcopy(pod)
    privileged(bad)
    assert refusals(policy, bad, user="system:serviceaccount:kube-system:daemon-set-controller") is None
    assert refusals(policy, bad, user="system:serviceaccount:other:fleetcanary") is None  # not this namespace's
