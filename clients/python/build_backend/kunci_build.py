"""The kunci package's own PEP 517 build backend: it builds the wheel (and
the sdist) with the standard library alone, so that ``pip install
./clients/python`` works on a machine without PyPI and without setuptools
(pip's isolated build environment then has nothing to download).

The package is pure Python: the wheel is the ``kunci`` directory, its
metadata from pyproject.toml, and the RECORD of both.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[1]
TAG = "py3-none-any"


def _project() -> dict[str, Any]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    if tomllib is not None:
        return dict(tomllib.loads(text)["project"])
    # Python 3.10 has no TOML parser: the few fields used here, in the
    # simple form this project's pyproject.toml writes them.
    table = text.split("[project]", 1)[1].split("\n[", 1)[0]
    p: dict[str, Any] = dict(re.findall(r'^([a-z-]+) = "([^"]*)"$', table, re.M))
    license = re.search(r'^license = \{ text = "([^"]*)" \}$', table, re.M)
    p["license"] = {"text": license.group(1) if license else ""}
    p["classifiers"] = re.findall(r'^    "([^"]+)",$', table, re.M)
    return p


def _metadata() -> str:
    p = _project()
    lines: list[str] = [
        "Metadata-Version: 2.1",
        "Name: " + p["name"],
        "Version: " + p["version"],
        "Summary: " + p["description"],
        "Requires-Python: " + p["requires-python"],
        "License: " + p["license"]["text"],
    ]
    lines += ["Classifier: " + c for c in p.get("classifiers", [])]
    readme = (ROOT / str(p["readme"])).read_text(encoding="utf-8")
    return "\n".join(lines) + "\nDescription-Content-Type: text/markdown\n\n" + readme


def _files() -> list[Path]:
    """The package's files, in a stable order: its modules and py.typed."""
    pkg = ROOT / "kunci"
    return sorted(f for f in pkg.iterdir() if f.suffix == ".py" or f.name == "py.typed")


def _dist_info() -> str:
    p = _project()
    return "%s-%s.dist-info" % (str(p["name"]), str(p["version"]))


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: dict[str, Any] | None = None) -> list[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    d = Path(metadata_directory) / _dist_info()
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(_metadata(), encoding="utf-8")
    (d / "WHEEL").write_text(_wheel_file(), encoding="utf-8")
    return d.name


def _wheel_file() -> str:
    return "Wheel-Version: 1.0\nGenerator: kunci_build\nRoot-Is-Purelib: true\nTag: %s\n" % TAG


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    p = _project()
    name = "%s-%s-%s.whl" % (p["name"], p["version"], TAG)
    info = _dist_info()
    entries = [("kunci/" + f.name, f.read_bytes()) for f in _files()]
    entries += [(info + "/METADATA", _metadata().encode()), (info + "/WHEEL", _wheel_file().encode())]
    record = [_record_line(n, data) for n, data in entries] + [info + "/RECORD,,"]
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, data in entries:
            z.writestr(zipfile.ZipInfo(n, date_time=(1980, 1, 1, 0, 0, 0)), data)
        z.writestr(zipfile.ZipInfo(info + "/RECORD", date_time=(1980, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
    return name


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    p = _project()
    base = "%s-%s" % (p["name"], p["version"])
    files = ["pyproject.toml", "README.md", "build_backend/kunci_build.py"]
    files += ["kunci/" + f.name for f in _files()]
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for f in files:
            t.add(ROOT / f, arcname=base + "/" + f)
        pkg_info = _metadata().encode()
        ti = tarfile.TarInfo(base + "/PKG-INFO")
        ti.size = len(pkg_info)
        t.addfile(ti, io.BytesIO(pkg_info))
    return name
