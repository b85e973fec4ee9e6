"""Render the Helm chart with the real Helm v4 engine (PyPI ``helm-sdkpy``).

helm-sdkpy has no template/dry-run entry point, so a render is a real ``helm install``
against :class:`FakeKubeAPI`, a small Kubernetes API server on loopback: it answers
discovery (``/version``, ``/api``, ``/apis`` and one resource list per group version),
keeps what is created in memory (Helm's release Secrets included), and records every
object Helm creates. Those recorded objects are the rendered chart, exactly as a real
API server would receive them.

Anything the fake server cannot answer is recorded in ``unexpected`` (the tests assert
it stays empty), so a newer Helm that asks for more fails loudly instead of passing
on a half-answered install.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeKubeAPI", "HelmRenderError", "Render", "render_chart"]

# (group, version) -> [(plural, kind, namespaced)]: what the fake cluster serves. The
# monitoring.coreos.com group stands for an installed Prometheus Operator.
RESOURCES: dict[tuple[str, str], list[tuple[str, str, bool]]] = {
    ("", "v1"): [
        ("configmaps", "ConfigMap", True),
        ("secrets", "Secret", True),
        ("services", "Service", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True),
        ("pods", "Pod", True),
        ("namespaces", "Namespace", False),
    ],
    ("apps", "v1"): [
        ("statefulsets", "StatefulSet", True),
        ("deployments", "Deployment", True),
    ],
    ("policy", "v1"): [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    ("monitoring.coreos.com", "v1"): [
        ("servicemonitors", "ServiceMonitor", True),
        ("prometheusrules", "PrometheusRule", True),
    ],
}
_PROTOBUF = "application/vnd.kubernetes.protobuf"
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


class HelmRenderError(AssertionError):
    """Helm refused the chart (a template ``fail``, a YAML parse error, ...)."""


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _group_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


def _matches(labels: Mapping[str, str], selector: str) -> bool:
    """Equality-based label selectors (``a=b,c=d``), which is all Helm's storage uses."""
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value.lstrip("="):
            return False
    return True


