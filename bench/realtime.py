"""Realtime sessions: the tiny talking head at 1, 2 and 4 sessions, the relay's cost, speech's first byte.

One `omnirt-controller --http` and one `omnirt-worker --models tiny-talking-head,tiny-vits
--session-slots 4 --torch-threads 1` (legacy_call: one worker serves both). Each chunk is 1.12 s
of 16 kHz pcm_s16le (17,920 samples) in, 28 JPEG frames of 64x64 out.

- **Sessions.** At each concurrency, that many clients (one thread each, the sync SDK's
  `Client.open_session`) open a session, wait for each other, then stream `chunks` chunks:
  `fast` sends them all at once (the server takes them as flow control lets it), `paced`
  sends one every 1.12 s (real time). Per concurrency: the first chunk's latency (first chunk
  handed to the SDK -> chunk 1 received), each chunk's `latency_ms` (the worker's: its input
  complete -> its send), the time between chunks at the client, the real-time factor (media
  out / wall time from the first send to the last chunk), the largest `SessionProgress.lag_ms`
  and the `SessionReport`.
- **Relay cost.** The same chunks pushed in this process (`TalkingHeadPipeline.open(...).push`
  plus the worker's JPEG encode, `omnirt.worker.realtime.media.jpeg_frames`) and through OmniRT
  (one session, client -> controller -> worker -> back, each chunk sent when the last came
  back), alternating which goes first each round (ABAB). OmniRT's added cost per chunk is the
  median of the rounds' differences.
- **Speech.** `POST /v1/audio/speech` on `tiny-vits` (`response_format` wav, `stream_format`
  audio): time to the first byte of the audio and to the last.

    python -m bench.realtime --chunks 8 --concurrency 1,2,4 --paced 1 --json out.json
    python -m bench.suite --only realtime
"""

from __future__ import annotations

import argparse
import http.client
import io
import itertools
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from PIL import Image

import omnirt

from . import _machine
from . import _scenario as sc
from ._daemons import Controller, Worker
from ._stacks import wait_connected
from ._stats import percentile

NAME = "realtime"
TITLE = "Realtime sessions: tiny talking head at 1, 2, 4 sessions, relay cost per chunk, speech first byte"
MODEL = "tiny-talking-head"
SPEECH_MODEL = "tiny-vits"
CHUNK = 17920
RATE = 16000
CHUNK_S = CHUNK / RATE
SLOTS = 4
ADDED_TARGET_MS = 5.0


@dataclass(frozen=True)
class Settings:
    """Sizes of the realtime scenario; the defaults are the full run."""

    chunks: int = 8  # chunks each session streams
    concurrency: tuple[int, ...] = (1, 2, 4)  # sessions at once, audio as fast as taken
    paced: tuple[int, ...] = (1,)  # sessions at once, audio in real time (1.12 s a chunk)
    relay_chunks: int = 12  # ABAB rounds of the relay-cost case
    speech_calls: int = 5  # timed POST /v1/audio/speech calls

    @classmethod
    def quick(cls) -> Settings:
        return replace(cls(), chunks=3, concurrency=(1, 2), relay_chunks=6, speech_calls=3)


def portrait() -> bytes:
    """A 64x64 PNG of seeded noise: the reference image of every session."""
    rng = np.random.default_rng(3)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def tone(index: int) -> np.ndarray:
    """One chunk of int16 PCM, a tone of its own per index."""
    t = np.arange(CHUNK) / RATE
    return (0.3 * np.sin(2 * np.pi * (180 + 40 * (index % 16)) * t) * 32767).astype(np.int16)


def _pct(values: list[float], pct: float) -> float:
    return round(percentile(values, pct), 2)


