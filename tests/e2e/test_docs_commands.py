"""The commands in README.md and docs/*.md run as written on a fresh clone.

Every shell block (```bash / ```sh, and the `$ ` lines of a transcript) and every inline code
span that starts with one of our programs is parsed with shlex: each `--flag` must appear in the
`--help` of the program (and subcommand) it is given to, and each repository path a command
names must exist. The README's "Using it" block and its Python snippet, and the Python snippets
of docs/sdk.md, then run for real against the daemons they start, on free ports.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.daemons import RedisServer, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = ROOT / ".venv" / "bin"
DAEMONS = ("omnirt-controller", "omnirt-worker")
# Folders whose files a doc command may name (relative to the repository root).
REPO_DIRS = ("scripts/", "examples/", "deploy/", "bench/", "docs/", "proto/", "tests/")
SHELL_FENCES = ("bash", "sh", "shell")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PROGRAM = re.compile(r"^(\.venv/bin/|python -m bench\.)|^(omnirtctl|omnirt-controller|omnirt-worker)( |$)")


@dataclass(frozen=True)
class Command:
    """One simple command of a doc (no pipes or `&&`), with where it was found."""

    doc: str
    line: int
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {shlex.join(self.argv)}"


def shell_texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, shell text) of every shell block and command-like inline span of a doc."""
    text = path.read_text()
    fenced = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 2
        fenced.append((m.start(), m.end()))
        if m.group(1) in SHELL_FENCES:
            yield line, m.group(2)
        elif not m.group(1):  # a transcript: the `$ ` lines are commands, the rest output
            rows = m.group(2).replace("\\\n", " ").splitlines()
            yield from ((line + i, row[2:] + "\n") for i, row in enumerate(rows) if row.startswith("$ "))
    for m in INLINE.finditer(text):
        if any(start <= m.start() < end for start, end in fenced):
            continue
        if PROGRAM.match(m.group(1)) and "|" not in m.group(1):  # `--mode a | b` lists choices
            yield text.count("\n", 0, m.start()) + 1, m.group(1) + "\n"