@dataclass
class FakeKubeAPI:
    """A Kubernetes API server on 127.0.0.1 that stores objects in memory."""

    kube_version: str = "v1.33.0"
    created: list[dict[str, Any]] = field(default_factory=list)
    release_records: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    _store: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "FakeKubeAPI is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def kubeconfig(self, namespace: str) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "fake", "user": {"token": "fake"}}],
                "contexts": [
                    {
                        "name": "fake",
                        "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                    }
                ],
                "current-context": "fake",
            }
        )

    @contextmanager
    def running(self) -> Iterator[FakeKubeAPI]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                kind = self.headers.get("Content-Type", "")
                if raw and not kind.startswith("application/json"):
                    raise ValueError(f"body is {kind!r}, not JSON")
                return json.loads(raw) if raw else {}

            def _reply(self, code: int, body: Mapping[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                kind = self.headers.get("Content-Type", "")
                if kind and not kind.startswith("application/json"):
                    self._opaque(kind)
                    return
                try:
                    code, body = api._answer(self.command, self.path, self._body)
                except Exception as exc:  # any surprise is a recorded failure, not a hang
                    api.unexpected.append(f"{self.command} {self.path}: {exc!r}")
                    code, body = 500, _status(500, "InternalError", repr(exc))
                self._reply(code, body)

            def _opaque(self, kind: str) -> None:
                """Helm's release record: a Secret its typed client sends as protobuf.

                It is echoed back (what a real server answers is the stored object) and
                counted; the fake does not decode protobuf, so nothing else may send it.
                """
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                release = (
                    kind == _PROTOBUF
                    and raw.startswith(b"k8s\x00")
                    and b"helm.sh/release.v1" in raw
                    and self.command in ("POST", "PUT")
                    and "/secrets" in self.path
                )
                if not release:
                    api.unexpected.append(f"{self.command} {self.path} with a {kind} body")
                    self._reply(415, _status(415, "UnsupportedMediaType", f"{kind} body"))
                    return
                api.release_records.append(f"{self.command} {self.path}")
                self.send_response(201 if self.command == "POST" else 200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=10)

    # ---------------------------------------------------------------- requests

    def _answer(self, method: str, raw_path: str, body: Any) -> tuple[int, dict[str, Any]]:
        url = urlsplit(raw_path)
        parts = [p for p in url.path.split("/") if p]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if method == "GET":
            discovery = self._discovery(parts)
            if discovery is not None:
                return 200, discovery
            if parts and parts[0] == "openapi":
                return 404, _status(404, "NotFound", "no OpenAPI document here")
        located = self._locate(parts)
        if located is None:
            self.unexpected.append(f"{method} {raw_path}")
            return 404, _status(404, "NotFound", f"the fake API does not serve {url.path}")
        group, version, kind, namespace, collection, name = located
        with self._lock:
            if method == "GET" and name is None:
                selector = query.get("labelSelector", "")
                items = [
                    copy.deepcopy(obj)
                    for key, obj in sorted(self._store.items())
                    if key.startswith(collection + "/")
                    and _matches(obj["metadata"].get("labels") or {}, selector)
                ]
                return 200, {
                    "kind": f"{kind}List",
                    "apiVersion": _group_version(group, version),
                    "metadata": {"resourceVersion": "1"},
                    "items": items,
                }
            key = f"{collection}/{name}"
            if method == "GET":
                if key in self._store:
                    return 200, copy.deepcopy(self._store[key])
                return 404, _status(404, "NotFound", f'{collection} "{name}" not found')
            if method == "POST":
                obj = body()
                name = obj["metadata"]["name"]
                key = f"{collection}/{name}"
                if key in self._store:
                    return 409, _status(409, "AlreadyExists", f'"{name}" already exists')
                self.created.append(copy.deepcopy(obj))
                stored = self._stamp(obj, namespace)
                self._store[key] = stored
                return 201, copy.deepcopy(stored)
            if method == "PUT":
                if key not in self._store:
                    return 404, _status(404, "NotFound", f'"{name}" not found')
                self._store[key] = self._stamp(body(), namespace)
                return 200, copy.deepcopy(self._store[key])
            if method == "DELETE":
                gone = self._store.pop(key, None)
                if gone is None:
                    return 404, _status(404, "NotFound", f'"{name}" not found')
                return 200, _status(200, "", "deleted") | {"status": "Success"}
        self.unexpected.append(f"{method} {raw_path}")
        return 405, _status(405, "MethodNotAllowed", f"{method} is not served here")

    def _discovery(self, parts: list[str]) -> dict[str, Any] | None:
        if parts == ["version"]:
            major, minor = self.kube_version.lstrip("v").split(".")[:2]
            return {"major": major, "minor": minor, "gitVersion": self.kube_version}
        if parts == ["api"]:
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": self.url.split("//")[1]}
                ],
            }
        if parts == ["apis"]:
            groups = []
            for group, version in RESOURCES:
                if group:
                    gv = {"groupVersion": f"{group}/{version}", "version": version}
                    groups.append({"name": group, "versions": [gv], "preferredVersion": gv})
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if parts == ["api", "v1"] or (len(parts) == 3 and parts[0] == "apis"):
            group, version = ("", "v1") if parts[0] == "api" else (parts[1], parts[2])
            if (group, version) not in RESOURCES:
                return None
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": _group_version(group, version),
                "resources": [
                    {
                        "name": plural,
                        "singularName": kind.lower(),
                        "namespaced": namespaced,
                        "kind": kind,
                        "verbs": _VERBS,
                    }
                    for plural, kind, namespaced in RESOURCES[(group, version)]
                ],
            }
        return None

    @staticmethod
    def _locate(
        parts: list[str],
    ) -> tuple[str, str, str, str | None, str, str | None] | None:
        """(group, version, kind, namespace, collection key, name) of a resource path."""
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not 1 <= len(rest) <= 2:
            return None
        for plural, kind, namespaced in RESOURCES.get((group, version), []):
            if plural == rest[0] and namespaced == (namespace is not None):
                collection = f"{group}/{version}/{namespace}/{plural}"
                return group, version, kind, namespace, collection, (rest[1:] or [None])[0]
        return None

    @staticmethod
    def _stamp(obj: dict[str, Any], namespace: str | None) -> dict[str, Any]:
        stored = copy.deepcopy(obj)
        meta = stored.setdefault("metadata", {})
        if namespace is not None:
            meta.setdefault("namespace", namespace)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(int(meta.get("resourceVersion") or 0) + 1)
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        return stored


