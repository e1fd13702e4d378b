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

# An absolute path in an exception's text (`/srv/models/x/unet/config.json`); its last part is kept.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~\x00])~?/(?:[^\s'\"/:,;()\[\]]+/)+([^\s'\"/:,;()\[\]]*)")


def redact_paths(text: str, known: Mapping[str, str] | None = None, keep: Iterable[str] = ()) -> str:
    """`text` with the `known` paths replaced by their public names and other absolute paths by
    `.../LASTPART`, so an error never shows the worker's folders. Strings in `keep` stay as they
    are (a model's catalog `source`: the catalog shows it to every client anyway)."""
    for path, name in sorted((known or {}).items(), key=lambda item: -len(item[0])):
        if path and os.path.isabs(os.path.expanduser(path)):
            text = text.replace(path, name)
    kept = {f"\x00{i}\x00": value for i, value in enumerate(v for v in keep if v)}
    for marker, value in kept.items():
        text = text.replace(value, marker)
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
