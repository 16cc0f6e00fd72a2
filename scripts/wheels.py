#!/usr/bin/env python3
"""Binary wheels of otel-gil: manylinux2014 (glibc 2.17) for each CPython and machine of
pyproject.toml's [tool.otel-gil.wheels], with every C part setup.py declares, the sdist, and
otel-gil-collector's pure-Python wheel (collector/).

Usage (make wheels runs it with the tools of scripts/wheel-tools.txt on PATH, as root):
    scripts/wheels.py [--out dist]

How: the sdist first, then each wheel built from it by `pip wheel` under a CPython of that
version (pyenv's on this host, a free-threaded one (3.13t) from scripts/freethreaded.sh, else
sid's from scripts/rootfs.sh, in a chroot), with zig cc
as compiler and linker for <machine>-linux-gnu.2.17 (glibc 2.17 symbol versions from zig's
own stubs, whatever glibc builds them); aarch64 is cross-compiled, setuptools told the
machine's extension suffix and platform tag. OTEL_GIL_REQUIRE_EXTENSIONS=1 makes a C part
that does not build fail the wheel. auditwheel repairs each to its manylinux tag, then the
gates auditwheel lacks: the extension modules all there, no RPATH/RUNPATH, every libc symbol
versioned and none newer than 2.17, the ELF machine; every header the collector's BPF program
includes in the wheel that installs it (otel_gil's in each otel_gil wheel, its own in the
collector's); and dist holds exactly the expected files.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTOR = ROOT / "collector"  # otel-gil-collector's project
CACHE = Path(os.environ.get("OTEL_GIL_CACHE", "/var/cache/otel-gil"))
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
GLIBC = (2, 17)  # manylinux2014
LEGACY_ALIAS = {"manylinux_2_17": "manylinux2014"}  # auditwheel names both in the file name
ELF_MACHINE = {"x86_64": "Advanced Micro Devices X86-64", "aarch64": "AArch64"}  # readelf -h
HOST_MACHINE = os.uname().machine
BUILD_TREE = "sid"  # scripts/rootfs.sh's tree with -dev packages for both machines
# The tree's multiarch pyconfig.h includes <TRIPLET/python3.X/pyconfig.h>: zig gets that
# directory alone, never /usr/include (the tree's glibc headers would replace zig's 2.17 ones).
TREE_PYCONFIG = "/tmp/otel-gil-pyconfig"


@dataclass(frozen=True)
class Target:
    python: str  # "3.12", "3.13t" (free-threaded)
    platform: str  # "manylinux_2_17_x86_64"

    @property
    def machine(self) -> str:
        return self.platform.split("_", 3)[3]  # manylinux_2_17_x86_64 -> x86_64

    @property
    def policy(self) -> str:
        return self.platform[: -len(self.machine) - 1]  # -> manylinux_2_17

    @property
    def tag(self) -> str:
        """The ABI tag: cp313, cp313t."""
        return "cp" + self.python.replace(".", "")

    @property
    def free_threaded(self) -> bool:
        return self.python.endswith("t")

    @property
    def ext_suffix(self) -> str:
        return f".{self.tag.replace('cp', 'cpython-')}-{self.machine}-linux-gnu.so"

    def wheel_name(self) -> str:
        """The file name auditwheel gives the repaired wheel."""
        legacy = LEGACY_ALIAS.get(self.policy)
        plat = f"{legacy}_{self.machine}.{self.platform}" if legacy else self.platform
        return f"otel_gil-{version()}-{self.tag.rstrip('t')}-{self.tag}-{plat}.whl"  # cp313-cp313t


def targets() -> list[Target]:
    """Every wheel built: the one list of versions and platforms, in pyproject.toml."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["otel-gil"]["wheels"]
    return [Target(py, plat) for py in config["pythons"] for plat in config["platforms"]]


def version() -> str:
    return re.search(r'"(.+)"', (ROOT / "otel_gil" / "version.py").read_text()).group(1)


def sdist_name() -> str:
    return f"otel_gil-{version()}.tar.gz"


