"""The image's build file and the Kubernetes manifests (deploy/k8s) hold what a cluster needs of them.

The manifests are checked here, not applied: the DaskCluster is the one the Dask operator's own
`make_cluster_spec` lays out (deploy/k8s/daskcluster.py), the preloads and the worker's scheduler address come
from the image's entry point, which the integration test runs on the manifests' command lines and parses the
result with Dask's and Shoal's own command-line parsers.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from shoal.configs import load_profile
from shoal.pipeline.jobs.reindex import load_job
from tests.support.paths import ROOT

K8S = ROOT / "deploy" / "k8s"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/shoal:{VERSION}"  # what `make image` (deploy/build-image.sh) tags


def manifests(name: str) -> dict[str, dict]:
    """The documents of deploy/k8s/NAME, by kind."""
    return {doc["kind"]: doc for doc in yaml.safe_load_all((K8S / name).read_text())}


def daskcluster_module():
    spec = importlib.util.spec_from_file_location("daskcluster", K8S / "daskcluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pod(name: str, kind: str) -> dict:
    """The pod spec of a Deployment's or a CronJob's pods."""
    doc = manifests(name)[kind]
    template = doc["spec"]["jobTemplate"]["spec"] if kind == "CronJob" else doc["spec"]
    return template["template"]["spec"]


def cluster_pods() -> dict[str, dict]:
    spec = manifests("daskcluster.yaml")["DaskCluster"]["spec"]
    return {"scheduler": spec["scheduler"]["spec"], "worker": spec["worker"]["spec"]}


def env(container: dict) -> dict[str, str]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


def all_pods() -> list[dict]:
    return [*cluster_pods().values(), pod("gateway.yaml", "Deployment"), pod("reindex-cronjob.yaml", "CronJob")]


def test_daskcluster_is_what_the_operators_make_cluster_spec_gives():
    module = daskcluster_module()
    committed = manifests("daskcluster.yaml")["DaskCluster"]
    assert committed == module.daskcluster(), "deploy/k8s/daskcluster.yaml is stale: run deploy/k8s/daskcluster.py"
    assert committed["apiVersion"] == "kubernetes.dask.org/v1"


def test_the_autoscaler_scales_the_daskcluster_between_bounds_the_pinned_model_allows():
    module = daskcluster_module()
    documents = manifests("daskcluster.yaml")
    autoscaler, cluster = documents["DaskAutoscaler"], documents["DaskCluster"]
    assert autoscaler == module.daskautoscaler(), "deploy/k8s/daskcluster.yaml is stale: run deploy/k8s/daskcluster.py"
    assert autoscaler["apiVersion"] == cluster["apiVersion"] == "kubernetes.dask.org/v1"
    assert autoscaler["spec"]["cluster"] == cluster["metadata"]["name"]
    minimum, maximum = autoscaler["spec"]["minimum"], autoscaler["spec"]["maximum"]
    assert 0 <= minimum <= cluster["spec"]["worker"]["replicas"] <= maximum
    (worker,) = cluster_pods()["worker"]["containers"]
    pins = [arg for i, arg in enumerate(worker["args"]) if i and worker["args"][i - 1] == "--shoal-pin"]
    assert minimum >= (1 if pins else 0)  # a pinned model keeps a holder: the queue never asks for fewer


def test_the_images_scheduler_serves_dasks_own_routes_and_its_api_for_the_operator():
    import distributed

    defaults = yaml.safe_load((Path(distributed.__file__).parent / "distributed.yaml").read_text())
    routes = yaml.safe_load((ROOT / "deploy" / "dask.yaml").read_text())["distributed"]["scheduler"]["http"]["routes"]
    dasks = defaults["distributed"]["scheduler"]["http"]["routes"]
    assert routes == [*dasks, "distributed.http.scheduler.api"]


def test_every_pod_runs_the_image_make_image_builds_as_the_non_root_user():
    containerfile = (ROOT / "Containerfile").read_text()
    users = set(re.findall(r"^USER (\d+):(\d+)$", containerfile, re.M))
    assert users == {("10001", "10001")}
    assert "IMAGE=localhost/shoal:$VERSION" in (ROOT / "deploy" / "build-image.sh").read_text()
    for spec in all_pods():
        assert [c["image"] for c in spec["containers"]] == [IMAGE]
        assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001}


def test_every_container_is_offline_and_leaves_the_entrypoint_in_place():
    for spec in all_pods():
        (container,) = spec["containers"]
        assert env(container)["HF_HUB_OFFLINE"] == "1"
        assert "command" not in container, "`command` would replace the image's entry point, and the preloads"


def test_scheduler_and_workers_leave_the_preloads_to_the_entrypoint():
    pods = cluster_pods()
    scheduler_args = pods["scheduler"]["containers"][0]["args"]
    worker_args = pods["worker"]["containers"][0]["args"]
    assert scheduler_args[:2] == ["dask", "scheduler"]
    assert worker_args[:2] == ["dask", "worker"]
    # the entry point adds them: a second --preload would load the plugin twice
    assert "--preload" not in scheduler_args + worker_args


def test_gpu_workers_ask_kubernetes_and_dask_for_one_gpu_each():
    (worker,) = cluster_pods()["worker"]["containers"]
    for section in ("requests", "limits"):
        assert worker["resources"][section]["nvidia.com/gpu"] == 1
    args = worker["args"]
    assert args[args.index("--resources") + 1].split(",")[0] == "GPU=1"
    profile = load_profile(env(worker)["SHOAL_PROFILE"])
    assert profile.device == "cuda"
    # One Dask worker per pod: the operator's autoscaler deletes the pods whose worker names retire_workers gives.
    assert args[args.index("--nworkers") + 1] == "1"
    (scheduler,) = cluster_pods()["scheduler"]["containers"]
    assert "nvidia.com/gpu" not in scheduler["resources"]["limits"]


def test_a_sigtermed_worker_pod_is_killed_only_well_after_its_retirement_grace():
    import dask.config

    from shoal.workers.termination import GRACE_CONFIG, termination_grace

    pod = cluster_pods()["worker"]
    grace = env(pod["containers"][0])["DASK_SHOAL__WORKER__TERMINATION_GRACE"]
    with dask.config.set({GRACE_CONFIG: grace}):
        assert pod["terminationGracePeriodSeconds"] >= termination_grace() + 15  # hand back, close, free the GPU


def test_scheduler_probes_its_dashboards_health_route():
    (scheduler,) = cluster_pods()["scheduler"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in scheduler["ports"]}
    assert ports == {"tcp-comm": 8786, "http-dashboard": 8787}
    for probe in ("readinessProbe", "livenessProbe"):
        assert scheduler[probe]["httpGet"] == {"port": "http-dashboard", "path": "/health"}


def test_gateway_reaches_the_operators_scheduler_service_and_is_ready_on_readyz():
    cluster = manifests("daskcluster.yaml")["DaskCluster"]
    scheduler_service = cluster["spec"]["scheduler"]["service"]
    comm_port = next(p["port"] for p in scheduler_service["ports"] if p["name"] == "tcp-comm")
    (gateway,) = pod("gateway.yaml", "Deployment")["containers"]
    args = gateway["args"]
    assert args[:2] == ["shoal", "gateway"]
    # the operator names the scheduler's Service CLUSTER-scheduler
    assert args[args.index("--scheduler") + 1] == f"tcp://{cluster['metadata']['name']}-scheduler:{comm_port}"
    assert args[args.index("--host") + 1] == "0.0.0.0"
    (port,) = gateway["ports"]
    assert port["containerPort"] == int(args[args.index("--port") + 1])
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    token = next(item for item in gateway["env"] if item["name"] == "SHOAL_GATEWAY_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True


def test_gateway_service_sends_to_the_gateway_pods():
    docs = manifests("gateway.yaml")
    deployment, service = docs["Deployment"], docs["Service"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    assert service["spec"]["selector"] == labels
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]


def test_reindex_cronjob_runs_a_valid_job_file_on_the_cluster(tmp_path):
    docs = manifests("reindex-cronjob.yaml")
    cronjob, configmap = docs["CronJob"], docs["ConfigMap"]
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    spec = pod("reindex-cronjob.yaml", "CronJob")
    (container,) = spec["containers"]
    assert container["args"][:2] == ["shoal", "reindex"]
    (mount,) = container["volumeMounts"]
    job_path = Path(container["args"][2])
    assert job_path.parent == Path(mount["mountPath"])
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    (tmp_path / job_path.name).write_text(configmap["data"][job_path.name])
    job = load_job(tmp_path / job_path.name)
    assert job.scheduler == "tcp://shoal-scheduler:8786"


def test_containerfile_pins_torch_as_the_project_does_and_labels_version_and_commit():
    containerfile = (ROOT / "Containerfile").read_text()
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = next(d for d in dependencies if d.startswith("torch"))
    assert re.findall(r"^ARG TORCH=(.*)$", containerfile, re.M) == [torch, torch]
    assert f"$(PIP) install --quiet {torch}" in (ROOT / "Makefile").read_text()
    assert re.findall(r"^ARG VERSION=(.*)$", containerfile, re.M) == [VERSION, VERSION]
    for label in ('org.opencontainers.image.version="${VERSION}"', 'org.opencontainers.image.revision="${GIT_COMMIT}"'):
        assert containerfile.count(label) == 2
    assert containerfile.count("HF_HUB_OFFLINE=1") == 2
    assert containerfile.count('ENTRYPOINT ["/usr/local/bin/shoal-entrypoint"]') == 2


# -- the entry point on the manifests' command lines (integration: it runs the script) -----------------


def through_entrypoint(args: list[str], tmp_path: Path, **environment: str) -> list[str]:
    """The command line deploy/entrypoint.sh runs for `args`, with `dask` a stub that prints its arguments."""
    stub = tmp_path / "bin" / "dask"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text("#!/bin/sh\nprintf '%s\\n' dask \"$@\"\n")
    stub.chmod(0o755)
    # Kubernetes expands $(VAR) in args from the container's environment
    args = [re.sub(r"\$\((\w+)\)", lambda m: environment[m.group(1)], a) for a in args]
    result = subprocess.run(
        ["sh", str(ROOT / "deploy" / "entrypoint.sh"), *args],
        env={"PATH": f"{stub.parent}:/usr/bin:/bin", **environment},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.splitlines()


@pytest.mark.integration
def test_entrypoint_gives_the_scheduler_its_preload(tmp_path):
    from distributed.cli.dask_scheduler import main as dask_scheduler

    (scheduler,) = cluster_pods()["scheduler"]["containers"]
    argv = through_entrypoint(scheduler["args"], tmp_path)
    assert argv[:2] == ["dask", "scheduler"]
    params = dask_scheduler.make_context("scheduler", argv[2:]).params
    assert params["preload"] == ("shoal.scheduler_plugins",)
    assert params["host"] == "0.0.0.0"


@pytest.mark.integration
def test_entrypoint_puts_the_operators_scheduler_address_first_for_the_shoal_options(tmp_path):
    from distributed.cli.dask_worker import main as dask_worker

    from shoal.workers import dask_setup

    (worker,) = cluster_pods()["worker"]["containers"]
    address = "tcp://shoal-scheduler.default.svc.cluster.local:8786"  # what the operator sets
    argv = through_entrypoint(
        worker["args"], tmp_path, DASK_SCHEDULER_ADDRESS=address, DASK_WORKER_NAME="shoal-default-worker-7d4c"
    )
    params = dask_worker.make_context("worker", argv[2:]).params
    assert params["scheduler"] == address
    assert params["preload"] == ("shoal.workers",)
    assert params["name"] == "shoal-default-worker-7d4c"
    assert params["resources"] == "GPU=1,VRAM=80e9"
    assert params["nthreads"] == 1
    shoal_options = dask_setup.make_context("dask_setup", list(params["preload_argv"])).params
    assert shoal_options["shoal_pin"] == ("minilm",)


@pytest.mark.integration
def test_entrypoint_keeps_an_address_given_first_and_runs_other_commands_as_given(tmp_path):
    argv = through_entrypoint(["dask", "worker", "tcp://10.0.0.5:8786", "--nthreads", "1"], tmp_path)
    assert argv == ["dask", "worker", "tcp://10.0.0.5:8786", "--preload", "shoal.workers", "--nthreads", "1"]
    assert through_entrypoint(["dask", "--version"], tmp_path) == ["dask", "--version"]
