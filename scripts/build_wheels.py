"""Builds every Linux wheel and the sdist into one directory, each checked before it is written.

    python3 scripts/build_wheels.py                      # all four abi3 wheels, cp313t, sdist
    python3 scripts/build_wheels.py --out DIR --only x86_64-manylinux2014 --no-sdist

The targets (manylinux2014 and musllinux_1_2, x86-64 and aarch64) are scripts/wheel_targets.py's;
each is cross-compiled by maturin with zig as the linker, against glibc 2.17 or musl, and checked
right after packing by scripts/wheel_audit.py (policy tag, linked libraries and symbol versions,
its own platform's shared object only, size). A wheel that fails its check is deleted and the
run exits non-zero; nothing reaches the output directory until it has passed (wheels are built
in a private staging directory and moved in). Free-threaded cp313t wheels are built where the
interpreter scripts/freethreaded.sh makes is present (otherwise the run says so and skips them).

Needs Rust (rustup, with the targets: the run names any that are missing), a C compiler and
Python >= 3.11. maturin, ziglang and auditwheel come from the package index into a tools
environment outside the checkout (~/.cache/loaderx-wheel-tools, made on first use); each target's
cargo target directory is kept under ~/.cache/loaderx-wheel-target (LOADERX_WHEEL_TARGET), one
per checkout, so a later build of the same checkout compiles only what changed. Every cargo run
holds /tmp/loaderx-cargo.lock.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wheel_targets  # a sibling script, found through the line above

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache"
TOOLS = Path(os.environ.get("LOADERX_WHEEL_TOOLS", CACHE / "loaderx-wheel-tools"))
TARGET_CACHE = Path(os.environ.get("LOADERX_WHEEL_TARGET", CACHE / "loaderx-wheel-target"))
# The target directories are per checkout (by its path): cargo judges a workspace crate fresh by
# its sources' times against its last build, so another checkout's build of older sources in
# the same directory would be taken for this one's, and a change left out of the wheel.
CHECKOUT_KEY = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
# Free-threaded interpreters, as scripts/freethreaded.sh builds them (cpython-3.13t/, ...).
FT_CACHE = Path(os.environ.get("LOADERX_FT_CACHE", CACHE / "loaderx-ft"))
# Empty: no lock (a machine that runs one build at a time).
LOCK = os.environ.get("LOADERX_CARGO_LOCK", "/tmp/loaderx-cargo.lock")
# The tools, pinned: a release that changes how wheels are tagged or checked is taken on purpose.
TOOL_REQUIREMENTS = ["maturin==1.16.0", "ziglang==0.17.1", "auditwheel==6.8.2"]
# Free space each build needs: a target directory is about 1 GiB, a wheel a few MB.
SPACE_PER_TARGET_GIB = 2


def say(msg: str) -> None:
    print(f"build_wheels: {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    say(msg)
    raise SystemExit(1)


def tools_python() -> Path:
    return TOOLS / "venv" / "bin" / "python"


def ensure_tools() -> None:
    """Makes the tools environment once per requirement list; re-runs this script under it."""
    stamp = TOOLS / "venv" / ".requirements"
    want = "\n".join(TOOL_REQUIREMENTS)
    if not (stamp.is_file() and stamp.read_text() == want and tools_python().exists()):
        say(f"installing {' '.join(TOOL_REQUIREMENTS)} into {TOOLS / 'venv'} (once)")
        shutil.rmtree(TOOLS / "venv", ignore_errors=True)
        TOOLS.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(TOOLS / "venv")], check=True)
            subprocess.run([str(tools_python()), "-m", "pip", "install", "-q",
                            "--disable-pip-version-check", *TOOL_REQUIREMENTS], check=True)
        except subprocess.CalledProcessError:
            shutil.rmtree(TOOLS / "venv", ignore_errors=True)
            die(f"could not install {' '.join(TOOL_REQUIREMENTS)} from the package index "
                f"(pip's message is above); nothing was built")
        stamp.write_text(want)
    if Path(sys.prefix).resolve() != (TOOLS / "venv").resolve():
        os.execv(str(tools_python()), [str(tools_python()), __file__, *sys.argv[1:]])


def preflight(targets: list[wheel_targets.Target], out: Path) -> None:
    """Stops with what to install when a rustup target, zig, flock or disk space is missing."""
    if shutil.which("cargo") is None:
        die("no cargo on PATH: install Rust (rustup) first")
    installed = set()
    if shutil.which("rustup"):
        r = subprocess.run(["rustup", "target", "list", "--installed"], capture_output=True,
                           text=True)
        installed = set(r.stdout.split())
    else:  # a toolchain without rustup: the standard library's directory per target
        sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True,
                                 text=True).stdout.strip()
        installed = {p.name for p in Path(sysroot, "lib", "rustlib").iterdir() if p.is_dir()}
    missing = [t.rust for t in targets if t.rust not in installed]
    if missing:
        die(f"the Rust standard library is missing for {', '.join(missing)}: "
            f"run `rustup target add {' '.join(missing)}`")
    zig = subprocess.run([sys.executable, "-m", "ziglang", "version"], capture_output=True,
                         text=True)
    if zig.returncode != 0:
        die(f"zig does not run from {sys.executable} -m ziglang: `pip install ziglang` into "
            f"{TOOLS / 'venv'} (or delete that directory: the next run remakes it)")
    if LOCK and shutil.which("flock") is None:
        die("no flock (util-linux): builds take /tmp/loaderx-cargo.lock with it")
    TARGET_CACHE.mkdir(parents=True, exist_ok=True)
    need = SPACE_PER_TARGET_GIB * len(targets)
    for path in (TARGET_CACHE, out):
        free = shutil.disk_usage(path).free / 2**30
        if free < need:
            die(f"{need} GiB free needed at {path} ({len(targets)} target(s)), {free:.1f} GiB "
                f"free: free some space or point LOADERX_WHEEL_TARGET / --out elsewhere")


def parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def lock_prefix() -> list[str]:
    """`flock LOCK`, unless an ancestor of this process holds the lock already (test.sh run as
    `flock /tmp/loaderx-cargo.lock bash scripts/test.sh`): taking it again would wait forever."""
    if not LOCK:
        return []
    try:
        inode = os.stat(LOCK).st_ino
        table = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return ["flock", LOCK]
    holders = set()
    for line in table:  # "1: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF"
        f = line.split()
        if len(f) >= 6 and f[1] == "FLOCK" and f[5].endswith(f":{inode}"):
            holders.add(int(f[4]))
    pid = os.getpid()
    while pid > 1:
        if pid in holders:
            return []
        try:
            pid = parent(pid)
        except (OSError, IndexError, ValueError):
            break
    return ["flock", LOCK]


def run_locked(cmd: list[str], env: dict[str, str], log: Path) -> bool:
    """Runs a cargo-driving command under the shared cargo lock; its output goes to log."""
    with log.open("w") as f:
        r = subprocess.run([*lock_prefix(), *cmd], cwd=ROOT, env=env, stdout=f,
                           stderr=subprocess.STDOUT)
    if r.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()
        say(f"{' '.join(cmd[:3])} ... failed; the end of {log}:")
        print("\n".join(lines[-25:]), file=sys.stderr)
    return r.returncode == 0


@functools.cache
def host_triple() -> str:
    out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True).stdout
    return next(line.split()[1] for line in out.splitlines() if line.startswith("host:"))


def free_threaded_interpreter(target: wheel_targets.Target, flavour: str) -> tuple[str, str]:
    """maturin's --interpreter for a free-threaded flavour and target, or "" and why there is
    none. The host's target needs the interpreter itself (scripts/freethreaded.sh builds it);
    another target gets maturin's own description of that CPython, which maturin 1.16 has for
    3.14t and later only (it refuses to cross-compile for 3.13t)."""
    series = f"{flavour[2]}.{flavour[3:-1]}"
    if target.rust == host_triple():
        path = FT_CACHE / f"cpython-{series}t" / "bin" / f"python{series}t"
        if path.exists():
            return str(path), ""
        make = "bash scripts/freethreaded.sh" if series == "3.13" else (
            f"FT_SERIES={series} FT_SUITE=forky bash scripts/freethreaded.sh")  # its 3.14 line
        return "", f"no free-threaded CPython {series}t at {path} (`{make}` builds it)"
    if (int(flavour[2]), int(flavour[3:-1])) < (3, 14):
        return "", "maturin cross-compiles free-threaded wheels for 3.14t and later only"
    return f"python{series}t", ""


def remove_old(out: Path, target: wheel_targets.Target, flavour: str) -> None:
    """Drops an earlier run's wheel for this target and flavour: a failed rebuild leaves none."""
    python = wheel_targets.FLAVOURS[flavour]
    for old in out.glob(f"loaderx-*-{python}-*.whl"):
        if target.tag in old.name.removesuffix(".whl").split("-")[4].split("."):
            old.unlink()


