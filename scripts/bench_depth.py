#!/usr/bin/env python3
"""What a receive+delete costs as a queue gets deeper, split into the
library's own work and the kernel's, for queues with and without shards and
for the bare filesystem loop laid out the same ways.

Each case fills a fresh directory (untimed, in its own process), then a
second process opens it and takes N messages one by one, under
``perf stat -e instructions:u,instructions:k``; a run that takes none gives
the start-up to subtract. User-space instructions do not move with the load
on a shared machine, so they show whether the library's own work per message
grows with depth; kernel instructions and CPU time show the filesystem's.

    .venv/bin/python scripts/bench_depth.py                       # depths 1,000 and 1,000,000 (~15 min here)
    .venv/bin/python scripts/bench_depth.py --depths 1000,100000 --shards 1,16

Needs ``perf`` (Debian: linux-perf). Imports vsqs from this checkout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = b"x" * 100


def worker(argv: list[str]) -> None:
    """``worker KIND fill|take PATH COUNT SHARDS``: KIND is vsqs or bare."""
    kind, role, path, count, shards = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    if kind == "vsqs":
        sys.path.insert(0, REPO)
        import vsqs

        if role == "fill":
            q = vsqs.Queue(path, create=True, shards=shards)
            for start in range(0, count, 1000):
                q.publish_batch([BODY] * min(1000, count - start), durable=False)
            return
        q = vsqs.Queue(path)
        started = time.process_time()
        for _ in range(count):
            m = q.receive()
            q.delete(m.receipt)
    else:  # the bare loop: same-shaped names, spread over ``shards`` directories as vsqs would
        dirs = [os.path.join(path, f"{i:02x}") for i in range(shards)]
        if role == "fill":
            for d in dirs:
                os.makedirs(d)
            for i in range(count):
                name = f"9-{1795305501723584 + i:016d}-{i * 0x9E3779B97F4A7C15 % 2**64:016x}"
                fd = os.open(os.path.join(dirs[i % shards], name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                os.write(fd, BODY)
                os.close(fd)
            return
        started = time.process_time()
        done = 0
        for d in dirs:  # one listing per directory, names in order, as a consumer would
            for name in sorted(os.listdir(d)):
                if done == count:
                    break
                taken = os.path.join(d, name + ".x")
                os.rename(os.path.join(d, name), taken)
                fd = os.open(taken, os.O_RDONLY)
                os.read(fd, 65536)
                os.close(fd)
                os.unlink(taken)
                done += 1
    print(f"cpu_s {time.process_time() - started}")


def perf(kind: str, path: str, count: int, shards: int) -> dict[str, float]:
    cmd = ["perf", "stat", "-x", ",", "-e", "instructions:u,instructions:k", sys.executable,
           os.path.abspath(__file__), "--worker", kind, "take", path, str(count), str(shards)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    found = {"cpu_s": 0.0}
    for line in done.stdout.splitlines():
        if line.startswith("cpu_s "):
            found["cpu_s"] = float(line.split()[1])
    for line in done.stderr.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2].startswith("instructions"):
            found[fields[2]] = float(fields[0])
    return found


def case(kind: str, depth: int, take: int, shards: int, scratch: str) -> dict[str, float]:
    path = os.path.join(scratch, f"{kind}-{depth}-{shards}")
    started = time.monotonic()
    subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", kind, "fill", path,
                    str(depth + take), str(shards)], check=True)
    fill_s = time.monotonic() - started
    base, run = perf(kind, path, 0, shards), perf(kind, path, take, shards)
    shutil.rmtree(path)
    return {
        "user": (run["instructions:u"] - base["instructions:u"]) / take,
        "kernel": (run["instructions:k"] - base["instructions:k"]) / take,
        "cpu_us": run["cpu_s"] / take * 1e6,
        "fill_s": fill_s,
    }


def main() -> int:
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", default="1000,1000000", help="comma-separated depths (1000,1000000)")
    p.add_argument("--shards", default="1,64", help="comma-separated shard counts (1,64)")
    p.add_argument("--take", type=int, default=250_000, help="messages taken at a depth, at most the depth (250000)")
    p.add_argument("--dir", default=os.path.join(os.getcwd(), ".bench"), help="scratch parent (./.bench)")
    p.add_argument("--markdown", nargs="?", const="-", metavar="PATH",
                   help="also print the results as markdown tables, with a line naming the command, commit, "
                        "date and machine (to PATH, or to stdout after the usual output)")
    args = p.parse_args()
    if shutil.which("perf") is None:
        p.error("needs perf (Debian: apt install linux-perf)")
    probe = subprocess.run(["perf", "stat", "-x,", "-e", "instructions:u,instructions:k", "true"],
                           capture_output=True, text=True, check=False)
    if "<not supported>" in probe.stderr or probe.returncode != 0:
        p.error("perf cannot count instructions:u and instructions:k on this machine (a VM?); "
                "scripts/bench_instructions.py --counter callgrind counts user-space instructions without it")
    depths = [int(d) for d in args.depths.split(",")]
    shard_counts = [int(s) for s in args.shards.split(",")]
    os.makedirs(args.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="depth-", dir=args.dir)
    print(f"{'case':<28} {'depth':>9} {'taken':>7} {'user instr/msg':>15} {'kernel instr/msg':>17} "
          f"{'CPU us/msg':>11} {'fill s':>7}")
    rows: dict[tuple[str, int, int], dict[str, float]] = {}
    try:
        for shards in shard_counts:
            for kind in ("vsqs", "bare"):
                for depth in depths:
                    take = min(depth, args.take)
                    r = rows[(kind, shards, depth)] = case(kind, depth, take, shards, scratch)
                    label = f"{kind} {'flat' if shards == 1 else f'{shards} shards'}"
                    print(f"{label:<28} {depth:>9,} {take:>7,} {r['user']:>15,.0f} {r['kernel']:>17,.0f} "
                          f"{r['cpu_us']:>11.1f} {r['fill_s']:>7.0f}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    low, high = min(depths), max(depths)
    print(f"\nat depth {high:,} / at depth {low:,}:")
    growth = []
    for shards in shard_counts:
        for kind in ("vsqs", "bare"):
            a, b = rows[(kind, shards, high)], rows[(kind, shards, low)]
            label = f"{kind} {'flat' if shards == 1 else f'{shards} shards'}"
            growth.append([label, f"{a['user'] / b['user']:.2f}x", f"{a['kernel'] / b['kernel']:.2f}x",
                           f"{a['cpu_us'] / b['cpu_us']:.2f}x"])
            print(f"  {label:<26} user {growth[-1][1]}   kernel {growth[-1][2]}   CPU {growth[-1][3]}")
    if args.markdown:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _report

        table = [[f"{kind} {'flat' if shards == 1 else f'{shards} shards'}", f"{depth:,}",
                  f"{min(depth, args.take):,}", f"{r['user']:,.0f}", f"{r['kernel']:,.0f}", f"{r['cpu_us']:.1f}",
                  f"{r['fill_s']:.0f}"] for (kind, shards, depth), r in rows.items()]
        _report.emit([
            _report.provenance(REPO, args.dir, "perf stat, (a run taking N) - (a run taking none)"),
            _report.table(["case", "depth", "taken", "user instr/msg", "kernel instr/msg", "CPU µs/msg", "fill s"],
                          table, right=(1, 2, 3, 4, 5, 6)),
            _report.table([f"at depth {high:,} / at depth {low:,}", "user", "kernel", "CPU"], growth,
                          right=(1, 2, 3)),
        ], args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
