"""The Linux wheels the project publishes: the one place that maps a platform to its tags.

Each target names the Rust target it is compiled for, the compatibility policy maturin packs it
under, the platform tag its file name must carry and what its shared object may link: the
libraries, and the newest glibc symbol version. `scripts/build_wheels.py` builds from this table,
`scripts/wheel_audit.py` checks against it, and `docs/guide/wheels.md` describes it.
No imports beyond the standard library: both scripts load it under any Python >= 3.11.
"""

from __future__ import annotations

from dataclasses import dataclass

# ELF e_machine values (the ELF specification's numbers, as pyelftools names them).
_MACHINE = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}

# What a glibc wheel under manylinux2014 may link: the C library's own parts, its dynamic loader
# (for thread-local storage) and libgcc_s (for unwinding). The policy allows more (libstdc++,
# X11, ...); we need none of them, so any other name is a mistake to catch, not one to allow.
_GLIBC_LIBS = frozenset(
    {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libgcc_s.so.1"}
)
# musl is one library (libc.so, which is also its dynamic loader): nothing else may be linked.
_MUSL_LIBS = frozenset({"libc.so"})
# glibc's dynamic loader, by architecture (the psABI's names).
_GLIBC_LOADER = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}

# Symbol versions other than glibc's that the glibc libraries above define, with the newest a
# manylinux2014 (CentOS 7, GCC 4.8) system provides.
_GCC_MAX = (4, 8, 0)


@dataclass(frozen=True)
class Target:
    """One Linux platform: where it is built and what its wheel must be."""

    name: str  # the build script's name for it (--only NAME)
    rust: str  # the rustup target triple
    compatibility: str  # maturin's --compatibility value
    arch: str  # uname -m
    libc: str  # "glibc" or "musl"

    @property
    def tag(self) -> str:
        """The PEP 600 / PEP 656 platform tag the wheel's file name must carry."""
        if self.libc == "glibc":
            return f"manylinux_2_17_{self.arch}"
        return f"musllinux_1_2_{self.arch}"

    @property
    def tags(self) -> tuple[str, ...]:
        """Every platform tag the file name carries: the tag, and manylinux2014's legacy alias."""
        if self.libc == "glibc":
            return (f"{self.compatibility}_{self.arch}", self.tag)
        return (self.tag,)

    @property
    def machine(self) -> str:
        """The ELF e_machine of the shared object."""
        return _MACHINE[self.arch]

    @property
    def allowed_libs(self) -> frozenset[str]:
        """The DT_NEEDED names the shared object may carry."""
        if self.libc == "glibc":
            return _GLIBC_LIBS | {_GLIBC_LOADER[self.arch]}
        return _MUSL_LIBS

    @property
    def glibc_max(self) -> tuple[int, ...] | None:
        """The newest GLIBC_x.y symbol version allowed; None: no glibc version at all (musl)."""
        return (2, 17) if self.libc == "glibc" else None

    @property
    def gcc_max(self) -> tuple[int, ...] | None:
        """The newest GCC_x.y.z (libgcc_s) symbol version allowed; None: none at all."""
        return _GCC_MAX if self.libc == "glibc" else None

    def native_suffix(self, flavour: str) -> str:
        """The extension module's file name suffix for a flavour ("abi3" or "cp313t")."""
        if flavour == "abi3":
            return ".abi3.so"
        gnu = "gnu" if self.libc == "glibc" else "musl"
        return f".cpython-{flavour[2:]}-{self.arch}-linux-{gnu}.so"


TARGETS: tuple[Target, ...] = (
    Target("x86_64-manylinux2014", "x86_64-unknown-linux-gnu", "manylinux2014", "x86_64",
           "glibc"),
    Target("aarch64-manylinux2014", "aarch64-unknown-linux-gnu", "manylinux2014", "aarch64",
           "glibc"),
    Target("x86_64-musllinux_1_2", "x86_64-unknown-linux-musl", "musllinux_1_2", "x86_64",
           "musl"),
    Target("aarch64-musllinux_1_2", "aarch64-unknown-linux-musl", "musllinux_1_2", "aarch64",
           "musl"),
)

# Python flavours: one abi3 wheel for every CPython >= 3.11, and one per free-threaded series
# (the stable ABI does not cover them). The Python tag each flavour's wheel name carries.
FLAVOURS = {"abi3": "cp311-abi3", "cp313t": "cp313-cp313t", "cp314t": "cp314-cp314t"}

# A sane wheel: the release build's shared object is a few MB (zstd's C code, the engine, PyO3);
# well below means a stub or a failed link, well above means debug info or a second copy.
SIZE_MIN = 512 * 1024
SIZE_MAX = 24 * 1024 * 1024


def by_name(name: str) -> Target:
    for t in TARGETS:
        if t.name == name:
            return t
    known = ", ".join(t.name for t in TARGETS)
    raise SystemExit(f"unknown wheel target {name!r}: one of {known}")


def for_wheel(filename: str) -> tuple[Target, str]:
    """The target and flavour a wheel's file name says it is for."""
    parts = filename.removesuffix(".whl").split("-")
    if len(parts) != 5:
        raise SystemExit(f"{filename}: not a wheel name (name-version-python-abi-platform.whl)")
    python = f"{parts[2]}-{parts[3]}"
    flavours = [f for f, t in FLAVOURS.items() if t == python]
    targets = [t for t in TARGETS if t.tag in parts[4].split(".")]
    if not flavours or not targets:
        raise SystemExit(f"{filename}: {python} / {parts[4]} is not a wheel this project builds")
    return targets[0], flavours[0]
