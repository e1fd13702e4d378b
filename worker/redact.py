"""What a client may see of the worker's file system in an error: nothing but last names.

Errors go from the worker to whoever submitted the job; a path in them tells a stranger where the
worker keeps its models and what else lies there ("File name too long: '/home/svc/.cache/omnirt/
models/...'"). `redact_paths` replaces known folders by public names (`MODEL_DIR`, a model's
catalog source) and any other absolute path by `.../LASTPART`; the worker logs the full text.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping

from omnirt import types as t

# One part of a path: what an exception's text has between slashes.
_PART = r"[^\s'\"/:,;()\[\]]"
# An absolute path in an exception's text (`/srv/models/x/unet/config.json`), or the path of a
# `file://` URI; its last part is kept. Not after a word, `:` or `/` (`1/2`, `org/name`, URLs).
_ABSOLUTE_PATH = re.compile(rf"(?:(?<=file://)|(?<![\w.:/~\x00]))~?/(?:{_PART}+/)+({_PART}*)")


def _replace_whole(text: str, path: str, by: str) -> str:
    """`text` with `path` replaced by `by` where it is all of a path, not part of a longer name
    (`/srv/models` in `/srv/models2/x` or `/data/srv/models`)."""
    return re.sub(rf"(?<!{_PART}){re.escape(path)}(?!{_PART})", lambda _: by, text)


def redact_paths(text: str, known: Mapping[str, str] | None = None, keep: Iterable[str] = ()) -> str:
    """`text` with the `known` paths replaced by their public names and other absolute paths by
    `.../LASTPART`, so an error never shows the worker's folders. Strings in `keep` stay as they
    are (a model's catalog `source`: the catalog shows it to every client anyway)."""
    for path, name in sorted((known or {}).items(), key=lambda item: -len(item[0])):
        if path and os.path.isabs(os.path.expanduser(path)):
            text = _replace_whole(text, path, name)
    kept = {f"\x00{i}\x00": value for i, value in enumerate(v for v in keep if v)}
    for marker, value in kept.items():
        text = _replace_whole(text, value, marker)
    text = _ABSOLUTE_PATH.sub(lambda m: ".../" + m.group(1), text)
    for marker, value in kept.items():
        text = text.replace(marker, value)
    return text


def public_error(
    error: t.JobError, known: Mapping[str, str] | None = None, keep: Iterable[str] = ()
) -> t.JobError:
    """`error` with `redact_paths` applied to its message."""
    message = redact_paths(error.message, known, keep)
    return error if message == error.message else dataclasses.replace(error, message=message)
