"""The worker of this tree against the worker of another commit, alternating, in one hour.

    .venv/bin/python benchmarks/versus.py REV [--mode batched|single] [--rounds 12]

``make bench`` times each contender three times in one run, but this machine's speed moves
between hours by more than most changes move the worker (three runs of one morning gave
batched 0.85x, 0.84x and 0.78x Quix; README, "Where memdiag stands"). This takes the hour
out of a comparison of two versions of memdiag: it checks ``REV`` out in a worktree beside
this one (``.build/versus/REV``, with its own ``make install``, kept for the next time), then
runs the two workers in turn, round after round, each on a fresh embedded broker with the
pipeline benchmark's events (``benchmarks/pipeline.py``), timed as ``make bench`` times
them: from the worker's first record until its committed offsets reach the input's end, and
the CPU of its whole process in that time. Each round's own ratio (this ÷ REV) is its figure;
the median of them is the one to read.

One round is a child process per worker (``--one``), so each runs its own tree's code.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVENTS = 60_000


def one(mode: str, tag: str) -> None:
    """A round of one worker (the code of the tree this file was run from): its rate and CPU
    per event, on the last line of standard output."""
    sys.path.insert(0, str(Path.cwd() / "benchmarks"))
    from pipeline import make_events, messages, publish, run_memdiag

    from memdiag.broker import EmbeddedBroker
    from memdiag.kafka import ensure_topics
    from memdiag.settings import Settings

    msgs = messages(make_events(EVENTS, 1_000), mode)
    with EmbeddedBroker() as broker:
        settings = Settings.from_env({}, broker=broker.url, topic_prefix=f"vs{tag}.",
                                     app_id=f"versus-{tag}")  # fmt: skip
        asyncio.run(ensure_topics(settings))
        asyncio.run(publish(settings, msgs))
        took, cpu = run_memdiag(settings, Path(tempfile.mkdtemp(prefix="memdiag-versus-")))
    print(f"{EVENTS / took:.1f} {cpu / EVENTS * 1e6:.3f}")


def worktree(rev: str) -> Path:
    """``rev`` checked out beside this tree, installed (once)."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    tree = ROOT / ".build" / "versus" / sha
    if not tree.exists():
        print(f"checking out {sha} in {tree} and installing it (a minute or two)", flush=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT,
                       check=True, capture_output=True)  # fmt: skip
    if not (tree / ".venv" / ".installed").exists():
        made = subprocess.run(["make", ".venv/.installed"], cwd=tree,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if made.returncode:
            sys.exit(f"installing {sha} in {tree} failed:\n{made.stderr}")
    return tree


def run_round(tree: Path, mode: str, tag: str) -> tuple[float, float]:
    """One round of the worker of ``tree``, in its own interpreter and code."""
    out = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), str(Path(__file__).resolve()), "--one", mode,
         tag], cwd=tree, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    return float(out[-2]), float(out[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", nargs="?", help="the commit to compare this tree's worker with")
    parser.add_argument("--mode", choices=["batched", "single"], default="batched")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--one", nargs=2, metavar=("MODE", "TAG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(*args.one)
        return 0
    if not args.rev:
        parser.error("name the commit to compare with (e.g. HEAD~3 or a tag)")
    other = worktree(args.rev)
    rows: dict[str, list[tuple[float, float]]] = {"this": [], args.rev: []}
    for n in range(1, args.rounds + 1):
        for name, tree in (("this", ROOT), (args.rev, other)):
            rate, cpu = run_round(tree, args.mode, f"{n}{'t' if name == 'this' else 'o'}")
            rows[name].append((rate, cpu))
            print(f"round {n:>2} {name:<12} {rate:>9,.0f} events/s {cpu:6.1f} CPU µs/event",
                  flush=True)  # fmt: skip
    this, that = rows["this"], rows[args.rev]
    print(f"\n{EVENTS:,} {args.mode} search events, {args.rounds} rounds, alternating")
    print(f"{'worker':<14}{'events/s':>12}{'CPU µs/event':>16}   (medians)")
    for name, runs in rows.items():
        print(f"{name:<14}{statistics.median(r for r, _ in runs):>12,.0f}"
              f"{statistics.median(c for _, c in runs):>16.1f}")  # fmt: skip
    rate = statistics.median(a[0] / b[0] for a, b in zip(this, that, strict=True))
    cpu = statistics.median(a[1] / b[1] for a, b in zip(this, that, strict=True))
    print(f"{'this ÷ ' + args.rev:<14}{rate:>11.2f}×{cpu:>15.2f}×   (median of the rounds' "
          "own ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
