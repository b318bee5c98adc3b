"""The README's picture of the live view: `memdiag serve` on the demo, in Debian's Chromium.

    .venv/bin/python scripts/screenshot.py [--db memdiag-demo.duckdb] [--out docs/img/overview.png]

Makes the demo's file first when it is missing (`memdiag demo`), serves it on a free port,
and takes the overview at 1280 px wide, the top 1500 px (the cards, the latest failed
sessions, the failure distribution). `make screenshot` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser import CHROMIUM_ARGS, chromium_path  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="memdiag-demo.duckdb")
    p.add_argument("--out", default=str(ROOT / "docs" / "img" / "overview.png"))
    args = p.parse_args()
    chromium = chromium_path()
    if chromium is None:
        print("Debian's chromium is not installed: `make browser` (as root)", file=sys.stderr)
        return 2
    db = Path(args.db)
    env = {k: v for k, v in os.environ.items() if k != "MEMDIAG_BROKER"}
    if not db.exists():
        subprocess.run([sys.executable, "-m", "memdiag.cli", "demo", "--db", str(db), "--quiet",
                        "--report", str(db.with_suffix(".html"))], check=True, env=env,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "memdiag.cli", "serve", "--db", str(db),
                               "--port", str(port)], env=env)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as r:  # noqa: S310 - loopback
                    if json.loads(r.read())["state"] == "ready":
                        break
            except OSError:
                time.sleep(0.1)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1500})
            page.goto(base + "/")
            page.wait_for_load_state("networkidle")
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=args.out)
            browser.close()
        print(f"wrote {args.out}")
    finally:
        server.terminate()
        server.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
