"""The Kubernetes manifests under deploy/kubernetes: valid against the Kubernetes API's own
schemas (offline, ``kubernetes-validate``), and saying what the CLI really understands:
the command parses, every variable names a setting and loads, the ports, probes,
volumes and resources are the ones the settings and the supervisor use."""

from __future__ import annotations

import copy
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from kascade.cli import build_parser
from kascade.dataflow.control import ControlServer
from kascade.dataflow.ports import free_port
from kascade.dataflow.supervisor import DRAIN_S
from kascade.schemas.settings import Settings, load_settings

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
KUBERNETES = "1.31.0"  # apps.kubernetes.io/pod-index labels pods since 1.28


def manifests() -> dict[str, dict[str, Any]]:
    docs = {}
    for f in sorted(DEPLOY.glob("*.yaml")):
        if f.name != "kustomization.yaml":
            for d in yaml.safe_load_all(f.read_text()):
                docs[d["kind"]] = d
    return docs


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict[str, Any]]:
    return manifests()


@pytest.fixture(scope="module")
def container(k8s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (c,) = k8s["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    return c


def pod_env(k8s: dict[str, dict[str, Any]], ordinal: int) -> dict[str, str]:
    """The environment Kubernetes gives pod ``ordinal``'s container."""
    (c,) = k8s["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    env = dict(k8s["ConfigMap"]["data"])
    for var in c["env"]:
        source = var.get("valueFrom", {})
        if "fieldRef" in source:
            field = source["fieldRef"]["fieldPath"]
            pod = {
                "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal),
                "status.podIP": f"10.0.0.{10 + ordinal}",
            }
            env[var["name"]] = pod[field]
        elif "secretKeyRef" in source:  # the operator's own Secret (kustomization.yaml)
            env[var["name"]] = f"secret-of-{source['secretKeyRef']['key']}"
        else:
            env[var["name"]] = var["value"]
    return env


def setting_exists(variable: str) -> bool:
    """Whether ``KASCADE_A__B`` names the setting ``a.b``."""
    model: type[BaseModel] = Settings
    *groups, leaf = variable.removeprefix("KASCADE_").lower().split("__")
    for g in groups:
        field = model.model_fields.get(g)
        if field is None or not isinstance(field.annotation, type):
            return False
        model = field.annotation
    return leaf in model.model_fields


def settings_of_pod(
    k8s: dict[str, dict[str, Any]], ordinal: int, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    with monkeypatch.context() as m:
        for name, value in pod_env(k8s, ordinal).items():
            m.setenv(name, value)
        return load_settings()


def test_every_manifest_is_valid_against_the_kubernetes_schemas(
    k8s: dict[str, dict[str, Any]],
) -> None:
    assert set(k8s) == {
        "ConfigMap",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "Service",
        "StatefulSet",
        "PodDisruptionBudget",
    }
    for doc in k8s.values():
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_validation_would_catch_a_misspelled_field(k8s: dict[str, dict[str, Any]]) -> None:
    broken = copy.deepcopy(k8s["StatefulSet"])
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_the_kustomization_applies_every_manifest_and_no_secret() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(
        f.name for f in DEPLOY.glob("*.yaml") if f.name != "kustomization.yaml"
    )
    assert "secretGenerator" not in kustomization
    for name in listed:  # the operator's Secret is never overwritten by an apply
        kinds = {d["kind"] for d in yaml.safe_load_all((DEPLOY / name).read_text())}
        assert "Secret" not in kinds, name


def test_the_image_is_pinned_by_digest(container: dict[str, Any]) -> None:
    (image,) = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["images"]
    assert image["name"] == container["image"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", image["digest"])
    assert ":" not in container["image"]  # no tag that could move


def test_the_pod_meets_pod_security_restricted_field_by_field(
    k8s: dict[str, dict[str, Any]], container: dict[str, Any]
) -> None:
    pod = k8s["StatefulSet"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key, False), key
    psc, csc = pod["securityContext"], container["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0 and psc["runAsGroup"] > 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"] == {"drop": ["ALL"]}
    assert not csc.get("privileged", False)
    assert csc["readOnlyRootFilesystem"] is True
    assert all("hostPort" not in p for p in container["ports"])
    allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral"}
    allowed |= {"persistentVolumeClaim", "projected", "secret"}
    for volume in pod["volumes"]:
        assert set(volume) - {"name"} <= allowed, volume
    # Where a read-only root leaves the process room to write, bounded.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    (tmp,) = [v for v in pod["volumes"] if v["name"] == mounts["/tmp"]]
    assert tmp["emptyDir"]["sizeLimit"]
    resources = container["resources"]
    assert resources["requests"]["ephemeral-storage"] and resources["limits"]["ephemeral-storage"]


def test_the_network_policy_opens_exactly_the_ports_the_settings_derive(
    k8s: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_of_pod(k8s, 0, monkeypatch)
    policy = k8s["NetworkPolicy"]["spec"]
    assert policy["podSelector"] == k8s["StatefulSet"]["spec"]["selector"]
    assert policy["policyTypes"] == ["Ingress"]
    peers, monitoring = policy["ingress"]
    assert settings.hosts is not None
    dataflow = int(settings.hosts[0].rpartition(":")[2])
    control = dataflow + settings.cluster.control_port_offset
    assert peers["from"] == [{"podSelector": policy["podSelector"]}]
    assert {p["port"] for p in peers["ports"]} == {dataflow, control}
    assert monitoring["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert [p["port"] for p in monitoring["ports"]] == [settings.metrics_port]


def test_the_container_runs_kascade_run(container: dict[str, Any]) -> None:
    assert container["command"] == ["kascade"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "run"


def test_every_variable_names_a_setting_and_every_pod_loads_its_own_process_id(
    k8s: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in pod_env(k8s, 0):
        assert setting_exists(name), f"{name} is not a kascade setting"
    replicas = k8s["StatefulSet"]["spec"]["replicas"]
    for ordinal in range(replicas):
        settings = settings_of_pod(k8s, ordinal, monkeypatch)
        assert settings.process_id == ordinal
        assert settings.kafka.sasl_password is not None
        assert settings.registry.basic_auth_password is not None


def test_the_addresses_name_every_pod_through_the_headless_service_on_its_ports(
    k8s: dict[str, dict[str, Any]], container: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_of_pod(k8s, 0, monkeypatch)
    sts, service = k8s["StatefulSet"], k8s["Service"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    name = sts["metadata"]["name"]
    assert settings.hosts == [
        f"{name}-{i}.{service['metadata']['name']}:{ports['dataflow']}"
        for i in range(sts["spec"]["replicas"])
    ]
    assert ports["control"] == ports["dataflow"] + settings.cluster.control_port_offset
    assert ports["metrics"] == settings.metrics_port
    assert settings.metrics_host == "0.0.0.0"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == ports
    template = sts["spec"]["template"]["metadata"]
    assert template["annotations"]["prometheus.io/port"] == str(settings.metrics_port)


def test_the_probes_ask_the_supervisor_what_it_answers(container: dict[str, Any]) -> None:
    probes = {k: container[k]["httpGet"] for k in ("livenessProbe", "readinessProbe")}
    assert {p["port"] for p in probes.values()} == {"control"}
    port = free_port()
    server = ControlServer(f"127.0.0.1:{port - 1}", 1, on_drain=lambda: None, token="t")
    try:

        def status(path: str) -> int:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status
            except urllib.error.HTTPError as e:
                return e.code

        live, ready = probes["livenessProbe"]["path"], probes["readinessProbe"]["path"]
        assert (status(live), status(ready)) == (200, 503)  # waiting for its peers
        server.state = "running"
        assert (status(live), status(ready)) == (200, 200)
        server.state = "restarting"
        assert (status(live), status(ready)) == (200, 503)
    finally:
        server.close()


def test_each_pod_keeps_its_recovery_partition_on_its_own_volume_and_reads_the_models(
    k8s: dict[str, dict[str, Any]], container: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_of_pod(k8s, 0, monkeypatch)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    spec = k8s["StatefulSet"]["spec"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert Path(mounts[claim["metadata"]["name"]]["mountPath"]) == settings.recovery_dir
    models = mounts["models"]
    assert models["readOnly"] is True
    assert settings.model_dir is not None
    assert settings.model_dir.is_relative_to(models["mountPath"])
    (volume,) = [v for v in spec["template"]["spec"]["volumes"] if v["name"] == "models"]
    assert (
        volume["persistentVolumeClaim"]["claimName"]
        == k8s["PersistentVolumeClaim"]["metadata"]["name"]
    )


def test_the_pod_gets_the_cores_its_workers_and_threads_use_and_time_to_drain(
    k8s: dict[str, dict[str, Any]], container: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_of_pod(k8s, 0, monkeypatch)
    cores = settings.workers * settings.encoder.threads
    resources = container["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == str(cores)
    grace = k8s["StatefulSet"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > DRAIN_S
    pdb = k8s["PodDisruptionBudget"]["spec"]
    assert pdb["selector"] == k8s["StatefulSet"]["spec"]["selector"]
    assert pdb["maxUnavailable"] == 1