def _stream(
    client: omnirt.Client, index: int, settings: Settings, paced: bool, go: threading.Barrier
) -> dict:
    """One client's session: open, wait for the others, stream, read everything back."""
    audio = [tone(index * 100 + i).astype("<i2").tobytes() for i in range(settings.chunks)]
    opened = time.perf_counter()
    with client.open_session(MODEL, image=portrait(), config={"seed": index + 1}) as session:
        ready_ms = (time.perf_counter() - opened) * 1000
        go.wait(timeout=300)
        sent: list[float] = []

        def send() -> None:
            start = time.perf_counter()
            for i, pcm in enumerate(audio):
                if paced:
                    time.sleep(max(0.0, start + i * CHUNK_S - time.perf_counter()))
                sent.append(time.perf_counter())
                session.send_audio(pcm)
            session.end()

        sender = threading.Thread(target=send, name=f"bench-send-{index}")
        sender.start()
        arrivals, latencies, lags, sequences = [], [], [0.0], []
        for chunk in session:
            arrivals.append(time.perf_counter())
            latencies.append(chunk.latency_ms)
            sequences.append(chunk.sequence)
            if session.progress is not None:  # the progress that followed the chunk before
                lags.append(session.progress.lag_ms)
        sender.join()
        if session.progress is not None:
            lags.append(session.progress.lag_ms)
        closed = session.closed
    assert closed is not None, "the session ended without SessionClosed"
    report = closed.report
    wall_s = arrivals[-1] - sent[0] if arrivals else 0.0
    return {
        "ready_ms": ready_ms,
        "sequences": sequences,
        "first_chunk_ms": (arrivals[0] - sent[0]) * 1000 if arrivals else 0.0,
        "latency_ms": latencies,
        "client_latency_ms": [(a - s) * 1000 for a, s in zip(arrivals, sent, strict=False)],
        "client_gap_ms": [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)],
        "rtf_wall": len(arrivals) * CHUNK_S / wall_s if wall_s else 0.0,
        "lag_max_ms": max(lags),
        "reason": closed.reason,
        "report": {
            "chunks_in": report.chunks_in,
            "chunks_out": report.chunks_out,
            "first_chunk_latency_ms": round(report.first_chunk_latency_ms, 2),
            "mean_chunk_latency_ms": round(report.mean_chunk_latency_ms, 2),
            "real_time_factor": round(report.real_time_factor, 3),
            "underruns": report.underruns,
        },
    }


def sessions_at(client: omnirt.Client, settings: Settings, concurrency: int, paced: bool) -> dict[str, Any]:
    """`concurrency` sessions streaming at once, one thread each; their figures pooled."""
    go = threading.Barrier(concurrency)
    results: list[dict | BaseException] = [RuntimeError("no result")] * concurrency

    def one(i: int) -> None:
        try:
            results[i] = _stream(client, i, settings, paced, go)
        except BaseException as exc:  # reported below, in the caller's thread
            go.abort()
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,), name=f"bench-session-{i}") for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    done = [r for r in results if isinstance(r, dict)]
    pooled = {
        key: [v for r in done for v in r[key]] for key in ("latency_ms", "client_latency_ms", "client_gap_ms")
    }
    first = [r["first_chunk_ms"] for r in done]
    reports = [r["report"] for r in done]
    return {
        "mode": "paced" if paced else "fast",
        "concurrency": concurrency,
        "chunks_per_session": settings.chunks,
        "in_order": all(r["sequences"] == list(range(1, settings.chunks + 1)) for r in done),
        "reasons": sorted({r["reason"] for r in done}),
        "ready_ms_p50": _pct([r["ready_ms"] for r in done], 50),
        "first_chunk_ms_p50": _pct(first, 50),
        "first_chunk_ms_p99": _pct(first, 99),
        **{f"{key}_p{p}": _pct(values, p) for key, values in pooled.items() for p in (50, 99)},
        "rtf_wall_p50": round(sc.median([r["rtf_wall"] for r in done]), 3),
        "rtf_wall_min": round(min(r["rtf_wall"] for r in done), 3),
        "lag_max_ms": round(max(r["lag_max_ms"] for r in done), 2),
        "report": {
            "chunks_out": sum(r["chunks_out"] for r in reports),
            "first_chunk_latency_ms_p50": _pct([r["first_chunk_latency_ms"] for r in reports], 50),
            "mean_chunk_latency_ms_max": max(r["mean_chunk_latency_ms"] for r in reports),
            "real_time_factor_min": min(r["real_time_factor"] for r in reports),
            "underruns": sum(r["underruns"] for r in reports),
        },
    }


