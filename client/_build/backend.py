"""The PEP 517 build backend of runledger-client: a wheel (PEP 427) is a zip of the package with
METADATA, WHEEL and RECORD; an sdist a tar.gz of the sources with PKG-INFO. Standard library only,
so `pip wheel --no-deps --no-build-isolation client/` works offline on a bare Python."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "runledger" / "client"
EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same sources give the same wheel bytes


def _project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _dist_name(project: dict[str, Any]) -> str:
    return project["name"].replace("-", "_")


def _metadata(project: dict[str, Any]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}",
             f"Summary: {project['description']}", f"Requires-Python: {project['requires-python']}"]
    lines += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    lines += ["Description-Content-Type: text/markdown", ""]
    return "\n".join(lines) + "\n" + (ROOT / project["readme"]).read_text()


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.is_file() and p.suffix in (".py", ".typed")
                  and "__pycache__" not in p.parts)


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: Any = None) -> list[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None) -> str:
    project = _project()
    dist = f"{_dist_name(project)}-{project['version']}"
    name = f"{dist}-py3-none-any.whl"
    files: list[tuple[str, bytes]] = [(p.relative_to(ROOT).as_posix(), p.read_bytes()) for p in _sources()]
    files.append((f"{dist}.dist-info/METADATA", _metadata(project).encode()))
    files.append((f"{dist}.dist-info/WHEEL", b"Wheel-Version: 1.0\nGenerator: runledger-client _build\n"
                                             b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    record = "".join(f"{path},{_hash(data)},{len(data)}\n" for path, data in files)
    files.append((f"{dist}.dist-info/RECORD", (record + f"{dist}.dist-info/RECORD,,\n").encode()))
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files:
            wheel.writestr(zipfile.ZipInfo(path, EPOCH), data, zipfile.ZIP_DEFLATED)
    return name


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    project = _project()
    dist = f"{_dist_name(project)}-{project['version']}"
    name = f"{dist}.tar.gz"
    members = [ROOT / "pyproject.toml", ROOT / "README.md", Path(__file__).resolve(), *_sources()]
    with tarfile.open(Path(sdist_directory) / name, "w:gz") as sdist:
        for path in members:
            sdist.add(path, f"{dist}/{path.relative_to(ROOT).as_posix()}")
        info = _metadata(project).encode()
        entry = tarfile.TarInfo(f"{dist}/PKG-INFO")
        entry.size = len(info)
        sdist.addfile(entry, io.BytesIO(info))
    return name
