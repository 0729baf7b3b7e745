#!/usr/bin/env python3
"""Checks the images images/build.sh wrote, from their own filesystems (tests/images/run.sh).

For each <name>.oci.tar: umoci (an independent OCI implementation, from Debian) verifies every
blob against its digest and unpacks the image into a runtime bundle; the bundle's process (the
image config's entrypoint, user and environment) must be the binary, as a non-root user, with no
shell anywhere in the filesystem; then the entrypoint runs from the unpacked root (chroot, as the
image's user, with only the image's environment) with --version and --help. The gateway image
also serves a chat completion through an engine simulator on loopback, found by a name in the
container's /etc/hosts (as the kubelet writes it): the C runtime, name lookup and the non-root
user work as they will in a pod.

  check.py IMAGES_DIR VERSION ENGINESIM
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SHELLS = ("bin/sh", "bin/bash", "bin/dash", "bin/busybox", "usr/bin/sh", "usr/bin/bash", "usr/bin/env")


def fail(msg):
    sys.exit(f"FAIL {msg}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unpack(archive, work):
    layout, bundle = os.path.join(work, "layout"), os.path.join(work, "bundle")
    os.makedirs(layout)
    subprocess.run(["tar", "-xf", archive, "-C", layout], check=True)
    with open(os.path.join(layout, "index.json")) as f:
        refs = [m["annotations"]["org.opencontainers.image.ref.name"] for m in json.load(f)["manifests"]]
    if len(refs) != 1:
        fail(f"{archive}: index.json has {len(refs)} images, expected one")
    # umoci checks each blob's digest and size while it unpacks.
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{refs[0]}", bundle], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(bundle, "config.json")) as f:
        return refs[0], os.path.join(bundle, "rootfs"), json.load(f)["process"]


def command(rootfs, process, extra):
    """The image's process, run from its root as its user with only its environment."""
    user = process["user"]
    chroot = [shutil.which("chroot") or "/usr/sbin/chroot", f"--userspec={user['uid']}:{user['gid']}", rootfs]
    return ["env", "-i"] + process["env"] + chroot + process["args"] + extra


def check_image(name, archive, version, enginesim):
    with tempfile.TemporaryDirectory() as work:
        ref, rootfs, process = unpack(archive, work)
        if ref != version:
            fail(f"{name}: tagged {ref!r}, expected the release version {version!r}")
        entry = f"/usr/local/bin/{name}"
        if process["args"] != [entry]:
            fail(f"{name}: entrypoint {process['args']}, expected [{entry!r}]")
        if process["user"]["uid"] == 0 or process["user"]["gid"] == 0:
            fail(f"{name}: runs as {process['user']}, expected a non-root user")
        shells = [s for s in SHELLS if os.path.lexists(os.path.join(rootfs, s))]
        if shells:
            fail(f"{name}: the image has a shell: {shells}")
        programs = sorted(
            os.path.relpath(os.path.join(d, f), rootfs)
            for d, _, files in os.walk(rootfs) for f in files
            if os.access(os.path.join(d, f), os.X_OK) and ".so" not in f
        )
        if programs != [entry.lstrip("/")]:
            fail(f"{name}: executables other than the entrypoint: {programs}")
        out = subprocess.run(command(rootfs, process, ["--version"]), capture_output=True, text=True)
        if out.returncode != 0 or out.stdout.strip() != f"{name} {version}":
            fail(f"{name}: --version gave {out.returncode} {out.stdout!r} {out.stderr!r}")
        out = subprocess.run(command(rootfs, process, ["--help"]), capture_output=True, text=True)
        if out.returncode != 0 or "Usage:" not in out.stdout:
            fail(f"{name}: --help gave {out.returncode} {out.stderr!r}")
        if name == "flotilla-gateway":
            serve_through(rootfs, process, enginesim)
        size = os.path.getsize(archive)
        print(f"ok {name}: {ref}, user {process['user']['uid']}, {len(programs)} program, {size // 1024} KiB archive", flush=True)


def serve_through(rootfs, process, enginesim):
    engine_port, gateway_port = free_port(), free_port()
    with open(os.path.join(rootfs, "etc/hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n127.0.0.1 engine.member.test\n")
    with open(os.path.join(rootfs, "tmp/routing.yaml"), "w") as f:
        f.write(f"clusters:\n  - {{name: m1, url: \"http://engine.member.test:{engine_port}\", jurisdiction: EU}}\n"
                "models:\n  - name: tiny\n    routes: [{cluster: m1}]\n")
    os.chmod(os.path.join(rootfs, "tmp/routing.yaml"), 0o644)
    engine = subprocess.Popen([enginesim, "--listen", f"127.0.0.1:{engine_port}", "--name", "m1", "--model", "tiny"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    listen = ["--config", "/tmp/routing.yaml", "--listen", f"127.0.0.1:{gateway_port}", "--api-keys", "sk-image-test"]
    gateway = subprocess.Popen(command(rootfs, process, listen), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
        deadline, last = time.time() + 30, None
        while time.time() < deadline:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{gateway_port}/v1/chat/completions", body,
                                             {"content-type": "application/json", "authorization": "Bearer sk-image-test"})
                with urllib.request.urlopen(req, timeout=5) as resp:
                    answer = json.load(resp)
                if answer["choices"][0]["message"]["content"]:
                    return
            except Exception as err:  # not listening yet, or the engine not probed healthy yet
                last = err
            if gateway.poll() is not None:
                fail(f"flotilla-gateway: exited {gateway.returncode} from its image: {gateway.stderr.read()[-2000:]}")
            time.sleep(0.3)
        fail(f"flotilla-gateway: no chat completion from the image within 30 s: {last}")
    finally:
        for p in (gateway, engine):
            p.kill()
            p.wait()


def main():
    images, version, enginesim = sys.argv[1:4]
    if os.geteuid() != 0:
        fail("check.py runs each image from its own filesystem with chroot and umoci, which need root")
    with open(os.path.join(images, "digests.tsv")) as f:
        names = [line.split("\t")[0] for line in f if line.strip()]
    expected = ["flotilla-controller", "flotilla-gateway", "flotilla-stage", "flotilla-member-router"]
    if names != expected:
        fail(f"digests.tsv names {names}, expected {expected}")
    for name in names:
        check_image(name, os.path.join(images, f"{name}.oci.tar"), version, enginesim)


if __name__ == "__main__":
    main()