def relay_cost(client: omnirt.Client, model_dir: Path, rounds: int) -> dict[str, Any]:
    """The same chunks in this process and through OmniRT, alternating; per-chunk medians."""
    from omnirt.worker.pipelines.talking_head import TalkingHeadPipeline
    from omnirt.worker.realtime import media
    from omnirt.worker.tiny.registry import ensure_builtin

    pipe = TalkingHeadPipeline.from_pretrained(ensure_builtin(MODEL, model_dir), "cpu")
    direct = pipe.open(Image.open(io.BytesIO(portrait())), seed=11)
    local_ms, omnirt_ms, worker_ms, added_ms = [], [], [], []
    with client.open_session(MODEL, image=portrait(), config={"seed": 11}) as session:
        chunks = iter(session)

        def local(i: int) -> float:
            started = time.perf_counter()
            media.jpeg_frames(direct.push(tone(i)).frames)
            return (time.perf_counter() - started) * 1000

        def through(i: int) -> float:
            started = time.perf_counter()
            session.send_audio(tone(i).astype("<i2").tobytes())
            chunk = next(chunks)
            elapsed = (time.perf_counter() - started) * 1000
            worker_ms.append(chunk.latency_ms)
            return elapsed

        local(0), through(0)  # warm-up: the first push pays torch's first-call costs
        worker_ms.clear()
        for r in range(rounds):
            i = r + 1
            if r % 2 == 0:
                a, b = local(i), through(i)
            else:
                b, a = through(i), local(i)
            local_ms.append(a)
            omnirt_ms.append(b)
            added_ms.append(b - a)
        session.end()
        rest = list(chunks)
        report = session.closed.report if session.closed else None
    direct.close()
    assert not rest, f"{len(rest)} chunks more than sent"
    chunks_out = report.chunks_out if report else 0
    push_ms = (
        chunks_out * CHUNK_S * 1000 / report.real_time_factor if report and report.real_time_factor else 0.0
    )
    return {
        "rounds": rounds,
        "direct_ms_p50": round(sc.median(local_ms), 2),
        "omnirt_ms_p50": round(sc.median(omnirt_ms), 2),
        "worker_latency_ms_p50": round(sc.median(worker_ms), 2),
        "worker_push_ms_mean": round(push_ms / chunks_out, 2) if chunks_out else 0.0,
        "added_ms_p50": round(sc.median(added_ms), 2),
        "added_ms_min": round(min(added_ms), 2),
        "added_ms_max": round(max(added_ms), 2),
        "transport_ms_p50": round(sc.median([o - w for o, w in zip(omnirt_ms, worker_ms, strict=True)]), 2),
        "chunks_out": chunks_out,
    }


def speech_first_byte(base_url: str, calls: int) -> dict[str, Any]:
    """`POST /v1/audio/speech` on tiny-vits, one at a time: first byte and last byte, p50."""
    url = urlsplit(base_url)
    body = json.dumps(
        {
            "model": SPEECH_MODEL,
            "input": "Hello from the realtime benchmark.",
            "voice": "alloy",
            "response_format": "wav",
            "stream_format": "audio",
            "seed": 3,
        }
    )
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=120)
    first_ms, total_ms, sizes, audio_ms = [], [], [], []
    try:
        for call in range(calls + 1):  # the first is a warm-up (the model loads)
            started = time.perf_counter()
            conn.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            head = response.read(1)
            first = time.perf_counter()
            data = head + response.read()
            done = time.perf_counter()
            if response.status != 200:
                raise RuntimeError(f"speech call {response.status}: {data[:300]!r}")
            if call:
                first_ms.append((first - started) * 1000)
                total_ms.append((done - started) * 1000)
                sizes.append(len(data))
                audio_ms.append(float(response.getheader("X-OmniRT-Duration-Ms") or 0))
    finally:
        conn.close()
    return {
        "calls": calls,
        "first_byte_ms_p50": round(sc.median(first_ms), 2),
        "last_byte_ms_p50": round(sc.median(total_ms), 2),
        "bytes_p50": int(sc.median(sizes)),
        "audio_ms_p50": round(sc.median(audio_ms), 1),
    }


