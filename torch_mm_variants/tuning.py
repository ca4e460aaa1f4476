"""The measured mode of algorithm="auto" and a look at what auto picks.

With MM_VARIANTS_AUTOTUNE=1 (or true, yes, on) in the environment, or after `set_autotune(True)`,
the first call of `auto` for a (device, dtype, layout, shape bucket) times every eligible kernel
on the real inputs and keeps the fastest. Choices are saved to a JSON file in the user's cache
directory, one file per torch and package version (the GPU's name is part of each key), and are
reused by later processes, measured mode or not; processes that measure at once merge their
choices into it (`<file>.lock` orders their saves). Nothing is measured during CUDA graph capture
or torch.compile tracing.
"""
from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import torch

from . import _C
from .nn import check_matmul_operand, check_tensor, not_a_tensor
from .version import __version__

AUTOTUNE_ON = ("1", "true", "yes", "on")
AUTOTUNE_OFF = ("0", "false", "no", "off", "")


def autotune_requested() -> bool:
    """Whether MM_VARIANTS_AUTOTUNE asks for the measured mode: 1, true, yes or on, in any case and
    with any surrounding spaces. Unset, empty, 0, false, no and off leave it off, and so does any
    other value, with a warning, so that a misspelt value does not pass unnoticed."""
    value = os.environ.get("MM_VARIANTS_AUTOTUNE", "")
    word = value.strip().lower()
    if word not in AUTOTUNE_ON + AUTOTUNE_OFF:
        warnings.warn(f"MM_VARIANTS_AUTOTUNE={value!r} is not understood, so the measured mode of "
                      f"algorithm='auto' stays off; accepted values: {', '.join(AUTOTUNE_ON)} "
                      f"(on), {', '.join(AUTOTUNE_OFF[:-1])} or empty (off)")
    return word in AUTOTUNE_ON


# The file each folder setting (with the HOME that ~ reads) was first taken to name.
_placed: dict[tuple[str, str | None], Path] = {}


def cache_file() -> Path:
    """The JSON file that keeps measured choices (MM_VARIANTS_CACHE_DIR overrides its folder).
    A leading ~ is the home directory, and a relative folder is taken from the current directory
    once, the first time a setting is read (at import): later saves, and set_autotune, go to the
    same file wherever the process has moved since. Raises RuntimeError where the folder names a
    home directory that cannot be found (no HOME and no account entry, as for a container run
    under an arbitrary user id)."""
    folder = os.environ.get("MM_VARIANTS_CACHE_DIR")
    if not folder:  # empty counts as unset, as for XDG_CACHE_HOME, not as the current directory
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        folder = os.path.join(base, "torch_mm_variants")
    setting = (folder, os.environ.get("HOME"))
    if setting in _placed:
        return _placed[setting]
    tag = re.sub(r"[^A-Za-z0-9.]+", "_", f"torch{torch.__version__}-mmv{__version__}")
    try:
        return _placed.setdefault(setting,
                                  Path(folder).expanduser().absolute() / f"autotune-{tag}.json")
    except RuntimeError as error:  # pathlib's, naming no variable
        raise RuntimeError(f"torch_mm_variants: the folder for measured choices, {folder!r}, "
                           f"cannot be placed ({error}); set MM_VARIANTS_CACHE_DIR or "
                           "XDG_CACHE_HOME to a folder") from None


def placed_cache_file() -> Path | None:
    """cache_file(), or None where it cannot be placed (measured choices then live in memory)."""
    try:
        return cache_file()
    except (RuntimeError, OSError):  # no home directory; a current directory that was removed
        return None


def load_cache(path: Path | None = None) -> int:
    """Loads saved choices into memory and points future saves at `path`; returns the count."""
    path = path or placed_cache_file()
    _C.set_tuning_file(str(path) if path is not None and _C.autotune_enabled() else "")
    if path is None:
        return 0
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # unreadable, or not JSON we can parse
        return 0
    # Only an object of strings is a tuning file, as the saves (C++) read it: anything else would
    # be written back stringified, or dropped whole by the next save.
    if not isinstance(entries, dict) or not all(isinstance(v, str) for v in entries.values()):
        return 0
    # A lone surrogate (valid JSON escapes, "\ud800") has no UTF-8 form to hand to C++, and no
    # bucket or algorithm name holds one.
    entries = {k: v for k, v in entries.items() if encodes_to_utf8(k) and encodes_to_utf8(v)}
    _C.add_tuned_entries(entries)
    return len(entries)


def encodes_to_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def set_autotune(enabled: bool = True) -> None:
    """Switches the measured mode of algorithm="auto" on or off (process-wide, thread-safe).

    `enabled` must be a Python bool: anything else is refused (TypeError) rather than read by its
    truth value, under which "false", "0" or "off" would switch the mode on."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_autotune: enabled must be True or False, not "
                        f"{type(enabled).__name__} {enabled!r}")
    _C.set_autotune(enabled)
    if enabled:
        path = placed_cache_file()
        if path is None:
            _C.set_tuning_file("")
            warnings.warn("torch_mm_variants: measured choices are kept in memory only, as the "
                          "folder to save them in cannot be placed (tuning.cache_file); set "
                          "MM_VARIANTS_CACHE_DIR or XDG_CACHE_HOME to an absolute folder")
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # measured choices then live in memory only
        load_cache(path)  # saves go there; what it holds (maybe a folder set since import) counts


def explain_auto(a: torch.Tensor, b: torch.Tensor) -> dict:
    """What algorithm="auto" runs for these inputs, and why:
    {"algorithm": ..., "reason": "heuristic" | "measured" | "cached" | "batched", "bucket": ...}.
    For a batch a [B, M, K] against a shared b whose entries' rows follow one another, the choice
    for their one product of B * M rows; for other batches, the choice for one entry. "batched":
    a batch of entries too small to fill the GPU runs in one launch of the highest rung with a
    batched kernel, not in auto's choice for one entry (a launch per entry). Under
    torch.autocast, the choice for the dtype the op casts the inputs to. Where the inputs hold no
    data (fake tensors, as in tracing), nothing is measured: the cached or heuristic choice."""
    # Every non-tensor, as matmul words it, not pybind's overload list: unlike matmul (see
    # check_tensor), the binding below cannot take objects that override torch functions.
    for position, (name, operand) in enumerate([("a", a), ("b", b)], start=1):
        if not isinstance(operand, torch.Tensor):
            raise not_a_tensor("torch_mm_variants.explain_auto", name, position, operand)
        check_tensor("torch_mm_variants.matmul", name, position, operand)  # speaks for matmul
    check_matmul_operand("torch_mm_variants.matmul", a)
    algorithm, reason, bucket = _C.explain_auto(in_autocast_dtype(a), in_autocast_dtype(b))
    return {"algorithm": algorithm, "reason": reason, "bucket": bucket}


def in_autocast_dtype(t: torch.Tensor) -> torch.Tensor:
    """`t` as the ops take it under torch.autocast (csrc/autocast.cpp): a floating tensor other
    than float64 in the autocast dtype of its device, where autocast is on for it."""
    device = t.device.type
    if (device in ("cpu", "cuda") and torch.is_autocast_enabled(device) and t.is_floating_point()
            and t.dtype != torch.float64):
        return t.to(torch.get_autocast_dtype(device))
    return t


def tuned_entries() -> dict:
    """The measured or loaded choices held in memory, bucket -> algorithm."""
    return dict(_C.tuned_entries())


def clear() -> None:
    """Forgets the choices held in memory (the file is left alone)."""
    _C.clear_tuned_entries()


if autotune_requested():
    set_autotune(True)
load_cache()
