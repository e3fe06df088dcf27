#!/usr/bin/env python3
"""Wider payments: the stream of ../shared/peers/flink/gen.py with wider
events, for bench/wide_payments.toml.

Usage: wide_gen.py N OUT_EVENTS.jsonl [--seed S] [--accounts A]

The same clock, out-of-order share (5%), duplicates (1%, re-emitted
verbatim 1-2,000 lines later) and approved share (90%) as the peer's
generator, with:
  * 200,000 accounts by default, so that most events open a window of
    their own (about 3.9M windows for 5M events);
  * the id, the amount and the account inside nested objects, the amount
    a numeric string ("123.45");
  * members the contract does not read: a merchant with escaped text
    (quotes, a backslash, \\u escapes, a newline), a list of tags, a device
    object, a nested risk score, in a different order on some events.

Prints the lines, the approved unique events and the distinct windows
(account, minute) to stderr.
"""
import argparse
import heapq
import json
import random
import sys
import time

T0_MS = 1704067200000  # 2024-01-01T00:00:00.000Z
MERCHANTS = [
    'Caf\\u00e9 \\"Le Nord\\"',
    "B\\u00e4ckerei M\\u00fcller",
    'Joe\\u0027s \\\\ Diner',
    "Line\\nBreak Books",
    "\\u6771\\u4eac Mart",
    "Plain Shop",
]
TAGS = ['["food","eu"]', '["travel"]', "[]", '["online","subscription","eu"]']
AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X)",
    "okhttp/4.12.0",
]
REGIONS = ["eu-west", "eu-central", "us-east", "ap-south"]
TIERS = ["free", "pro", "team"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int)
    ap.add_argument("events")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--accounts", type=int, default=200_000)
    a = ap.parse_args()

    rng = random.Random(a.seed)
    rnd = rng.random
    randrange = rng.randrange
    sec_cache = {}

    def ts_str(ms):
        s, milli = divmod(ms, 1000)
        p = sec_cache.get(s)
        if p is None:
            p = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s))
            sec_cache[s] = p
        return f"{p}.{milli:03d}Z"

    clock = T0_MS
    base_n = written = 0
    pending = []
    seq = 0
    approved_unique = 0
    windows = set()
    out = open(a.events, "w", buffering=1 << 20)
    w = out.write
    while written < a.n:
        if pending and pending[0][0] <= written:
            w(heapq.heappop(pending)[2])
            written += 1
            continue
        clock += randrange(3)
        ts = clock
        if rnd() < 0.05:
            ts -= 1 + randrange(20000)
        k = randrange(a.accounts)
        cents = 100 + randrange(49901)
        amount = f"{cents // 100}.{cents % 100:02d}"
        currency = "EUR" if rnd() < 0.8 else "USD"
        approved = rnd() < 0.9
        status = "approved" if approved else "declined"
        merchant = (
            f'{{"name":"{MERCHANTS[randrange(len(MERCHANTS))]}","mcc":"{5000 + randrange(999)}",'
            f'"tags":{TAGS[randrange(len(TAGS))]}}}'
        )
        device = (
            f'{{"ua":"{AGENTS[randrange(len(AGENTS))]}",'
            f'"ip":"10.{randrange(256)}.{randrange(256)}.{randrange(256)}","trusted":{"true" if rnd() < 0.7 else "false"}}}'
        )
        payment = f'{{"id":"p-{base_n:09d}","amount":"{amount}","currency":"{currency}"}}'
        account = (
            f'{{"id":"acct-{k:06d}","tier":"{TIERS[k % 3]}","region":"{REGIONS[k % 4]}"}}'
        )
        risk = f'{{"score":{randrange(1000) / 1000},"rules":{{"velocity":{randrange(9)},"geo":null}}}}'
        when = f'"approved_at":"{ts_str(ts)}"'
        if base_n % 4 == 3:
            line = (
                f'{{{when},"status":"{status}","account":{account},"payment":{payment},'
                f'"device":{device},"merchant":{merchant},"risk":{risk}}}\n'
            )
        else:
            line = (
                f'{{"payment":{payment},"merchant":{merchant},"device":{device},'
                f'"account":{account},"risk":{risk},"status":"{status}",{when}}}\n'
            )
        base_n += 1
        w(line)
        written += 1
        if rnd() < 0.01:
            heapq.heappush(pending, (written + randrange(2000), seq, line))
            seq += 1
        if approved:
            approved_unique += 1
            windows.add((k, ts - ts % 60_000))
    out.close()
    meta = {"lines": written, "approved_unique": approved_unique, "windows": len(windows)}
    print("wide_gen", json.dumps(meta), file=sys.stderr)


if __name__ == "__main__":
    main()
