"""The wheel check (scripts/wheel_audit.py) and the build script's preflight reject what they must.

Shared objects are compiled here by the C compiler with the symbols a wheel must not need (a
glibc newer than 2.17, a library outside the policy) and checked as the build checks a freshly
packed wheel; the wheels are hand-made zips with the wrong tags or files.
"""

from __future__ import annotations

import dataclasses
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("elftools", reason="pyelftools reads the ELF (scripts/env.sh installs it)")

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import build_wheels  # noqa: E402  (scripts/, put on the path above)
import wheel_audit  # noqa: E402
import wheel_targets  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

X86_GLIBC = wheel_targets.by_name("x86_64-manylinux2014")
ARM_GLIBC = wheel_targets.by_name("aarch64-manylinux2014")
X86_MUSL = wheel_targets.by_name("x86_64-musllinux_1_2")

# A stand-in for the extension module: it exports PyInit__native and calls what it is told to.
_MODULE = """
#include <stdlib.h>
void *PyInit__native(void) { return %s; }
"""


def _shared_object(tmp_path: Path, call: str, *flags: str, source: str | None = None) -> bytes:
    """``source`` (default: the module stand-in calling ``call``) compiled and read."""
    src = tmp_path / "m.c"
    src.write_text(source if source is not None else _MODULE % call)
    out = tmp_path / "m.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src), *flags],
                   check=True)
    return out.read_bytes()


@pytest.fixture
def host_x86(tmp_path):
    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip("the compiler here must make x86-64 objects")
    return tmp_path


def test_an_object_that_needs_only_old_glibc_symbols_passes(host_x86):
    data = _shared_object(host_x86, "malloc(8)")
    assert wheel_audit.check_elf(data, X86_GLIBC) == []


def test_a_symbol_newer_than_glibc_2_17_fails_the_check(host_x86):
    # reallocarray came in glibc 2.26: a wheel that needs it does not load on CentOS 7 or RHEL 8.
    data = _shared_object(host_x86, "reallocarray(0, 2, 8)")
    problems = wheel_audit.check_elf(data, X86_GLIBC)
    assert any("GLIBC_2.26" in p and "newer than GLIBC_2.17" in p for p in problems), problems


def test_a_library_outside_the_policy_fails_the_check(host_x86):
    data = _shared_object(host_x86, "malloc(8)", "-Wl,--no-as-needed", "-lstdc++")
    problems = wheel_audit.check_elf(data, X86_GLIBC)
    assert any(p.startswith("links libstdc++") for p in problems), problems


def test_another_machine_or_libc_fails_the_check(host_x86):
    data = _shared_object(host_x86, "malloc(8)")
    problems = wheel_audit.check_elf(data, ARM_GLIBC)
    assert any(p.startswith("machine EM_X86_64: want EM_AARCH64") for p in problems), problems
    # Built against glibc: any GLIBC_ symbol version is foreign to a musl wheel.
    problems = wheel_audit.check_elf(data, X86_MUSL)
    assert any("no GLIBC symbol version is allowed" in p for p in problems), problems


def test_an_object_without_the_module_init_fails_the_check(host_x86):
    data = _shared_object(host_x86, "", source="int other(void) { return 1; }\n")
    problems = wheel_audit.check_elf(data, X86_GLIBC)
    assert any("exports no PyInit__native" in p for p in problems), problems


def _wheel(path: Path, files: dict[str, bytes], tag_lines: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        wheel_meta = "Wheel-Version: 1.0\n" + "".join(f"Tag: {t}\n" for t in tag_lines)
        zf.writestr("loaderx-0.1.0.dist-info/WHEEL", wheel_meta)
    return path


def test_a_wheel_with_wrong_tags_a_second_object_and_strays_fails(host_x86):
    module = _shared_object(host_x86, "malloc(8)")
    name = "loaderx-0.1.0-cp311-abi3-manylinux_2_17_x86_64.whl"  # the legacy alias is missing
    wheel = _wheel(host_x86 / name, {
        "loaderx/_native.abi3.so": module,
        "loaderx/extra.so": module,  # a second shared object: not this wheel's to carry
        "vendored/libfoo.so": b"x",
    }, ["cp311-abi3-manylinux_2_17_x86_64"])
    problems = wheel_audit.audit(wheel, None)
    text = "\n".join(problems)
    assert "platform tags ['manylinux_2_17_x86_64']" in text
    assert "WHEEL's Tag lines" in text
    assert "ELF files ['loaderx/_native.abi3.so', 'loaderx/extra.so']" in text
    assert "files outside the package: ['vendored/libfoo.so']" in text
    assert "bytes: a sane wheel is" in text  # a few kB: a stub, not a release build


def test_a_wheel_named_for_another_build_is_refused(host_x86):
    wheel = host_x86 / "loaderx-0.1.0-cp311-abi3-musllinux_1_2_x86_64.whl"
    _wheel(wheel, {}, [])
    assert wheel_audit.audit(wheel, "x86_64-manylinux2014") == [
        "its name says x86_64-musllinux_1_2, the build was for x86_64-manylinux2014"]


def test_the_build_stops_with_the_rustup_command_for_a_missing_target(tmp_path, capsys):
    if shutil.which("cargo") is None:
        pytest.skip("needs cargo")
    absent = dataclasses.replace(X86_GLIBC, rust="riscv64gc-unknown-none-elf")
    with pytest.raises(SystemExit) as exc:
        build_wheels.preflight([absent], tmp_path)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert "`rustup target add riscv64gc-unknown-none-elf`" in err
    assert list(tmp_path.iterdir()) == []  # nothing written to the output directory


def test_an_unknown_target_name_is_refused_with_the_known_ones():
    with pytest.raises(SystemExit, match="unknown wheel target 'sparc'.*x86_64-manylinux2014"):
        wheel_targets.by_name("sparc")
