"""Screenshot the report artifact in the Prefect UI with a real headless browser, and check that
the capacity chart rendered (not a broken image); or, with --releases REPO, the release-history table
artifact, and check that its columns and a release rendered.

    make ui &                                    # or scripts/ui.sh: the UI on the demo's database
    .venv/bin/python -m scripts.screenshot_report --out ui-report.png
    .venv/bin/python -m scripts.screenshot_report --releases quantize-serve/tiny-llama-awq-w4a16 \
        --out docs/ui-release-history.png

Needs Chromium (Debian: apt-get install chromium). It finds the newest artifact with the key
(default: the demo's tiny-llama-awq-report), opens its page in the UI (the default v2 UI, or v1
with --ui-version v1), then checks three things:
1. the rendered page holds an <img alt="capacity"> whose src is a data:image/png URI;
2. that URI decodes to a PNG with a non-zero size;
3. the screenshot shows the chart's own bar colours (a broken image shows none of them).
For --releases: the rendered page shows the table's columns and at least one gated release.
Exit status 0 when all hold, 1 otherwise. The screenshot is then stored with a 256-colour palette
(small enough to commit). Not part of the test suite: it needs a browser.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from tasks.releases import history_artifact_key

# The capacity chart's colours (quantize_serve/capacity/chart.py): weights, KV cache, concurrency.
CHART_COLOURS = {
    "weights": (0x4C, 0x72, 0xB0),
    "KV cache": (0xDD, 0x84, 0x52),
    "concurrency": (0x55, 0xA8, 0x68),
}
MIN_PIXELS = 500  # per colour; a bar of the chart at any sensible size has many more
# What the release-history table must show (quantize_serve/release/history.py rows): its columns and a
# release.
HISTORY_CELLS = ("commit", "decision", "min recovery", "KV tokens", "promoted")


def latest_artifact_id(ui: str, key: str) -> str:
    body = json.dumps({"artifacts": {"key": {"any_": [key]}}, "sort": "CREATED_DESC", "limit": 1}).encode()
    req = urllib.request.Request(f"{ui}/api/artifacts/filter", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        found = json.loads(resp.read())
    if not found:
        raise SystemExit(f"no artifact with key {key!r} at {ui}: run the demo (make demo) first")
    return found[0]["id"]


def chromium(binary: str, url: str, *extra: str, width: int, height: int) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "--virtual-time-budget=20000",
                *extra,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return struct.unpack(">II", data[16:24])


def chart_image_in_dom(dom: str, alt: str = "capacity") -> tuple[int, int] | None:
    """The size of the PNG an <img alt=...> carries as a data URI in the rendered page, or None."""
    for tag in re.findall(r"<img\b[^>]*>", dom):
        if f'alt="{alt}"' not in tag:
            continue
        m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', tag)
        if m:
            return png_size(base64.b64decode(m.group(1)))
        print(f"the <img alt={alt!r}> is there but its src is not a PNG data URI: {tag[:200]}")
    return None


def missing_cells(dom: str, cells: tuple[str, ...]) -> list[str]:
    """The ``cells`` the rendered page's text does not show."""
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    return [c for c in cells if c not in text]


def colour_pixels(png: Path) -> dict[str, int]:
    from PIL import Image  # comes with matplotlib in the pipeline environment

    img = Image.open(png).convert("RGB")
    counts = dict.fromkeys(CHART_COLOURS, 0)
    for (r, g, b), n in ((px, n) for n, px in img.getcolors(maxcolors=1 << 24)):
        for name, (cr, cg, cb) in CHART_COLOURS.items():
            if abs(r - cr) + abs(g - cg) + abs(b - cb) <= 24:
                counts[name] += n
    return counts


def compact(png: Path) -> None:
    """Re-save as a 256-colour PNG: a UI screenshot loses nothing visible and shrinks ~3x."""
    from PIL import Image

    Image.open(png).convert("RGB").quantize(colors=256).save(png, optimize=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ui", default="http://127.0.0.1:4200", help="the Prefect server (UI and API)")
    ap.add_argument("--key", default="tiny-llama-awq-report", help="the report artifact's key")
    ap.add_argument(
        "--releases",
        metavar="REPO",
        help="screenshot the release-history table of this Hub repo instead of the report",
    )
    ap.add_argument("--ui-version", choices=("v2", "v1"), default="v2")
    ap.add_argument("--out", type=Path, default=Path("ui-report.png"))
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=2400)
    ap.add_argument(
        "--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
    )
    args = ap.parse_args(argv)

    ui = args.ui.rstrip("/")
    key = history_artifact_key(args.releases) if args.releases else args.key
    artifact = latest_artifact_id(ui, key)
    url = f"{ui}{'/v2' if args.ui_version == 'v2' else ''}/artifacts/artifact/{artifact}"
    print(f"artifact {key} ({artifact}): {url}")

    dom = chromium(args.chromium, url, "--dump-dom", width=args.width, height=args.height)
    if args.releases:
        return screenshot_table(args, url, missing_cells(dom.stdout, HISTORY_CELLS))
    size = chart_image_in_dom(dom.stdout)
    print(
        f"rendered page: {len(dom.stdout):,} characters; capacity chart <img>: "
        f"{'%d x %d PNG data URI' % size if size else 'NOT FOUND'}"
    )

    args.out.parent.mkdir(parents=True, exist_ok=True)
    shot = chromium(
        args.chromium, url, f"--screenshot={args.out.resolve()}", width=args.width, height=args.height
    )
    if not args.out.is_file():
        print(f"no screenshot was written:\n{shot.stderr[-2000:]}")
        return 1
    pixels = colour_pixels(args.out)
    compact(args.out)
    print(
        f"screenshot {args.out} ({args.out.stat().st_size:,} bytes); chart colours on screen (pixels): "
        + ", ".join(f"{k} {v:,}" for k, v in pixels.items())
    )

    ok = bool(size and size[0] > 0 and size[1] > 0) and min(pixels.values()) >= MIN_PIXELS
    print("OK: the capacity chart renders in the UI" if ok else "FAILED: the capacity chart did not render")
    return 0 if ok else 1


def screenshot_table(args: argparse.Namespace, url: str, missing: list[str]) -> int:
    shown = f"shows {', '.join(HISTORY_CELLS)}" if not missing else f"MISSING {', '.join(missing)}"
    print(f"release-history table: {shown}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    chromium(args.chromium, url, f"--screenshot={args.out.resolve()}", width=args.width, height=args.height)
    if not args.out.is_file():
        print("no screenshot was written")
        return 1
    compact(args.out)
    print(f"screenshot {args.out} ({args.out.stat().st_size:,} bytes)")
    print(
        "OK: the release history renders in the UI"
        if not missing
        else "FAILED: the release history did not render"
    )
    return 0 if not missing else 1


if __name__ == "__main__":
    sys.exit(main())
