"""The Docker backend's image, built locally (no registry): a skeleton of folders and links.

Containers see the same system as the bubblewrap sandbox: the host's ``/usr`` parts of
:func:`~.environment.system_paths`, the solution environment and the ``/etc`` files are bind-mounted
read-only at run time, so the image itself holds only what those mounts need -- the top-level
links of a merged-``/usr`` system (``/bin -> usr/bin``...), empty mount points, a ``passwd``/``group``
naming the sandbox users, and ``/tmp``. It is a few kilobytes, built by ``docker import`` of a
tarball made here, tagged by a digest of its contents, in about a second.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

from .solution_env import INSIDE_PATH

__all__ = ["IMAGE_REPOSITORY", "ensure_image", "skeleton_tar"]

IMAGE_REPOSITORY = "wmrl-sandbox"
_TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def skeleton_tar(mount_points: list[str], uids: range) -> bytes:
    """The image's root filesystem as an uncompressed tarball (deterministic for equal inputs)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add_dir(path: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(path.strip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
            tar.addfile(info)

        def add_file(path: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(path.strip("/"))
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))

        dirs = {"/usr", "/etc", "/proc", "/dev", "/sys", "/sandbox", "/opt", INSIDE_PATH}
        dirs |= {"/sandbox/data", "/sandbox/code"}
        links = {}
        for top in _TOP_LINKS:
            if os.path.islink(top):
                links[top] = os.readlink(top)
            elif os.path.isdir(top):
                dirs.add(top)
        for mp in mount_points:
            if mp.startswith("/etc/"):
                continue  # files, bound over the image's (Docker creates file mount points)
            parts = mp.strip("/").split("/")
            for i in range(1, len(parts) + 1):
                dirs.add("/" + "/".join(parts[:i]))
        for d in sorted(dirs):
            add_dir(d)
        # tmpfs mounts take the mode of the folder they cover: writable for the sandbox users.
        add_dir("/tmp", 0o1777)
        add_dir("/sandbox/work", 0o1777)
        for top, target in sorted(links.items()):
            info = tarfile.TarInfo(top.strip("/"))
            info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 0
            tar.addfile(info)
        passwd = "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n" + "".join(
            f"sandbox{u}:x:{u}:{u}:sandbox:/sandbox/work:/usr/sbin/nologin\n" for u in uids
        )
        group = "root:x:0:\n" + "".join(f"sandbox{u}:x:{u}:\n" for u in uids)
        add_file("/etc/passwd", passwd.encode())
        add_file("/etc/group", group.encode())
    return buf.getvalue()


def ensure_image(client, mount_points: list[str], uids: range) -> str:
    """The tag of the skeleton image for these mount points and users, imported if missing."""
    import docker

    data = skeleton_tar(mount_points, uids)
    tag = hashlib.sha256(data).hexdigest()[:16]
    name = f"{IMAGE_REPOSITORY}:{tag}"
    try:
        client.images.get(name)
        return name
    except docker.errors.ImageNotFound:
        pass
    client.api.import_image_from_data(data, repository=IMAGE_REPOSITORY, tag=tag)
    client.images.get(name)  # raises if the import did not produce it
    return name
