#!/usr/bin/python3
"""deploy.packages: every apt package list the images install resolves on this machine's
apt archive (Debian 12 after scripts/setup.sh), through

  apt-get install --simulate --no-install-recommends -o Debug::NoLocking=1 LIST...

so that a misspelt, renamed or missing package fails here, with its name, and not in a
`docker build` (no Docker engine and no registry for the base images here).

Lists checked:
  cpu-build     deploy/docker/Dockerfile.cpu, build stage (debian:12): the packages of
                deploy/docker/build-packages.txt it installs
  cpu-runtime   deploy/docker/Dockerfile.cpu, runtime stage (debian:12-slim): what
                deploy/docker/runtime-packages.sh prints for the given built flce-server
                and flce-client (--elf), which is what the image's build stage computes
                and its runtime stage installs (both on Debian 12, like this machine);
                plus any package the runtime stage names itself
  gpu-build     Dockerfile, build stage (nvidia/cuda ...-devel-ubuntu24.04): the same
                list, by name against Debian 12 (build-packages.txt holds names that
                Ubuntu 24.04 and Debian 12 share)
Not checked (printed): the GPU runtime stage's list, which runtime-packages.sh computes on
Ubuntu 24.04 at image build time (Ubuntu's 64-bit-time_t names such as libgrpc++1.51t64
do not exist in Debian), and that the gpu-build names exist in Ubuntu 24.04.

Usage: packages_test.py --root SOURCE_DIR [--elf FILE]... [--list NAME=PKG,PKG...]
(--list adds a list, e.g. to see a misspelt name fail.)
Exit: 0 passed, 1 failed, 77 skipped (no apt-get on this machine).
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_checks as dc  # noqa: E402


def stage_packages(root, rel):
    """[(stage image, [packages])] of a Dockerfile: what each stage installs by name (its
    apt-get install commands, and deploy/docker/build-packages.txt where it installs that)."""
    text = open(os.path.join(root, rel), encoding="utf-8").read()
    return [(st["image"], dc.stage_install_packages(root, st))
            for st in dc.dockerfile_stages(text)]


def apt_lists_present():
    p = subprocess.run(["apt-get", "indextargets", "--format", "$(FILENAME)",
                        "Created-By: Packages"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return any(glob.glob(f + "*") for f in p.stdout.split())


def simulate(pkgs):
    """(ok, problems, output) of apt-get install --simulate on pkgs."""
    env = dict(os.environ, LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
    p = subprocess.run(["apt-get", "install", "--simulate", "--no-install-recommends", "-qq",
                        "-o", "Debug::NoLocking=1", "-o", "APT::Get::Show-Versions=0"] + pkgs,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    problems = []
    for m in re.finditer(r"Unable to locate package (\S+)", p.stdout):
        problems.append(f"{m.group(1)}: no such package")
    for m in re.finditer(r"Package '?([^' ]+)'? has no installation candidate", p.stdout):
        problems.append(f"{m.group(1)}: no installation candidate")
    for m in re.finditer(r"^ (\S+) : Depends: (.*)$", p.stdout, re.M):
        problems.append(f"{m.group(1)}: unmet dependency {m.group(2).strip()}")
    return p.returncode == 0, problems, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--elf", action="append", default=[],
                    help="a built flce-server / flce-client (the CPU image's runtime list)")
    ap.add_argument("--list", action="append", default=[], metavar="NAME=PKG,PKG...")
    args = ap.parse_args()
    root = os.path.abspath(args.root)

    if not shutil.which("apt-get"):
        print("SKIP: apt-get is not installed (not a Debian/Ubuntu machine): the images' "
              "package lists were not checked")
        return 77
    osr = {}
    if os.path.exists("/etc/os-release"):
        for line in open("/etc/os-release", encoding="utf-8"):
            k, _, v = line.strip().partition("=")
            osr[k] = v.strip('"')
    host = f"{osr.get('ID', '?')} {osr.get('VERSION_ID', '?')}"
    print(f"host: {osr.get('PRETTY_NAME', host)}")
    if host != "debian 12":
        print(f"note: the lists are meant to be checked on Debian 12; this is {host}")
    if not apt_lists_present():
        print("FAIL: no apt package lists on this machine (/var/lib/apt/lists): run "
              "`apt-get update` (scripts/setup.sh does) and rerun")
        return 1

    lists = []  # (name, packages)
    cpu = stage_packages(root, dc.CPU_DOCKERFILE)
    gpu = stage_packages(root, dc.GPU_DOCKERFILE)
    if len(cpu) < 2 or len(gpu) < 2:
        print("FAIL: a Dockerfile has fewer than two stages (deploy.dockerfile says more)")
        return 1
    lists.append((f"cpu-build ({dc.CPU_DOCKERFILE}, {cpu[0][0]})", cpu[0][1]))
    runtime = list(cpu[-1][1])
    if args.elf:
        script = os.path.join(root, "deploy", "docker", "runtime-packages.sh")
        p = subprocess.run([script] + args.elf, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        if p.returncode != 0:
            print(f"FAIL: {script} exited with {p.returncode}:\n{p.stderr}")
            return 1
        runtime += p.stdout.split()
    else:
        print("note: no --elf given (flce-server/flce-client not built): the CPU runtime list "
              "computed from the binaries was not checked")
    if runtime:
        lists.append((f"cpu-runtime ({dc.CPU_DOCKERFILE}, {cpu[-1][0]})", runtime))
    lists.append((f"gpu-build ({dc.GPU_DOCKERFILE}, {gpu[0][0]}; names checked against "
                  f"{host})", gpu[0][1]))
    if gpu[-1][1]:
        lists.append((f"gpu-runtime named packages ({dc.GPU_DOCKERFILE}, {gpu[-1][0]})",
                      gpu[-1][1]))
    for extra in args.list:
        name, _, pkgs = extra.partition("=")
        lists.append((name, [p for p in pkgs.split(",") if p]))

    failed = 0
    done = {}  # a list already simulated (the two build stages share theirs): its result
    for name, pkgs in lists:
        key = tuple(sorted(pkgs))
        if pkgs and key in done:
            print(f"{'ok' if done[key][0] else 'FAIL'}: {name}: the same {len(pkgs)} packages "
                  f"as {done[key][1]}")
            failed += 0 if done[key][0] else 1
            continue
        if not pkgs:
            print(f"FAIL: {name}: no packages found (the apt-get install could not be parsed)")
            failed += 1
            continue
        ok, problems, out = simulate(pkgs)
        done[key] = (ok, name.split(" ")[0])
        if ok:
            print(f"ok: {name}: {len(pkgs)} packages resolve: {' '.join(pkgs)}")
            continue
        failed += 1
        print(f"FAIL: {name}: apt-get install --simulate failed for {' '.join(pkgs)}")
        for pr in problems:
            print(f"  {pr}")
        if not problems:
            print("  " + out.strip().replace("\n", "\n  "))
    print(f"not checked: {dc.GPU_DOCKERFILE}'s runtime list (computed on Ubuntu 24.04 at image "
          "build), and whether the gpu-build names exist in Ubuntu 24.04")
    if failed:
        print(f"deploy packages: {failed} of {len(lists)} lists failed")
        return 1
    print(f"deploy packages: {len(lists)} lists resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
