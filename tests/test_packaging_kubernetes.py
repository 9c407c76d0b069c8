"""The Helm chart and the manifests rendered from it: linted and rendered by Helm's own engine, validated
against Kubernetes' schemas, the config against tpuwatch's own parser, the rules with promtool."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tpuwatch import config as config_module

from conftest import require_tool

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("tpuwatch_kubernetes_render", REPO / "packaging/kubernetes/render.py")
assert _spec and _spec.loader
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

CHART = REPO / "packaging/kubernetes/chart/tpuwatch"
KUBERNETES_VERSION = "1.30.0"
# BENCHMARKS.md: tpuwatch's resident memory is about 38 MiB with 8 simulated chips.
MEASURED_RSS_BYTES = 38 * 2**20
CORE_KINDS = {"ConfigMap", "DaemonSet", "Service"}
POOL_BACKENDS = {None: "auto", "values-tpu.yaml": "tpu", "values-gpu.yaml": "nvidia"}
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def _require_module(name: str) -> ModuleType:
    """Import a test-only package; skip without it, except in CI where it fails."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("TPUWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{name} is required in CI (pip install -e '.[test]')")
        pytest.skip(f"{name} not installed")


def _bytes(quantity: str) -> int:
    number = quantity.rstrip("KMGi")
    return int(number) * UNITS.get(quantity[len(number):], 1)


def _documents(values_file: str | None, extra: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    _require_module("helm_python")
    values = {**render.pool_values(values_file), **(extra or {})}
    docs = [doc for doc in yaml.safe_load_all(render.render(values)) if doc]
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs), "one object of each kind"
    return by_kind