@dataclass(frozen=True)
class Render:
    """What one install created: the chart's objects (Helm's release Secret left out)."""

    release: str
    namespace: str
    objects: list[dict[str, Any]]
    result: dict[str, Any]

    def kinds(self) -> list[tuple[str, str]]:
        return sorted((o["kind"], o["metadata"]["name"]) for o in self.objects)

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [
            o
            for o in self.objects
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
        ]
        assert len(found) == 1, f"{len(found)} objects of kind {kind} named {name}: {found}"
        return found[0]


def render_chart(
    chart: Path,
    release: str,
    values: Mapping[str, Any] | None = None,
    *,
    namespace: str = "icespool",
    kube_version: str = "v1.33.0",
) -> Render:
    """``helm install RELEASE CHART -f values`` into a fresh fake cluster; its objects.

    Runs in a child Python process, so Helm's Go runtime (its threads and signal handlers)
    never lives in the test process. Raises HelmRenderError with Helm's own message when
    Helm refuses the chart; any other failure of the child is an AssertionError with its
    output.
    """
    request = {
        "chart": str(chart),
        "release": release,
        "values": dict(values or {}),
        "namespace": namespace,
        "kube_version": kube_version,
    }
    child = subprocess.run(
        [sys.executable, __file__],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert child.returncode in (0, 3), (
        f"the Helm render process failed (exit {child.returncode}):\n"
        f"{child.stdout[-4000:]}\n{child.stderr[-4000:]}"
    )
    answer = json.loads(child.stdout)
    if child.returncode == 3:
        raise HelmRenderError(answer["refused"])
    return Render(release=release, namespace=namespace, **answer)


def _main() -> int:
    """The child: one render request on stdin, its objects (or Helm's refusal) on stdout."""
    request = json.load(sys.stdin)
    try:
        render = _render_in_process(
            Path(request["chart"]),
            request["release"],
            request["values"],
            namespace=request["namespace"],
            kube_version=request["kube_version"],
        )
    except HelmRenderError as exc:
        json.dump({"refused": str(exc)}, sys.stdout)
        return 3
    json.dump({"objects": render.objects, "result": render.result}, sys.stdout)
    return 0


def _render_in_process(
    chart: Path,
    release: str,
    values: Mapping[str, Any] | None = None,
    *,
    namespace: str,
    kube_version: str,
) -> Render:
    import helm_sdkpy  # imported here: it loads Helm's Go runtime into this process

    api = FakeKubeAPI(kube_version=kube_version)
    with api.running(), tempfile.TemporaryDirectory(prefix="helm-render-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig(namespace))
        config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=str(kubeconfig))
        install = helm_sdkpy.Install(config)
        try:
            result = asyncio.run(
                install.run(
                    release_name=release,
                    chart_path=str(chart),
                    values=dict(values or {}),
                    wait=False,
                    timeout=60,
                )
            )
        except helm_sdkpy.HelmError as exc:
            raise HelmRenderError(str(exc)) from exc
    assert not api.unexpected, f"the fake Kubernetes API was asked for {api.unexpected}"
    # Helm stores the release (POST) and marks it deployed (PUT): the install completed.
    assert [r.split()[0] for r in api.release_records] == ["POST", "PUT"], api.release_records
    return Render(release=release, namespace=namespace, objects=api.created, result=result)


if __name__ == "__main__":
    sys.exit(_main())
