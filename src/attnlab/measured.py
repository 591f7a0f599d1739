"""What this machine measured, kept on disk per machine and library version, so that a later process pays nothing.

Choices made by timing (the layout in which each weight shape streams fastest,
whether a compiled decode step beats the eager one) depend on the CPU, the
threads and the libraries, and take seconds to tens of seconds to make. They
are kept in one JSON file per machine and version::

    $ATTNLAB_CACHE/measured/<key>.json    ($ATTNLAB_CACHE: $XDG_CACHE_HOME/attnlab, else ~/.cache/attnlab)

``<key>`` is a digest of :func:`fingerprint`: the CPU's model and flags, the
cores, torch's threads, and the Python, torch and attnlab versions (attnlab's
with a digest of its source, so a changed kernel counts as a new version). Another
machine, another thread count or a new torch reads another file, so a choice
measured elsewhere is never trusted; the file also holds the fingerprint it
was made under, and one that differs is measured anew. An entry a caller can
no longer use (a kernel whose toolchain went away) is measured again by that
caller.

A measurement whose deciding passes were not steady (:func:`steady`: they spread
past :data:`SETTLED`, as they do while another program holds the machine) is
used and kept as unsettled, and the next process that would use it measures it
again, :data:`TRIES` times at most (:func:`unsettled`).

``ATTNLAB_MEASURE=0`` skips measuring: what is kept is still used, nothing new
is timed (the plain defaults stand in for it). It governs what ``generate`` decides on its own; an
explicit ``quantize("int8")``, which asks for the fastest kernel, times them where
nothing is kept (:mod:`attnlab.linear.int8_choice`). Each write is atomic (a
temporary file in the folder, then ``os.replace``), merged with the file as it
is just before: an interrupted write leaves the last whole file. A folder that
cannot be written costs a measurement in the next process, never the call.
A measurement is announced on the ``attnlab`` logger at WARNING level (shown
on stderr unless logging is set up otherwise): a pause of seconds deserves a line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Collection, Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import torch

import attnlab

LOG = logging.getLogger("attnlab")
ENV_FOLDER = "ATTNLAB_CACHE"
ENV_MEASURE = "ATTNLAB_MEASURE"
SCHEMA = "attnlab.measured/1"
_OFF, _ON = ("0", "off", "no", "false"), ("", "1", "on", "yes", "true")


def folder() -> Path:
    """Where measurements are kept: ``$ATTNLAB_CACHE/measured``, the cache folder defaulting to
    ``$XDG_CACHE_HOME/attnlab`` or ``~/.cache/attnlab``."""
    base = os.environ.get(ENV_FOLDER) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "attnlab"
    )
    return Path(base) / "measured"


def measuring() -> bool:
    """Whether a choice that is not kept may be measured now (``ATTNLAB_MEASURE``, on unless 0/off/no/false)."""
    value = os.environ.get(ENV_MEASURE, "").strip().lower()
    if value not in (*_OFF, *_ON):
        raise ValueError(f"{ENV_MEASURE} must be 1 (measure once per machine) or 0 (never measure), got {value!r}")
    return value not in _OFF


@cache
def _cpu() -> tuple[str, str]:
    """The CPU's model name and a digest of its flags, from /proc/cpuinfo (the platform's name elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = fields.get("flags") or fields.get("Features") or ""
    return fields.get("model name", platform.machine()), hashlib.sha256(flags.encode()).hexdigest()[:16]