def _container(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (container,) = docs["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    return container


def _host_mounts(docs: dict[str, dict[str, Any]]) -> dict[str, tuple[str, bool]]:
    """mountPath -> (host path, read-only) for every hostPath volume the container mounts."""
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    return {m["mountPath"]: (host_paths[m["name"]], m.get("readOnly", False))
            for m in _container(docs)["volumeMounts"] if m["name"] in host_paths}


def test_chart_lints_without_warnings() -> None:
    helm = _require_module("helm_python")
    report = helm.lint(render.CHART, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values_file", list(POOL_BACKENDS))
def test_core_objects_valid_against_kubernetes_schemas(values_file: str | None) -> None:
    validate = _require_module("kubernetes_validate")
    docs = _documents(values_file)
    assert set(docs) == CORE_KINDS | {"ServiceMonitor", "PrometheusRule"}
    for kind in CORE_KINDS:
        validate.validate(docs[kind], KUBERNETES_VERSION, strict=True)


def test_unprivileged_container_keeps_only_syslog() -> None:
    validate = _require_module("kubernetes_validate")
    docs = _documents(None, {"privileged": False})
    validate.validate(docs["DaemonSet"], KUBERNETES_VERSION, strict=True)
    assert _container(docs)["securityContext"] == {
        "privileged": False, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["SYSLOG"]}}


def test_schema_validation_catches_a_broken_object() -> None:
    validate = _require_module("kubernetes_validate")
    daemonset = _documents(None)["DaemonSet"]
    _container({"DaemonSet": daemonset})["ports"][0]["containerPort"] = "metrics-port"
    with pytest.raises(validate.ValidationError):
        validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("values_file", list(POOL_BACKENDS))
def test_config_is_valid_and_reads_the_host_through_read_only_mounts(values_file: str | None) -> None:
    docs = _documents(values_file)
    config = config_module.parse(docs["ConfigMap"]["data"]["config.yaml"], "ConfigMap")
    assert config.devices.backend == POOL_BACKENDS[values_file]
    assert config.listen == f"0.0.0.0:{_container(docs)['ports'][0]['containerPort']}"
    mounts = _host_mounts(docs)
    assert mounts[config.paths.sysfs] == ("/sys", True)
    assert mounts[config.paths.procfs] == ("/proc", True)
    assert mounts[config.paths.dev] == ("/dev", True)  # /dev/kmsg is read as paths.dev + /kmsg
    assert mounts[config.state_dir] == ("/var/lib/tpuwatch", False)
    assert config.host.pod_resources_socket is not None  # the chips' pods and containers come from the kubelet
    assert mounts[os.path.dirname(config.host.pod_resources_socket)] == ("/var/lib/kubelet/pod-resources", True)
    config_mount = next(m for m in _container(docs)["volumeMounts"] if m["name"] == "config")
    assert _container(docs)["args"] == ["run", "--config", f"{config_mount['mountPath']}/config.yaml"]


def test_resources_cover_the_measured_footprint() -> None:
    resources = _container(_documents(None))["resources"]
    assert MEASURED_RSS_BYTES < _bytes(resources["requests"]["memory"]) <= _bytes(resources["limits"]["memory"])
    assert resources["requests"]["cpu"] and resources["limits"]["cpu"]


def test_pools_schedule_on_their_nodes() -> None:
    tpu, gpu = (_documents(f)["DaemonSet"]["spec"]["template"]["spec"] for f in ("values-tpu.yaml", "values-gpu.yaml"))
    assert tpu["hostNetwork"] is True  # libtpu's metric service listens on the node's localhost
    ours = {f"tpuwatch.io/{c}" for c in ("AcceleratorHardwareProblem", "AcceleratorComputeProblem",
                                          "AcceleratorMemoryProblem", "AcceleratorProgressProblem")}
    assert {t["key"] for t in tpu["tolerations"]} == {"google.com/tpu"} | ours  # it keeps watching tainted nodes
    assert gpu["runtimeClassName"] == "nvidia" and {t["key"] for t in gpu["tolerations"]} == {"nvidia.com/gpu"} | ours
    env = {e["name"]: e.get("value") for e in gpu["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_service_and_servicemonitor_reach_the_pods() -> None:
    docs = _documents(None)
    pod_labels = docs["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    service, monitor = docs["Service"], docs["ServiceMonitor"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {p["name"] for p in service["spec"]["ports"]} == {e["port"] for e in monitor["spec"]["endpoints"]}
    assert service["spec"]["ports"][0]["targetPort"] == _container(docs)["ports"][0]["name"]


SHIPPED_RULES = sorted((REPO / "alerts").glob("*.rules.yml"))


def test_the_charts_rules_are_the_repositorys() -> None:
    chart_rules = sorted((CHART / "rules").glob("*.rules.yml"))
    assert [p.name for p in chart_rules] == [p.name for p in SHIPPED_RULES]
    for ours, shipped in zip(chart_rules, SHIPPED_RULES):
        assert ours.read_text() == shipped.read_text(), f"copy {shipped} to {ours}"


@pytest.mark.parametrize("rules_file", [None, *SHIPPED_RULES], ids=lambda p: p.name if p else "default")
def test_prometheusrule_carries_rules_promtool_accepts(rules_file: Path | None, tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    if rules_file is None:  # the default: every shipped file's groups
        groups = [g for path in SHIPPED_RULES for g in yaml.safe_load(path.read_text())["groups"]]
        rule = _documents(None)["PrometheusRule"]
    else:
        groups = yaml.safe_load(rules_file.read_text())["groups"]
        rule = _documents(None, {"prometheusRule": {"enabled": True, "groups": groups}})["PrometheusRule"]
    assert rule["spec"]["groups"] == groups
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheusrule_runbook_links_follow_runbook_base_url() -> None:
    base = "https://wiki.example/ops/tpuwatch/"
    rule = _documents(None, {"prometheusRule": {"enabled": True, "runbookBaseUrl": base}})["PrometheusRule"]
    links = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert links and all(link.startswith(base) for link in links), links
    assert f"{base}alerting.md#acceleratorlost" in links


def test_plain_manifests_are_the_charts_rendering() -> None:
    _require_module("helm_python")
    assert render.main(["--check"]) == 0


KUBERNETES_ON = {"config": {"kubernetes": {"node_conditions": True}}}
REMEDIATION_ON = {"config": {"kubernetes": {"node_conditions": True, "remediation": [
    {"trigger": "AcceleratorHardwareProblem", "actions": [{"type": "taint"}]}]}}}
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}


def _rules(doc: dict[str, Any]) -> dict[str, set[str]]:
    return {f"{g or 'core'}/{r}": set(rule["verbs"]) for rule in doc["rules"]
            for g in rule["apiGroups"] for r in rule["resources"]}


def test_kubernetes_access_is_off_by_default() -> None:
    docs = _documents(None)
    assert not set(docs) & (RBAC_KINDS | {"Role", "RoleBinding", "ValidatingAdmissionPolicy"})
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    config = config_module.parse(docs["ConfigMap"]["data"]["config.yaml"], "ConfigMap")
    assert config.kubernetes.node_conditions is False and config.kubernetes.remediation == []


def test_node_conditions_get_least_privilege_rbac_and_the_downward_api() -> None:
    validate = _require_module("kubernetes_validate")
    docs = _documents(None, KUBERNETES_ON)
    assert RBAC_KINDS <= set(docs) and "Role" not in docs  # no Leases without remediation
    for kind in (*RBAC_KINDS, "DaemonSet"):
        validate.validate(docs[kind], KUBERNETES_VERSION, strict=True)
    assert _rules(docs["ClusterRole"]) == {"core/nodes": {"get"}, "core/nodes/status": {"patch"}}
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    account = docs["ServiceAccount"]["metadata"]["name"]
    assert pod["serviceAccountName"] == account and pod["automountServiceAccountToken"] is True
    subject = docs["ClusterRoleBinding"]["subjects"][0]
    assert (subject["name"], subject["namespace"]) == (account, render.NAMESPACE)
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"] == "spec.nodeName" and env["POD_NAMESPACE"] == "metadata.namespace"
    config = config_module.parse(docs["ConfigMap"]["data"]["config.yaml"], "ConfigMap")
    assert config.kubernetes.node_conditions and config.kubernetes.node_name is None  # $NODE_NAME


def test_remediation_adds_node_patch_and_leases_in_one_namespace() -> None:
    validate = _require_module("kubernetes_validate")
    docs = _documents(None, REMEDIATION_ON)
    assert _rules(docs["ClusterRole"]) == {"core/nodes": {"get", "list", "patch"}, "core/nodes/status": {"patch"}}
    role = docs["Role"]
    assert role["metadata"]["namespace"] == render.NAMESPACE
    assert _rules(role) == {"coordination.k8s.io/leases": {"get", "list", "create", "update"}}
    for kind in ("Role", "RoleBinding"):
        validate.validate(docs[kind], KUBERNETES_VERSION, strict=True)
    config = config_module.parse(docs["ConfigMap"]["data"]["config.yaml"], "ConfigMap")
    assert config.kubernetes.remediation[0].actions[0].type == "taint"


def test_own_node_policy_checks_the_tokens_node_name() -> None:
    validate = _require_module("kubernetes_validate")
    docs = _documents(None, {**REMEDIATION_ON, "rbac": {"create": True, "ownNodePolicy": True}})
    policy, binding = docs["ValidatingAdmissionPolicy"], docs["ValidatingAdmissionPolicyBinding"]
    for doc in (policy, binding):
        validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    account = f"system:serviceaccount:{render.NAMESPACE}:{docs['ServiceAccount']['metadata']['name']}"
    assert account in policy["spec"]["matchConditions"][0]["expression"]
    assert "authentication.kubernetes.io/node-name" in policy["spec"]["validations"][0]["expression"]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes", "nodes/status"]
