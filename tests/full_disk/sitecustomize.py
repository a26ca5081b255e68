"""A disk that fills up, for the tests: imported at start-up by every Python process whose PYTHONPATH begins with
this folder (worker processes inherit it). A file whose name ends with $FULL_DISK_AT opens for writing as usual,
and its first write fails with ENOSPC, as on a full disk; every other file is untouched."""
import builtins
import errno
import os

SUFFIX = os.environ.get("FULL_DISK_AT")


class FullFile:
    def __init__(self, file):
        self.file = file

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def __getattr__(self, name):
        return getattr(self.file, name)


def full_disk_open(suffix, real_open):
    """An `open` whose files ending with `suffix` open for writing and then fail their first write (ENOSPC)."""
    def open_on_a_full_disk(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and os.fspath(file).endswith(suffix) and set(mode) & set("wax"):
            return FullFile(opened)
        return opened
    return open_on_a_full_disk


if SUFFIX:
    builtins.open = full_disk_open(SUFFIX, builtins.open)