def measure(settings: Settings, ctx: sc.Context) -> dict[str, Any]:
    """Start the daemons, warm up, run every case; the numbers."""
    import torch

    from omnirt.worker.tiny.registry import ensure_builtin

    from .suite import quiet_libraries  # the suite imports this module

    quiet_libraries()
    torch.set_num_threads(ctx.torch_threads)  # the same as the worker's --torch-threads
    started = time.perf_counter()
    for name in (MODEL, SPEECH_MODEL):  # built here, so the worker's first load only loads
        ensure_builtin(name, ctx.model_dir)
    build_s = round(time.perf_counter() - started, 2)
    slots = max(SLOTS, *settings.concurrency, *settings.paced)
    controller = Controller(ctx.log_dir, http=True).start()
    worker = Worker(
        ctx.log_dir,
        controller.address,
        f"w-{NAME}",
        ctx.model_dir,
        "--backend", "cpu", "--models", f"{MODEL},{SPEECH_MODEL}",
        "--session-slots", str(slots), "--torch-threads", str(ctx.torch_threads),
    )  # fmt: skip
    try:
        worker.start()
        wait_connected(controller, [worker])
        with omnirt.Client(controller.address, timeout=120) as client:
            sessions_at(client, replace(settings, chunks=1), 1, paced=False)  # loads the model
            relay = relay_cost(client, ctx.model_dir, settings.relay_chunks)
            runs = [sessions_at(client, settings, c, paced=False) for c in settings.concurrency]
            runs += [sessions_at(client, settings, c, paced=True) for c in settings.paced]
        speech = speech_first_byte(controller.http, settings.speech_calls)
    finally:
        worker.stop()
        controller.stop()
    return {
        "model_build_s": build_s,
        "session_slots": slots,
        "sessions": runs,
        "relay": relay,
        "speech": speech,
    }


def _rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    fast = [s for s in result["sessions"] if s["mode"] == "fast"]
    paced = [s for s in result["sessions"] if s["mode"] == "paced"]
    relay, speech = result["relay"], result["speech"]

    def per_c(runs: list[dict[str, Any]], key: str, fmt: Any) -> str:
        return ", ".join(f"c{s['concurrency']} {fmt(s[key])}" for s in runs)

    added = relay["added_ms_p50"]
    ms, rtf = sc.fmt_ms, "x{:.2f}".format
    rows = [
        sc.Row(NAME, "first chunk p50, audio as fast as taken", per_c(fast, "first_chunk_ms_p50", ms)),
        sc.Row(NAME, "real-time factor per session p50, as fast as taken", per_c(fast, "rtf_wall_p50", rtf)),
        sc.Row(
            NAME,
            "OmniRT's added time per chunk vs the pipeline in-process (ABAB medians)",
            f"{'+' if added >= 0 else ''}{ms(added)} on {ms(relay['omnirt_ms_p50'])}",
            f"in-process {sc.fmt_ms(relay['direct_ms_p50'])}",
            sc.ratio(relay["omnirt_ms_p50"], relay["direct_ms_p50"]),
            f"added <= {ADDED_TARGET_MS:g} ms",
            "met" if added <= ADDED_TARGET_MS else "missed",
        ),
        sc.Row(
            NAME,
            "of which the relay: time through OmniRT minus the worker's latency_ms (median)",
            sc.fmt_ms(relay["transport_ms_p50"]),
            f"worker latency_ms {sc.fmt_ms(relay['worker_latency_ms_p50'])}",
        ),
    ]  # fmt: skip
    for s in paced:
        latency = f"{sc.fmt_ms(s['latency_ms_p50'])} / {sc.fmt_ms(s['latency_ms_p99'])}"
        case = f"audio in real time, c{s['concurrency']}: worker latency p50 / p99, lag max"
        rows.append(sc.Row(NAME, case, f"{latency}, {sc.fmt_ms(s['lag_max_ms'])}"))
    first, last = sc.fmt_ms(speech["first_byte_ms_p50"]), sc.fmt_ms(speech["last_byte_ms_p50"])
    rows.append(
        sc.Row(NAME, "POST /v1/audio/speech tiny-vits: first byte p50 (last byte)", f"{first} ({last})")
    )
    return [r.as_dict() for r in rows]


def run(settings: Settings, ctx: sc.Context) -> dict[str, Any]:
    """The scenario, as the suite runs it."""
    result = {
        "settings": sc.settings_dict(settings),
        "commit": _machine.describe().get("git_commit", ""),
        "started_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        **measure(settings, ctx),
    }
    result["rows"] = _rows(result)
    return result


