"""The web console end to end in headless Chromium, against a real controller (`--http`,
`--auth-keys`) and a real worker serving tiny-sd, tiny-wan, tiny-vits and tiny-talking-head (one
session slot).

A user types a key; the model picker starts on a served image model and marks the unserved;
the user generates an image and watches it beside the form (the cold load, progress to the last
step, a live preview, the result, its parameters, its download), runs it again, copies it as
curl, Python and omnirtctl commands (each run here), sees a waiting job's reason and place, uses
the queue as history (thumbnails, filters, cancel), sees the workers as an admin (their slots,
jobs, warm models and memory; drain offered) and as a user (the 403 shown, no drain), dismisses
an error that stays in its tab, finds no broken image on the idle Realtime tab, uses every tab
800 px wide, and runs a realtime session from Chromium's fake microphone. Screenshots of each
view go to test-artifacts/console/. The browser is Debian's
`chromium` (scripts/test.sh installs it); without one, the browser tests skip, saying so. A tiny-wan
video and a tiny-vits clip must play in the browser (their metadata loads, with a duration).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
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
from tests.daemons import Controller, Worker, wait_for
from tests.tools import require_tool

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
    require_tool("chromium", Path(CHROMIUM).exists(), "scripts/test.sh runs apt-get install chromium")
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
    permissions = ["microphone", "clipboard-read", "clipboard-write"]
    context.grant_permissions(permissions, origin=str(http.base_url).rstrip("/"))
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


def wait_job(http: httpx.Client, job_id: str, who: str = "alice") -> dict[str, Any]:
    """The job once it is final."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        job = http.get(f"/v1/jobs/{job_id}", headers=auth(who)).json()["job"]
        if job["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"{job_id} did not finish")


def ran_as(job: dict[str, Any]) -> dict[str, Any]:
    """What a job ran with, from its report (the API does not return the request)."""
    resolved = job["result"]["report"]["config_resolved"]
    keys = ("width", "height", "num_inference_steps", "guidance_scale", "seeds")
    return {"model": job["model"], "task": job["task"], **{k: resolved[k] for k in keys}}


def shown_job(page: Page) -> str:
    return page.evaluate("() => decodeURIComponent(location.hash.split('/')[1] || '')")


def params(page: Page) -> dict[str, str]:
    rows = "rs => rs.map(r => [r.dataset.param, r.querySelector('td').textContent])"
    return dict(page.eval_on_selector_all("#j-params tr", rows))


def tiny_sd_job(http: httpx.Client, who: str = "alice") -> str:
    body = {"model": "tiny-sd", "prompt": "a pebble", "width": 64, "height": 64, "num_inference_steps": 2}
    answer = http.post("/v1/generate", json=body, headers=auth(who))
    assert answer.status_code == 200, answer.text
    return str(answer.json()["result"]["job_id"])


def test_the_picker_starts_on_a_served_image_model_and_marks_the_unserved(page: Page) -> None:
    use_key(page, "alice")
    page.wait_for_selector("#g-model option[value=tiny-sd]", state="attached")
    assert page.input_value("#g-model") == "tiny-sd"  # served and makes pictures (null: an 8x8 dot)
    groups = page.eval_on_selector_all(
        "#g-model optgroup", "gs => gs.map(g => [g.label, [...g.children].map(o => o.value)])"
    )
    (_, served), (label, unserved) = groups
    # The job models a worker serves (tiny-talking-head streams: the Realtime tab's), then the rest.
    assert served == ["null", "tiny-sd", "tiny-vits", "tiny-wan"]
    assert label == "not served by any connected worker" and "unserved-sd" in unserved and len(unserved) > 50
    assert page.is_hidden("#g-unserved")
    page.select_option("#g-model", "unserved-sd")
    assert "No connected worker serves unserved-sd" in page.text_content("#g-unserved")
    assert page.is_hidden("#g-preset")  # a model without presets
    assert page.is_disabled("#g-previews")  # a modular model takes no runtime options per request
    page.select_option("#g-model", "tiny-sd")
    assert page.is_hidden("#g-unserved") and page.is_checked("#g-previews")
    assert "fast" in page.eval_on_selector_all("#g-preset option", "os => os.map(o => o.value)")
    assert page.input_value("#g-preset") == ""  # none unless chosen
    assert page.get_attribute("#g-width", "max")  # the model's limits became the form's bounds


def test_generate_shows_the_live_stage_and_the_result_beside_the_form(page: Page) -> None:
    use_key(page, "alice")
    page.wait_for_selector("#g-model option[value=tiny-sd]", state="attached")
    page.fill("#g-prompt", "a red fox in the snow")
    page.fill("#g-width", "64")
    page.fill("#g-height", "64")
    page.fill("#g-steps", "12")
    page.fill("#g-seed", "5")
    assert page.is_checked("#g-previews")
    page.click("#g-submit")
    page.wait_for_url("**/#job/*")
    # The first tiny-sd job of the module: its worker loads the model for it.
    page.wait_for_selector("#j-stage:has-text('loading model (cold)')", timeout=WAIT_MS)
    page.wait_for_function("() => document.getElementById('j-progress').value === 12", timeout=WAIT_MS)
    assert page.text_content("#j-step").startswith("step 12 / 12")
    page.wait_for_selector("#j-preview-box:not([hidden])", timeout=WAIT_MS)
    assert page.get_attribute("#j-preview", "src").startswith("data:image/jpeg;base64,")
    result = page.wait_for_selector("#j-results img.result", timeout=WAIT_MS)
    page.wait_for_function("() => document.querySelector('#j-results img.result').naturalWidth === 64")
    assert result.get_attribute("src").startswith("blob:")
    page.wait_for_selector("#j-state[data-state=succeeded]")
    assert "done in" in page.text_content("#j-stage") and "cold start" in page.text_content("#j-stage")
    # The form stays, filled as it was, to the left of the result.
    form, panel = page.locator("#generate-form").bounding_box(), page.locator("#job-panel").bounding_box()
    assert form and panel and form["x"] + form["width"] <= panel["x"] and abs(form["y"] - panel["y"]) < 2
    assert page.input_value("#g-prompt") == "a red fox in the snow"
    # The request as a table; what it left to the model's defaults as run, integers as integers.
    shown = params(page)
    assert shown["prompt"] == "a red fox in the snow" and shown["width"] == "64"
    assert shown["num_inference_steps"] == "12" and shown["seed"] == "5" and shown["guidance_scale"] == "7.5"
    assert shown["num_outputs"] == "1 (default)" and shown["previews"] == "on"
    assert page.locator("#j-timings tr[data-stage=load]").text_content().startswith("load (cold start)")
    assert '"worker_id": "w-console"' in page.text_content("#j-report")
    shot(page, "generate-result")
    with page.expect_download() as download:
        page.click("#j-results a:has-text('Download')")
    saved = Path(download.value.path())
    assert saved.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert download.value.suggested_filename.endswith(".png")


def test_run_again_and_copy_as_curl_python_and_omnirtctl(
    page: Page, http: httpx.Client, controller: Controller, tmp_path: Path
) -> None:
    use_key(page, "alice")
    page.wait_for_selector("#g-model option[value=tiny-sd]", state="attached")
    page.fill("#g-prompt", "a lighthouse, it's late")  # a quote the shell commands must keep
    page.fill("#g-steps", "2")
    page.fill("#g-seed", "7")
    page.uncheck("#g-previews")
    page.click("#g-submit")
    page.wait_for_url("**/#job/*")
    first = shown_job(page)
    page.wait_for_selector("#j-state[data-state=succeeded]", timeout=WAIT_MS)
    page.fill("#g-prompt", "something else")  # run again takes the job's request, not the form's
    page.click("#j-again")
    page.wait_for_function("id => !location.hash.endsWith(id)", arg=first)
    second = shown_job(page)
    page.wait_for_selector("#j-state[data-state=succeeded]", timeout=WAIT_MS)
    assert page.input_value("#g-prompt") == "a lighthouse, it's late" and page.is_visible("#generate-form")
    assert params(page)["prompt"] == "a lighthouse, it's late"
    asked = ran_as(wait_job(http, first))
    assert ran_as(wait_job(http, second)) == asked and asked["seeds"] == [7.0]

    require_tool("curl", shutil.which("curl"), "apt-get install curl")
    env = {**os.environ, "OMNIRT_API_KEY": KEYS["alice"], "OMNIRT_CONTROLLER": controller.address}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # omnirtctl
    commands: dict[str, str] = {}
    for kind in ("curl", "python", "cli"):
        page.click(f"[data-copy={kind}]")
        page.wait_for_selector(f"#j-command[data-kind={kind}]")
        commands[kind] = page.evaluate("() => navigator.clipboard.readText()")
        assert commands[kind] == page.text_content("#j-command")
    assert KEYS["alice"] not in "".join(commands.values())  # the key stays in $OMNIRT_API_KEY

    def run(argv: list[str], script: str, folder: str) -> str:
        (tmp_path / folder).mkdir()
        done = subprocess.run(
            argv, input=script, capture_output=True, text=True, env=env, cwd=tmp_path / folder, timeout=120
        )
        assert done.returncode == 0, (script, done.stdout, done.stderr)
        return done.stdout

    queued = json.loads(run(["bash"], commands["curl"], "curl"))["job"]
    assert ran_as(wait_job(http, queued["id"])) == asked
    for kind, argv in (("python", [sys.executable, "-"]), ("cli", ["bash"])):
        run(argv, commands[kind], kind)
        assert list((tmp_path / kind / "outputs").glob("*.png")), kind
        newest = http.get("/v1/jobs?page_size=1", headers=auth("alice")).json()["jobs"][0]
        assert ran_as(newest) == asked, kind


def test_a_waiting_job_says_why_and_how_many_are_ahead(page: Page, http: httpx.Client) -> None:
    use_key(page, "alice")
    page.wait_for_selector("#g-model option[value=unserved-sd]", state="attached")
    page.select_option("#g-model", "unserved-sd")
    page.fill("#g-prompt", "waits")
    page.click("#g-submit")
    page.wait_for_url("**/#job/*")
    first = shown_job(page)
    page.click("#g-submit")
    page.wait_for_function("id => !location.hash.endsWith(id)", arg=first)
    second = shown_job(page)
    page.wait_for_selector("#j-stage:has-text('waiting: no connected worker serves model unserved-sd')")
    ahead = http.get(f"/v1/jobs/{second}", headers=auth("alice")).json()["job"]["queue_position"]
    assert ahead >= 1  # the first one at least
    page.wait_for_selector(f"#j-stage:has-text('· {ahead} ahead')")
    assert page.is_hidden("#j-progress")  # no steps to show before it runs
    shot(page, "generate-waiting")
    page.click("#j-cancel")
    page.wait_for_selector("#j-state[data-state=cancelled]")
    assert http.delete(f"/v1/jobs/{first}", headers=auth("alice")).json()["cancelled"]


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
    assert params(page)["image"] == "start.png"
    first = shown_job(page)
    page.fill("#g-prompt", "")
    page.set_input_files("#g-image", [])
    page.click("#j-again")  # the input file goes again too
    page.wait_for_function("id => !location.hash.endsWith(id)", arg=first)
    page.wait_for_selector("#j-state[data-state=succeeded]", timeout=WAIT_MS)
    assert page.input_value("#g-prompt") == "warmer" and params(page)["image"] == "start.png"


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


def test_the_queue_is_also_the_history(page: Page, http: httpx.Client) -> None:
    done = tiny_sd_job(http)
    r = http.post("/v1/jobs", json={"model": "unserved-sd", "prompt": "waits"}, headers=auth("alice"))
    waiting = r.json()["job"]["id"]  # no worker runs unserved-sd's mode: it waits until cancelled
    use_key(page, "alice")
    page.click("#tabs [data-tab=queue]")
    row = page.wait_for_selector(f"#q-jobs tr[data-job='{waiting}'][data-state=queued]")
    where = row.query_selector("td.where").text_content()
    assert "no connected worker serves model unserved-sd" in where and " ahead" in where
    assert row.query_selector("button.cancel") is not None
    finished = page.wait_for_selector(f"#q-jobs tr[data-job='{done}'][data-state=succeeded]")
    thumb = "id => (document.querySelector(`tr[data-job='${id}'] img.thumb`) || {}).naturalWidth === 64"
    page.wait_for_function(thumb, arg=done)
    assert finished.query_selector("td.run").text_content().endswith("s")  # "1.2 s", "350 ms"
    assert finished.query_selector("td.wait").text_content().endswith("s")
    assert finished.query_selector("button.cancel") is None
    shot(page, "queue-history")
    page.select_option("#q-model", "unserved-sd")
    page.wait_for_selector(f"#q-jobs tr[data-job='{done}']", state="detached")
    models = page.eval_on_selector_all("#q-jobs tbody tr", "rs => rs.map(r => r.children[3].textContent)")
    assert set(models) == {"unserved-sd"}
    page.select_option("#q-model", "")
    page.select_option("#q-state", "JOB_STATE_SUCCEEDED")
    page.wait_for_selector(f"#q-jobs tr[data-job='{waiting}']", state="detached")
    page.wait_for_selector(f"#q-jobs tr[data-job='{done}']")
    page.select_option("#q-state", "")
    page.click(f"#q-jobs tr[data-job='{waiting}'] button.cancel")
    page.wait_for_selector(f"#q-jobs tr[data-job='{waiting}'][data-state=cancelled]")
    state = http.get(f"/v1/jobs/{waiting}", headers=auth("alice")).json()["job"]["state"]
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
    row = f"#q-jobs tr[data-job='{job_id}']"
    page.wait_for_selector(f"{row}[data-state=running]", timeout=WAIT_MS)
    assert "w-console · " in page.text_content(f"{row} td.where")
    page.click(f"{row} a.mono")  # its live stage, beside the form
    page.wait_for_selector("#j-stage:text-matches('^step [1-9][0-9]*/100$')", timeout=WAIT_MS)
    page.click("#tabs [data-tab=queue]")
    page.click(f"{row}[data-state=running] button.cancel")
    page.wait_for_selector(f"#q-jobs tr[data-job='{job_id}'][data-state=cancelled]", timeout=WAIT_MS)
    job = http.get(f"/v1/jobs/{job_id}", headers=auth("alice")).json()["job"]
    assert job["state"] == "JOB_STATE_CANCELLED", job
    assert int(job.get("progress", {}).get("step", 0)) < 100, "stopped at a step, not run to the end"


def console_worker(http: httpx.Client) -> dict[str, Any]:
    """w-console as `GET /v1/workers` lists it (uint64 counts are JSON strings)."""
    (worker,) = [
        w for w in http.get("/v1/workers", headers=auth("root")).json()["workers"] if w["id"] == "w-console"
    ]
    return worker


def finished_on_console_worker(http: httpx.Client, state: str) -> int:
    """The module's jobs in `state` that w-console ran (an admin lists every tenant's)."""
    query = {"states": f"JOB_STATE_{state}", "page_size": "1000"}
    jobs = http.get("/v1/jobs", params=query, headers=auth("root")).json()["jobs"]
    return sum(job.get("worker_id") == "w-console" for job in jobs)


def test_workers_show_their_work_and_drain_to_admins_only(page: Page, http: httpx.Client) -> None:
    before = console_worker(http)
    done, failed = int(before["jobs_succeeded"]) + 1, int(before["jobs_failed"]) + 1
    tiny_sd_job(http)  # tiny-sd warm, one more job done
    bad = {"model": "null", "prompt": "x", "extra": {"sleep_ms_per_step": -1}}  # the worker refuses it
    assert http.post("/v1/generate", json=bad, headers=auth("alice")).status_code == 400
    wait_for(
        lambda: (
            (int(console_worker(http)["jobs_succeeded"]), int(console_worker(http)["jobs_failed"]))
            == (done, failed)
        ),
        10,
        "the worker's heartbeat to count both jobs",
    )
    # The worker's own counts are every job it ran to its end in this module (cancelled ones: neither).
    assert (done, failed) == (
        finished_on_console_worker(http, "SUCCEEDED"),
        finished_on_console_worker(http, "FAILED"),
    )
    use_key(page, "root")
    page.click("#tabs [data-tab=workers]")
    card = page.wait_for_selector("#w-workers [data-worker=w-console]")
    warm = card.query_selector("table.warm tr[data-model=tiny-sd]")
    assert warm is not None and re.fullmatch(r"tiny-sd[\d.]+ (KiB|MiB|GiB)", warm.text_content())
    assert re.fullmatch(r"\d / 1 busy", card.query_selector(".slots").text_content())
    assert card.query_selector(".jobs").text_content() == f"{done} done · {failed} failed"
    assert card.query_selector("[data-field=Device]").text_content() == "cpu · cpu backend"
    assert card.query_selector(".heartbeat").text_content().endswith(" ago")
    assert card.query_selector("button.drain") is not None
    assert page.is_hidden("#w-models")  # the catalog is folded away
    assert re.search(r"\d+ models, 5 served", page.text_content("#w-catalog-summary"))
    shot(page, "workers")
    page.click("#w-catalog summary")
    page.wait_for_selector("#w-models tr[data-model=tiny-sd]")
    use_key(page, "alice")
    denied = page.wait_for_selector("#w-denied:not([hidden])")
    assert "admin key" in denied.text_content() and "PERMISSION_DENIED" in denied.text_content()
    assert page.locator("button.drain").count() == 0
    assert page.locator("#w-workers [data-worker]").count() == 0
    page.wait_for_selector("#w-models tr[data-model=tiny-sd]")  # where models are warm: for everyone
    shot(page, "workers-user")


def test_errors_belong_to_their_tab_and_can_be_dismissed(page: Page) -> None:
    use_key(page, "alice")
    page.wait_for_selector("#g-model option[value=null]", state="attached")
    page.select_option("#g-model", "null")
    page.click("#g-submit")  # no prompt
    alert = page.wait_for_selector("[data-alert=generate]:not([hidden])")
    assert "prompt: required" in alert.text_content()
    assert "invalid" in (page.get_attribute("#g-prompt", "class") or "")
    page.click("#tabs [data-tab=queue]")
    page.wait_for_function("() => document.getElementById('q-count').textContent !== ''")
    assert page.locator("[data-alert]:visible").count() == 0  # not the Queue tab's
    page.click("#tabs [data-tab=generate]")
    # Still the Generate tab's (the tab shows on the hashchange, a moment after the click).
    page.wait_for_selector("[data-alert=generate]", state="visible", timeout=5000)
    assert page.is_disabled("#g-previews")  # the null pipeline takes no runtime options
    page.fill("#g-prompt", "a dot")
    page.click("#g-submit")  # a later success clears it
    page.wait_for_selector("[data-alert=generate]", state="hidden")
    page.wait_for_selector("#j-state[data-state=succeeded]")
    page.click("#tabs [data-tab=realtime]")
    page.click("#r-start")  # no portrait
    alert = page.wait_for_selector("[data-alert=realtime]:not([hidden])")
    assert "portrait" in alert.text_content()
    alert.query_selector("button.dismiss").click()
    page.wait_for_selector("[data-alert=realtime]", state="hidden")


def test_the_idle_realtime_tab_shows_no_broken_image(page: Page) -> None:
    use_key(page, "alice")
    page.click("#tabs [data-tab=realtime]")
    page.wait_for_selector("#r-model option[value=tiny-talking-head]", state="attached")
    assert page.is_visible("#r-placeholder") and page.is_hidden("#r-video")
    # An <img> on screen that is not a loaded picture is a broken image.
    broken = "() => [...document.images].filter(i => i.offsetParent && !(i.complete && i.naturalWidth))"
    assert page.evaluate(f"{broken}.length") == 0
    shot(page, "realtime-idle")


def test_every_tab_is_usable_800_px_wide(page: Page, http: httpx.Client) -> None:
    job_id = tiny_sd_job(http, "root")  # not from this tab: its parameters come from its report
    page.set_viewport_size({"width": 800, "height": 900})
    use_key(page, "root")
    page.evaluate("id => { location.hash = 'job/' + id; }", job_id)
    page.wait_for_selector("#j-results img.result", timeout=WAIT_MS)
    form, panel = page.locator("#generate-form").bounding_box(), page.locator("#job-panel").bounding_box()
    assert form and panel and panel["y"] >= form["y"] + form["height"]  # stacked
    # The gateway's JSON has config_resolved's 64.0 (a Struct's double): shown as 64.
    assert params(page)["width"] == "64 (as run)" and page.is_visible("#j-request-note")
    assert page.is_disabled("#j-again")
    for tab, ready in (
        ("generate", "#j-results img.result"),
        ("queue", f"#q-jobs tr[data-job='{job_id}']"),
        ("workers", "#w-workers [data-worker=w-console]"),
        ("realtime", "#r-placeholder"),
    ):
        page.click(f"#tabs [data-tab={tab}]")
        page.wait_for_selector(ready)
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 800, tab
        shot(page, f"800px-{tab}")


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
    assert page.is_visible("#r-video") and page.is_hidden("#r-placeholder")
    assert "streaming the microphone" in page.text_content("#r-status")
    shot(page, "realtime")
    page.click("#r-stop")
    page.wait_for_selector("#r-start:not([disabled])", timeout=WAIT_MS)