def collector_wheel_name() -> str:
    """otel-gil-collector's wheel (pure Python: the daemon, its BPF source, the root tools)."""
    return f"otel_gil_collector-{version()}-py3-none-any.whl"


def expected_files() -> list[str]:
    return sorted([sdist_name(), collector_wheel_name(), *(t.wheel_name() for t in targets())])


@functools.cache
def bpf_includes() -> dict[str, str]:
    """What the collector's BPF program includes with quotes, transitively: file name -> the
    package it must be installed with (otel_gil's headers, or the collector's own)."""
    dirs = {"otel_gil": ROOT / "otel_gil", "otel_gil_collector": COLLECTOR / "otel_gil_collector"}
    found: dict[str, str] = {}
    todo = [COLLECTOR / "otel_gil_collector" / "gil.bpf.c"]
    while todo:
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', todo.pop().read_text(), re.M):
            package = next((p for p, d in dirs.items() if (d / name).exists()), None)
            if package is None:
                raise SystemExit(f"wheels.py: the BPF program includes {name}, found in neither package")
            if name not in found:
                found[name] = package
                todo.append(dirs[package] / name)
    return found


# setup.py run against a stand-in setuptools that prints the names of its extension modules,
# for a free-threaded build if argv[1] is 1.
_EXT_MODULES = """import sys, sysconfig, types
config_var = sysconfig.get_config_var
sysconfig.get_config_var = lambda name: int(sys.argv[1]) if name == "Py_GIL_DISABLED" else config_var(name)
class Extension:
    def __init__(self, name, *args, **kwargs):
        self.name = name
def setup(**kwargs):
    print(" ".join(e.name for e in kwargs.get("ext_modules", [])))
sys.modules["setuptools"] = types.SimpleNamespace(Extension=Extension, setup=setup)
sys.modules["setuptools.command.build_py"] = types.SimpleNamespace(build_py=object)
exec(open("setup.py").read())
"""