def command(settings: dict[str, Any]) -> str:
    """The command line that runs these settings alone."""
    counts = {key: ",".join(str(c) for c in settings[key]) for key in ("concurrency", "paced")}
    return (
        f"python -m bench.realtime --chunks {settings['chunks']} --concurrency {counts['concurrency']} "
        f"--paced {counts['paced']} --relay-chunks {settings['relay_chunks']} "
        f"--speech-calls {settings['speech_calls']}"
    )


def _sessions_table(result: dict[str, Any]) -> str:
    header = [
        "audio", "sessions", "first chunk p50 / p99", "worker latency_ms p50 / p99",
        "client: between chunks p50 / p99", "client: sent -> received p50 / p99",
        "real-time factor p50 (min)", "report RTF min", "lag max", "underruns",
    ]  # fmt: skip

    def pair(run: dict[str, Any], key: str) -> str:
        return f"{sc.fmt_ms(run[key + '_p50'])} / {sc.fmt_ms(run[key + '_p99'])}"

    rows = [
        [
            "as fast as taken" if r["mode"] == "fast" else "real time",
            r["concurrency"],
            pair(r, "first_chunk_ms"),
            pair(r, "latency_ms"),
            pair(r, "client_gap_ms"),
            pair(r, "client_latency_ms"),
            f"x{r['rtf_wall_p50']:.2f} (x{r['rtf_wall_min']:.2f})",
            f"x{r['report']['real_time_factor_min']:.2f}",
            sc.fmt_ms(r["lag_max_ms"]),
            r["report"]["underruns"],
        ]
        for r in result["sessions"]
    ]
    return sc.md_table(header, rows, right=2)


def _relay_table(relay: dict[str, Any]) -> str:
    ms = sc.fmt_ms
    spread = f"{ms(relay['added_ms_min'])} to {ms(relay['added_ms_max'])}"
    rows = [
        ["in-process: `push` + JPEG encode", ms(relay["direct_ms_p50"])],
        ["through OmniRT: audio handed to the SDK -> its chunk received", ms(relay["omnirt_ms_p50"])],
        ["of which in the worker: `latency_ms` (input complete -> sent)", ms(relay["worker_latency_ms_p50"])],
        ["the worker's push (report: media / RTF, mean, first chunk in)", ms(relay["worker_push_ms_mean"])],
        ["the relay: through OmniRT minus the worker's `latency_ms`", ms(relay["transport_ms_p50"])],
        [f"**OmniRT's added time**: through OmniRT minus in-process, per round ({spread})",
         f"**{ms(relay['added_ms_p50'])}**"],
    ]  # fmt: skip
    return sc.md_table(["per chunk (medians)", ""], rows)