def publish(staged: Path, out: Path) -> Path:
    """Moves a checked file into the output directory in one rename (no partial file there)."""
    tmp = out / f".{staged.name}.part"
    shutil.copyfile(staged, tmp)
    dest = out / staged.name
    os.replace(tmp, dest)
    staged.unlink()
    return dest


def build_wheel(target: wheel_targets.Target, flavour: str, out: Path, stage: Path) -> str:
    """Builds, checks and publishes one wheel; returns its result line."""
    remove_old(out, target, flavour)
    here = stage / f"{target.name}-{flavour}"
    here.mkdir()
    # Not the caller's environment (test.sh activates .venv): maturin is told what to build for.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    suffix = "" if flavour == "abi3" else f"-{flavour}"
    env["CARGO_TARGET_DIR"] = str(TARGET_CACHE / CHECKOUT_KEY / f"{target.rust}{suffix}")
    cmd = [sys.executable, "-m", "maturin", "build", "--release", "--zig", "--target",
           target.rust, "--compatibility", target.compatibility, "--out", str(here)]
    if flavour != "abi3":
        cmd += ["--interpreter", free_threaded_interpreter(target, flavour)[0],
                "--no-default-features"]
    start = time.monotonic()
    if not run_locked(cmd, env, stage / f"{target.name}-{flavour}.log"):
        return f"FAILED  {target.name} {flavour}: maturin build failed"
    seconds = time.monotonic() - start
    wheels = sorted(here.glob("*.whl"))
    if len(wheels) != 1:
        return f"FAILED  {target.name} {flavour}: maturin made {[w.name for w in wheels]}"
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "wheel_audit.py"),
                            str(wheels[0]), "--target", target.name])
    if check.returncode != 0:
        wheels[0].unlink()
        return f"FAILED  {target.name} {flavour}: its check failed (above); wheel deleted"
    dest = publish(wheels[0], out)
    return f"ok      {dest.name} ({dest.stat().st_size / 2**20:.1f} MiB, built in {seconds:.0f} s)"


