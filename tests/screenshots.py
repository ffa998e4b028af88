"""Headless Chromium screenshots for the tests that render a page (the fleet report, the
dashboard preview), and a PNG reader (zlib and struct, no image library) to check that what
was drawn is not blank. With SATTR_SCREENSHOTS naming a directory the picture is kept there
(`make screenshots`: the README's pictures)."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


def screenshot(page: Path, png: Path, size: str, keep_as: str = "") -> None:
    """Render ``page`` (a local file, no network) at ``size`` ("W,H") into ``png``."""
    assert CHROMIUM, "chromium is not installed (cluster/deps.sh apt)"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--disable-background-networking", "--disable-component-update", "--disable-sync",
                               "--no-first-run", f"--user-data-dir={profile}", f"--screenshot={png}",
                               f"--window-size={size}", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    shots = os.environ.get("SATTR_SCREENSHOTS")
    if shots and keep_as:
        os.makedirs(shots, exist_ok=True)
        shutil.copy(png, os.path.join(shots, keep_as))


def png_colours(data: bytes, want: set[tuple[int, int, int]] | None = None, sample: int = 1) -> set[tuple[int, int, int]]:
    """The RGB colours of a PNG's pixels (8-bit RGB or RGBA, not interlaced), every ``sample``th
    pixel of every ``sample``th row, reading from the top until every colour in ``want`` was seen."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    assert head is not None, "no IHDR"
    width, height, depth, ctype, _comp, _filt, interlace = head
    assert depth == 8 and ctype in (2, 6) and interlace == 0, head
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(b"".join(idat)), width * bpp
    prev, seen = bytearray(stride), set()
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride) if f else ():  # PNG's filters undone (RFC 2083 6.3-6.6)
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % sample == 0:
            step = bpp * sample
            seen.update(zip(line[0::step], line[1::step], line[2::step]))
        prev = line
        if want and want <= seen:
            break
    return seen
