"""The web console end to end in headless Chromium, against a real controller (`--http`,
`--auth-keys`) and a real worker serving tiny-sd, tiny-wan, tiny-vits and tiny-talking-head (one
session slot).

A user types a key, generates an image and watches it (progress to the last step, a live
preview, the result, its download), cancels a queued job from the queue, sees the workers as an
admin (drain offered) and as a user (the 403 shown, no drain), and runs a realtime session from
Chromium's fake microphone. Screenshots go to test-artifacts/console/. The browser is Debian's
`chromium` (scripts/test.sh installs it); without one, the browser tests skip, saying so. A tiny-wan
video and a tiny-vits clip must play in the browser (their metadata loads, with a duration).
"""

from __future__ import annotations

import asyncio
import base64
import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import httpx
import pytest
from PIL import Image

import omnirt.controller.http
from omnirt.controller.edges.auth import key_digest
from omnirt.controller.http.console import CSP
from tests.conftest import USER_CATALOG
from tests.daemons import Controller, Worker

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

KEYS = {"alice": "sk-console-alice-0123456789abcdef", "root": "sk-console-root-0123456789abcdef"}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WAIT_MS = 60_000


def key_file(folder: Path) -> Path:
    lines = []
    for name, key in KEYS.items():
        role = "admin" if name == "root" else "user"
        lines += ["[[keys]]", f'tenant = "{name}"', f'role = "{role}"', f'sha256 = "{key_digest(key)}"']
    path = folder / "keys.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}


def portrait_png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 150, 120)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def controller(log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    folder = tmp_path_factory.mktemp("console")
    catalog = folder / "user.toml"
    catalog.write_text(USER_CATALOG)
    keys = key_file(folder)
    args = ("--catalog", str(catalog), "--auth-keys", str(keys))
    daemon = Controller(log_dir, *args, http=True, api_key=KEYS["root"]).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    models = ("--models", "tiny-sd,tiny-wan,tiny-vits,tiny-talking-head,null", "--session-slots", "1")
    daemon = Worker(log_dir, controller.address, "w-console", model_dir, *models).start()
    controller.wait_worker("w-console", timeout=120)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def http(controller: Controller, worker: Worker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=controller.http, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.skip("no chromium on this machine (apt-get install chromium; scripts/test.sh tries)")
    from playwright.sync_api import sync_playwright

    args = ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, http: httpx.Client, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh tab (its own sessionStorage) that fails the test on a script error or a CSP report.

    Waits are functions, not strings: a string is eval'd in the page, which its CSP refuses."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    context.grant_permissions(["microphone"], origin=str(http.base_url).rstrip("/"))
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    tab.on(
        "console",
        lambda message: (
            problems.append(message.text)
            if message.type == "error" and "Content Security Policy" in message.text
            else None
        ),
    )
    tab.goto(str(http.base_url))
    yield tab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"{request.node.name}-end.png"), full_page=True)
    context.close()
    assert not problems, problems


def use_key(page: Page, who: str) -> None:
    page.fill("#api-key", KEYS[who])
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#key-state:has-text('key set')")


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


# ---- without a browser -----------------------------------------------------------------------


