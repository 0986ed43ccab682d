"""runledger-client is a distribution of its own: its wheel builds offline from client/ with
nothing but the standard library (pip's PEP 517 call into client/_build), requires httpx and
nothing else, holds only runledger/client, and, imported from the wheel alone, loads no module
that importing httpx does not load too."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parent.parent

THIRD_PARTY = """
import json, sys
{imports}
print(json.dumps(sorted({{name.partition(".")[0] for name in sys.modules}} - set(sys.stdlib_module_names)
                        - set(sys.builtin_module_names))))
"""


def _third_party_modules(site: Path, imports: str) -> set[str]:
    code = f"import sys; sys.path.insert(0, {str(site)!r})\n" + THIRD_PARTY.format(imports=imports)
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def test_the_client_wheel_builds_offline_and_needs_only_httpx(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT / "client"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (tmp_path / "dist").glob("*.whl")
    assert wheel.name == "runledger_client-0.1.0-py3-none-any.whl"

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read("runledger_client-0.1.0.dist-info/METADATA").decode()
        record = archive.read("runledger_client-0.1.0.dist-info/RECORD").decode()
        for line in record.splitlines():
            path, digest, size = line.rsplit(",", 2)
            if digest:  # every file as RECORD says (RECORD itself has no hash)
                data = archive.read(path)
                assert (
                    digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                )
                assert int(size) == len(data)
        archive.extractall(tmp_path / "site")

    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires == ["httpx>=0.27,<1"]
    assert "Name: runledger-client" in metadata
    assert {n for n in names if not n.startswith("runledger_client-0.1.0.dist-info/")} == {
        f"runledger/client/{name}"
        for name in (
            "__init__.py",
            "_core.py",
            "aio.py",
            "errors.py",
            "outbox.py",
            "sync.py",
            "wrappers.py",
            "py.typed",
        )
    }

    located = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r}); "
            "import runledger.client as c; print(c.__file__); print(c.Client.__name__)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert located.returncode == 0, located.stderr
    assert located.stdout.split() == [str(tmp_path / "site" / "runledger" / "client" / "__init__.py"), "Client"]
    client_modules = _third_party_modules(tmp_path / "site", "import runledger.client")
    httpx_modules = _third_party_modules(tmp_path / "site", "import httpx")
    assert "httpx" in httpx_modules
    assert client_modules - {"runledger"} == httpx_modules
