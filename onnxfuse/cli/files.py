"""The files a command writes besides the model: checks made before the expensive work (the folder exists and is
writable, the name is no device, no input and no external data file of a model), the atomic write of a report,
and what a report file's reader should know (the width of a text report, the sizes of an HTML chart)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from onnxfuse.cli.console import log
from onnxfuse.errors import InputError

if TYPE_CHECKING:
    from onnxfuse.model import io as model_io
    from onnxfuse.report import model as report_model


def check_folder(path: Path, what: str) -> None:
    """Fail before the expensive work when ``path`` cannot be written, or names something that is not a
    regular file (replacing /dev/null or a FIFO with a file would be destructive).

    Raises:
        InputError: ``path`` exists and is no regular file, its folder is missing or not writable.
    """
    if path.exists() and not path.is_file():
        raise InputError(f"{what} {path}: exists and is not a regular file; onnxfuse will not replace it")
    folder = resolve(path, what).parent
    if not folder.is_dir():
        raise InputError(f"{what} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{what} {path}: the folder {folder} is not writable")


def resolve(path: Path, what: str) -> Path:
    """``path.resolve()``; a symbolic link that loops is an input error (Python raises RuntimeError or OSError)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        raise InputError(f"{what} {path}: cannot follow the symbolic link ({exc})") from None


def names_a_data_file_of(path: Path, output: Path) -> bool:
    """True when ``path`` has the name of an external data file that ``model_io.save_model`` may write or remove
    beside ``output`` (through a symlinked output, beside the file it points to): ``<name>.data``, or
    ``model_io.data_file_name``'s ``<name, shortened from its end to fit NAME_MAX>.<16 hex digits>.data``."""
    target = resolve(output, "OUTPUT") if output.is_symlink() else Path(os.path.abspath(output))
    if resolve(Path(os.path.abspath(path)).parent, "--report") != resolve(target.parent, "OUTPUT"):
        return False
    if path.name == target.name + ".data":
        return True
    found = re.fullmatch(r"(.+)\.[0-9a-f]{16}\.data", path.name)
    return found is not None and target.name.startswith(found.group(1))


def check_not_data_file(path: Path, what: str, loaded: model_io.LoadedModel) -> None:
    """Refuse to write a report over one of the input model's external data files (its weights).

    Raises:
        InputError: ``path`` is one of ``loaded.data_files``.
    """
    from onnxfuse.model import io as model_io

    if any(model_io.same_file(path, f) for f in loaded.data_files):
        raise InputError(f"{what} {path}: is an external data file of the input model; choose another name")


def write_text(path: Path, text: str) -> None:
    """Write a report file atomically (:func:`onnxfuse.model.files.write_atomically`), UTF-8.

    Raises:
        InputError: the folder takes no new file, or the write or the rename fails.
    """
    from onnxfuse.model.files import write_atomically

    check_folder(path, "report")
    try:
        write_atomically(path, text)
    except OSError as exc:  # also /proc, /sys: the folder passes os.access but takes no new file
        raise InputError(f"{path}: cannot write the report ({exc.strerror or exc})") from None


def text_width(output: Path | None) -> int:
    """Columns for text reports: the terminal's when stdout is one, else 120."""
    import shutil

    if output is None and sys.stdout.isatty():
        return max(80, shutil.get_terminal_size((120, 24)).columns)
    return 120


def chart_note(report: report_model.Report, formats: Sequence[str]) -> None:
    """Say on stderr (INFO) at which sizes an HTML report's chart is drawn when the model's dims are symbolic and
    have no value (``present.chart_sizes``)."""
    if "html" not in formats:
        return
    from onnxfuse.report.present import chart_sizes, display_names

    doc = report.to_dict()
    sizes = chart_sizes(doc)
    if sizes is not None:
        names = display_names(doc)
        at = ", ".join(f"{names.get(k, k)}={v}" for k, v in sizes[0].items())
        log.info("the HTML report's chart draws each layer at %s (%s); give --input-shape for your sizes", at,
                 sizes[1])
