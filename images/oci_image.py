#!/usr/bin/env python3
"""Writes Flotilla's container images as OCI image-layout archives, without a container engine.

Each image is two layers: a base shared by every image (the C runtime the binaries link
against, CA certificates, a passwd/group naming the non-root user 65532, nsswitch.conf, /tmp)
and the one binary, stripped, at /usr/local/bin/<name>, which is the entrypoint. There is no
shell and no package manager. The base files are copied from the build machine's own Debian
packages (the libraries the binary was linked against, found by `ldd`), and the image's
annotations name those packages and their versions.

Reproducible: entries are sorted, every timestamp is SOURCE_DATE_EPOCH (the caller passes the
commit's time), owners are numeric, gzip carries no name or time. The same binaries, base files,
version and revision give the same bytes, so the same manifest digest.

  oci_image.py --out-dir DIR --version V --revision R [--source-date-epoch T] BINARY...

writes DIR/<binary name>.oci.tar for each BINARY and DIR/digests.tsv (name, manifest digest,
archive size) and prints the digests.
"""
import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

USER = 65532
SOURCE = "https://github.com/flotilla-dev/flotilla"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
ETC = {
    "etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    "etc/group": "root:x:0:\nnonroot:x:65532:\n",
    "etc/nsswitch.conf": "hosts: files dns\n",
}


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def linked_libraries(binary):
    """The shared objects `binary` loads, as (path in the image, path on this machine)."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts:
            path = parts[parts.index("=>") + 1]
        elif parts and parts[0].startswith("/"):
            path = parts[0]  # the dynamic loader
        else:
            continue  # linux-vdso
        if path.startswith("/"):
            libs.append((path.lstrip("/"), os.path.realpath(path)))
    if not libs:
        sys.exit(f"oci_image: {binary} links nothing (static?); this writer copies the C runtime it links")
    return libs


def owning_package(path):
    try:
        out = subprocess.run(["dpkg-query", "-S", path], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    pkg = out.split(":")[0].strip()
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True).stdout
    return f"{pkg}={version}" if version else pkg


class Layer:
    """A tar layer built in memory, entries sorted and normalised."""

    def __init__(self, epoch):
        self.epoch = epoch
        self.entries = {}  # path -> (TarInfo, bytes or None)

    def _info(self, path, kind, mode, size=0):
        info = tarfile.TarInfo(path)
        info.type, info.mode, info.size, info.mtime = kind, mode, size, self.epoch
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    def directory(self, path, mode=0o755, owner=0):
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub not in self.entries:
                self.entries[sub] = (self._info(sub, tarfile.DIRTYPE, 0o755), None)
        info = self._info(path.strip("/"), tarfile.DIRTYPE, mode)
        info.uid = info.gid = owner
        self.entries[path.strip("/")] = (info, None)

    def file(self, path, data, mode=0o644):
        parent = os.path.dirname(path)
        if parent and parent not in self.entries:
            self.directory(parent)
        self.entries[path] = (self._info(path, tarfile.REGTYPE, mode, len(data)), data)

    def symlink(self, path, target):
        parent = os.path.dirname(path)
        if parent and parent not in self.entries:
            self.directory(parent)
        info = self._info(path, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.entries[path] = (info, None)

    def blobs(self):
        """(diff_id, gzip bytes): the layer's uncompressed and compressed forms."""
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.entries):
                info, data = self.entries[path]
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        raw = raw.getvalue()
        packed = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=6) as gz:
            gz.write(raw)
        return sha256(raw), packed.getvalue()


def base_layer(binaries, epoch):
    layer = Layer(epoch)
    packages = set()
    for image_path, host_path in sorted({lib for b in binaries for lib in linked_libraries(b)}):
        with open(host_path, "rb") as f:
            layer.file(image_path, f.read(), 0o755)
        packages.add(owning_package(host_path))
    if not os.path.exists(CA_BUNDLE):
        sys.exit(f"oci_image: {CA_BUNDLE} is missing: install Debian's ca-certificates")
    with open(CA_BUNDLE, "rb") as f:
        layer.file(CA_BUNDLE.lstrip("/"), f.read())
    packages.add(owning_package("/usr/share/ca-certificates"))
    for path, text in ETC.items():
        layer.file(path, text.encode())
    layer.directory("tmp", 0o1777)
    layer.directory("home/nonroot", 0o700, USER)
    return layer, sorted(p for p in packages if p)


def stripped(binary):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bin")
        subprocess.run(["strip", "--strip-all", "-o", out, binary], check=True)
        with open(out, "rb") as f:
            return f.read()


def write_layout(path, blobs, manifest, ref, epoch):
    """An OCI image layout (oci-layout, index.json, blobs/sha256/*) as one tar archive."""
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(manifest),
            "size": len(manifest),
            "annotations": {"org.opencontainers.image.ref.name": ref},
        }],
    }
    layout = Layer(epoch)
    layout.file("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
    layout.file("index.json", canonical(index))
    for data in blobs + [manifest]:
        layout.file("blobs/sha256/" + sha256(data)[7:], data)
    with open(path + ".part", "wb") as out, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(layout.entries):
            info, data = layout.entries[name]
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    os.replace(path + ".part", path)


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def image(binary, base, packages, args):
    name = os.path.basename(binary)
    created = datetime.datetime.fromtimestamp(args.source_date_epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    app = Layer(args.source_date_epoch)
    app.file(f"usr/local/bin/{name}", stripped(binary), 0o755)
    layers = [base, app.blobs()]
    annotations = {
        "org.opencontainers.image.title": name,
        "org.opencontainers.image.version": args.version,
        "org.opencontainers.image.revision": args.revision,
        "org.opencontainers.image.source": SOURCE,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.created": created,
        "dev.flotilla.base.packages": " ".join(packages),
    }
    config = canonical({
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "User": f"{USER}:{USER}",
            "Entrypoint": [f"/usr/local/bin/{name}"],
            "Env": ["PATH=/usr/local/bin", f"SSL_CERT_FILE={CA_BUNDLE}"],
            "WorkingDir": "/home/nonroot",
            "Labels": annotations,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff for diff, _ in layers]},
        "history": [
            {"created": created, "created_by": "flotilla images/oci_image.py: base (C runtime, CA certificates, user 65532)"},
            {"created": created, "created_by": f"flotilla images/oci_image.py: /usr/local/bin/{name}"},
        ],
    })
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config), "size": len(config)},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha256(gz), "size": len(gz)}
            for _, gz in layers
        ],
        "annotations": annotations,
    })
    out = os.path.join(args.out_dir, f"{name}.oci.tar")
    write_layout(out, [config] + [gz for _, gz in layers], manifest, args.version, args.source_date_epoch)
    return name, sha256(manifest), os.path.getsize(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--source-date-epoch", type=int, default=int(os.environ.get("SOURCE_DATE_EPOCH", "0")))
    parser.add_argument("binaries", nargs="+")
    args = parser.parse_args()
    if shutil.which("strip") is None or shutil.which("ldd") is None:
        sys.exit("oci_image: needs strip (binutils) and ldd (libc-bin)")
    os.makedirs(args.out_dir, exist_ok=True)
    base, packages = base_layer(args.binaries, args.source_date_epoch)
    base = base.blobs()
    rows = [image(b, base, packages, args) for b in args.binaries]
    with open(os.path.join(args.out_dir, "digests.tsv"), "w") as f:
        for name, digest, size in rows:
            f.write(f"{name}\t{digest}\t{size}\n")
            print(f"{name}\t{digest}\t{size} bytes")


if __name__ == "__main__":
    main()