@cache
def _source() -> str:
    """A digest of attnlab's own source files: a changed kernel is a new version even where the number is not."""
    digest = hashlib.sha256()
    root = Path(attnlab.__file__).parent
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".cpp") and path.is_file():
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def fingerprint() -> dict[str, str]:
    """What a measurement depends on: the CPU, its cores, torch's threads and the versions (attnlab's with a
    digest of its source)."""
    model, flags = _cpu()
    return {
        "cpu": model,
        "cpu_flags": flags,
        "cores": str(os.cpu_count()),
        "threads": str(torch.get_num_threads()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "attnlab": f"{attnlab.__version__}+{_source()}",
    }


def store_file() -> Path:
    """This machine's and version's file of measurements."""
    digest = hashlib.sha256(json.dumps(fingerprint(), sort_keys=True).encode()).hexdigest()[:16]
    return folder() / f"{digest}.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    fits = isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("fingerprint") == fingerprint()
    return data if fits and isinstance(data.get("entries"), dict) else {}


def recall(section: str, key: str) -> dict[str, Any] | None:
    """The entry kept for ``key`` in ``section`` on this machine and version; None where there is none."""
    entry = _read(store_file()).get("entries", {}).get(section, {}).get(key)
    return entry if isinstance(entry, dict) else None


def remember(section: str, key: str, entry: dict[str, Any]) -> Path | None:
    """Keep ``entry`` for ``key`` in ``section``, atomically; the file, or None where it cannot be written."""
    path = store_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read(path) or {"schema": SCHEMA, "fingerprint": fingerprint(), "entries": {}}
        data["entries"].setdefault(section, {})[key] = entry
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as out:
                json.dump(data, out, indent=1, sort_keys=True)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as error:
        LOG.warning("attnlab: could not keep a measurement in %s (%s); the next process measures again", path, error)
        return None
    return path


Name = TypeVar("Name", bound=str)  # what a choice names its candidates by: a layout, a kernel
SETTLED = 0.25  # the project's noise rule: deciding passes that spread wider ((max - min) / median) are not steady
TRIES = 3  # measurements of one choice at most, where none is steady: the last is kept


def spread_but_one(passes: list[float]) -> float:
    """(max - min) / median of ``passes`` less the one farthest from their median (one disturbed repeat may
    stray, as a layout may lose one repeat by the margin rule); 0 for fewer than 3 passes or a median of 0."""
    if len(passes) < 3:
        return 0.0
    middle = statistics.median(passes)
    kept = sorted(passes, key=lambda rate: abs(rate - middle))[:-1]
    centre = statistics.median(kept)
    return (max(kept) - min(kept)) / centre if centre > 0 else 0.0


def steady(passes: Mapping[Name, list[float]], deciding: Collection[Name]) -> bool:
    """Whether the passes of every name in ``deciding`` spread at most :data:`SETTLED` (:func:`spread_but_one`)."""
    return all(spread_but_one(passes[name]) <= SETTLED for name in deciding if name in passes)


def unsettled(entry: dict[str, Any]) -> bool:
    """Whether a kept entry is to be measured again by a later process: it was not steady, and was measured fewer
    than :data:`TRIES` times. An entry kept without these fields counts as settled."""
    tries = entry.get("tries", TRIES)
    return entry.get("settled", True) is False and isinstance(tries, int) and tries < TRIES


def due(entry: dict[str, Any]) -> bool:
    """Whether a kept ``entry`` is to be measured again now: measuring is on and it is :func:`unsettled`. (Its
    callers keep what this process measured for the rest of it: a model with twelve weights of one shape measures
    that shape once a process.)"""
    return measuring() and unsettled(entry)


def keep(section: str, key: str, entry: dict[str, Any], *, read: dict[str, Any] | None, usable: bool) -> None:
    """Keep a new measurement (with ``settled``) for ``key``; ``read``: the entry the caller read before it measured,
    ``usable``: whether the caller could use it. The store is read again just before the write: an entry another
    process kept meanwhile, settled, is not replaced by an unsettled one; otherwise the new one is kept, counted as
    one more try of the unsettled one it replaces (a usable one, or another process's made meanwhile), else as 1."""
    latest = recall(section, key)
    changed = latest != read  # another process wrote it while this one measured
    if changed and latest is not None and latest.get("settled", True) is True and entry["settled"] is False:
        return
    base = latest if changed else read if usable else None
    tries = base["tries"] + 1 if base is not None and unsettled(base) else 1
    remember(section, key, entry | {"tries": tries})


def announce(what: str, *, again: bool = False) -> None:
    """One line before a measurement: what is timed, where it is kept, how to skip it; ``again``: a measurement
    kept before was not steady, and is taken anew."""
    when = "again on this machine: the last measurement was not steady" if again else "once on this machine"
    LOG.warning("attnlab: measuring %s %s (kept in %s; %s=0 skips it)", what, when, folder(), ENV_MEASURE)
    for handler in LOG.handlers or logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
