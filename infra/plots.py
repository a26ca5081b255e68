"""matplotlib, optional: every result plot of the project is drawn through pyplot(), and skipped without it.

A plot is drawn from the JSON beside it (same name, .json), written just before it by the same command, and
save() stamps the PNG with that JSON's sha256: tests/test_house.py checks every committed plot against its JSON,
so a table rerun without redrawing its plot is caught (experiments/redraw.py redraws them all from their JSON)."""
import hashlib
import os
import zlib

STAMP = "Source"  # the PNG text key that holds "<name>.json sha256 <hex>"


def pyplot():
    """matplotlib.pyplot drawing into files (no screen needed), or None where matplotlib is not installed: a plot
    is an extra beside its table, never a reason to fail."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def json_digest(png_path):
    """(file name, sha256) of the JSON a plot is drawn from: the same path with .json."""
    json_path = os.path.splitext(png_path)[0] + ".json"
    with open(json_path, "rb") as f:
        return os.path.basename(json_path), hashlib.sha256(f.read()).hexdigest()


def save(fig, path, dpi):
    """fig to the PNG `path`, whole or not at all, stamped with the digest of the JSON beside it; the figure is
    closed (a long run draws many)."""
    name, digest = json_digest(path)
    partial = path + ".partial"
    fig.savefig(partial, dpi=dpi, format="png", metadata={STAMP: f"{name} sha256 {digest}"})
    os.replace(partial, path)
    import matplotlib.pyplot as plt
    plt.close(fig)


def stamp(png_path):
    """The text save() wrote into a PNG, or None: read from its tEXt chunks (no package needed)."""
    with open(png_path, "rb") as f:
        data = f.read()
    at = 8  # after the PNG signature: chunks of (length, type, data, crc)
    while at + 8 <= len(data):
        length, kind = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8]
        body = data[at + 8:at + 8 + length]
        if kind in (b"tEXt", b"zTXt", b"iTXt"):
            key, _, text = body.partition(b"\0")
            if kind == b"zTXt":
                text = zlib.decompress(text[1:])
            elif kind == b"iTXt":
                text = text[2:].split(b"\0", 2)[2]  # compression flag, method, language, translated keyword
            if key.decode("latin-1") == STAMP:
                return text.decode("utf-8")
        at += 12 + length
    return None
