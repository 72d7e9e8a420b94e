"""Check what gemvx's sdist and wheel contain, and what the wheel's extension module needs.

    python scripts/check_dist.py sdist dist/gemvx-X.tar.gz
    python scripts/check_dist.py wheel wheelhouse/gemvx-X-cpXY-cpXY-PLATFORM.whl

sdist: exactly the files the build and the test suite need, as tracked by git (CMakeLists.txt,
pyproject.toml, README.md, LICENSE, cc/, python/, tests/) plus PKG-INFO; nothing missing, nothing
else. wheel: the package's files from python/gemvx, one extension module and the dist-info, and
nothing grafted in (no CUDA runtime: it is linked statically); the module's NEEDED libraries are
the C/C++ system libraries only, it exports no CUDA symbols (they would interpose another
library's CUDA runtime), and the report names the glibc/libstdc++ symbol versions that set the
manylinux platform tag. Exits 1 with the reasons when a check fails. Needs readelf, nm, objdump
(binutils).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SDIST_TREE = ["CMakeLists.txt", "pyproject.toml", "README.md", "LICENSE", "cc", "python", "tests"]
# Libraries every Linux system provides (the manylinux policies' own list, for what a C++ module
# with a static CUDA runtime links); libcuda.so.1 is not among them: the runtime dlopens it.
SYSTEM_LIBS = re.compile(r"^(libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libdl\.so\.2|"
                         r"librt\.so\.1|libpthread\.so\.0|ld-linux-(x86-64|aarch64)\.so\.[12])$")
CUDA_SYMBOL = re.compile(r"^(cuda|cu[A-Z]|__cuda|nv[A-Z])")


def tracked(paths: list[str]) -> set[str]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "--", *paths], check=True,
                         capture_output=True, text=True).stdout
    return set(out.split())


def check_sdist(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    expected = tracked(SDIST_TREE) | {"PKG-INFO"}
    errors = [f"sdist lacks {n}" for n in sorted(expected - names)]
    errors += [f"sdist has {n}, which the build does not need" for n in sorted(names - expected)]
    print(f"{path.name}: {len(names)} files, {path.stat().st_size // 1024} KiB")
    return errors


def tool(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def symbol_versions(so: Path, prefix: str) -> dict[str, list[str]]:
    """{version: [undefined symbols needing it]} for versions named prefix_* (GLIBC, GLIBCXX)."""
    out: dict[str, list[str]] = {}
    for line in tool("objdump", "-T", str(so)).splitlines():
        m = re.search(rf"\(({prefix}_[0-9.]+)\)\s+(\S+)$", line)
        if m and "*UND*" in line:
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


def newest(versions: dict[str, list[str]]) -> tuple[str, list[str]]:
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("_", 1)[1].split("."))

    top = max(versions, key=key)
    return top, sorted(versions[top])


def check_wheel(path: Path) -> list[str]:
    errors: list[str] = []
    package = REPO / "python" / "gemvx"
    expected = {"gemvx/" + p.relative_to(package).as_posix() for p in package.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".so"}
    with zipfile.ZipFile(path) as whl, tempfile.TemporaryDirectory() as tmp:
        names = {n for n in whl.namelist() if not n.endswith("/")}  # no directory entries
        modules = sorted(n for n in names if re.fullmatch(r"gemvx/_ext\..*\.so", n))
        dist_info = {n for n in names if n.split("/", 1)[0].endswith(".dist-info")}
        errors += [f"wheel lacks {n}" for n in sorted(expected - names)]
        errors += [f"wheel has {n}, which is not part of the package"
                   for n in sorted(names - expected - dist_info - set(modules))]
        if len(modules) != 1:
            return errors + [f"wheel has {len(modules)} extension modules, expected 1: {modules}"]
        if not any(n.endswith(".dist-info/licenses/LICENSE") for n in dist_info):
            errors.append("wheel's dist-info has no licenses/LICENSE")
        so = Path(whl.extract(modules[0], tmp))
        needed = re.findall(r"\(NEEDED\).*\[(.+)\]", tool("readelf", "-d", str(so)))
        exported = [line.split()[-1] for line in tool("nm", "-D", "--defined-only", str(so)).splitlines()]
        glibc, glibcxx = symbol_versions(so, "GLIBC"), symbol_versions(so, "GLIBCXX")
        size = path.stat().st_size
        tags = path.name[:-4].split("-")[-1]
        print(f"{path.name}: {size / 2**20:.2f} MiB, platform tag(s) {tags}")
        print(f"  {modules[0]}: {so.stat().st_size / 2**20:.2f} MiB; NEEDED {', '.join(needed)}")
        for versions in (glibc, glibcxx):
            if versions:
                top, syms = newest(versions)
                more = f" and {len(syms) - 8} more" if len(syms) > 8 else ""
                print(f"  newest {top.split('_')[0]} symbol version {top}, needed by "
                      f"{', '.join(syms[:8])}{more}")
        errors += [f"extension module needs {lib}, not a system library (CUDA must be linked "
                   "statically; the driver's libcuda.so.1 is loaded at run time)"
                   for lib in needed if not SYSTEM_LIBS.match(lib)]
        errors += [f"extension module exports the CUDA symbol {s}" for s in exported
                   if CUDA_SYMBOL.match(s)]
    return errors


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("sdist", "wheel"):
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[2])
    errors = check_sdist(path) if argv[1] == "sdist" else check_wheel(path)
    for e in errors:
        print(f"FAIL: {e}", file=sys.stderr)
    if not errors:
        print(f"{argv[1]} check passed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