def markdown(result: dict[str, Any]) -> str:
    """The scenario's section of docs/BENCHMARKS.md."""
    s, relay, speech = result["settings"], result["relay"], result["speech"]
    ms = sc.fmt_ms
    verdict = "within" if relay["added_ms_p50"] <= ADDED_TARGET_MS else "over"
    setup = (
        f"`{command(s)}` (or `python -m bench.suite --only realtime`; measured at commit "
        f"`{result.get('commit') or 'unknown'}`, {result.get('started_at', '')}): one `omnirt-controller "
        f"--http` and one `omnirt-worker --models {MODEL},{SPEECH_MODEL} --session-slots "
        f"{result['session_slots']} --torch-threads 1` (legacy_call), after a warm-up session. A chunk "
        "is 1.12 s of 16 kHz pcm_s16le in, 28 JPEG frames of 64x64 out. Each session is one client "
        f"thread of the sync SDK (`Client.open_session`) streaming {s['chunks']} chunks; the sessions of "
        "a row start together. *As fast as taken*: all the audio handed over at once (the server "
        "takes it as flow control lets it); *real time*: one chunk every 1.12 s. *First chunk*: the "
        "first chunk handed to the SDK -> chunk 1 received. *latency_ms*: the worker's (the chunk's "
        "input complete -> the chunk sent; with all the audio at once it includes the wait behind the "
        "chunks before). *Real-time factor*: media out / wall time from the first send to the last "
        "chunk (above 1 keeps up; in real time the input bounds it); the report's is media / time "
        "in the model's pushes. *Lag*: the largest `SessionProgress.lag_ms`."
    )
    relay_setup = (
        f"**The relay's cost**: one session, {relay['rounds']} rounds, each chunk sent when the one "
        "before came back; the in-process call and the call through OmniRT take turns to go first "
        "(ABAB). In-process is the same `TalkingHeadPipeline` `open(...).push(pcm)` plus the worker's "
        "JPEG encode (Pillow, quality 90) in the benchmark process. Through OmniRT adds the SDK, gRPC "
        "to the controller, its relay to the worker's session stream and back, the worker's buffering, "
        "threads and conversions, and the 28 JPEGs and 35 KiB of audio each chunk carries back."
    )
    added, spread = relay["added_ms_p50"], relay["added_ms_max"] - relay["added_ms_min"]
    if added >= 0:
        headline = f"OmniRT added **{ms(added)}** a chunk to a {ms(relay['direct_ms_p50'])} push and encode"
    else:
        headline = (
            f"Through OmniRT a chunk came back **{ms(-added)} sooner** than the "
            f"{ms(relay['direct_ms_p50'])} push and encode in-process"
        )
    relay_text = (
        f"{headline} (median of the rounds), {verdict} the issue's goal of {ADDED_TARGET_MS:g} ms; the "
        f"rounds spread over {ms(spread)}, so at this load the difference of two pushes in two processes "
        "cannot resolve a few milliseconds. The relay itself (the SDK, gRPC both ways, the controller, "
        f"the worker's stream), timed on the same chunks, took **{ms(relay['transport_ms_p50'])}**: the "
        f"rest of a chunk's time is in the worker, whose `latency_ms` ({ms(relay['worker_latency_ms_p50'])}) "
        f"holds its push ({ms(relay['worker_push_ms_mean'])} on average, the session's first chunk "
        "included), the same encode and its hand-offs between threads."
    )
    speech_text = (
        f"**Speech** (`POST /v1/audio/speech`, `{SPEECH_MODEL}`, `response_format` wav, "
        f"`stream_format` audio, {speech['calls']} calls one at a time after a warm-up): first byte "
        f"**{ms(speech['first_byte_ms_p50'])}**, last byte {ms(speech['last_byte_ms_p50'])} (p50), "
        f"{speech['bytes_p50']:,} bytes, {speech['audio_ms_p50']:,.0f} ms of audio. The job runs to "
        "its end before the first byte leaves (docs/http.md), so the first byte waits for the whole clip."
    )
    return "\n\n".join(
        [setup, _sessions_table(result), relay_setup, _relay_table(relay), relay_text, speech_text]
    )


SCENARIO = sc.Scenario(NAME, TITLE, Settings(), Settings.quick(), run, markdown, needs_models=False)


def _counts(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if any(v < 1 or v > 64 for v in values):
        raise argparse.ArgumentTypeError(f"session counts from 1 to 64, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.realtime", description=__doc__.split("\n")[0])
    d = Settings()
    parser.add_argument(
        "--chunks", type=int, default=d.chunks, help=f"chunks per session (default {d.chunks})"
    )
    parser.add_argument(
        "--concurrency",
        type=_counts,
        default=d.concurrency,
        help="sessions at once, comma-separated (default 1,2,4)",
    )
    parser.add_argument(
        "--paced",
        type=_counts,
        default=d.paced,
        help="the same with audio in real time (default 1; '' for none)",
    )
    parser.add_argument(
        "--relay-chunks", type=int, default=d.relay_chunks, help=f"ABAB rounds (default {d.relay_chunks})"
    )
    parser.add_argument("--speech-calls", type=int, default=d.speech_calls, help=f"default {d.speech_calls}")
    parser.add_argument("--model-dir", type=Path, help="tiny models folder (default: a fresh temporary one)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)  # fmt: skip
    if min(args.chunks, args.relay_chunks, args.speech_calls) < 1:
        parser.error("--chunks, --relay-chunks and --speech-calls must be at least 1")
    settings = Settings(args.chunks, args.concurrency, args.paced, args.relay_chunks, args.speech_calls)
    with tempfile.TemporaryDirectory(prefix="omnirt-bench-") as tmp:
        ctx = sc.Context(log_dir=Path(tmp), model_dir=args.model_dir or Path(tmp) / "models", torch_threads=1)
        return sc.run_alone(run, settings, ctx, args.json)


if __name__ == "__main__":
    sys.exit(main())
