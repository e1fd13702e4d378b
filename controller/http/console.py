"""The web console: static pages at `/` and `/console/NAME`, served by the gateway itself.

The console is plain HTML, CSS and ES modules in `web-console/` (package data; no build step, no
CDN). It holds no data, so loading it needs no key (`security.is_open`); every call it makes
goes to the authenticated API with the key the user typed (kept in the tab's sessionStorage).
The files are read once, when the gateway is made, and served from a fixed table: a name that
is not one of them is a 404, whatever it contains (no path is ever joined from the request).
Its pages carry a Content-Security-Policy that allows only this origin's scripts and styles,
images and media from this origin, `blob:` (downloaded artifacts) and `data:` (previews).
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from omnirt.controller.http.errors import HttpError

PREFIX = "/console/"
# Not an identifier, so not mistaken for a subpackage (setuptools warns about such folders).
FOLDER = "web-console"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "media-src 'self' blob: data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'none'"
)
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def is_console(path: str) -> bool:
    """The console's own paths: open to anyone (they are the same static files for everyone)."""
    return path == "/" or path.startswith(PREFIX)


def load_files() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content type) of every console file of a known type."""
    folder = resources.files("omnirt.controller.http").joinpath(FOLDER)
    files: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in TYPES:
            files[entry.name] = (entry.read_bytes(), TYPES[suffix])
    return files


def register(app: web.Application) -> None:
    """Add `GET /` (the console's page) and `GET /console/{name}` (its scripts and styles)."""
    files = load_files()

    def answer(name: str) -> web.Response:
        found = files.get(name)
        if found is None:
            raise HttpError(404, f"no console file {name[:100]!r}")
        body, content_type = found
        return web.Response(body=body, headers={"Content-Type": content_type, "Content-Security-Policy": CSP})

    async def index(request: web.Request) -> web.Response:
        return answer("index.html")

    async def asset(request: web.Request) -> web.Response:
        return answer(request.match_info["name"])

    app.router.add_get("/", index)
    app.router.add_get(PREFIX + "{name}", asset)
