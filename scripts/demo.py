#!/usr/bin/env python3
"""The main job: a producer/consumer pipeline over a spool in a local directory.

    scripts/demo                      # ./spool, 10,000 orders, 2 worker processes
    scripts/demo --spool /mnt/shared/spool --orders 50000 --workers 4

The driver publishes generated orders into `incoming`; worker processes
receive them, price each order and publish the result to `results`, deleting
the input only after the result is durably published; the driver then drains
`results` into a summary. Some orders are malformed on purpose: their
handler fails, and they stay in `incoming` for inspection after the run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sys
import time
from collections import Counter

import vsqs

PRODUCTS = {"widget": 2.50, "gadget": 12.00, "gizmo": 7.25, "doohickey": 0.99}


def make_orders(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    orders = []
    for i in range(n):
        order = {
            "order": i,
            "customer": f"c{rng.randrange(500):03d}",
            "product": rng.choice(list(PRODUCTS)),
            "quantity": rng.randrange(1, 20),
        }
        if rng.random() < 0.001:
            order["quantity"] = "many"  # malformed: the handler rejects it
        orders.append(json.dumps(order).encode())
    return orders


def price(body: bytes) -> bytes:
    order = json.loads(body)
    if not isinstance(order["quantity"], int):
        raise ValueError(f"order {order['order']}: bad quantity {order['quantity']!r}")
    total = round(PRODUCTS[order["product"]] * order["quantity"], 2)
    return json.dumps({"customer": order["customer"], "product": order["product"], "total": total}).encode()


def work(spool: str) -> tuple[int, int]:
    incoming = vsqs.Queue(os.path.join(spool, "incoming"))
    results = vsqs.Queue(os.path.join(spool, "results"))

    def handle(message: vsqs.Message) -> None:
        results.publish(price(message.body))  # durable, before the input is deleted

    stats = vsqs.Worker(incoming, handle, burst=True, wait=0.5, visibility_timeout=30).work()
    return stats.processed, stats.failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spool", default="spool", help="spool directory (default ./spool)")
    parser.add_argument("--orders", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the spool from an earlier run")
    args = parser.parse_args()

    spool = os.path.abspath(args.spool)
    if not args.keep and os.path.isdir(spool):
        shutil.rmtree(spool)
    incoming = vsqs.Queue(os.path.join(spool, "incoming"), create=True)
    results = vsqs.Queue(os.path.join(spool, "results"), create=True)
    print(f"spool: {spool}")

    started = time.monotonic()
    orders = make_orders(args.orders)
    for i in range(0, len(orders), 1000):
        incoming.publish_batch(orders[i : i + 1000])
    published = time.monotonic()
    print(f"published {len(orders):,} orders in {published - started:.2f}s")

    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        counts = pool.map(work, [spool] * args.workers)
    processed = sum(p for p, _ in counts)
    failed = sum(f for _, f in counts)
    worked = time.monotonic()
    print(
        f"{args.workers} workers processed {processed:,} orders in {worked - published:.2f}s "
        f"({processed / max(worked - published, 1e-9):,.0f} msg/s), {failed} failed"
    )

    revenue: Counter[str] = Counter()
    drained = 0
    while batch := results.receive_batch(100):
        for m in batch:
            doc = json.loads(m.body)
            revenue[doc["product"]] += doc["total"]
            m.delete()
            drained += 1
    print(f"drained {drained:,} results")
    for product, total in revenue.most_common():
        print(f"  {product:<10} {total:>12,.2f}")
    left = incoming.stats()
    print(f"incoming after the run: {left.ready} ready (malformed orders kept for inspection)")
    ok = drained == processed and processed + left.total == len(orders)
    print("OK: every order accounted for" if ok else "MISMATCH: orders lost or duplicated")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