def split_commands(doc: str, line: int, text: str) -> Iterator[Command]:
    """The simple commands of a shell text: continuations joined, comments dropped, and split
    at `;`, `&`, `&&`, `|`, `||`, `(`, `)`; `VAR=value` prefixes and `for`/`do` words skipped."""
    text = text.replace("\\\n", " ")
    for offset, row in enumerate(text.splitlines()):
        lexer = shlex.shlex(row, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        argv: list[str] = []
        for token in [*lexer, ";"]:
            if token and set(token) <= set(";&|()"):
                while argv and (re.match(r"^[A-Z_]+=", argv[0]) or argv[0] in ("do", "then", "time")):
                    argv.pop(0)
                if argv and argv[0] not in ("for", "done", "fi", "if", "while"):
                    yield Command(doc, line + offset, tuple(argv))
                argv = []
            else:
                argv.append(token)


def doc_commands() -> list[Command]:
    return [
        command
        for path in DOCS
        for line, text in shell_texts(path)
        for command in split_commands(path.relative_to(ROOT).as_posix(), line, text)
    ]


COMMANDS = doc_commands()


def program_of(argv: tuple[str, ...]) -> tuple[list[str], list[str]] | None:
    """(the command that runs the program, its arguments) for one of ours, else None."""
    name = argv[0].removeprefix(".venv/bin/")
    if name in ("python", "python3") and argv[1:2] == ("-m",) and argv[2].startswith("bench."):
        return [str(BIN / "python"), "-m", argv[2]], list(argv[3:])
    if name in ("omnirtctl", *DAEMONS):
        return [str(BIN / name)], list(argv[1:])
    return None


@functools.cache
def help_text(*command: str) -> str:
    done = subprocess.run(
        [*command, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60, env=_env()
    )
    assert done.returncode == 0, f"{shlex.join(command)} --help: {done.stderr[-2000:]}"
    return done.stdout


@functools.cache
def subcommands(*command: str) -> frozenset[str]:
    """The subcommands an argparse `--help` lists (the indented names under COMMAND)."""
    return frozenset(re.findall(r"^    (\w+)(?:\s|$)", help_text(*command), re.M))


def flags_of(argument: str) -> str | None:
    if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", argument):
        return argument.split("=", 1)[0]
    return None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OMNIRT_CONTROLLER", None)
    return env


def test_the_docs_have_commands_to_check() -> None:
    ours = [c for c in COMMANDS if program_of(c.argv)]
    assert len(ours) > 20, [str(c) for c in COMMANDS]
    assert {c.doc for c in ours} >= {"README.md", "docs/operations.md", "docs/cli.md"}


def test_every_flag_a_doc_command_uses_is_in_its_help() -> None:
    wrong = []
    for command in COMMANDS:
        found = program_of(command.argv)
        if found is None:
            continue
        base, args = found
        path: list[str] = []
        for arg in args:
            flag = flags_of(arg)
            if flag is not None:
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text(*base, *path)):
                    wrong.append(f"{command}  ({flag} is not in `{shlex.join([*base, *path])} --help`)")
            elif base[-1].endswith("omnirtctl") and arg in subcommands(*base, *path):
                path.append(arg)
    assert not wrong, "\n".join(wrong)


def made_by_the_operator(path: Path) -> bool:
    """A file the docs have the operator make (secrets) in a folder git ignores all of."""
    ignore = path.parent / ".gitignore"
    return ignore.is_file() and ignore.read_text().split()[:1] == ["*"]


def test_every_repository_path_a_doc_command_names_exists() -> None:
    missing = []
    for command in COMMANDS:
        for arg in command.argv:
            value = arg.split("=", 1)[-1].removeprefix("./")
            if value.startswith(REPO_DIRS) and "..." not in value and not (ROOT / value).exists():
                if made_by_the_operator(ROOT / value):
                    continue
                missing.append(f"{command}  ({value})")
    assert not missing, "\n".join(missing)


def catalog_names() -> set[str]:
    """Model ids and aliases of the built-in catalog and of the Kubernetes example's catalog."""
    import tomllib

    import yaml

    from omnirt.controller.core.catalog import Catalog

    names = set()
    for spec in Catalog.load():
        names |= {spec.id, *spec.aliases}
    config_map = yaml.safe_load((ROOT / "deploy/k8s/catalog.yaml").read_text())
    for model in tomllib.loads(config_map["data"]["catalog.toml"])["models"]:
        names |= {model["id"], *model.get("aliases", [])}
    return names


def test_every_model_a_doc_command_names_is_in_a_catalog() -> None:
    names, unknown = catalog_names(), []
    for command in COMMANDS:
        found = program_of(command.argv)
        for flag, value in itertools.pairwise(found[1] if found else []):
            if flag in ("--model", "-m", "--models") and not value.isupper():  # MODEL: a placeholder
                unknown += [f"{command}  ({name})" for name in value.split(",") if name not in names]
    assert not unknown, "\n".join(unknown)


def test_the_readme_can_run_top_to_bottom_without_a_port_clash() -> None:
    """Each daemon the README starts listens on an address of its own, and each worker dials
    a controller started above it."""
    listening: list[str] = []
    for command in (c for c in COMMANDS if c.doc == "README.md"):
        argv = [a.split("=", 1)[-1] if a.startswith("--") else a for a in command.argv]
        options = dict(itertools.pairwise(argv))
        name = argv[0].removeprefix(".venv/bin/")
        if name == "omnirt-controller" and len(argv) > 1:
            for flag in ("--listen", "--http"):
                if flag in options:
                    assert options[flag] not in listening, f"{command}: {options[flag]} is taken above"
                    listening.append(options[flag])
        if name == "omnirt-worker" and "--controller" in options:
            assert options["--controller"] in listening, f"{command}: no controller started there"
    assert len(listening) >= 3


def test_the_docs_install_from_the_checkout_not_from_pypi() -> None:
    # `omnirt` on PyPI is someone else's package.
    wrong = [str(c) for c in COMMANDS if c.argv[:3] in (("pip", "install", "omnirt"),)]
    for path in DOCS:
        wrong += [
            f"{path.name}: {m.group(0)}"
            for m in re.finditer(r"pip install omnirt\b(?![\w/\[.-])", path.read_text())
        ]
    assert not wrong, wrong


# ---- the README's "Using it" and the SDK guide, run -----------------------------------------


def section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def blocks(text: str, fence: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(text) if m.group(1) == fence]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder to run the docs in: `.venv` links to the checkout's, outputs land here."""
    path = tmp_path_factory.mktemp("docs")
    (path / ".venv").symlink_to(ROOT / ".venv")
    return path


@dataclass(frozen=True)
class Readme:
    """The daemons the README's first block left running, and what the block printed."""

    address: str
    http: str
    env: dict[str, str]
    output: str

    def run(self, block: str, workdir: Path) -> str:
        """Run a later README block as written, against these daemons' ports."""
        script = block.replace("127.0.0.1:50051", self.address).replace("localhost:8080", self.http)
        done = subprocess.run(
            ["bash", "-ec", script], cwd=workdir, env=self.env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout


@pytest.fixture(scope="module")
def readme(workdir: Path, model_dir: Path) -> Iterator[Readme]:
    """Runs the README's "Using it" block as written (ports rewritten) and keeps its daemons up
    for the blocks and snippets after it."""
    block = blocks(section(ROOT / "README.md", "Using it"), "bash")[0]
    address, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    assert "127.0.0.1:50051" in block
    script = block.replace("127.0.0.1:50051", address).replace("127.0.0.1:8080", http)
    env = {**_env(), "OMNIRT_MODEL_DIR": str(model_dir), "OMNIRT_CONTROLLER": address}
    # The block leaves its daemons in the background; this shell stops them when told (stdin).
    wrapper = f"set -e\n{script}\necho '== block done'\nread _ || true\nkill $(jobs -p)\nwait\n"
    out, log = workdir / "block.out", workdir / "daemons.log"
    shell = subprocess.Popen(
        ["bash", "-c", wrapper],
        cwd=workdir,
        env=env,
        stdin=subprocess.PIPE,
        stdout=out.open("w"),
        stderr=log.open("w"),  # the daemons log to stderr
        start_new_session=True,  # its own process group, to stop whatever it left running
    )
    assert shell.stdin is not None
    try:
        wait_for(lambda: "== block done" in out.read_text() or shell.poll() is not None, 90, "the block")
        assert "== block done" in out.read_text(), out.read_text()[-3000:] + log.read_text()[-3000:]
        yield Readme(address, http, env, out.read_text())
    finally:
        shell.stdin.close()
        try:
            shell.wait(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)


def run_python(snippet: str, workdir: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", snippet], cwd=workdir, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_the_readme_using_it_block_runs(readme: Readme, workdir: Path) -> None:
    output = readme.output
    images = list((workdir / "outputs").glob("job-*-0.png"))
    assert len(images) == 1 and images[0].read_bytes().startswith(b"\x89PNG"), output[-3000:]
    assert "tiny-sd" in output and "text2image" in output  # `models list` and the run report
    jobs = json.loads(output[output.index("[\n") :].split("\n]\n", 1)[0] + "\n]")
    assert [j["state"] for j in jobs] == ["succeeded"]


def test_the_readme_python_snippet_runs(readme: Readme, workdir: Path) -> None:
    address, env = readme.address, readme.env
    snippet = blocks(section(ROOT / "README.md", "Using it"), "python")[0]
    assert "127.0.0.1:50051" in snippet
    output = run_python(snippet.replace("127.0.0.1:50051", address), workdir, env)
    assert (workdir / "fox.png").read_bytes().startswith(b"\x89PNG")
    assert "denoise" in output  # the timings


@pytest.mark.parametrize("heading", ["One call", "Client", "asyncio"])
def test_the_sdk_guide_snippets_run(heading: str, readme: Readme, workdir: Path) -> None:
    address, env = readme.address, readme.env
    (snippet,) = blocks(section(ROOT / "docs" / "sdk.md", heading), "python")
    run_python(snippet.replace("127.0.0.1:50051", address), workdir, env)


def test_the_readme_http_block_runs(readme: Readme, workdir: Path) -> None:
    text = section(ROOT / "README.md", "Using it")
    block = next(b for b in blocks(text, "bash") if "curl" in b)
    assert "localhost:8080" in block
    output = readme.run(block, workdir)
    decoder = json.JSONDecoder()
    generated, end = decoder.raw_decode(output)  # curl -s prints no newline after a body
    openai, end = decoder.raw_decode(output, end)
    metrics = output[end:]
    assert generated["job"]["state"] == "JOB_STATE_SUCCEEDED" and openai["data"]
    assert 'omnirt_queue_depth{model="tiny-sd"} 0.0' in metrics


def test_the_readme_redis_block_runs(readme: Readme, workdir: Path, tmp_path: Path) -> None:
    text = section(ROOT / "README.md", "Using it")
    block = next(b for b in blocks(text, "bash") if "--store redis://" in b)
    redis_server = RedisServer(tmp_path).start()
    ports = [free_port(), free_port()]
    script = block.replace("redis://127.0.0.1:6379/0", redis_server.url)
    for old, port in zip(sorted(set(re.findall(r"127\.0\.0\.1:5005\d", script))), ports, strict=True):
        script = script.replace(old, f"127.0.0.1:{port}")
    # Both controllers answer (as the block leaves them, in the background), then stop.
    ready = "".join(
        f"until .venv/bin/omnirtctl -c 127.0.0.1:{p} workers list >/dev/null 2>&1; do sleep 0.2; done\n"
        for p in ports
    )
    try:
        readme.run(f"{script}{ready}kill $(jobs -p)\nwait\n", workdir)
    finally:
        redis_server.stop()


def test_the_readme_network_block_runs(tmp_path: Path, model_dir: Path) -> None:
    """Keys, a worker token, and one generation with the key, as written (port rewritten); the
    same controller refuses a call without the key."""
    block = blocks(section(ROOT / "README.md", "On a network"), "bash")[0]
    port = free_port()
    script = block.replace("127.0.0.1:50054", f"127.0.0.1:{port}")
    refused = (
        f"OMNIRT_API_KEY= .venv/bin/omnirtctl --controller 127.0.0.1:{port} models list && exit 9 || true\n"
    )
    env = {**_env(), "OMNIRT_MODEL_DIR": str(model_dir)}
    env.pop("OMNIRT_API_KEY", None)
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    # Files, not pipes: the daemons the block leaves in the background keep its output open.
    out_path, err_path = tmp_path / "block.out", tmp_path / "block.err"
    with out_path.open("w") as out_file, err_path.open("w") as err_file:
        shell = subprocess.Popen(
            ["bash", "-ec", f"{script}\n{refused}"],
            cwd=tmp_path, env=env, stdout=out_file, stderr=err_file,
            start_new_session=True,  # its own process group: the daemons it leaves are stopped below
        )  # fmt: skip
        try:
            shell.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGTERM)
    out, err = out_path.read_text(), err_path.read_text()
    assert shell.returncode == 0, out[-2000:] + err[-2000:]
    assert list((tmp_path / "outputs").glob("job-*-0.png")), out[-2000:] + err[-2000:]
    assert "UNAUTHENTICATED" in err
    assert "sha256" in (tmp_path / "keys.toml").read_text()