@functools.cache
def extension_modules(free_threaded: bool = False) -> list[str]:
    """The extension modules setup.py declares for a build with a GIL, or a free-threaded one
    (whatever it declares: its ``setup()`` call, intercepted)."""
    done = subprocess.run([sys.executable, "-c", _EXT_MODULES, str(int(free_threaded))], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def run(cmd: list[str], log: Path, **kwargs) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    if done.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise SystemExit(f"{tail}\nwheels.py: {cmd[0]} failed ({done.returncode}); log: {log}")


def zig_dir() -> Path:
    """The ziglang package (PyPI) of the interpreter running this: zig and its libc stubs."""
    import ziglang

    return Path(ziglang.__file__).parent


def compiler_env(target: Target, zig: str) -> dict[str, str]:
    """setuptools' compiler and linker (LDSHARED too: pyenv's carries an -rpath), and for a
    cross build the target's extension suffix and platform tag."""
    triple = f"-target {target.machine}-linux-gnu.{GLIBC[0]}.{GLIBC[1]}"
    env = {
        # zig builds a UBSan-instrumented debug binary with no -O: -O2 is the floor (the
        # interpreter's own CFLAGS, -O2 or -O3, come after it), and no sanitizer either way.
        "CC": f"{zig} cc {triple} -O2 -fno-sanitize=undefined",
        "LDSHARED": f"{zig} cc {triple} -shared",
        "OTEL_GIL_REQUIRE_EXTENSIONS": "1",
        "ZIG_GLOBAL_CACHE_DIR": "/tmp/otel-gil-zig-cache",
    }
    if target.machine != HOST_MACHINE:
        env.update(SETUPTOOLS_EXT_SUFFIX=target.ext_suffix, _PYTHON_HOST_PLATFORM=f"linux-{target.machine}")
    return env


def pyenv_python(version: str) -> Path | None:
    found = sorted(PYENV.glob(f"versions/{version}.*/bin/python{version}"),
                   key=lambda p: [int(n) for n in re.findall(r"\d+", p.parts[-3])])
    return found[-1] if found else None


def host_python(version: str) -> Path | None:
    """This host's CPython ``version``: pyenv's, or scripts/freethreaded.sh's for a free-threaded ``3.Xt``."""
    if not version.endswith("t"):
        return pyenv_python(version)
    done = subprocess.run([str(ROOT / "scripts" / "freethreaded.sh"), version[:-1]], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{done.stderr}\nwheels.py: scripts/freethreaded.sh {version[:-1]} failed")
    return Path(done.stdout.split()[-1])


def tree_path(name: str) -> Path:
    done = subprocess.run([str(ROOT / "scripts" / "rootfs.sh"), name], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{done.stderr}\nwheels.py: scripts/rootfs.sh {name} failed")
    return Path(done.stdout.split()[-1])


def build_wheel(target: Target, sdist: Path, work: Path, tree: Path | None) -> Path:
    """``pip wheel`` of the sdist for this target, linux_<machine>-tagged, in ``work``."""
    log = work / "build.log"
    python = host_python(target.python)
    if python is not None:
        env = {**os.environ, **compiler_env(target, str(zig_dir() / "zig"))}
        run([str(python), "-m", "pip", "wheel", "--no-deps", "-w", str(work / "wheel"), str(sdist)], log, env=env)
    else:
        if tree is None:
            raise SystemExit(f"wheels.py: no CPython {target.python} (pyenv install {target.python}, or add it to "
                             f"scripts/rootfs.sh's {BUILD_TREE})")
        inside = Path("/tmp") / f"otel-gil-wheel-{work.name}"
        (tree / inside.relative_to("/")).mkdir()
        shutil.copy2(sdist, tree / inside.relative_to("/"))
        triplet = f"{target.machine}-linux-gnu"
        env = {**compiler_env(target, "/opt/zig/zig"), "CPPFLAGS": f"-I{TREE_PYCONFIG}", "HOME": "/root",
               "PATH": "/usr/bin:/bin"}
        script = (f"mkdir -p {TREE_PYCONFIG}/{triplet} && ln -sfn /usr/include/{triplet}/python{target.python} "
                  f"{TREE_PYCONFIG}/{triplet}/ && cd {inside} && /opt/venv/{target.python}/bin/python -m pip wheel "
                  f"-q --no-deps -w wheel {sdist.name}")
        mount = ('mkdir -p "$1/opt/zig" && mount --bind "$2" "$1/opt/zig" && mount -t proc proc "$1/proc" '
                 '&& exec chroot "$1" env -i "${@:3}"')
        try:
            run(["unshare", "--mount", "--fork", "bash", "-c", mount, "build", str(tree), str(zig_dir()),
                 *(f"{k}={v}" for k, v in env.items()), "sh", "-c", script], log)
            shutil.copytree(tree / inside.relative_to("/") / "wheel", work / "wheel")
        finally:
            shutil.rmtree(tree / inside.relative_to("/"))
    wheels = list((work / "wheel").glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def repair(wheel: Path, out: Path, log: Path) -> None:
    """auditwheel: the manylinux tag the wheel's symbols allow, that tag alone. ``auto``:
    its --plat accepts only the host machine's policies, and a cross-built wheel's machine
    comes from the wheel; the exact expected file names (main) hold each to manylinux_2_17."""
    run(["auditwheel", "repair", "--plat", "auto", "--only-plat", "-w", str(out), str(wheel)], log)


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def check_wheel(path: Path, target: Target) -> list[str]:
    """What is wrong with a repaired wheel (the gates auditwheel lacks); empty if nothing."""
    problems, modules = [], extension_modules(target.free_threaded)
    with zipfile.ZipFile(path) as wheel, tempfile.TemporaryDirectory() as tmp:
        names = set(wheel.namelist())
        missing = sorted(f"{p}/{h}" for h, p in bpf_includes().items() if p == "otel_gil" and f"{p}/{h}" not in names)
        if missing:
            problems.append(f"lacks {missing}, which the collector compiles from the installed otel_gil")
        binaries = sorted(n for n in names if re.search(r"\.so(\.|$)", n))
        wanted = sorted(m.replace(".", "/") + target.ext_suffix for m in modules)
        if binaries != wanted:
            problems.append(f"shared objects {binaries}, expected {wanted} (setup.py's modules, nothing grafted)")
        for name in set(binaries) & set(wanted):
            so = wheel.extract(name, tmp)
            machine = re.search(r"Machine:\s+(.*)", readelf("-h", so)).group(1).strip()
            if machine != ELF_MACHINE[target.machine]:
                problems.append(f"{name}: ELF machine {machine}")
            if re.search(r"\((RPATH|RUNPATH)\)", readelf("-d", so)):
                problems.append(f"{name}: has an RPATH/RUNPATH")
            for line in readelf("--dyn-syms", so).splitlines():
                fields = line.split()
                if len(fields) < 8 or fields[6] != "UND" or not fields[7].strip():
                    continue
                symbol = fields[7]
                if "@" not in symbol:
                    if not symbol.startswith(("Py", "_Py")):  # the interpreter's: unversioned
                        problems.append(f"{name}: unversioned undefined symbol {symbol}")
                    continue
                glibc = re.search(r"@GLIBC_(\d+)\.(\d+)", symbol)
                if glibc and (int(glibc[1]), int(glibc[2])) > GLIBC:
                    problems.append(f"{name}: {symbol} is newer than glibc {GLIBC[0]}.{GLIBC[1]}")
    return problems


def build_sdist(out: Path, log: Path) -> Path:
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(ROOT)], log)
    sdist = out / sdist_name()
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    bad = [n for n in names if n.endswith(".so")]
    sources = sorted(p.name for p in (ROOT / "otel_gil").glob("*.[ch]"))  # every C part's, free-threaded or not
    missing = [h for h in sources if not any(n.endswith(f"/otel_gil/{h}") for n in names)]
    if bad or missing:
        raise SystemExit(f"wheels.py: the sdist has {bad} and lacks {missing}")
    return sdist


def build_collector_wheel(out: Path, log: Path) -> list[str]:
    """otel-gil-collector's wheel; what is wrong with it (the BPF program's own includes
    missing from it, which only a non-editable install shows), empty if nothing."""
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(COLLECTOR)], log)
    with zipfile.ZipFile(out / collector_wheel_name()) as wheel:
        names = set(wheel.namelist())
    wanted = ["otel_gil_collector/gil.bpf.c", *(f"{p}/{h}" for h, p in bpf_includes().items() if p == "otel_gil_collector")]
    return [f"{collector_wheel_name()} lacks {n}" for n in wanted if n not in names]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the files go (default: dist)")
    args = parser.parse_args()
    for tool in ("auditwheel", "patchelf", "readelf"):
        if shutil.which(tool) is None:
            raise SystemExit(f"wheels.py: {tool} not on PATH (make wheels installs the tools; readelf: binutils)")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("otel_gil[-_]*"):
        old.unlink()
    work = Path(tempfile.mkdtemp(prefix="otel-gil-wheels-"))
    sdist = build_sdist(out, work / "sdist.log")
    collector_problems = build_collector_wheel(out, work / "collector.log")
    todo = targets()
    tree = tree_path(BUILD_TREE) if any(host_python(t.python) is None for t in todo) else None

    def one(target: Target) -> list[str]:
        where = work / f"{target.tag}-{target.machine}"
        where.mkdir()
        wheel = build_wheel(target, sdist, where, tree)
        repair(wheel, out, where / "build.log")
        problems = check_wheel(out / target.wheel_name(), target) if (out / target.wheel_name()).exists() \
            else [f"auditwheel wrote {sorted(p.name for p in out.glob(f'*{target.tag}*{target.machine}*'))}"]
        print(f"wheels.py: {target.wheel_name()}: {'; '.join(problems) or 'ok'}", file=sys.stderr)
        return problems

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        problems = [*collector_problems, *(p for found in pool.map(one, todo) for p in found)]
    files = sorted(p.name for p in out.glob("otel_gil[-_]*"))
    if files != expected_files():
        problems.append(f"{out} holds {files}, expected {expected_files()}")
    if problems:
        print("\n".join(f"wheels.py: {p}" for p in problems), file=sys.stderr)
        return 1
    shutil.rmtree(work)
    print(f"wheels.py: {len(files)} files in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
