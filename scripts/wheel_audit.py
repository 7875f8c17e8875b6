"""Checks one built wheel against its platform (scripts/wheel_targets.py); exit 1 on any failure.

    python scripts/wheel_audit.py WHEEL [--target NAME]     # needs pyelftools and auditwheel

Run by scripts/build_wheels.py on every wheel right after packing, under the wheel tools'
environment (~/.cache/loaderx-wheel-tools), which has both. What it checks:
  * the policy tag: the file name's platform tags are exactly the target's, the WHEEL file's Tag
    lines agree, and `auditwheel show` (the PyPA's reference) finds the shared object consistent
    with that same tag;
  * what the shared object links: its DT_NEEDED names are the target's C library only, and every
    symbol version it needs is at most glibc 2.17 (manylinux2014) or there is none (musl) --
    read from the ELF's version-needs section, not assumed from how it was built;
  * that it carries only its own platform's shared object: one ELF file, the extension module at
    its expected path, of the target's machine, and no vendored libraries;
  * that its size is sane (wheel_targets.SIZE_MIN..SIZE_MAX).
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wheel_targets


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def check_elf(data: bytes, target: wheel_targets.Target) -> list[str]:
    """What is wrong with the extension module's ELF for this target (empty: nothing)."""
    problems = []
    elf = ELFFile(io.BytesIO(data))
    if elf.elfclass != 64 or not elf.little_endian:
        problems.append(f"ELF class {elf.elfclass}, little-endian {elf.little_endian}: "
                        "want 64-bit little-endian")
    if elf["e_machine"] != target.machine:
        problems.append(f"machine {elf['e_machine']}: want {target.machine} ({target.arch})")
    if elf["e_type"] != "ET_DYN":
        problems.append(f"ELF type {elf['e_type']}: want ET_DYN (a shared object)")
    needed: list[str] = []
    exports_init = False
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            needed += [t.needed for t in section.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
        if section.name == ".dynsym":
            exports_init = any(
                s.name == "PyInit__native" and s["st_shndx"] != "SHN_UNDEF"
                for s in section.iter_symbols()
            )
    extra = sorted(set(needed) - target.allowed_libs)
    if extra:
        allowed = ", ".join(sorted(target.allowed_libs))
        problems.append(f"links {', '.join(extra)}: only {allowed} may be linked")
    if not exports_init:
        problems.append("exports no PyInit__native: not the loaderx._native extension module")
    versions: list[tuple[str, str]] = []
    for section in elf.iter_sections():
        if isinstance(section, GNUVerNeedSection):
            for verneed, auxs in section.iter_versions():
                versions += [(verneed.name, aux.name) for aux in auxs]
    for lib, version in versions:
        name, _, number = version.partition("_")
        limit = {"GLIBC": target.glibc_max, "GCC": target.gcc_max}.get(name)
        if limit is None or not re.fullmatch(r"\d+(\.\d+)*", number):
            problems.append(f"needs {version} from {lib}: no {name} symbol version is allowed")
        elif version_tuple(number) > limit:
            newest = ".".join(map(str, limit))
            problems.append(f"needs {version} from {lib}: newer than {name}_{newest}")
    glibc = sorted({v for _, v in versions if v.startswith("GLIBC_")}, key=lambda v: version_tuple(
        v[6:]))
    print(f"  linked: {', '.join(needed) or 'nothing'}; newest glibc version needed: "
          f"{glibc[-1] if glibc else 'none'} ({len(versions)} versioned needs)")
    return problems


# `auditwheel show`, with one name added to the musllinux policies' libraries: zig's musl links
# the C library as `libc.so`, Alpine's toolchain as `libc.musl-<arch>.so.1`, and musl's dynamic
# loader resolves every `libc.*` name to itself, so both are the one library the policy allows
# (auditwheel knows only the second spelling). The hook is auditwheel's private function: the
# version is pinned (build_wheels.py), and a release without it fails the check by name.
_AUDITWHEEL = """
import sys
import auditwheel.policy as policy
fixup = policy._fixup_musl_libc_soname
policy._fixup_musl_libc_soname = lambda libc, arch, names: (
    fixup(libc, arch, names) | ({"libc.so"} if str(libc) == "musl" else set()))
from auditwheel.main import main
sys.argv[0] = "auditwheel"
sys.exit(main())
"""


def auditwheel_problems(wheel: Path, target: wheel_targets.Target) -> list[str]:
    """What `auditwheel show` finds wrong: the policy its libraries and symbols allow, libraries
    it would have to vendor, instructions beyond the architecture's baseline."""
    # No library search path: the host's libraries say nothing about a wheel for another
    # platform (and its glibc's `libc.so` linker script stops the musl wheels' analysis).
    with tempfile.TemporaryDirectory() as nowhere:
        out = subprocess.run([sys.executable, "-c", _AUDITWHEEL, "show", "--json", "--ldpaths",
                              nowhere, str(wheel)], capture_output=True, text=True)
    try:
        report = json.loads(out.stdout)
    except json.JSONDecodeError:
        report = {}
    if not isinstance(report, dict) or "overall_tag" not in report:
        error = report.get("error") if isinstance(report, dict) else None
        text = " ".join((error or out.stdout + out.stderr).split())
        return [f"auditwheel show failed: {text[-400:]}"]
    print(f"  auditwheel show: consistent with {report['overall_tag']}")
    problems = []
    if report["overall_tag"] != target.tag:
        problems.append(f"auditwheel show: consistent with {report['overall_tag']}, want "
                        f"{target.tag}")
    if report["external_libs"]:
        problems.append(f"auditwheel show: would vendor {sorted(report['external_libs'])}")
    if report["unsupported_isa"]:
        problems.append("auditwheel show: uses instructions beyond the architecture's baseline")
    return problems


def audit(wheel: Path, want: str | None) -> list[str]:
    target, flavour = wheel_targets.for_wheel(wheel.name)
    if want is not None and want != target.name:
        return [f"its name says {target.name}, the build was for {want}"]
    print(f"{wheel.name}: {target.name}, {flavour}")
    problems = []
    platform_tags = set(wheel.name.removesuffix(".whl").split("-")[4].split("."))
    if platform_tags != set(target.tags):
        problems.append(f"platform tags {sorted(platform_tags)}: want {sorted(target.tags)}")
    size = wheel.stat().st_size
    if not wheel_targets.SIZE_MIN <= size <= wheel_targets.SIZE_MAX:
        problems.append(f"{size} bytes: a sane wheel is {wheel_targets.SIZE_MIN}.."
                        f"{wheel_targets.SIZE_MAX}")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        wheel_meta = [n for n in names if n.endswith(".dist-info/WHEEL")]
        tags = set()
        if len(wheel_meta) == 1:
            text = zf.read(wheel_meta[0]).decode()
            tags = {line.split(":", 1)[1].strip() for line in text.splitlines()
                    if line.startswith("Tag:")}
        python = wheel_targets.FLAVOURS[flavour]
        want_tags = {f"{python}-{t}" for t in target.tags}
        if tags != want_tags:
            problems.append(f"WHEEL's Tag lines {sorted(tags)}: want {sorted(want_tags)}")
        elves = [n for n in names if zf.read(n)[:4] == b"\x7fELF"]
        module = f"loaderx/_native{target.native_suffix(flavour)}"
        if elves != [module]:
            problems.append(f"ELF files {elves}: want exactly [{module!r}]")
        strays = [n for n in names if not n.startswith(("loaderx/", "loaderx-"))]
        if strays:
            problems.append(f"files outside the package: {strays}")
        if module in names:
            data = zf.read(module)
            print(f"  {module}: {len(data)} bytes; wheel: {size} bytes, {len(names)} files")
            if len(data) < wheel_targets.SIZE_MIN:
                problems.append(f"{module} is {len(data)} bytes: too small for a release build")
            problems += check_elf(data, target)
    return problems + auditwheel_problems(wheel, target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--target", help="the target it was built for (wheel_targets.TARGETS)")
    args = parser.parse_args()
    problems = audit(args.wheel, args.target)
    for p in problems:
        print(f"  FAIL: {p}")
    print(f"  {'ok' if not problems else 'FAILED'}: {args.wheel.name}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
