"""The Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/) checked on a
rendered pod spec, offline: the controls of the baseline and restricted levels as the pod-security-admission
library defines them (its policy/check_*.go), for the fields fleetcanary's manifests can set. Windows host
processes, AppArmor and SELinux options are not set anywhere here, and are checked only for being absent.

violations(spec, level) lists each broken control as "control: where: what", [] when the spec passes.
"""
from __future__ import annotations

LEVELS = ("privileged", "baseline", "restricted")
BASELINE_CAPS = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                           "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                                "projected", "secret"})
SAFE_SYSCTLS = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                          "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
                          "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                          "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"})


def containers(spec: dict) -> list[tuple[str, dict]]:
    return [(f"{kind}[{c.get('name', i)}]", c) for kind in ("initContainers", "containers", "ephemeralContainers")
            for i, c in enumerate(spec.get(kind) or [])]


def _baseline(spec: dict) -> list[str]:
    out = []
    psc = spec.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            out.append(f"host namespaces: pod: {host}")
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            out.append(f"hostPath volumes: volume {v['name']}: {v['hostPath'].get('path')}")
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctls: pod: {s.get('name')}")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("seccomp: pod: Unconfined")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("host process: pod")
    for where, c in containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"privileged: {where}")
        extra = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPS
        if extra:
            out.append(f"capabilities: {where}: adds {sorted(extra)}")
        ports = [p.get("hostPort") for p in c.get("ports") or [] if p.get("hostPort")]
        if ports:
            out.append(f"host ports: {where}: {ports}")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"/proc mount: {where}: {sc['procMount']}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"seccomp: {where}: Unconfined")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"host process: {where}")
    return out


def _restricted(spec: dict) -> list[str]:
    out = []
    psc = spec.get("securityContext") or {}
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume types: volume {v['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_nonroot = psc.get("runAsNonRoot") is True
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    if psc.get("runAsUser") == 0:
        out.append("running as non-root user: pod: runAsUser 0")
    for where, c in containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"privilege escalation: {where}: allowPrivilegeEscalation is not false")
        nonroot = sc.get("runAsNonRoot")
        if nonroot is False or (nonroot is None and not pod_nonroot):
            out.append(f"running as non-root: {where}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            out.append(f"running as non-root user: {where}: runAsUser 0")
        cs = (sc.get("seccompProfile") or {}).get("type")
        if not (cs in ("RuntimeDefault", "Localhost") or (cs is None and pod_seccomp)):
            out.append(f"seccomp: {where}: not RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"capabilities: {where}: does not drop ALL")
        extra = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if extra:
            out.append(f"capabilities: {where}: adds {sorted(extra)} (restricted allows NET_BIND_SERVICE only)")
    return out


def violations(spec: dict, level: str) -> list[str]:
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r}")
    if level == "privileged":
        return []
    return _baseline(spec) + (_restricted(spec) if level == "restricted" else [])


def pod_specs(docs: list[dict]) -> list[tuple[str, str, dict]]:
    """(kind/name, namespace, pod spec) of every workload in rendered manifests."""
    out = []
    for d in docs:
        kind, meta = d.get("kind"), d.get("metadata") or {}
        if kind == "Pod":
            out.append((f"Pod/{meta['name']}", meta.get("namespace", ""), d["spec"]))
        elif kind in ("DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job"):
            out.append((f"{kind}/{meta['name']}", meta.get("namespace", ""), d["spec"]["template"]["spec"]))
        elif kind == "CronJob":
            out.append((f"{kind}/{meta['name']}", meta.get("namespace", ""),
                        d["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
    return out
