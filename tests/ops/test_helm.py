"""The Helm chart rendered by the real Helm v4 engine, and what it renders checked.

``support.helm_render`` installs helm/icespool with PyPI ``helm-sdkpy`` (the Helm v4 Go
library) into a fake Kubernetes API server on loopback and records the objects Helm
creates. Every object is validated offline against the Kubernetes JSON schemas of PyPI
``kubernetes-validate``; the ConfigMap's icespool.toml goes through ``icespool
check-config``; the PrometheusRule's rules go through promtool's unit tests with the job
the ServiceMonitor gives the targets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support.helm_render import HelmRenderError, Render, render_chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm/icespool"
RULES = ROOT / "deploy/prometheus/icespool-rules.yml"
RULES_TEST = ROOT / "deploy/prometheus/icespool-rules.test.yml"
# The chart's minimum (Chart.yaml kubeVersion) and the newest schemas kubernetes-validate has.
KUBE_VERSIONS = ("1.27.0", "1.37.0")
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

BASE_OBJECTS = [
    ("ConfigMap", "{f}"),
    ("PodDisruptionBudget", "{f}"),
    ("Service", "{f}"),
    ("Service", "{f}-headless"),
    ("ServiceAccount", "{f}"),
    ("StatefulSet", "{f}"),
]
FULL_OBJECTS = sorted([*BASE_OBJECTS, ("PrometheusRule", "{f}"), ("ServiceMonitor", "{f}")])

KAFKA = {
    "bootstrap_servers": "kafka-0.kafka:9092,kafka-1.kafka:9092",
    "group_id": "icespool",
    "topics": ["events"],
    "table": "demo.events",
    "format": "json",
    "dead_letter": "table",
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_plain_username": "icespool",
}
# The catalog's own secret: a REST catalog's OAuth2 credential, the PostgreSQL URI with
# its password (a sql catalog takes no `credential` key: it would be an unknown key).
CATALOG_SECRET_ENV = {
    "rest": ("ICESPOOL__CATALOG__CREDENTIAL", "credential"),
    "postgresql": ("ICESPOOL__CATALOG__URI", "uri"),
}
SECRETS = {
    "catalog": {"existingSecret": "icespool-catalog", "env": {}},
    "objectStore": {
        "existingSecret": "icespool-s3",
        "env": {
            "ICESPOOL__CATALOG__S3__ACCESS-KEY-ID": "access-key-id",
            "ICESPOOL__CATALOG__S3__SECRET-ACCESS-KEY": "secret-access-key",
        },
    },
    "kafka": {
        "existingSecret": "icespool-kafka",
        "env": {"ICESPOOL__KAFKA__0__SASL_PLAIN_PASSWORD": "sasl-password"},
    },
    "authToken": {"existingSecret": "icespool-token"},
}
CATALOGS = {
    "rest": {
        "name": "lake",
        "type": "rest",
        "uri": "http://iceberg-rest.lake.svc:8181",
        "warehouse": "s3://lake/warehouse",
        "s3.endpoint": "http://minio.lake.svc:9000",
    },
    # The password part of the URI comes from secrets.catalog (ICESPOOL__CATALOG__URI).
    "postgresql": {
        "name": "lake",
        "type": "sql",
        "uri": "postgresql+psycopg2://icespool@postgres.lake.svc/lake",
        "warehouse": "s3://lake/warehouse",
        "s3.endpoint": "http://minio.lake.svc:9000",
    },
}


def full_values(catalog: str) -> dict[str, Any]:
    """3 replicas on a shared catalog, ServiceMonitor, PrometheusRule, secrets, Kafka."""
    return {
        "replicaCount": 3,
        "image": {"repository": "registry.example.com/data/icespool", "tag": "0.1.0"},
        "config": {"catalog": CATALOGS[catalog], "kafka": [KAFKA]},
        "secrets": {
            **SECRETS,
            "catalog": {
                "existingSecret": "icespool-catalog",
                "env": dict([CATALOG_SECRET_ENV[catalog]]),
            },
        },
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
        },
    }


@pytest.fixture(scope="module")
def default_render() -> Render:
    return render_chart(CHART, "lake")


@pytest.fixture(scope="module", params=sorted(CATALOGS))
def full_render(request: pytest.FixtureRequest) -> Render:
    return render_chart(CHART, "prod", full_values(request.param))


@pytest.fixture(scope="module", params=["default", "rest", "postgresql"])
def any_render(request: pytest.FixtureRequest) -> Render:
    if request.param == "default":
        return render_chart(CHART, "lake")
    return render_chart(CHART, "prod", full_values(request.param))


def _names(render: Render, expected: list[tuple[str, str]]) -> list[tuple[str, str]]:
    fullname = f"{render.release}-icespool"
    return sorted((kind, name.format(f=fullname)) for kind, name in expected)


def _container(render: Render) -> dict[str, Any]:
    pod = render.one("StatefulSet")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["icespool"]
    container: dict[str, Any] = pod["containers"][0]
    return container


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# ------------------------------------------------------------------ what is rendered


def test_default_values_render_exactly_these_objects(default_render: Render) -> None:
    assert default_render.kinds() == _names(default_render, BASE_OBJECTS)
    assert {o["metadata"]["namespace"] for o in default_render.objects} == {"icespool"}
    sts = default_render.one("StatefulSet")
    selector = {"app.kubernetes.io/name": "icespool", "app.kubernetes.io/instance": "lake"}
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["selector"] == {"matchLabels": selector}
    assert sts["spec"]["serviceName"] == "lake-icespool-headless"
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert pod_labels == selector
    container = _container(default_render)
    # The image the README's `docker build -t icespool:0.1.0 .` makes; set your registry's.
    assert container["image"] == "icespool:0.1.0"
    assert container["args"] == ["run", "--config", "/etc/icespool/icespool.toml"]
    assert container["env"] == [{"name": "ICESPOOL_CONFIG", "value": "/etc/icespool/icespool.toml"}]
    for name in ("lake-icespool", "lake-icespool-headless"):
        assert default_render.one("Service", name)["spec"]["selector"] == selector
    pdb = default_render.one("PodDisruptionBudget")["spec"]
    assert pdb == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "spool"
    assert claim["spec"]["resources"] == {"requests": {"storage": "20Gi"}}


def test_full_values_render_every_part(full_render: Render) -> None:
    assert full_render.kinds() == _names(full_render, FULL_OBJECTS)
    sts = full_render.one("StatefulSet")
    assert sts["spec"]["replicas"] == 3
    container = _container(full_render)
    assert container["image"] == "registry.example.com/data/icespool:0.1.0"
    env = {e["name"]: e for e in container["env"]}
    assert env.pop("ICESPOOL_CONFIG") == {
        "name": "ICESPOOL_CONFIG",
        "value": "/etc/icespool/icespool.toml",
    }
    assert env.pop("ICESPOOL__HTTP__AUTH_TOKEN_FILE")["value"] == "/etc/icespool/token/token"
    from_secrets = {
        name: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for name, e in env.items()
    }
    catalog_env = next(n for n in from_secrets if n in {v[0] for v in CATALOG_SECRET_ENV.values()})
    assert from_secrets == {
        catalog_env: ("icespool-catalog", catalog_env.rsplit("__", 1)[1].lower()),
        "ICESPOOL__CATALOG__S3__ACCESS-KEY-ID": ("icespool-s3", "access-key-id"),
        "ICESPOOL__CATALOG__S3__SECRET-ACCESS-KEY": ("icespool-s3", "secret-access-key"),
        "ICESPOOL__KAFKA__0__SASL_PLAIN_PASSWORD": ("icespool-kafka", "sasl-password"),
    }
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["token"]["secret"] == {"secretName": "icespool-token", "defaultMode": 0o440}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["token"] == "/etc/icespool/token"
    for kind in CRD_KINDS:
        assert full_render.one(kind)["metadata"]["labels"]["release"] == "prom"


def test_every_rendered_object_passes_kubernetes_validate(any_render: Render) -> None:
    validated: list[str] = []
    for obj in any_render.objects:
        for version in KUBE_VERSIONS:
            if obj["kind"] in CRD_KINDS:
                # kubernetes-validate has built-in kinds only; the CRDs are checked below
                # (structure) and by promtool (the rules).
                with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                    kubernetes_validate.validate(obj, version, strict=True)
                continue
            checked = kubernetes_validate.validate(obj, version, strict=True)
            assert checked == version.rsplit(".", 1)[0]
            validated.append(f"{obj['kind']}@{checked}")
    built_in = [o for o in any_render.objects if o["kind"] not in CRD_KINDS]
    assert len(built_in) == 6
    assert len(validated) == len(built_in) * len(KUBE_VERSIONS)


def test_kubernetes_validate_catches_a_broken_statefulset(default_render: Render) -> None:
    """The validation above really checks: a misspelt field fails strict validation."""
    sts = yaml.safe_load(yaml.safe_dump(default_render.one("StatefulSet")))
    sts["spec"]["replica"] = sts["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(sts, KUBE_VERSIONS[0], strict=True)


# ------------------------------------------------------------------ the rendered config


def _check_config(
    toml_text: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "icespool.toml"
    path.write_text(toml_text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ICESPOOL")}
    argv = [sys.executable, "-m", "icespool", "check-config", "--config", str(path)]
    return subprocess.run(
        argv,
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_rendered_config_passes_check_config(any_render: Render, tmp_path: Path) -> None:
    toml_text = any_render.one("ConfigMap")["data"]["icespool.toml"]
    # The container's environment: the secret-backed variables with stand-in values.
    env = {
        e["name"]: f"from-secret-{e['valueFrom']['secretKeyRef']['key']}"
        for e in _container(any_render)["env"]
        if "valueFrom" in e
    }
    result = _check_config(toml_text, tmp_path, env)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    effective = tomllib.loads(result.stdout)
    assert effective["spool"]["dir"] == "/var/lib/icespool/spool"
    assert effective["http"]["listen"] == "0.0.0.0:8080"
    assert [t["name"] for t in effective["tables"]] == ["demo.events"]
    catalog = effective["catalog"]
    if any_render.release == "lake":
        assert env == {}
        assert catalog["uri"] == "sqlite:////var/lib/icespool/catalog.db"
        assert effective.get("kafka", []) == []
        return
    assert catalog["warehouse"] == "s3://lake/warehouse"
    assert catalog["s3.endpoint"] == "http://minio.lake.svc:9000"
    # The secret-backed keys reached the config (and are redacted in the output).
    if catalog["type"] == "rest":
        assert catalog["credential"] == "***"
    else:
        assert catalog["uri"] == "from-secret-uri"
    [overrides] = [line for line in result.stdout.splitlines() if "environment overrides" in line]
    assert CATALOG_SECRET_ENV["rest" if catalog["type"] == "rest" else "postgresql"][0] in overrides
    assert catalog["s3.secret-access-key"] == "***"
    [kafka] = effective["kafka"]
    assert kafka["bootstrap_servers"] == ["kafka-0.kafka:9092", "kafka-1.kafka:9092"]
    assert kafka["topics"] == ["events"] and kafka["table"] == "demo.events"
    assert kafka["sasl_plain_password"] == "***"


def test_check_config_rejects_a_broken_rendered_config(
    default_render: Render, tmp_path: Path
) -> None:
    """The check above is a real check: a bad value in the rendered TOML exits 2."""
    toml_text = default_render.one("ConfigMap")["data"]["icespool.toml"]
    broken = toml_text.replace('"compression" = "zstd"', '"compression" = "brotli"')
    assert broken != toml_text
    result = _check_config(broken, tmp_path)
    assert result.returncode == 2
    assert "defaults.compression" in result.stderr


def test_statefulset_rolls_when_the_config_changes() -> None:
    one = render_chart(CHART, "lake").one("StatefulSet")
    two = render_chart(CHART, "lake", {"config": {"log": {"level": "debug"}}}).one("StatefulSet")
    key = "checksum/config"
    first = one["spec"]["template"]["metadata"]["annotations"][key]
    second = two["spec"]["template"]["metadata"]["annotations"][key]
    assert re.fullmatch(r"[0-9a-f]{64}", first) and re.fullmatch(r"[0-9a-f]{64}", second)
    assert first != second


# ------------------------------------------------------------------ replicas need a shared catalog


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"replicaCount": 2}, ["config.catalog.uri is SQLite", "sqlite:////var/lib/icespool"]),
        (
            {
                "replicaCount": 3,
                "config": {"catalog": {"uri": "postgresql+psycopg2://icespool@db/lake"}},
            },
            ["config.catalog.warehouse is file:///var/lib/icespool/warehouse"],
        ),
        (
            {
                "replicaCount": 3,
                "config": {"catalog": {"type": "rest", "uri": "http://rest:8181"}},
            },
            ["config.catalog.warehouse is file:///var/lib/icespool/warehouse"],
        ),
    ],
    ids=["sqlite-catalog", "file-warehouse", "rest-with-file-warehouse"],
)
def test_replicas_without_a_shared_catalog_refuse_to_render(
    values: dict[str, Any], names: list[str]
) -> None:
    with pytest.raises(HelmRenderError) as refused:
        render_chart(CHART, "prod", values)
    message = str(refused.value)
    assert "icespool/templates/statefulset.yaml" in message
    assert f"replicaCount={values['replicaCount']} needs a" in message
    assert "that all replicas share" in message
    for name in names:
        assert name in message
    assert "or set replicaCount=1" in message


def test_replicas_accept_a_catalog_uri_from_a_secret() -> None:
    """The SQLite default in config is replaced by ICESPOOL__CATALOG__URI at run time."""
    values = {
        "replicaCount": 2,
        "config": {"catalog": {"warehouse": "s3://lake/warehouse"}},
        "secrets": {
            "catalog": {
                "existingSecret": "icespool-catalog",
                "env": {"ICESPOOL__CATALOG__URI": "uri"},
            }
        },
    }
    render = render_chart(CHART, "prod", values)
    assert render.one("StatefulSet")["spec"]["replicas"] == 2
    env = {e["name"]: e.get("valueFrom") for e in _container(render)["env"]}
    assert env["ICESPOOL__CATALOG__URI"] == {
        "secretKeyRef": {"name": "icespool-catalog", "key": "uri"}
    }


def test_one_replica_keeps_the_sqlite_default(default_render: Render) -> None:
    toml_text = default_render.one("ConfigMap")["data"]["icespool.toml"]
    assert '"uri" = "sqlite:////var/lib/icespool/catalog.db"' in toml_text
    assert default_render.one("StatefulSet")["spec"]["replicas"] == 1


# ------------------------------------------------------------------ Prometheus


def test_service_monitor_selects_exactly_the_headless_service(full_render: Render) -> None:
    fullname = f"{full_render.release}-icespool"
    monitor = full_render.one("ServiceMonitor")["spec"]
    selector = monitor["selector"]["matchLabels"]
    services = [o for o in full_render.objects if o["kind"] == "Service"]
    assert len(services) == 2
    selected = [s for s in services if _selects(selector, s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in selected] == [f"{fullname}-headless"]
    headless = selected[0]["spec"]
    # It keeps not-ready pods (replaying the spool, catalog down) in the targets.
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    pods = full_render.one("StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert _selects(headless["selector"], pods)
    [endpoint] = monitor["endpoints"]
    assert endpoint["port"] in [p["name"] for p in headless["ports"]]
    assert endpoint["path"] == "/metrics"
    assert endpoint["relabelings"] == [
        {"action": "replace", "targetLabel": "job", "replacement": fullname}
    ]


def _rule_groups(render: Render) -> dict[str, Any]:
    spec: dict[str, Any] = render.one("PrometheusRule")["spec"]
    return spec


def _deploy_rules_with_job(job: str) -> dict[str, Any]:
    text = RULES.read_text().replace('job="icespool"', f'job="{job}"')
    rules: dict[str, Any] = yaml.safe_load(text)
    return rules


def test_alert_rules_select_the_job_the_service_monitor_produces(full_render: Render) -> None:
    job = full_render.one("ServiceMonitor")["spec"]["endpoints"][0]["relabelings"][0]
    assert job["targetLabel"] == "job"
    groups = _rule_groups(full_render)
    exprs = [rule["expr"] for group in groups["groups"] for rule in group["rules"]]
    jobs = [m for expr in exprs for m in re.findall(r'job="([^"]*)"', expr)]
    # IcespoolDown, IcespoolAbsent, and the two process_* series of the fd alert
    assert jobs == [job["replacement"]] * 4
    # The same rules as deploy/prometheus apart from the job label.
    assert groups == _deploy_rules_with_job(job["replacement"])


def test_release_named_icespool_ships_the_deploy_rules_unchanged() -> None:
    render = render_chart(CHART, "icespool", {"metrics": {"prometheusRule": {"enabled": True}}})
    assert render.kinds() == sorted([*_names_for("icespool"), ("PrometheusRule", "icespool")])
    assert _rule_groups(render) == yaml.safe_load(RULES.read_text())


def _names_for(fullname: str) -> list[tuple[str, str]]:
    return [(kind, name.format(f=fullname)) for kind, name in BASE_OBJECTS]


def _promtool() -> str:
    local = Path(sys.executable).parent / "promtool"
    found = str(local) if local.exists() else __import__("shutil").which("promtool")
    assert found, "promtool is not installed: make test-deps puts it in .venv/bin"
    return found


def test_rendered_rules_pass_the_promtool_unit_tests(full_render: Render, tmp_path: Path) -> None:
    """deploy/prometheus's promtool tests, with the series under the rendered job, pass
    against the PrometheusRule: IcespoolDown fires for a down target of this release and
    IcespoolAbsent stays quiet while one is scraped."""
    job = f"{full_render.release}-icespool"
    (tmp_path / "icespool-rules.yml").write_text(yaml.safe_dump(_rule_groups(full_render)))
    unit_tests = RULES_TEST.read_text()
    moved = unit_tests.replace('job="icespool"', f'job="{job}"').replace(
        "job: icespool", f"job: {job}"
    )
    assert moved.count(job) >= 20  # every series and expected alert moved to the job
    (tmp_path / "rules.test.yml").write_text(moved)
    promtool = _promtool()
    check = subprocess.run(
        [promtool, "check", "rules", "icespool-rules.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 17 rules found" in check.stdout
    tested = subprocess.run(
        [promtool, "test", "rules", "rules.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
    # And the old job="icespool" series no longer satisfy the rendered rules.
    (tmp_path / "old.test.yml").write_text(unit_tests)
    old = subprocess.run(
        [promtool, "test", "rules", "old.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert old.returncode == 1 and "FAILED" in old.stdout + old.stderr


# ------------------------------------------------------------------ docs: REST + S3 example

_EXAMPLE_DOC = ROOT / "docs" / "operations.md"
_EXAMPLE_MARK = "<!-- helm example: rest-s3 -->"


def _readme_example() -> dict[str, Any]:
    """The values of the operations page's REST + S3 example (the yaml block after its
    marker)."""
    text = _EXAMPLE_DOC.read_text()
    assert _EXAMPLE_MARK in text, "docs/operations.md lost its REST + S3 Helm example"
    block = text.split(_EXAMPLE_MARK, 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    values: dict[str, Any] = yaml.safe_load(block)
    return values


def test_readme_rest_s3_example_renders_with_keys_from_existing_secrets() -> None:
    values = _readme_example()
    render = render_chart(CHART, "prod", values)

    assert render.one("StatefulSet")["spec"]["replicas"] == 3
    env = {e["name"]: e.get("valueFrom") for e in _container(render)["env"]}
    assert env["ICESPOOL__CATALOG__CREDENTIAL"] == {
        "secretKeyRef": {"name": "icespool-catalog", "key": "credential"}
    }
    assert env["ICESPOOL__CATALOG__S3__ACCESS-KEY-ID"] == {
        "secretKeyRef": {"name": "icespool-s3", "key": "access-key-id"}
    }
    assert env["ICESPOOL__CATALOG__S3__SECRET-ACCESS-KEY"] == {
        "secretKeyRef": {"name": "icespool-s3", "key": "secret-access-key"}
    }
    # Exactly these: no credential or key in the ConfigMap, only in the Secrets.
    catalog = tomllib.loads(render.one("ConfigMap")["data"]["icespool.toml"])["catalog"]
    assert catalog == {
        "name": "lake",
        "type": "rest",
        "uri": "https://iceberg-rest.lake.svc:8181",
        "warehouse": "s3://lake/warehouse",
        "s3.endpoint": "https://minio.lake.svc:9000",
        "s3.region": "eu-west-1",
    }


@pytest.mark.parametrize(
    "values",
    [
        {"config": {"catalog": {"type": "SQL", "uri": "SQLITE:////var/lib/icespool/c.db"}}},
        # Not an ICESPOOL__ variable: the daemon never reads it, so the SQLite URI stays.
        {
            "secrets": {
                "catalog": {
                    "existingSecret": "icespool-catalog",
                    "env": {"icespool__catalog__uri": "uri"},
                }
            }
        },
    ],
    ids=["upper-case-sqlite", "lower-case-variable"],
)
def test_replicas_refuse_sqlite_in_any_spelling(values: dict[str, Any]) -> None:
    catalog = {"warehouse": "s3://lake/warehouse", **values.get("config", {}).get("catalog", {})}
    full = {**values, "replicaCount": 2, "config": {"catalog": catalog}}
    with pytest.raises(HelmRenderError) as refused:
        render_chart(CHART, "prod", full)
    assert "replicaCount=2 needs a catalog that all replicas share" in str(refused.value)
    assert "is SQLite" in str(refused.value)


# ------------------------------------------------------------------ the install notes


def _run_drain_note(render: Render, tmp_path: Path, ordinal: int) -> list[list[str]]:
    """Run the notes' drain commands with bash, N set to ``ordinal``, against a kubectl
    that records its arguments (no cluster here); returns each call's arguments."""
    notes: str = render.result["info"]["notes"]
    lines = notes.splitlines()
    start = lines.index("  N=2")
    end = next(i for i, line in enumerate(lines) if "delete pvc" in line)
    script = "\n".join(
        [f"N={ordinal}", *lines[start + 1 : end - 2], lines[end]]  # the two prose lines out
    )
    calls = tmp_path / "calls"
    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.parent.mkdir()
    kubectl.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"with open({str(calls)!r}, 'a') as f: f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{kubectl.parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euc", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stderr) == (0, ""), script
    return [json.loads(line) for line in calls.read_text().splitlines()]