def test_the_console_loads_without_a_key_and_the_api_still_needs_one(http: httpx.Client) -> None:
    index = http.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert index.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
    assert index.headers["x-frame-options"] == "DENY"
    script = http.get("/console/app.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    for missing in ("/console/nope.js", "/console/..%2Fconsole.py", "/console/"):
        r = http.get(missing)
        assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND", missing
    assert http.get("/v1/jobs").status_code == 401
    assert http.get("/v1/jobs", headers=auth("alice")).status_code == 200


def test_a_browser_websocket_sends_its_key_as_a_subprotocol(http: httpx.Client) -> None:
    url = str(http.base_url).replace("http://", "ws://") + "/v1/avatar/realtime"

    def offer(key: str) -> list[str]:
        encoded = base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")
        return ["omnirt.v1", f"omnirt.bearer.{encoded}"]

    async def handshake(protocols: list[str]) -> Any:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(url, protocols=protocols) as ws:
                    return ws.protocol
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    assert asyncio.run(handshake(offer(KEYS["alice"]))) == "omnirt.v1"  # the key is never echoed
    assert asyncio.run(handshake(offer("sk-wrong"))) == 401
    assert asyncio.run(handshake(["omnirt.v1", "omnirt.bearer.!!"])) == 401
    assert asyncio.run(handshake(["omnirt.v1"])) == 401


def test_the_console_never_writes_html_from_data() -> None:
    # API data (model ids, errors, job fields) reaches the page as text nodes only (dom.js `el`).
    folder = Path(omnirt.controller.http.__file__).with_name("web-console")
    scripts = {p.name: p.read_text() for p in folder.glob("*.js")}
    assert "dom.js" in scripts and "app.js" in scripts
    for name, text in scripts.items():
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, (name, sink)


# ---- in the browser --------------------------------------------------------------------------


def test_generate_watch_and_download_an_image(page: Page) -> None:
    use_key(page, "alice")
    page.wait_for_selector("#g-model option[value=tiny-sd]", state="attached")
    served = page.eval_on_selector_all("#g-model option", "os => os.slice(0, 5).map(o => o.value)")
    # Served job models first (a streaming model is for the Realtime tab), then the others.
    assert served[:4] == ["null", "tiny-sd", "tiny-vits", "tiny-wan"] and served[4] != "tiny-talking-head"
    page.select_option("#g-model", "unserved-sd")
    assert page.is_hidden("#g-preset")  # a model without presets
    page.select_option("#g-model", "tiny-sd")
    assert "fast" in page.eval_on_selector_all("#g-preset option", "os => os.map(o => o.value)")
    assert page.input_value("#g-preset") == ""  # none unless chosen
    assert page.get_attribute("#g-width", "max")  # the model's limits became the form's bounds
    page.fill("#g-prompt", "a red fox in the snow")
    page.fill("#g-width", "64")
    page.fill("#g-height", "64")
    page.fill("#g-steps", "12")
    page.fill("#g-seed", "5")
    assert page.is_checked("#g-previews")
    shot(page, "generate")
    page.click("#g-submit")
    page.wait_for_url("**/#job/*")
    page.wait_for_function("() => document.getElementById('j-progress').value === 12", timeout=WAIT_MS)
    assert page.text_content("#j-step").startswith("step 12 / 12")
    page.wait_for_selector("#j-preview-box:not([hidden])", timeout=WAIT_MS)
    assert page.get_attribute("#j-preview", "src").startswith("data:image/jpeg;base64,")
    result = page.wait_for_selector("#j-results img.result", timeout=WAIT_MS)
    page.wait_for_function("() => document.querySelector('#j-results img.result').naturalWidth === 64")
    assert result.get_attribute("src").startswith("blob:")
    page.wait_for_selector("[data-field=State]:has-text('succeeded')")
    assert page.locator("#j-timings tbody tr").count() > 0
    assert '"worker_id": "w-console"' in page.text_content("#j-report")
    shot(page, "job")
    with page.expect_download() as download:
        page.click("#j-results a:has-text('Download')")
    saved = Path(download.value.path())
    assert saved.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert download.value.suggested_filename.endswith(".png")


def test_an_uploaded_image_drives_an_image2image_job(page: Page, tmp_path: Path) -> None:
    picture = tmp_path / "start.png"
    picture.write_bytes(portrait_png())
    use_key(page, "alice")
    page.wait_for_selector("#g-model option[value=tiny-sd]", state="attached")
    page.select_option("#g-model", "tiny-sd")
    page.select_option("#g-task", "TASK_IMAGE2IMAGE")
    assert page.is_visible("#g-image") and page.is_hidden("#g-mask")
    page.set_input_files("#g-image", str(picture))
    page.fill("#g-prompt", "warmer")
    page.fill("#g-steps", "2")
    page.uncheck("#g-previews")
    page.click("#g-submit")
    page.wait_for_selector("[data-field=Task]:has-text('image2image')")
    page.wait_for_selector("#j-results img.result", timeout=WAIT_MS)
    page.wait_for_selector("[data-field=State]:has-text('succeeded')")
    assert page.is_hidden("#j-preview-box")  # previews were not asked for


@pytest.mark.parametrize(
    ("model", "fields", "player"),
    [
        ("tiny-wan", {"#g-frames": "5", "#g-steps": "2", "#g-width": "32", "#g-height": "32"}, "video"),
        ("tiny-vits", {}, "audio"),
    ],
)
def test_a_video_or_audio_result_plays_in_the_browser(
    page: Page, model: str, fields: dict[str, str], player: str
) -> None:
    """The result's player is one the browser can decode: its metadata loads and has a duration."""
    use_key(page, "alice")
    page.wait_for_selector(f"#g-model option[value={model}]", state="attached")
    page.select_option("#g-model", model)
    page.fill("#g-prompt", "hello there")
    for selector, value in fields.items():
        page.fill(selector, value)
    page.uncheck("#g-previews")
    page.click("#g-submit")
    element = page.wait_for_selector(f"#j-results {player}", timeout=WAIT_MS)
    assert element.get_attribute("src").startswith("blob:")
    page.wait_for_function(
        "s => { const p = document.querySelector(s); return p.readyState >= 1 && p.duration > 0; }",
        arg=f"#j-results {player}",
        timeout=WAIT_MS,
    )
    page.wait_for_selector("[data-field=State]:has-text('succeeded')")
    shot(page, f"result-{player}")


def test_the_queue_shows_a_job_and_cancels_it(page: Page, http: httpx.Client) -> None:
    r = http.post("/v1/jobs", json={"model": "unserved-sd", "prompt": "waits"}, headers=auth("alice"))
    job_id = r.json()["job"]["id"]  # no worker runs unserved-sd's mode: it waits until cancelled
    use_key(page, "alice")
    page.click("#tabs [data-tab=queue]")
    row = page.wait_for_selector(f"#q-jobs tr[data-job='{job_id}'][data-state=queued]")
    assert "unserved-sd" in row.text_content()
    shot(page, "queue")
    row.query_selector("button.cancel").click()
    page.wait_for_selector(f"#q-jobs tr[data-job='{job_id}']", state="detached")
    page.select_option("#q-state", "JOB_STATE_CANCELLED")
    page.wait_for_selector(f"#q-jobs tr[data-job='{job_id}'][data-state=cancelled]")
    state = http.get(f"/v1/jobs/{job_id}", headers=auth("alice")).json()["job"]["state"]
    assert state == "JOB_STATE_CANCELLED"


def test_the_queue_cancels_a_running_job(page: Page, http: httpx.Client) -> None:
    body = {
        "model": "null",
        "prompt": "slow",
        "num_inference_steps": 100,
        "extra": {"sleep_ms_per_step": 200},
    }
    job_id = http.post("/v1/jobs", json=body, headers=auth("alice")).json()["job"]["id"]  # 20 s
    use_key(page, "alice")
    page.click("#tabs [data-tab=queue]")
    row = page.wait_for_selector(f"#q-jobs tr[data-job='{job_id}'][data-state=running]", timeout=WAIT_MS)
    row.query_selector("button.cancel").click()
    page.wait_for_selector(f"#q-jobs tr[data-job='{job_id}']", state="detached", timeout=WAIT_MS)
    job = http.get(f"/v1/jobs/{job_id}", headers=auth("alice")).json()["job"]
    assert job["state"] == "JOB_STATE_CANCELLED", job
    assert int(job.get("progress", {}).get("step", 0)) < 100, "stopped at a step, not run to the end"


def test_workers_show_warm_models_and_drain_to_admins_only(page: Page, http: httpx.Client) -> None:
    warm = http.post(
        "/v1/generate",
        json={"model": "tiny-sd", "prompt": "warm", "width": 64, "height": 64, "num_inference_steps": 2},
        headers=auth("alice"),
    )
    assert warm.status_code == 200, warm.text
    use_key(page, "root")
    page.click("#tabs [data-tab=workers]")
    row = page.wait_for_selector("#w-workers tr[data-worker=w-console]")
    assert "tiny-sd" in row.query_selector("td.warm").text_content()
    assert row.query_selector("button.drain") is not None
    page.wait_for_selector("#w-models tr[data-model=tiny-sd]")
    shot(page, "workers-admin")
    use_key(page, "alice")
    denied = page.wait_for_selector("#w-denied:not([hidden])")
    assert "admin key" in denied.text_content() and "PERMISSION_DENIED" in denied.text_content()
    assert page.locator("button.drain").count() == 0
    assert page.is_hidden("#w-workers")
    page.wait_for_selector("#w-models tr[data-model=tiny-sd]")  # where models are warm: for everyone
    shot(page, "workers-user")


def test_a_realtime_session_from_the_microphone_shows_video(page: Page, tmp_path: Path) -> None:
    face = tmp_path / "face.png"
    face.write_bytes(portrait_png())
    use_key(page, "alice")
    page.click("#tabs [data-tab=realtime]")
    page.wait_for_selector("#r-model option[value=tiny-talking-head]", state="attached")
    page.set_input_files("#r-portrait", str(face))
    page.click("#r-start")
    page.wait_for_function(
        "() => Number(document.getElementById('r-counts').dataset.frames || 0) >= 4", timeout=WAIT_MS
    )
    page.wait_for_function("() => document.getElementById('r-video').naturalWidth > 0")
    assert "streaming the microphone" in page.text_content("#r-status")
    shot(page, "realtime")
    page.click("#r-stop")
    page.wait_for_selector("#r-start:not([disabled])", timeout=WAIT_MS)
