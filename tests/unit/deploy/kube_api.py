"""A stand-in Kubernetes API server that answers discovery only, for `helm install --dry-run=client`.

Only `helm install` prints the chart's NOTES (`helm template` leaves them out), and helm 3.17's
client-side dry run still asks a cluster for its version and API groups before rendering
(helm/helm#13144): this server gives it those for the kinds a rendering holds, answers 404 for
every object (none exists) and takes no write. With `--disable-openapi-validation` nothing else
is asked.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def discovery(kinds: Iterable[tuple[str, str]], minor: str) -> dict[str, Any]:
    """Path -> JSON body of /version, /api, /apis and each group version's resource list."""
    by_version: dict[str, set[str]] = {"v1": set()}
    for api_version, kind in kinds:
        by_version.setdefault(api_version, set()).add(kind)

    def resources(group_version: str) -> dict[str, Any]:
        found = [
            {
                "name": k.lower() + "s",
                "singularName": k.lower(),
                "namespaced": True,
                "kind": k,
                "verbs": ["get"],
            }
            for k in sorted(by_version[group_version])
        ]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": found,
        }

    groups = sorted(v for v in by_version if "/" in v)
    answers: dict[str, Any] = {
        "/version": {"major": "1", "minor": minor, "gitVersion": f"v1.{minor}.0"},
        "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
        "/api/v1": resources("v1"),
        "/apis": {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": gv.split("/")[0],
                    "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                    "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]},
                }
                for gv in groups
            ],
        },
    }
    answers.update({f"/apis/{gv}": resources(gv) for gv in groups})
    return answers


@contextmanager
def kube_api(kinds: Iterable[tuple[str, str]], home: Path, minor: str = "30") -> Iterator[dict[str, str]]:
    """Serve discovery for `kinds` ((apiVersion, kind) pairs) on a free loopback port; yields the
    environment helm needs to use it (KUBECONFIG and helm's own folders, all under `home`)."""
    answers = discovery(kinds, minor)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers.get(self.path.split("?", 1)[0])
            data = json.dumps(body if body is not None else {"kind": "Status", "code": 404}).encode()
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = home / "kubeconfig"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "stand-in", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                ],
                "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "nobody"}}],
                "current-context": "stand-in",
                "users": [{"name": "nobody", "user": {}}],
            }
        )
    )
    try:
        yield {
            "KUBECONFIG": str(config),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