def test_drain_note_is_a_command_that_runs(any_render: Render, tmp_path: Path) -> None:
    render = any_render
    fullname = f"{render.release}-icespool"
    sts = render.one("StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    run, delete = _run_drain_note(render, tmp_path, 2)
    overrides = [a for a in run if a.startswith("--overrides=")]
    assert len(overrides) == 1
    assert [a for a in run if a != overrides[0]] == [
        "-n",
        "icespool",
        "run",
        "icespool-drain-2",
        "--rm",
        "--attach",
        "--restart=Never",
        f"--image={container['image']}",
    ]
    pod = json.loads(overrides[0].removeprefix("--overrides="))
    spec = pod["spec"]
    [drain] = spec["containers"]
    assert drain["name"] == "icespool-drain" and drain["image"] == container["image"]
    assert drain["args"] == ["replay", "--config", "/etc/icespool/icespool.toml"]
    # The same secrets, config, mounts and security as the replica it drains.
    secret_env = [e for e in container["env"] if "valueFrom" in e]
    secret_env = [e for e in secret_env if e["name"] != "ICESPOOL__HTTP__AUTH_TOKEN_FILE"]
    assert drain["env"] == secret_env
    assert drain["securityContext"] == container["securityContext"]
    mounts = [m for m in container["volumeMounts"] if m["name"] != "token"]
    assert drain["volumeMounts"] == mounts
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["spool"] == {
        "name": "spool",
        "persistentVolumeClaim": {"claimName": f"spool-{fullname}-2"},
    }
    assert volumes["config"]["configMap"] == {"name": render.one("ConfigMap")["metadata"]["name"]}
    pod_security = dict(sts["spec"]["template"]["spec"]["securityContext"])
    del pod_security["fsGroupChangePolicy"]  # a StatefulSet volume's concern
    assert spec["securityContext"] == pod_security
    assert spec["restartPolicy"] == "Never"
    # `kubectl run` builds a Pod around it: with the name it gives, a valid Pod.
    full = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "icespool-drain-2"}}
    full["spec"] = spec
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(full, version, strict=True)
    assert delete == ["-n", "icespool", "delete", "pvc", f"spool-{fullname}-2"]
    notes = render.result["info"]["notes"]
    if render.release == "lake":  # the default values: no token
        assert "WARNING: no secrets.authToken.existingSecret" in notes
    else:
        assert "WARNING" not in notes
