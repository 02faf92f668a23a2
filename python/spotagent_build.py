"""The client's build backend (PEP 517), standard library only.

`pip install ./python` works offline, in a fresh venv or on Debian's python3
with nothing else installed: pip's isolated build environment needs no
setuptools or wheel from an index (pyproject.toml's `requires` is empty).
The package is pure Python with no dependencies, so a wheel is a zip of
spotagent/ plus its metadata. Name, version, summary and requires-python are
read from pyproject.toml's [project] table, so they live in one place.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Any, Dict, Iterable, List, Optional, Tuple

Config = Optional[Dict[str, Any]]

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "spotagent"


def _project() -> Dict[str, str]:
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    table = text.split("[project]", 1)[1].split("\n[", 1)[0]
    fields: Dict[str, str] = {}
    for key in ("name", "version", "description", "requires-python"):
        m = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(key), table, re.M)
        if not m:
            raise ValueError("pyproject.toml: [project] has no %s" % key)
        fields[key] = m.group(1)
    return fields


def _metadata() -> str:
    p = _project()
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return (
        "Metadata-Version: 2.1\n"
        "Name: %s\nVersion: %s\nSummary: %s\nRequires-Python: %s\n"
        "Classifier: Programming Language :: Python :: 3\n"
        "Classifier: Operating System :: POSIX :: Linux\n"
        "Classifier: Typing :: Typed\n"
        "Description-Content-Type: text/markdown\n\n%s"
        % (p["name"], p["version"], p["description"], p["requires-python"], readme)
    )


def _package_files() -> List[Tuple[str, str]]:
    out = []
    root = os.path.join(HERE, PACKAGE)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".py", ".typed")):
                full = os.path.join(dirpath, name)
                out.append((os.path.relpath(full, HERE).replace(os.sep, "/"), full))
    return out


def _write_wheel(directory: str, files: Iterable[Tuple[str, bytes]]) -> str:
    """files: (archive name, bytes) pairs; adds the dist-info and RECORD."""
    p = _project()
    dist = "%s-%s" % (p["name"].replace("-", "_"), p["version"])
    info = dist + ".dist-info"
    files = list(files) + [
        (info + "/METADATA", _metadata().encode("utf-8")),
        (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: spotagent_build\n"
                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record: List[str] = []
    name = dist + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append("%s,sha256=%s,%d" % (arc, digest.decode(), len(data)))
        record.append(info + "/RECORD,,")
        z.writestr(info + "/RECORD", "\n".join(record) + "\n")
    return name


def get_requires_for_build_wheel(config_settings: Config = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Config = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Config = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Config = None,
                metadata_directory: Optional[str] = None) -> str:
    files: List[Tuple[str, bytes]] = []
    for arc, full in _package_files():
        with open(full, "rb") as f:
            files.append((arc, f.read()))
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory: str, config_settings: Config = None,
                   metadata_directory: Optional[str] = None) -> str:
    # A .pth line puts this directory on sys.path: edits show at once.
    return _write_wheel(wheel_directory, [(PACKAGE + "_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory: str, config_settings: Config = None) -> str:
    p = _project()
    base = "%s-%s" % (p["name"], p["version"])
    name = base + ".tar.gz"
    members = [("pyproject.toml", os.path.join(HERE, "pyproject.toml")),
               ("README.md", os.path.join(HERE, "README.md")),
               ("spotagent_build.py", os.path.abspath(__file__))] + _package_files()
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for arc, full in members:
            t.add(full, arcname=base + "/" + arc)
        pkg_info = _metadata().encode("utf-8")
        ti = tarfile.TarInfo(base + "/PKG-INFO")
        ti.size = len(pkg_info)
        t.addfile(ti, io.BytesIO(pkg_info))
    return name
