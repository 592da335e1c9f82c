#!/usr/bin/env python3
"""Whether the GPU bundle's programs will find every library they need on the GPU machine.

The GPU machine is a bare Ubuntu 24.04 with Python and the torch wheel: what a program there can
load is its bundle's own lib/ folder, the wheels' library folders (torch/lib, nvidia/*/lib) and
the few libraries every such system has (glibc's, libstdc++, libgcc_s, and the driver's
libcuda). This resolves every DT_NEEDED entry of every ELF file in the bundle against exactly
those, never against this machine's system folders: the first GPU run failed to load because
libutf8proc.so.2 and libpcre2-8.so.0 (the tokenizer's) were not there, while ldd here found them.

  gpu_bundle_libs.py --bundle .gpu_bundle --site SITE_PACKAGES          # check: exit 1 if any
  gpu_bundle_libs.py --bundle .gpu_bundle --site SITE_PACKAGES --carry  # copy the missing ones

--carry copies each library that is none of the above from this machine (ldconfig's cache) into
the bundle's lib/ under its soname, then resolves its own needs the same way. The names checked
and where each was found are printed; an unresolved one is named with the file that needs it.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys

# What a bare Ubuntu 24.04 image with the torch wheel provides outside the wheels: glibc's
# libraries, the C++ runtime, and the driver's libcuda (mounted in by the container runtime).
ALLOWED = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
    "ld-linux-x86-64.so.2", "libutil.so.1", "libresolv.so.2",
    "libstdc++.so.6", "libgcc_s.so.1",
    "libcuda.so.1",
}


def needed(path):
    """DT_NEEDED names of an ELF file (objdump -p), or None for a file that is not ELF."""
    out = subprocess.run(["objdump", "-p", path], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return [line.split()[1] for line in out.stdout.splitlines() if line.strip().startswith("NEEDED")]


def wheel_libraries(site):
    """soname -> path for every shared library in the wheels' library folders under `site`."""
    found = {}
    for folder in [os.path.join(site, "torch", "lib")] + glob.glob(os.path.join(site, "nvidia", "*", "lib")):
        for path in glob.glob(os.path.join(folder, "*.so*")):
            found.setdefault(os.path.basename(path), path)
    return found


def system_library(name):
    """This machine's path of `name` from ldconfig's cache (x86-64), or None."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.strip().split(" => ")
        if len(parts) == 2 and parts[0].split()[0] == name and "x86-64" in parts[0]:
            return parts[1]
    return None


def resolve(bundle, site, carry, log=print):
    lib = os.path.join(bundle, "lib")
    os.makedirs(lib, exist_ok=True)
    wheels = wheel_libraries(site)
    todo = sorted(glob.glob(os.path.join(bundle, "bin", "*")) + glob.glob(os.path.join(lib, "*.so*")))
    seen, missing, where = set(), [], {}
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        names = needed(path)
        if names is None:
            continue
        for name in names:
            if os.path.exists(os.path.join(lib, name)):
                where[name] = "bundle"
                todo.append(os.path.join(lib, name))
            elif name in wheels:
                where[name] = "wheel"
            elif name in ALLOWED:
                where[name] = "system (allowed)"
            elif carry and system_library(name):
                source = system_library(name)
                shutil.copy2(os.path.realpath(source), os.path.join(lib, name))
                log(f"carried {name} from {source}")
                where[name] = "bundle (carried)"
                todo.append(os.path.join(lib, name))
            else:
                missing.append((name, os.path.relpath(path, bundle)))
    return where, missing


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", required=True, help="the bundle folder (bin/ and lib/)")
    p.add_argument("--site", required=True, help="a site-packages folder with the torch wheel")
    p.add_argument("--carry", action="store_true", help="copy what is missing into lib/")
    a = p.parse_args()
    if not os.path.isdir(os.path.join(a.site, "torch", "lib")):
        sys.exit(f"gpu_bundle_libs.py: {a.site} has no torch/lib (expected the torch wheel's site-packages)")
    where, missing = resolve(a.bundle, a.site, a.carry)
    for kind in ("bundle", "bundle (carried)", "wheel", "system (allowed)"):
        names = sorted(n for n, w in where.items() if w == kind)
        if names:
            print(f"  {kind}: {' '.join(names)}")
    if missing:
        for name, by in missing:
            print(f"MISSING on the GPU machine: {name} (needed by {by}): neither in the bundle, "
                  f"the wheels, nor on the allow-list; run with --carry", file=sys.stderr)
        sys.exit(1)
    print("every library the bundle needs is in the bundle, a wheel or the allow-list")


if __name__ == "__main__":
    main()