def build_sdist(out: Path, stage: Path) -> str:
    for old in out.glob("loaderx-*.tar.gz"):
        old.unlink()
    here = stage / "sdist"
    here.mkdir()
    cmd = [sys.executable, "-m", "maturin", "sdist", "--out", str(here)]
    if not run_locked(cmd, dict(os.environ), stage / "sdist.log"):
        return "FAILED  sdist: maturin sdist failed"
    archives = sorted(here.glob("loaderx-*.tar.gz"))
    if len(archives) != 1:
        return f"FAILED  sdist: maturin made {[a.name for a in archives]}"
    with tarfile.open(archives[0]) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    # What pip needs to build it: the metadata, both manifests, the engine's and binding's source.
    want = {"PKG-INFO", "pyproject.toml", "Cargo.toml", "Cargo.lock",
            "crates/loaderx-py/Cargo.toml", "crates/zrecord/src/lib.rs",
            "python/loaderx/__init__.py"}
    if want - names:
        archives[0].unlink()
        return f"FAILED  sdist: lacks {sorted(want - names)}; deleted"
    dest = publish(archives[0], out)
    return f"ok      {dest.name} ({dest.stat().st_size / 2**20:.1f} MiB, {len(names)} files)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist",
                        help="the output directory (default: dist/ in the checkout)")
    parser.add_argument("--only", action="append", metavar="TARGET",
                        help="build this target only (repeatable): "
                             + ", ".join(t.name for t in wheel_targets.TARGETS))
    parser.add_argument("--flavour", action="append", choices=sorted(wheel_targets.FLAVOURS),
                        help="abi3, cp313t, cp314t (repeatable; default: all, each free-threaded "
                             "one where the toolchain can make it, the others named as skipped)")
    parser.add_argument("--no-sdist", action="store_true", help="leave the sdist out")
    args = parser.parse_args()
    ensure_tools()
    targets = [wheel_targets.by_name(n) for n in args.only] if args.only else list(
        wheel_targets.TARGETS)
    flavours = args.flavour or list(wheel_targets.FLAVOURS)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    preflight(targets, out)
    stage = TARGET_CACHE / f".staging-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    results, notes = [], []
    start = time.monotonic()
    try:
        for target in targets:
            for flavour in flavours:
                why = "" if flavour == "abi3" else free_threaded_interpreter(target, flavour)[1]
                if why:  # one the toolchain cannot make: a failure only when asked for by name
                    line = f"{target.name} {flavour}: {why}"
                    if args.flavour:
                        results.append(f"FAILED  {line}")
                    else:
                        notes.append(f"skipped {line}")
                    continue
                say(f"building {target.name} {flavour}")
                results.append(build_wheel(target, flavour, out, stage))
                say(results[-1])
        if not args.no_sdist:
            results.append(build_sdist(out, stage))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        for part in out.glob(".*.part"):
            part.unlink()
    ok = sum(r.startswith("ok") for r in results)
    print(f"\n{ok} of {len(results)} built in {time.monotonic() - start:.0f} s into {out}:")
    for line in results + notes:
        print(f"  {line}")
    return 1 if any(r.startswith("FAILED") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
